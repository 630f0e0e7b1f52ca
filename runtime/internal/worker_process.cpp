#include "runtime/internal/worker_process.h"

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"
#include "net/auth.h"
#include "runtime/cluster/cluster.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/driver.h"
#include "runtime/internal/value_codec.h"
#include "runtime/threads.h"

extern char** environ;

namespace baton {

namespace asio = boost::asio;

namespace {

std::mutex& console_mu() {
  static std::mutex mu;
  return mu;
}

std::string errno_text() { return std::strerror(errno); }

// How often a local worker's memory is sampled: the RSS an OOM kill reports
// is at most this old, and another SIGKILL is taken for an OOM kill only if
// its cgroup's OOM killer struck within this window. A sample costs ~30 µs
// of the I/O thread.
constexpr std::chrono::milliseconds kMemorySampleInterval{250};

// The error of a call that a dead worker never ran.
std::string refusal(const std::string& class_name, const std::string& method,
                    const std::string& death) {
  return class_name + "." + method + " refused: " + death;
}

}  // namespace

int high_fd(int fd) {
  if (fd > 3) return fd;
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return h;
}

std::optional<std::vector<std::string>> visible_gpus() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return std::nullopt;
  std::vector<std::string> entries;
  std::string entry;
  for (const char* c = visible;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!entry.empty()) entries.push_back(entry);
      entry.clear();
      if (*c == '\0') break;
    } else if (*c != ' ') {
      entry += *c;
    }
  }
  return entries;
}

std::string gpu_of_slot(int slot, const char* whose) {
  const std::optional<std::vector<std::string>> visible = visible_gpus();
  if (!visible) return std::to_string(slot);
  const std::vector<std::string>& entries = *visible;
  if (slot < 0 || slot >= static_cast<int>(entries.size()))
    throw Error("GPU slot " + std::to_string(slot) + " has no GPU: " + whose +
                " CUDA_VISIBLE_DEVICES=\"" + std::getenv("CUDA_VISIBLE_DEVICES") + "\" lists " +
                std::to_string(entries.size()) +
                " (give the driver more GPUs, or a pool with fewer workers per node)");
  return entries[static_cast<size_t>(slot)];
}

namespace {

// The runtime's variables for a worker. A remote worker's cluster token,
// driver pid and GPU are its node agent's to set (runtime/cluster/cluster.h): the
// token does not cross the network.
std::vector<std::string> runtime_variables(const WorkerInfo& info, bool remote) {
  std::vector<std::string> env;
  auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  add("BATON_WORKER_FD", "3");
  if (!remote) add("BATON_DRIVER_PID", std::to_string(getpid()));
  add("BATON_CLASS", info.class_name);
  add("BATON_GROUP", info.group_name);
  add("BATON_NODE", std::to_string(info.node));
  add("BATON_SLOT", std::to_string(info.slot));
  add("BATON_USE_GPU", info.use_gpu ? "1" : "0");
  add("BATON_THREADS", std::to_string(info.intra_op_threads));
  add("OMP_NUM_THREADS", std::to_string(info.intra_op_threads));
  apply_wait_policy(info.wait_policy, env);
  add("RANK", std::to_string(info.rank));
  add("WORLD_SIZE", std::to_string(info.world_size));
  add("LOCAL_RANK", std::to_string(info.local_rank));
  add("LOCAL_WORLD_SIZE", std::to_string(info.local_world_size));
  add("MASTER_ADDR", info.master_addr);
  add("MASTER_PORT", std::to_string(info.master_port));
  if (!remote) {
    // The rendezvous store's secret (net/auth.h): the worker reads it at
    // start and removes it from its environment.
    add("BATON_CLUSTER_TOKEN", auth::cluster_token());
    // One GPU per worker: inside the worker it is device 0 (WorkerInfo::device).
    if (info.use_gpu) add("CUDA_VISIBLE_DEVICES", gpu_of_slot(info.slot));
  }
  const ParallelLayout& l = info.layout;
  add("BATON_LAYOUT", std::to_string(l.tp) + "," + std::to_string(l.cp) + "," +
                          std::to_string(l.dp) + "," + std::to_string(l.pp));
  return env;
}

// A local worker's environment: the driver's, with the runtime's variables
// over it.
std::vector<std::string> worker_environment(const WorkerInfo& info) {
  std::vector<std::string> ours = runtime_variables(info, false);
  std::vector<std::string> keys = {"BATON_CLUSTER_TOKEN_FILE=", "BATON_NODE_ADDR="};
  for (const std::string& kv : ours) keys.push_back(kv.substr(0, kv.find('=') + 1));
  // The other knobs of the wait policy that runtime_variables overrides.
  if (info.wait_policy != WaitPolicy::kInherit) keys.insert(keys.end(), {"GOMP_SPINCOUNT=", "KMP_BLOCKTIME="});
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    bool replaced = false;
    for (const std::string& k : keys) replaced = replaced || kv.rfind(k, 0) == 0;
    if (!replaced) env.push_back(std::move(kv));
  }
  env.insert(env.end(), ours.begin(), ours.end());
  return env;
}

}  // namespace

