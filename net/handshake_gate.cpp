#include "net/handshake_gate.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "net/tls.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Accepts per wake-up, so that a flood cannot keep the gate from the
// handshakes it already holds.
constexpr int kAcceptBurst = 64;
constexpr milliseconds kFirstPause{10}, kLongestPause{500};
// A TLS client speaks first, at once; silent this long, a connection is taken
// for a plain client and told that TLS is required.
constexpr milliseconds kTlsSilence{1000};

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<milliseconds>(b - a).count();
}

}  // namespace

void RateLimitedLog::warn(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  if (now - window_ >= std::chrono::seconds(1)) {
    window_ = now;
    lines_ = 0;
  }
  if (lines_ >= per_second_) {
    ++dropped_;
    ++unreported_;
    return;
  }
  ++lines_;
  ++shown_;
  std::string text = prefix_ + ": " + line;
  if (unreported_ > 0) {
    text += " (" + std::to_string(unreported_) + " more such lines not shown)";
    unreported_ = 0;
  }
  log(LogLevel::kWarn, text);
}

uint64_t RateLimitedLog::shown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shown_;
}

uint64_t RateLimitedLog::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

struct HandshakeGate::Impl {
  HandshakeGateOptions options;
  Proven proven;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  RateLimitedLog log_;

  struct Pending {
    int fd = -1;
    std::string who, host;
    std::unique_ptr<auth::Conn> conn;
    std::unique_ptr<auth::ServerHandshake> handshake;
    bool tls_done = false;
    bool heard = false;  // any byte (or the end) arrived
    auth::Want want = auth::Want::kNone;
    Clock::time_point deadline, silent_deadline;
  };
  std::list<Pending> pending;           // the gate thread's
  std::map<std::string, int> per_host;  // connections in their handshake, by address

  // Out of descriptors: no accepts until `resume`.
  Clock::time_point resume{};
  milliseconds pause{0};
  uint64_t failures_in_episode = 0;
  Clock::time_point episode_start{};

  std::atomic<uint64_t> accepted{0}, authenticated{0}, rejected{0}, refused{0},
      accept_failures{0}, pending_now{0};

