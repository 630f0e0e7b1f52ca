#include "runtime/cluster/agent.h"

#include <arpa/inet.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/errors.h"
#include "base/log.h"
#include "net/auth.h"
#include "net/dial.h"
#include "net/tls.h"
#include "runtime/cluster/agent_protocol.h"
#include "runtime/cluster/relay.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/wire.capnp.h"
#include "runtime/internal/worker_process.h"
#include "runtime/threads.h"

extern char** environ;

namespace baton {

using namespace agent_protocol;

// ---------------------------------------------------------------------------
// The agent's side.

namespace {

struct AgentWorker {
  uint64_t id = 0;
  pid_t pid = -1;
  std::string label;
  std::shared_ptr<Channel> channel;  // the agent's end of the worker's socket pair
  int outputs_open = 2;              // its stdout and stderr pumps still running
};

class Agent {
 public:
  explicit Agent(AgentOptions o) : o_(std::move(o)) {}

  int run() {
    auto [host, port] = auth::split_host_port(o_.driver, "baton-agent: --driver");
    host_ = host;
    port_ = port;
    if (port_ == 0) throw Error("baton-agent: --driver " + o_.driver + " names no port");
    if (!auth::token_configured())
      throw Error("baton-agent: no cluster token is configured: set BATON_CLUSTER_TOKEN_FILE "
                  "(or BATON_CLUSTER_TOKEN) to the driver's");
    token_ = auth::cluster_token();
    tls_ = tls::Context::client_from_environment();
    if (o_.hostname.empty()) {
      char name[256] = {};
      ::gethostname(name, sizeof(name) - 1);
      o_.hostname = name;
    }
    const auto deadline = Clock::now() + o_.connect_timeout;
    up_ = dial(deadline, &up_fd_);
    local_address_ = auth::socket_host(up_fd_, true);
    uint64_t session = 0;
    const std::string r = auth::random_token();
    std::memcpy(&session, r.data(), sizeof(session));
    {
      capnp::MallocMessageBuilder b;
      auto h = b.initRoot<wire::AgentMessage>().initHello();
      h.setVersion(kAgentProtocol);
      h.setHostname(o_.hostname);
      h.setNodeRank(o_.node_rank);
      h.setCpuSlots(o_.cpu_slots > 0 ? o_.cpu_slots : usable_cores());
      h.setGpus(gpu_count());
      h.setPid(static_cast<int32_t>(::getpid()));
      h.setSession(session);
      send_up(b);
    }
    int down_fd = -1;
    std::unique_ptr<auth::Conn> down = dial(deadline, &down_fd);
    {
      capnp::MallocMessageBuilder b;
      b.initRoot<wire::AgentMessage>().setControl(session);
      write_with_deadline(*down, b);
    }
    log(LogLevel::kInfo, "baton-agent: " + o_.hostname + " joined the driver at " + o_.driver);
    std::thread reaper([this] { reap_loop(); });
    std::string why = "the driver closed the connection";
    int exit_code = 0;
    try {
      kj::Array<capnp::word> words;
      for (;;) {
        if (!relay::read_message(*down, words, "the driver at " + o_.driver)) break;
        capnp::FlatArrayMessageReader reader(words, reader_options());
        auto m = reader.getRoot<wire::AgentMessage>();
        if (m.isShutdown()) {
          why = "the driver is done";
          break;
        }
        if (m.isRefused()) {
          log(LogLevel::kError, "baton-agent: the driver at " + o_.driver + " refused this node: " +
                                    m.getRefused().cStr());
          exit_code = 3;
          break;
        }
        if (m.isSpawn()) {
          spawn(m.getSpawn());
        } else if (m.isKill()) {
          std::lock_guard<std::mutex> lock(mu_);
          if (auto it = workers_.find(m.getKill()); it != workers_.end() && it->second->pid > 0)
            ::kill(it->second->pid, SIGKILL);
        }
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    log(LogLevel::kInfo, "baton-agent: stopping (" + why + ")");
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& [id, w] : workers_)
        if (w->pid > 0) ::kill(w->pid, SIGKILL);
      cv_.notify_all();
    }
    reaper.join();
    ::shutdown(up_fd_, SHUT_RDWR);
    ::shutdown(down_fd, SHUT_RDWR);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(5), [&] { return threads_ == 0; });
      // A relay still blocked somewhere must not outlive this object.
      if (threads_ != 0) ::_exit(exit_code);
    }
    return exit_code;
  }