// Copies a worker's stdout or stderr to the driver's, a prefix on every line.
// Pending reads keep it alive until the pipe closes, so output written just
// before a crash still arrives.
struct LogPump : std::enable_shared_from_this<LogPump> {
  LogPump(asio::io_context& io, int fd) : pipe(io, fd), buf(64 * 1024) {}

  void start() {
    auto self = shared_from_this();
    pipe.async_read_some(asio::buffer(buf), [self](const boost::system::error_code& ec,
                                                   size_t n) { self->on_read(ec, n); });
  }

  void on_read(const boost::system::error_code& ec, size_t n) {
    line.append(buf.data(), n);
    size_t start_at = 0;
    for (size_t nl; (nl = line.find('\n', start_at)) != std::string::npos; start_at = nl + 1) {
      emit(std::string_view(line).substr(start_at, nl + 1 - start_at));
    }
    line.erase(0, start_at);
    if (!ec) {
      start();
      return;
    }
    if (!line.empty()) {
      line += '\n';
      emit(line);
    }
  }

  void emit(std::string_view text) {
    {
      std::lock_guard<std::mutex> lock(console_mu());
      std::fwrite(prefix.data(), 1, prefix.size(), sink);
      std::fwrite(text.data(), 1, text.size(), sink);
      std::fflush(sink);
    }
    // The run's log file (base/log.h) gets every process's lines.
    log_output_line(prefix + std::string(text));
  }

  asio::posix::stream_descriptor pipe;
  std::vector<char> buf;
  std::string line;
  std::string prefix;
  FILE* sink = stdout;
};

struct WorkerProcess::Io {
  explicit Io(asio::io_context& io) : socket(io) {}
  asio::posix::stream_descriptor socket;
  std::map<uint64_t, std::unique_ptr<asio::steady_timer>> timers;
  asio::steady_timer reaper{socket.get_executor()};
  asio::steady_timer sampler{socket.get_executor()};
};

WorkerProcess::WorkerProcess(WorkerInfo info, DeathHook on_death)
    : info_(std::move(info)), on_death_(std::move(on_death)), peer_(Driver::get().next_peer_id()) {}

WorkerProcess::~WorkerProcess() {
  Driver& driver = Driver::get();
  driver.pool().release_peer(peer_);
  // Asio objects belong to the I/O thread: hand them over to be closed there.
  // The socket's fd is owned by the channel, so the descriptor lets go of it.
  auto io = std::shared_ptr<Io>(std::move(io_));
  auto channel = std::shared_ptr<Channel>(std::move(channel_));
  asio::post(driver.io(), [io, channel]() mutable {
    if (io) io->socket.release();
    io.reset();
    channel.reset();
  });
}

std::string WorkerProcess::label() const {
  return "worker " + info_.class_name + " rank " + std::to_string(info_.rank) + " (pid " +
         std::to_string(pid_) + (remote_ ? " on " + remote_->node().describe() : "") + ")";
}

bool WorkerProcess::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return death_.empty();
}