  Impl(int fd, HandshakeGateOptions o, Proven p)
      : options(std::move(o)), proven(std::move(p)), listen_fd(fd), log_(options.name) {}

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::list<Pending>::iterator> which;
    for (;;) {
      const auto now = Clock::now();
      const bool accepting = now >= resume;
      fds.clear();
      which.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
      Clock::time_point next = Clock::time_point::max();
      if (!accepting) next = resume;
      for (auto it = pending.begin(); it != pending.end(); ++it) {
        const short events = it->want == auth::Want::kWrite ? POLLOUT : POLLIN;
        fds.push_back({it->fd, events, 0});
        which.push_back(it);
        next = std::min(next, it->deadline);
        if (options.tls && !it->heard) next = std::min(next, it->silent_deadline);
      }
      const int timeout =
          next == Clock::time_point::max() ? -1 : static_cast<int>(std::max<int64_t>(ms_between(now, next) + 1, 0));
      if (::poll(fds.data(), fds.size(), timeout) < 0) {
        if (errno == EINTR) continue;
        log_.warn(std::string("poll failed: ") + std::strerror(errno));
        std::this_thread::sleep_for(milliseconds(10));
        continue;
      }
      if (fds[0].revents != 0) return;
      for (size_t i = 0; i < which.size(); ++i) {
        const short r = fds[i + 2].revents;
        if (r == 0) continue;
        if (r & (POLLIN | POLLHUP | POLLERR)) which[i]->heard = true;
        advance(which[i]);
      }
      expire();
      if (fds[1].revents & POLLIN) accept_some();
      pending_now.store(pending.size());
    }
  }

  void accept_some() {
    for (int n = 0; n < kAcceptBurst; ++n) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          out_of_descriptors(errno);
        }
        return;
      }
      if (failures_in_episode > 0) {
        log(LogLevel::kWarn, options.name + ": accepting again, after " +
                                 std::to_string(failures_in_episode) + " failed accepts in " +
                                 std::to_string(ms_between(episode_start, Clock::now())) + " ms");
        failures_in_episode = 0;
      }
      pause = milliseconds(0);
      ++accepted;
      admit(fd);
    }
  }

  void out_of_descriptors(int err) {
    ++accept_failures;
    const auto now = Clock::now();
    if (failures_in_episode++ == 0) {
      episode_start = now;
      log(LogLevel::kWarn, options.name + ": cannot accept connections: " + std::strerror(err) +
                               "; pausing accepts, " + std::to_string(kFirstPause.count()) + " to " +
                               std::to_string(kLongestPause.count()) +
                               " ms between tries (logged once until an accept succeeds)");
    }
    pause = pause.count() == 0 ? kFirstPause : std::min(pause * 2, kLongestPause);
    resume = now + pause;
  }

  void refuse(int fd, auth::Refusal why, const std::string& who, const std::string& detail) {
    ++refused;
    const std::string frame = auth::refusal_frame(why);
    // A fresh socket's buffer takes the frame whole; if not, the peer sees
    // the end.
    (void)!::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    log_.warn("refused a connection from " + who + ": " + detail);
  }

  void admit(int fd) {
    const std::string who = auth::peer_address(fd);
    const std::string host = auth::socket_host(fd, false);
    if (static_cast<int>(pending.size()) >= options.max_pending) {
      refuse(fd, auth::Refusal::kBusy, who,
             std::to_string(options.max_pending) + " connections are already in their handshake");
      return;
    }
    int& from_host = per_host[host];
    if (from_host >= options.max_pending_per_address) {
      refuse(fd, auth::Refusal::kBusyFromAddress, who,
             std::to_string(from_host) + " connections from " + host +
                 " are already in their handshake");
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Pending p;
    p.fd = fd;
    p.who = who;
    p.host = host;
    const auto now = Clock::now();
    p.deadline = now + options.handshake_timeout;
    p.silent_deadline = now + std::min<milliseconds>(options.handshake_timeout / 2, kTlsSilence);
    try {
      p.conn = options.tls ? options.tls->accept_async(fd, who) : std::make_unique<auth::Conn>(fd);
    } catch (const std::exception& e) {
      ++rejected;
      log_.warn(e.what());
      ::close(fd);
      return;
    }
    p.handshake = std::make_unique<auth::ServerHandshake>(options.token, who);
    ++from_host;
    pending.push_back(std::move(p));
    // A plain server speaks first: its hello goes out now.
    advance(std::prev(pending.end()));
  }

  // Drops a connection in its handshake; `why` logged when not empty.
  void drop(std::list<Pending>::iterator it, const std::string& why) {
    if (!why.empty()) {
      ++rejected;
      log_.warn(why);
    }
    it->conn.reset();
    ::close(it->fd);
    release(it);
  }

  void release(std::list<Pending>::iterator it) {
    if (auto h = per_host.find(it->host); h != per_host.end() && --h->second <= 0) {
      per_host.erase(h);
    }
    pending.erase(it);
  }

  void advance(std::list<Pending>::iterator it) {
    try {
      if (!it->tls_done) {
        // Bytes there now are heard even if the TLS step takes them in
        // before poll() could report them.
        char byte;
        if (!it->heard && ::recv(it->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) it->heard = true;
        it->want = it->conn->handshake_step();
        if (it->want != auth::Want::kNone) return;
        it->tls_done = true;
        it->heard = true;
      }
      it->want = it->handshake->step(*it->conn);
      if (it->want != auth::Want::kNone) return;
    } catch (const std::exception& e) {
      drop(it, e.what());
      return;
    }
    ++authenticated;
    const int fd = it->fd;
    std::unique_ptr<auth::Conn> conn = std::move(it->conn);
    release(it);
    if (!options.tls) {
      // Plain TCP: blocking again, as the protocols behind expect.
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    try {
      proven(fd, std::move(conn));
    } catch (const std::exception& e) {
      log(LogLevel::kError, options.name + ": cannot serve an authenticated connection: " + e.what());
      ::close(fd);
    }
  }

  void expire() {
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      auto here = it++;
      if (options.tls && !here->heard && now >= here->silent_deadline) {
        // A TLS client speaks first; a plain baton client waits for the
        // server's hello and would otherwise time out without knowing why.
        ++rejected;
        const std::string frame = auth::refusal_frame(auth::Refusal::kTlsRequired);
        (void)!::send(here->fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        log_.warn("connection from " + here->who + " sent nothing in " +
                  std::to_string(ms_between(here->deadline - options.handshake_timeout, now)) +
                  " ms: told it that TLS is required");
        here->conn.reset();
        ::close(here->fd);
        release(here);
      } else if (now >= here->deadline) {
        drop(here, "connection from " + here->who + ": handshake timed out (deadline " +
                       std::to_string(options.handshake_timeout.count()) + " ms)");
      }
    }
  }

  void stop() {
    const char one = 1;
    (void)!::write(wake[1], &one, 1);
    if (thread.joinable()) thread.join();
    for (auto& p : pending) {
      p.conn.reset();
      ::close(p.fd);
    }
    pending.clear();
    ::close(listen_fd);
    ::close(wake[0]);
    ::close(wake[1]);
  }
};

HandshakeGate::HandshakeGate(int listen_fd, HandshakeGateOptions options, Proven proven)
    : impl_(std::make_unique<Impl>(listen_fd, std::move(options), std::move(proven))) {
  // accept() in a burst until EAGAIN, never blocking the gate.
  const int flags = ::fcntl(listen_fd, F_GETFL);
  if (flags >= 0) ::fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK);
  if (::pipe2(impl_->wake, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd);
    throw Error(impl_->options.name + ": pipe2: " + why);
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

HandshakeGate::~HandshakeGate() { impl_->stop(); }

HandshakeGate::Counts HandshakeGate::counts() const {
  Counts c;
  c.accepted = impl_->accepted.load();
  c.authenticated = impl_->authenticated.load();
  c.rejected = impl_->rejected.load();
  c.refused = impl_->refused.load();
  c.accept_failures = impl_->accept_failures.load();
  c.pending = impl_->pending_now.load();
  c.log_lines = impl_->log_.shown();
  c.log_dropped = impl_->log_.dropped();
  return c;
}

}  // namespace baton