 private:
  // Retried while the driver is not there yet or refuses for load
  // (net/dial.h).
  std::unique_ptr<auth::Conn> dial(Clock::time_point deadline, int* fd_out) {
    auth::DialOptions o;
    o.token = token_;
    o.where = "the driver at " + o_.driver;
    o.handshake_timeout = kHandshakeTimeout * 2;
    o.tls = tls_;
    std::unique_ptr<auth::Conn> conn;
    try {
      conn = auth::dial(host_, port_, deadline, o, fd_out);
    } catch (const auth::AuthError&) {
      throw;
    } catch (const Error& e) {
      throw Error(std::string("baton-agent: cannot reach the driver: ") + e.what());
    }
    keep_alive(*fd_out);
    return conn;
  }

  void send_up(capnp::MessageBuilder& b) {
    std::lock_guard<std::mutex> lock(up_mu_);
    write_with_deadline(*up_, b);
  }
  void send_up_quietly(capnp::MessageBuilder& b) {
    try {
      send_up(b);
    } catch (const std::exception& e) {
      // The driver is gone; the main loop notices and stops.
      ::shutdown(up_fd_, SHUT_RDWR);
    }
  }

  // The GPUs CUDA_VISIBLE_DEVICES lists (none when it is unset: this agent
  // offers its CPU cores).
  static int gpu_count() {
    const std::optional<std::vector<std::string>> gpus = visible_gpus();
    return gpus ? static_cast<int>(gpus->size()) : 0;
  }

