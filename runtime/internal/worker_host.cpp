#include "runtime/internal/worker_host.h"

#include <c10/util/Exception.h>
#if defined(BATON_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>

#include "base/errors.h"
#include "base/profiler.h"
#include "net/auth.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/crash_handler.h"
#include "runtime/internal/driver.h"
#include "runtime/internal/process_memory.h"
#include "runtime/internal/value_codec.h"
#include "runtime/method_table.h"
#include "runtime/role_set.h"
#include "runtime/threads.h"

namespace baton {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

WorkerInfo info_from_environment() {
  WorkerInfo info;
  info.class_name = env_str("BATON_CLASS");
  info.group_name = env_str("BATON_GROUP");
  info.rank = env_int("RANK", 0);
  info.world_size = env_int("WORLD_SIZE", 1);
  info.local_rank = env_int("LOCAL_RANK", 0);
  info.local_world_size = env_int("LOCAL_WORLD_SIZE", 1);
  info.node = env_int("BATON_NODE", 0);
  info.slot = env_int("BATON_SLOT", 0);
  info.use_gpu = env_int("BATON_USE_GPU", 0) != 0;
  info.device = info.use_gpu ? 0 : -1;
  info.intra_op_threads = env_int("BATON_THREADS", 1);
  info.master_addr = env_str("MASTER_ADDR");
  info.master_port = env_int("MASTER_PORT", 0);
  info.layout = ParallelLayout::data_parallel(info.world_size);
  if (const char* l = std::getenv("BATON_LAYOUT")) {
    std::sscanf(l, "%" SCNd64 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64, &info.layout.tp,
                &info.layout.cp, &info.layout.dp, &info.layout.pp);
  }
  info.coords = info.layout.coords(info.rank);
  // The cluster token is read once (auth::cluster_token caches it, or its
  // error) and leaves the environment, so that what the worker's methods
  // start does not inherit it.
  try {
    auth::cluster_token();
  } catch (const std::exception&) {
  }
  ::unsetenv("BATON_CLUSTER_TOKEN");
  return info;
}

// Makes the worker's GPU the current device before any role allocates:
// CUDA_VISIBLE_DEVICES holds just that GPU, so it is device 0 here
// (WorkerInfo::device). Throws, failing the group's start, when a GPU worker
// finds no device or the build has no CUDA.
void bind_device(const WorkerInfo& info) {
  if (!info.use_gpu) return;
  const std::string where = "rank " + std::to_string(info.rank) + " (GPU slot " +
                            std::to_string(info.slot) +
                            ", CUDA_VISIBLE_DEVICES=" + env_str("CUDA_VISIBLE_DEVICES") + ")";
#if defined(BATON_CUDA)
  if (c10::cuda::device_count() < 1)
    throw Error(where + ": CUDA sees no device (no driver, or a wrong GPU id)");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(info.device));
#else
  throw Error(where +
              ": this build has no CUDA (BATON_CUDA is off); a GPU pool needs a build "
              "against a CUDA LibTorch");
#endif
}

[[noreturn]] void quit(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  // Skip static destructors: LibTorch's thread pools may not survive them.
  _exit(status);
}

// A failed host allocation (std::bad_alloc; LibTorch's CPU allocator throws
// a plain c10::Error) is reported as out of memory with the worker's RSS and
// address-space limit. A device's (c10::OutOfMemoryError: "CUDA out of
// memory. Tried to allocate ...") says so itself.
std::string error_text(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return out_of_memory_text(e.what());
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    std::string text = c->what_without_backtrace();
    const bool host_allocation = dynamic_cast<const c10::OutOfMemoryError*>(&e) == nullptr &&
                                 text.find("DefaultCPUAllocator: ") != std::string::npos &&
                                 (text.find("can't allocate memory") != std::string::npos ||
                                  text.find("not enough memory") != std::string::npos);
    return host_allocation ? out_of_memory_text(text) : text;
  }
  return e.what();
}

class Host {
 public:
  explicit Host(int fd) : channel_(fd), info_(info_from_environment()) {}