std::shared_ptr<WorkerProcess> WorkerProcess::spawn(WorkerInfo info, DeathHook on_death,
                                                   std::shared_ptr<Cluster> cluster) {
  std::shared_ptr<WorkerProcess> w(new WorkerProcess(std::move(info), std::move(on_death)));
  Driver& driver = Driver::get();
  if (cluster) {
    // The agent starts it; the driver's end of its socket is relayed to the
    // agent over TCP, its output arrives through the pipes.
    int sv[2], out[2], err[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error("cannot create a socket pair for " + w->label() + ": " + errno_text());
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
      throw Error("cannot create pipes for " + w->label() + ": " + errno_text());
    const std::string what = "worker " + w->info_.class_name + " rank " +
                             std::to_string(w->info_.rank);
    try {
      w->remote_ = cluster->spawn(w->info_.node, what, driver.exe(), driver.args(),
                                  runtime_variables(w->info_, true), sv[1], out[1], err[1]);
    } catch (...) {
      close(sv[0]);
      close(out[0]);
      close(err[0]);
      throw;
    }
    w->pid_ = w->remote_->pid();
    driver.run_on_io([&] { w->attach(sv[0], out[0], err[0]); });
    return w;
  }
  // Before any fd is made: it throws for a GPU slot the driver has no GPU for.
  std::vector<std::string> env = worker_environment(w->info_);
  driver.run_on_io([&] {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      throw Error("cannot create a socket pair for " + w->label() + ": " + errno_text());
    }
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      throw Error("cannot create pipes for " + w->label() + ": " + errno_text());
    }
    int child_sock = high_fd(sv[1]), out_w = high_fd(out[1]), err_w = high_fd(err[1]);

    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = driver.args();
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_w, 1);
    posix_spawn_file_actions_adddup2(&fa, err_w, 2);
    posix_spawn_file_actions_adddup2(&fa, child_sock, 3);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, driver.exe().c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(child_sock);
    close(out_w);
    close(err_w);
    if (rc != 0) {
      close(sv[0]);
      close(out[0]);
      close(err[0]);
      throw Error("cannot start " + w->label() + " from " + driver.exe() + ": " +
                  std::strerror(rc));
    }
    w->pid_ = pid;
    w->attach(sv[0], out[0], err[0]);
  });
  return w;
}

void WorkerProcess::attach(int socket, int out, int err) {
  channel_ = std::make_unique<Channel>(socket);
  io_ = std::make_unique<Io>(Driver::get().io());
  io_->socket.assign(socket);
  start_reading();
  start_log_pipe(out, false);
  start_log_pipe(err, true);
  log(LogLevel::kDebug, "baton: started " + label());
  if (!remote_) {
    memory_.emplace(pid_);
    sample_memory();
  }
}

void WorkerProcess::sample_memory() {
  // Once reaped (memory_ reset) its pid may name another process. Until
  // then a sample that finds nothing (dying, or no file descriptor left)
  // keeps the last one.
  if (!memory_) return;
  memory_->sample();
  io_->sampler.expires_after(kMemorySampleInterval);
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  io_->sampler.async_wait([weak](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (self && !ec) self->sample_memory();
  });
}

void WorkerProcess::start_reading() {
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  io_->socket.async_wait(asio::posix::stream_descriptor::wait_read,
                         [weak](const boost::system::error_code& ec) {
                           auto self = weak.lock();
                           if (!self || ec) return;
                           self->on_readable();
                         });
}

void WorkerProcess::on_readable() {
  Channel::ReadStatus status = channel_->read_available();
  try {
    channel_->drain([this](wire::Envelope::Reader env, std::vector<int> fds) {
      handle_message(env, std::move(fds));
    });
  } catch (const std::exception& e) {
    kill(std::string("it sent a malformed message: ") + e.what());
    on_closed();  // reap it
    return;
  }
  if (status == Channel::ReadStatus::kClosed) {
    on_closed();
    return;
  }
  start_reading();
}