  void spawn(wire::AgentSpawn::Reader s) {
    auto w = std::make_shared<AgentWorker>();
    w->id = s.getWorkerId();
    w->label = s.getLabel().cStr();
    auto fail = [&](const std::string& why) {
      capnp::MallocMessageBuilder b;
      auto f = b.initRoot<wire::AgentMessage>().initSpawnFailed();
      f.setWorkerId(w->id);
      f.setMessage(why);
      send_up_quietly(b);
    };
    std::vector<std::string> env;
    try {
      env = environment(s);
    } catch (const std::exception& e) {
      fail(e.what());
      return;
    }
    int sv[2], out[2], err[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      fail("socketpair: " + errno_text());
      return;
    }
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      ::close(sv[0]);
      ::close(sv[1]);
      fail("pipe2: " + errno_text());
      return;
    }
    sv[1] = high_fd(sv[1]);
    out[1] = high_fd(out[1]);
    err[1] = high_fd(err[1]);
    std::vector<std::string> args;
    for (auto a : s.getArgv()) args.emplace_back(a.cStr());
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
    pid_t pid = -1;
    const std::string exe = s.getExe().cStr();
    // From this (the main) thread, which lives as long as the agent: a
    // worker's parent-death signal fires when its spawning thread ends.
    const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(sv[1]);
    ::close(out[1]);
    ::close(err[1]);
    if (rc != 0) {
      ::close(sv[0]);
      ::close(out[0]);
      ::close(err[0]);
      fail("cannot run " + exe + " on " + o_.hostname + ": " + std::strerror(rc));
      return;
    }
    w->pid = pid;
    w->channel = std::make_shared<Channel>(sv[0]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers_[w->id] = w;
      threads_ += 4;
      cv_.notify_all();
    }
    {
      capnp::MallocMessageBuilder b;
      auto ok = b.initRoot<wire::AgentMessage>().initSpawned();
      ok.setWorkerId(w->id);
      ok.setPid(pid);
      send_up_quietly(b);
    }
    log(LogLevel::kDebug, "baton-agent: started " + w->label + " (pid " + std::to_string(pid) + ")");
    std::thread([this, w, fd = out[0]] { pump_output(w, fd, false); }).detach();
    std::thread([this, w, fd = err[0]] { pump_output(w, fd, true); }).detach();
    std::thread([this, w] { pump_data(w, false); }).detach();
    std::thread([this, w] { pump_data(w, true); }).detach();
  }

  // The worker's environment: the agent's own, with the runtime's variables
  // from the driver over it; the token and the GPU are this node's.
  std::vector<std::string> environment(wire::AgentSpawn::Reader s) const {
    std::set<std::string> theirs = {"BATON_CLUSTER_TOKEN", "BATON_CLUSTER_TOKEN_FILE",
                                    "BATON_DRIVER_PID", "BATON_NODE_ADDR"};
    bool gpu = false;
    int slot = 0;
    for (auto kv : s.getEnv()) {
      std::string e = kv.cStr();
      const size_t eq = e.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = e.substr(0, eq);
      theirs.insert(key);
      if (key == "BATON_USE_GPU") gpu = e.substr(eq + 1) == "1";
      if (key == "BATON_SLOT") slot = std::atoi(e.c_str() + eq + 1);
    }
    if (gpu) theirs.insert("CUDA_VISIBLE_DEVICES");
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv(*e);
      if (!theirs.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    for (auto kv : s.getEnv()) env.emplace_back(kv.cStr());
    env.push_back("BATON_DRIVER_PID=" + std::to_string(::getpid()));
    env.push_back("BATON_CLUSTER_TOKEN=" + token_);
    env.push_back("BATON_NODE_ADDR=" + local_address_);
    if (gpu) env.push_back("CUDA_VISIBLE_DEVICES=" + gpu_of_slot(slot, "the node agent's"));
    return env;
  }

  void pump_output(std::shared_ptr<AgentWorker> w, int fd, bool is_stderr) {
    std::vector<char> buf(64 * 1024);
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      capnp::MallocMessageBuilder b;
      auto o = b.initRoot<wire::AgentMessage>().initOutput();
      o.setWorkerId(w->id);
      o.setStderr(is_stderr);
      o.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(buf.data()), static_cast<size_t>(n)));
      send_up_quietly(b);
    }
    ::close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    --w->outputs_open;
    --threads_;
    cv_.notify_all();
  }

  void pump_data(std::shared_ptr<AgentWorker> w, bool to_worker) {
    std::string why;
    try {
      int fd = -1;
      std::unique_ptr<auth::Conn> conn = dial(Clock::now() + std::chrono::seconds(30), &fd);
      capnp::MallocMessageBuilder b;
      auto a = b.initRoot<wire::AgentMessage>().initAttach();
      a.setWorkerId(w->id);
      a.setToWorker(to_worker);
      write_with_deadline(*conn, b);
      why = to_worker ? relay::pump_to_unix(*conn, *w->channel, w->label)
                      : relay::pump_to_tcp(*w->channel, *conn);
      ::shutdown(fd, SHUT_RDWR);
      conn.reset();
      ::close(fd);
    } catch (const std::exception& e) {
      why = e.what();
      ::kill(w->pid, SIGKILL);  // a worker the driver cannot reach is of no use
    }
    // The driver closed its side: the worker reads the end of its socket and
    // exits, as a local worker does when its driver goes.
    if (to_worker) ::shutdown(w->channel->fd(), SHUT_RDWR);
    if (!why.empty()) log(LogLevel::kDebug, "baton-agent: relay of " + w->label + ": " + why);
    std::lock_guard<std::mutex> lock(mu_);
    --threads_;
    cv_.notify_all();
  }

  void reap_loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !workers_.empty() || stopping_; });
        if (workers_.empty() && stopping_) return;
      }
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, 0);
      if (pid < 0) {
        if (errno == ECHILD) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      std::shared_ptr<AgentWorker> w;
      {
        std::unique_lock<std::mutex> lock(mu_);
        for (auto& [id, x] : workers_)
          if (x->pid == pid) w = x;
        if (!w) continue;
        // Its last output first: the driver closes its log when it hears of the exit.
        cv_.wait_for(lock, std::chrono::seconds(2), [&] { return w->outputs_open == 0; });
        workers_.erase(w->id);
      }
      capnp::MallocMessageBuilder b;
      auto e = b.initRoot<wire::AgentMessage>().initExited();
      e.setWorkerId(w->id);
      e.setWaitStatus(status);
      send_up_quietly(b);
      log(LogLevel::kDebug, "baton-agent: " + w->label + " " + describe_exit_status(status));
    }
  }

  AgentOptions o_;
  std::string host_;
  uint16_t port_ = 0;
  std::string token_;
  std::shared_ptr<tls::Context> tls_;
  std::string local_address_;
  std::mutex up_mu_;
  std::unique_ptr<auth::Conn> up_;
  int up_fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<AgentWorker>> workers_;
  bool stopping_ = false;
  int threads_ = 0;
};

}  // namespace

int run_agent(const AgentOptions& options) {
  ::signal(SIGPIPE, SIG_IGN);
  try {
    Agent agent(options);
    return agent.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace baton
