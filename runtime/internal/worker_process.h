// WorkerProcess: the driver's handle on one worker process (internal).
// Spawns it, sends it calls, completes their futures from the I/O thread,
// forwards its stdout/stderr with a "[Class:rank]" prefix, and notices its
// death (the socket closes) to fail its pending calls with the exit status.
// A worker on this machine has its memory sampled every 250 ms
// (process_memory.h), so that an OOM kill reads "was killed: out of memory
// (RSS ... last seen ..., peak ...; ...)" rather than as a plain SIGKILL.
//
// Nothing here blocks on the worker: a message the worker's socket cannot
// take now waits in the channel's outgoing queue, which the I/O thread
// writes as the worker reads (a worker reads between methods only).
#pragma once

#include <sys/types.h>

#include <capnp/common.h>
#include <kj/array.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/future.h"
#include "runtime/internal/process_memory.h"
#include "runtime/internal/shm_pool.h"
#include "runtime/internal/wire.capnp.h"
#include "runtime/role_set.h"
#include "runtime/value.h"
#include "runtime/worker.h"

namespace baton {

class Channel;
class Cluster;
class RemoteWorker;

// `fd` moved above the numbers a child gets by dup2 (0..3), close-on-exec
// (dup2 onto itself would leave close-on-exec set).
int high_fd(int fd);
// The entries of this process's CUDA_VISIBLE_DEVICES (blanks and empty
// entries dropped); none when it is unset.
std::optional<std::vector<std::string>> visible_gpus();
// The CUDA_VISIBLE_DEVICES entry of GPU slot `slot`: the slot-th GPU this
// process may use (its own CUDA_VISIBLE_DEVICES, an index, UUID or MIG id
// each; all GPUs when unset), so that a driver restricted to "2,3" places
// slot 0 on GPU 2. Throws naming `whose` list when it has no such entry.
std::string gpu_of_slot(int slot, const char* whose = "the driver's");

// A message encoded once and sendable to several workers.
struct OutgoingCall {
  uint64_t call_id = 0;
  std::string method;
  std::shared_ptr<const kj::Array<capnp::word>> words;  // shared by the queues it waits in
  std::vector<int> fds;              // the segment's: open while a peer holds it
  std::optional<SegmentId> segment;  // held by kSelfPeer until the sender releases it
  std::shared_ptr<void> keep;        // shared tensors' memory behind some of `fds`
};

class WorkerProcess : public std::enable_shared_from_this<WorkerProcess> {
 public:
  // Called on the I/O thread once the worker has died, with its description
  // ("worker Adder rank 2 (pid 123) was killed by signal 9 (SIGKILL) during
  // Adder.add", naming the call it was running, or "... while idle"; "was
  // killed: out of memory (RSS ...)" for an OOM kill).
  using DeathHook = std::function<void(WorkerProcess&, const std::string& what)>;

  // Spawns the process: on this machine (from the I/O thread), or through
  // the node agent of `cluster` node info.node when a cluster is given.
  // Throws baton::Error on failure.
  static std::shared_ptr<WorkerProcess> spawn(WorkerInfo info, DeathHook on_death,
                                              std::shared_ptr<Cluster> cluster = nullptr);
  ~WorkerProcess();

  const WorkerInfo& info() const { return info_; }
  pid_t pid() const { return pid_; }
  bool alive() const;
  // "worker Adder rank 2 (pid 123)", "... (pid 123 on node 1 (gpu-b, 10.0.0.2))"
  std::string label() const;
  // The process's pid in profiles: stable within a run (the order in which
  // the driver started its workers, from 2; the driver is 1).
  int trace_pid() const { return static_cast<int>(peer_); }

  // Sends the Init message; the future completes when the constructors (one
  // per role) ran.
  Future<Value> init(const std::vector<RoleSpec>& roles);

  // Sends `call` (built by encode_call) and returns the future of its result.
  // Never blocks: what the socket does not take now is queued, in order. The
  // timeout counts from here. Fails at once (WorkerDiedError, "Class.method
  // refused: <how the worker died>") if the worker is dead or was killed.
  Future<Value> send(const OutgoingCall& call, std::optional<std::chrono::milliseconds> timeout);

  // Asks the worker to exit after its queued calls. Never blocks.
  void request_exit();
  // Kills the process. Its pending calls fail at once (WorkerDiedError with
  // `reason` as the cause), and so do later ones; what is queued is dropped.
  void kill(const std::string& reason);
  // Waits until the process has been reaped; false on timeout.
  bool wait_exit(std::chrono::milliseconds timeout);

  // Encodes a call message once, to be sent to any number of workers.
  static OutgoingCall encode_call(const std::string& method, const List& args);

 private:
  struct Pending {
    Promise<Value> promise;
    std::string method;
    uint64_t seq = 0;  // order of sending: the oldest pending call is the one running
  };
  WorkerProcess(WorkerInfo info, DeathHook on_death);

  // On the I/O thread: the driver's end of the worker's socket and the read
  // ends of its output pipes (all taken over), read from now on.
  void attach(int socket, int out, int err);
  void start_reading();
  void on_readable();
  void handle_message(wire::Envelope::Reader env, std::vector<int> fds);
  void start_log_pipe(int fd, bool is_stderr);
  void sample_memory();  // and again every kMemorySampleInterval until it is reaped
  void on_closed();
  void reap(int attempts_left);
  void reap_remote(int attempts_left, bool killed);
  void finish_death(int wait_status, bool have_status);
  void finish_lost(const std::string& why);  // its node agent is gone
  void finish(const std::string& how);
  // Marks the worker dead, "<label> <how> during <the running call><cause>"
  // (or "<label> <how> while idle<cause>"),
  // fails every pending call (the running one with that description, the
  // others as refused) and returns the description; "" if it already was.
  std::string declare_dead(const std::string& how, const std::string& cause);
  void queue_release(SegmentId segment);
  void flush_releases();
  void arm_timeout(uint64_t call_id, std::chrono::steady_clock::time_point deadline,
                   std::chrono::milliseconds timeout);
  // Sends or queues one message; starts the I/O thread's flushing if needed.
  void enqueue(std::shared_ptr<const kj::Array<capnp::word>> words, std::vector<int> fds = {},
               std::shared_ptr<void> keep = nullptr);
  void wait_writable();  // on the I/O thread

  WorkerInfo info_;
  DeathHook on_death_;
  PeerId peer_;
  pid_t pid_ = -1;
  std::shared_ptr<RemoteWorker> remote_;  // set when a node agent runs it
  // A local worker's memory until it is reaped; on the I/O thread only.
  std::optional<MemoryWatch> memory_;
  std::unique_ptr<Channel> channel_;
  ShmRegionCache regions_;  // the worker's segments
  struct Io;  // Asio objects, touched only on the I/O thread
  std::unique_ptr<Io> io_;

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Pending> pending_;
  uint64_t next_seq_ = 0;
  std::string death_;                  // set once the worker is gone or killed
  std::string kill_reason_;            // why the runtime killed it, if it did
  bool exit_requested_ = false;
  bool exited_ = false;
  std::condition_variable exited_cv_;

  std::mutex release_mu_;
  std::vector<SegmentId> releases_;  // worker segments the driver no longer maps
};

}  // namespace baton