void WorkerProcess::handle_message(wire::Envelope::Reader env, std::vector<int> received) {
  // Closed on every way out below, a throw from a malformed message included,
  // unless the decoder takes them.
  OwnedFds fds(std::move(received));
  ShmPool& pool = Driver::get().pool();
  for (SegmentId id : env.getReleased()) pool.release(id, peer_);
  if (!env.isResult()) return;
  auto result = env.getResult();
  Pending pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(result.getCallId());
    if (it == pending_.end()) return;  // timed out earlier; the late result is dropped
    pending = std::move(it->second);
    pending_.erase(it);
  }
  if (auto t = io_->timers.find(result.getCallId()); t != io_->timers.end()) {
    t->second->cancel();
    io_->timers.erase(t);
  }
  if (result.isError()) {
    auto err = result.getError();
    std::string message = err.getMessage().cStr();
    switch (err.getKind()) {
      case wire::ErrorKind::EXCEPTION:
        pending.promise.fail(RemoteError(info_.class_name, info_.rank, pending.method, message));
        break;
      case wire::ErrorKind::BAD_CALL:
        pending.promise.fail(CallError(info_.class_name + "." + pending.method + " on rank " +
                                       std::to_string(info_.rank) + ": " + message));
        break;
      case wire::ErrorKind::INIT_FAILED:
        pending.promise.fail(Error("constructing " + info_.class_name + " on rank " +
                                   std::to_string(info_.rank) + " failed: " + message));
        break;
    }
    return;
  }
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  Value value;
  try {
    // On the I/O thread's track; the future's callbacks run after it.
    profiler::Span span("decode result", "runtime");
    span.arg("call_id", static_cast<int64_t>(result.getCallId())).arg("rank", info_.rank);
    ValueDecoder decoder(fds.take(), env.getSharedBytes(), regions_, [weak](SegmentId id) {
      if (auto self = weak.lock()) self->queue_release(id);
    });
    value = decoder.decode(result.getValue());
  } catch (const std::exception& e) {
    pending.promise.fail(Error("result of " + info_.class_name + "." + pending.method +
                               " on rank " + std::to_string(info_.rank) +
                               " could not be read: " + e.what()));
    return;
  }
  pending.promise.set_value(std::move(value));
}

void WorkerProcess::start_log_pipe(int fd, bool is_stderr) {
  auto pump = std::make_shared<LogPump>(Driver::get().io(), fd);
  pump->prefix = "[" + info_.class_name + ":" + std::to_string(info_.rank) + "] ";
  pump->sink = is_stderr ? stderr : stdout;
  pump->start();
}

void WorkerProcess::on_closed() {
  boost::system::error_code ignored;
  io_->socket.cancel(ignored);
  if (remote_) {
    reap_remote(2000, false);
  } else {
    reap(2000);
  }
}

// As reap, with the status from the node agent: it reports the exit a
// moment after the socket closed (or the agent is gone, and so is the worker).
void WorkerProcess::reap_remote(int attempts_left, bool killed) {
  int status = 0;
  std::string why;
  switch (remote_->state(&status, &why)) {
    case RemoteWorker::State::kExited: finish_death(status, true); return;
    case RemoteWorker::State::kLost: finish_lost(why); return;
    case RemoteWorker::State::kRunning: break;
  }
  if (attempts_left == 0) {
    if (killed) {
      finish_death(0, false);
      return;
    }
    remote_->kill();
    attempts_left = 2000;
    killed = true;
  }
  io_->reaper.expires_after(std::chrono::milliseconds(1));
  auto self = shared_from_this();
  io_->reaper.async_wait([self, attempts_left, killed](const boost::system::error_code&) {
    self->reap_remote(attempts_left - 1, killed);
  });
}

// The socket closes as the process exits; its status may take a moment to
// appear. Poll every millisecond, then kill it if it lingers (it closed the
// socket but did not exit).
void WorkerProcess::reap(int attempts_left) {
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    finish_death(status, true);
    return;
  }
  if (r < 0) {
    finish_death(0, false);
    return;
  }
  if (attempts_left == 0) {
    memory_.reset();  // the SIGKILL below is ours, not the OOM killer's
    ::kill(pid_, SIGKILL);
    if (waitpid(pid_, &status, 0) == pid_) {
      finish_death(status, true);
    } else {
      finish_death(0, false);
    }
    return;
  }
  io_->reaper.expires_after(std::chrono::milliseconds(1));
  auto self = shared_from_this();
  io_->reaper.async_wait([self, attempts_left](const boost::system::error_code&) {
    self->reap(attempts_left - 1);
  });
}