  [[noreturn]] void run() {
    for (;;) {
      const Channel::ReadStatus status = channel_.read_blocking();
      read_ns_ = profiler::enabled() ? profiler::now_ns() : 0;
      if (status == Channel::ReadStatus::kClosed) {
        // Drain what arrived before the close, then go: the driver is gone.
        drain();
        quit(0);
      }
      drain();
    }
  }

 private:
  void drain() {
    channel_.drain([this](wire::Envelope::Reader env, std::vector<int> received) {
      OwnedFds fds(std::move(received));  // closed if a malformed message throws first
      for (SegmentId id : env.getReleased()) pool_.release(id, kDriverPeer);
      switch (env.which()) {
        case wire::Envelope::INIT: on_init(env, fds.take()); break;
        case wire::Envelope::CALL: on_call(env, fds.take()); break;
        case wire::Envelope::SHUTDOWN: quit(0);
        default: break;
      }
    });
  }

  std::function<void(SegmentId)> release_sink() {
    return [this](SegmentId id) {
      std::lock_guard<std::mutex> lock(release_mu_);
      releases_.push_back(id);
    };
  }

  void on_init(wire::Envelope::Reader env, std::vector<int> fds) {
    std::string error;
    try {
      ValueDecoder decoder(std::move(fds), env.getSharedBytes(), regions_, release_sink());
      std::vector<RoleSpec> roles;
      for (auto r : env.getInit().getRoles()) {
        roles.push_back(
            {r.getRole().cStr(), r.getClassName().cStr(), decoder.decode(r.getInitArgs())});
      }
      roles_ = std::make_unique<RoleSet>(roles);
      bind_device(info_);
      // Every role of a colocated process gets the same WorkerInfo.
      for (size_t i = 0; i < roles.size(); ++i) {
        detail::set_pending_worker_info(info_);
        try {
          workers_.push_back(roles_->spec(i).factory(roles[i].init_args));
        } catch (const std::exception& e) {
          if (!roles_->colocated()) throw;
          throw Error("role '" + roles[i].role + "' (" + roles[i].class_name +
                      "): " + error_text(e));
        }
      }
    } catch (const std::exception& e) {
      error = error_text(e);
    } catch (...) {
      error = "unknown exception";
    }
    if (error.empty()) {
      reply(0, Value(), nullptr);
    } else {
      workers_.clear();
      reply(0, Value(), &error, wire::ErrorKind::INIT_FAILED);
    }
  }

  // When the call is traced (profiling on, and not one of the profiler's own
  // calls): the worker's spans of one call, on its main thread. The parent
  // span is named for the method; its children are queue (from the read of
  // the call's message, or the end of the call before it, to its start),
  // decode, execute and encode result. They end as the result is handed to
  // the socket: the driver may read it before the write returns here, and
  // the worker's spans of a call must lie within the driver's.
  struct CallSpans {
    bool on = false;
    int64_t queued = 0, decode = 0, execute = 0, executed = 0, encoded = 0;
  };

  void on_call(wire::Envelope::Reader env, std::vector<int> received) {
    OwnedFds fds(std::move(received));  // until the decoder takes them
    auto call = env.getCall();
    uint64_t id = call.getCallId();
    Value result;
    std::string error;
    wire::ErrorKind kind = wire::ErrorKind::EXCEPTION;
    CallSpans spans;
    spans.on = profiler::enabled();
    if (spans.on) {
      spans.decode = profiler::now_ns();
      spans.queued = std::min(spans.decode, std::max(read_ns_ > 0 ? read_ns_ : spans.decode,
                                                     last_call_end_ns_));
    }
    {
      ValueDecoder decoder(fds.take(), env.getSharedBytes(), regions_, release_sink());
      try {
        if (workers_.empty()) throw CallError("the worker was not constructed");
        RoleSet::Target t = roles_->find(call.getMethod().cStr());
        if (t.method->name.rfind("_profiler_", 0) == 0) spans.on = false;
        List args = decoder.decode(call.getArgs());
        t.method->check_args(roles_->qualified(t), args);
        if (spans.on) spans.execute = profiler::now_ns();
        result = t.method->invoke(*workers_[t.role], args);
      } catch (const CallError& e) {
        error = e.what();
        kind = wire::ErrorKind::BAD_CALL;
      } catch (const std::exception& e) {
        error = error_text(e);
      } catch (...) {
        error = "unknown exception";
      }
    }  // the arguments' shared memory is released here unless the method kept it
    if (spans.on) {
      spans.executed = profiler::now_ns();
      if (spans.execute == 0) spans.execute = spans.executed;  // failed before it ran
    }
    reply(id, result, error.empty() ? nullptr : &error, kind, spans.on ? &spans : nullptr);
    if (spans.on) record_call(id, call.getMethod().cStr(), spans, error.empty());
  }

