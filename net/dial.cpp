#include "net/dial.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <random>
#include <thread>

#include "base/errors.h"
#include "net/tls.h"

namespace baton::auth {
namespace {

using Clock = std::chrono::steady_clock;

std::string millis(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

std::unique_ptr<Conn> dial(const std::string& host, uint16_t port, Clock::time_point deadline,
                           const DialOptions& options, int* fd_out) {
  const auto start = Clock::now();
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  auto backoff = std::chrono::milliseconds(50);
  int tries = 0;
  for (;;) {
    ++tries;
    std::string why;
    std::optional<Refusal> refused;
    bool unanswered = false;
    const int fd = tcp_connect(host, port, std::min(deadline, Clock::now() + std::chrono::seconds(5)), why);
    if (fd >= 0) {
      std::unique_ptr<Conn> conn;
      try {
        const auto handshake_deadline = Clock::now() + options.handshake_timeout;
        conn = options.tls ? options.tls->connect(fd, handshake_deadline, host, options.where)
                           : std::make_unique<Conn>(fd);
        client_handshake(*conn, options.token, options.handshake_timeout, options.where);
        *fd_out = fd;
        return conn;
      } catch (const RefusedError& e) {
        conn.reset();
        ::close(fd);
        if (!e.retryable()) throw;
        why = e.what();
        refused = e.reason();
      } catch (const UnansweredError& e) {
        conn.reset();
        ::close(fd);
        why = e.what();
        unanswered = true;
      } catch (...) {
        conn.reset();
        ::close(fd);
        throw;
      }
    } else {
      why = "cannot connect to " + options.where + ": " + why;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      const std::string gave_up = " (" + std::to_string(tries) + " tries in " + millis(now - start) + ")";
      if (refused) throw RefusedError(why + gave_up, *refused);
      if (unanswered) throw UnansweredError(why + gave_up);
      throw Error(why + gave_up);
    }
    const auto pause = std::chrono::duration_cast<Clock::duration>(backoff * jitter(rng));
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

}  // namespace baton::auth