void WorkerProcess::finish_death(int wait_status, bool have_status) {
  std::string how = "closed its connection (exit status unknown)";
  if (have_status)
    how = memory_ ? memory_->describe_death(wait_status) : describe_exit_status(wait_status);
  finish(how);
}

void WorkerProcess::finish_lost(const std::string& why) { finish(why); }

void WorkerProcess::finish(const std::string& how) {
  memory_.reset();
  io_->sampler.cancel();
  bool expected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Asked to exit, or stopped by the runtime (and already reported).
    expected = exit_requested_ || !kill_reason_.empty();
  }
  std::string what = declare_dead(how, "");
  if (what.empty()) {  // kill() declared it dead and failed its calls then
    std::lock_guard<std::mutex> lock(mu_);
    what = death_;
  }
  if (expected) {
    log(LogLevel::kDebug, "baton: " + label() + " exited");
  } else {
    log(LogLevel::kError, "baton: " + what);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
  }
  exited_cv_.notify_all();
  for (auto& [id, t] : io_->timers) t->cancel();
  io_->timers.clear();
  // No write may still use a segment's fd once the peer's holds are gone.
  channel_->drop_queue();
  Driver::get().pool().release_peer(peer_);
  if (on_death_ && !what.empty()) on_death_(*this, what);
}

std::string WorkerProcess::declare_dead(const std::string& how, const std::string& cause) {
  std::unordered_map<uint64_t, Pending> pending;
  std::string what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!death_.empty()) return "";
    const Pending* running = nullptr;
    for (const auto& [id, p] : pending_) {
      if (running == nullptr || p.seq < running->seq) running = &p;
    }
    what = label() + " " + how;
    what += running != nullptr ? " during " + info_.class_name + "." + running->method
                               : std::string(" while idle");
    what += cause;
    death_ = what;
    pending.swap(pending_);
  }
  // The oldest pending call was running (a worker runs its calls in order);
  // the ones behind it never ran.
  uint64_t oldest = UINT64_MAX;
  for (const auto& [id, p] : pending) oldest = std::min(oldest, p.seq);
  for (auto& [id, p] : pending) {
    p.promise.fail(
        WorkerDiedError(p.seq == oldest ? what : refusal(info_.class_name, p.method, what)));
  }
  return what;
}

Future<Value> WorkerProcess::init(const std::vector<RoleSpec>& roles) {
  SmallMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  ValueEncoder enc(Driver::get().pool());
  for (const RoleSpec& r : roles) enc.plan(r.init_args);
  auto wire_roles = env.initInit().initRoles(static_cast<unsigned>(roles.size()));
  for (size_t i = 0; i < roles.size(); ++i) {
    auto r = wire_roles[static_cast<unsigned>(i)];
    r.setRole(roles[i].role);
    r.setClassName(roles[i].class_name);
    enc.encode(roles[i].init_args,
               r.initInitArgs(static_cast<unsigned>(roles[i].init_args.size())));
  }
  OutgoingCall call;
  call.call_id = 0;
  call.method = "<constructor>";
  call.fds = enc.finish(env);
  call.segment = enc.segment();
  call.keep = enc.keep_alive();
  call.words = std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder));
  Future<Value> f = send(call, std::nullopt);
  if (call.segment) Driver::get().pool().release(*call.segment, kSelfPeer);
  return f;
}

OutgoingCall WorkerProcess::encode_call(const std::string& method, const List& args) {
  SmallMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  ValueEncoder enc(Driver::get().pool());
  enc.plan(args);
  OutgoingCall call;
  call.call_id = Driver::get().next_call_id();
  call.method = method;
  auto c = env.initCall();
  c.setCallId(call.call_id);
  c.setMethod(method);
  enc.encode(args, c.initArgs(static_cast<unsigned>(args.size())));
  call.fds = enc.finish(env);
  call.segment = enc.segment();
  call.keep = enc.keep_alive();
  call.words = std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder));
  return call;
}