  void record_call(uint64_t id, const std::string& method, const CallSpans& s, bool ok) {
    last_call_end_ns_ = profiler::now_ns();
    const std::string args = profiler::Args()
                                 .add("call_id", static_cast<int64_t>(id))
                                 .add("method", method)
                                 .add("rank", info_.rank)
                                 .add("ok", ok ? 1 : 0)
                                 .take();
    auto span = [&](std::string name, int64_t begin, int64_t end, std::string a) {
      profiler::record({std::move(name), "worker", begin, end, 0, std::move(a)});
    };
    span(method, s.queued, s.encoded, args);
    span("queue", s.queued, s.decode, {});
    span("decode", s.decode, s.execute, {});
    span("execute", s.execute, s.executed, args);
    span("encode result", s.executed, s.encoded, {});
  }

  void reply(uint64_t id, const Value& value, const std::string* error,
             wire::ErrorKind kind = wire::ErrorKind::EXCEPTION, CallSpans* spans = nullptr) {
    SmallMessageBuilder builder;
    auto env = builder.initRoot<wire::Envelope>();
    {
      std::lock_guard<std::mutex> lock(release_mu_);
      auto list = env.initReleased(static_cast<unsigned>(releases_.size()));
      for (size_t i = 0; i < releases_.size(); ++i) list.set(static_cast<unsigned>(i), releases_[i]);
      releases_.clear();
    }
    auto result = env.initResult();
    result.setCallId(id);
    ValueEncoder enc(pool_);
    std::vector<int> fds;
    if (error == nullptr) {
      try {
        enc.plan(value);
        enc.encode(value, result.initValue());
        fds = enc.finish(env);
      } catch (const std::exception& e) {
        auto err = result.initError();
        err.setKind(wire::ErrorKind::EXCEPTION);
        err.setMessage(std::string("cannot send the result: ") + error_text(e));
      }
    } else {
      auto err = result.initError();
      err.setKind(kind);
      err.setMessage(*error);
    }
    if (auto seg = enc.segment()) pool_.hold(*seg, kDriverPeer);
    auto words = capnp::messageToFlatArray(builder);
    if (spans != nullptr) spans->encoded = profiler::now_ns();
    bool sent = channel_.send(words.asPtr(), fds);
    if (auto seg = enc.segment()) pool_.release(*seg, kSelfPeer);
    if (!sent) quit(0);  // the driver is gone
  }

  Channel channel_;
  WorkerInfo info_;
  ShmPool pool_;
  ShmRegionCache regions_;  // the driver's segments
  std::unique_ptr<RoleSet> roles_;
  std::vector<std::unique_ptr<Worker>> workers_;  // one per role
  std::mutex release_mu_;
  std::vector<SegmentId> releases_;  // driver segments this worker is done with
  // For the calls' queue spans (only while profiling): when the last read
  // from the driver returned, and when the last traced call was sent back.
  int64_t read_ns_ = 0;
  int64_t last_call_end_ns_ = 0;
};

}  // namespace

void run_worker_host(int fd) {
  // Die with the driver, even if it is killed. The check after prctl closes
  // the window in which the driver died before the signal was armed.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != env_int("BATON_DRIVER_PID", -1)) quit(70);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  install_crash_handler(env_str("BATON_CLASS") + ":" + env_str("RANK"));
  set_intra_op_threads(env_int("BATON_THREADS", 1));
  profiler::set_thread_name("main");
  Host host(fd);
  host.run();
}

}  // namespace baton