Future<Value> WorkerProcess::send(const OutgoingCall& call,
                                  std::optional<std::chrono::milliseconds> timeout) {
  const auto submitted = std::chrono::steady_clock::now();
  Promise<Value> promise;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!death_.empty()) {
      promise.fail(WorkerDiedError(refusal(info_.class_name, call.method, death_)));
      return promise.future();
    }
    pending_[call.call_id] = Pending{promise, call.method, next_seq_++};
    // Under mu_: a death declared after this point releases the hold.
    if (call.segment) Driver::get().pool().hold(*call.segment, peer_);
  }
  if (timeout) arm_timeout(call.call_id, submitted + *timeout, *timeout);
  flush_releases();
  // A message to a worker that has gone is dropped; its death fails the call.
  enqueue(call.words, call.fds, call.keep);
  return promise.future();
}

void WorkerProcess::enqueue(std::shared_ptr<const kj::Array<capnp::word>> words,
                            std::vector<int> fds, std::shared_ptr<void> keep) {
  if (channel_->send_or_queue({std::move(words), std::move(fds), std::move(keep)}) !=
      Channel::Queued::kNeedsFlusher) {
    return;
  }
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  asio::post(Driver::get().io(), [weak] {
    if (auto self = weak.lock()) self->wait_writable();
  });
}

void WorkerProcess::wait_writable() {
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  io_->socket.async_wait(asio::posix::stream_descriptor::wait_write,
                         [weak](const boost::system::error_code& ec) {
                           auto self = weak.lock();
                           if (!self || ec) return;
                           if (self->channel_->flush() == Channel::FlushStatus::kWouldBlock) {
                             self->wait_writable();
                           }
                         });
}

void WorkerProcess::arm_timeout(uint64_t call_id, std::chrono::steady_clock::time_point deadline,
                                std::chrono::milliseconds timeout) {
  std::weak_ptr<WorkerProcess> weak = weak_from_this();
  asio::post(Driver::get().io(), [weak, call_id, deadline, timeout] {
    auto self = weak.lock();
    if (!self) return;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (!self->pending_.count(call_id)) return;  // already done
    }
    auto timer = std::make_unique<asio::steady_timer>(Driver::get().io(), deadline);
    timer->async_wait([weak, call_id, timeout](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec) return;
      self->io_->timers.erase(call_id);
      std::string method;
      Promise<Value> promise;
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        auto it = self->pending_.find(call_id);
        if (it == self->pending_.end()) return;
        // Keep the entry: the late result is then recognised and dropped.
        method = it->second.method;
        promise = it->second.promise;
      }
      promise.fail(TimeoutError(self->info_.class_name + "." + method + " on rank " +
                                std::to_string(self->info_.rank) + " timed out after " +
                                std::to_string(timeout.count()) + " ms"));
    });
    self->io_->timers[call_id] = std::move(timer);
  });
}

void WorkerProcess::queue_release(SegmentId segment) {
  std::lock_guard<std::mutex> lock(release_mu_);
  releases_.push_back(segment);
}

void WorkerProcess::flush_releases() {
  std::vector<SegmentId> ids;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    if (releases_.empty()) return;
    ids.swap(releases_);
  }
  SmallMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  auto list = env.initReleased(static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) list.set(static_cast<unsigned>(i), ids[i]);
  env.setRelease();
  enqueue(std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder)));
}

void WorkerProcess::request_exit() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exit_requested_ = true;
  }
  SmallMessageBuilder builder;
  builder.initRoot<wire::Envelope>().setShutdown();
  enqueue(std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder)));
}

void WorkerProcess::kill(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exited_) return;
    if (kill_reason_.empty()) kill_reason_ = reason;
  }
  if (remote_) {
    remote_->kill();
  } else {
    ::kill(pid_, SIGKILL);
  }
  channel_->drop_queue();
  declare_dead("was stopped", " because " + reason);
}

bool WorkerProcess::wait_exit(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return exited_cv_.wait_for(lock, timeout, [&] { return exited_; });
}

}  // namespace baton
