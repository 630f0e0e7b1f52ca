// WorkerGroup: N worker processes, spawned on a ResourcePool, each hosting one
// worker class (spawn) or several colocated roles (spawn_colocated), and the
// calls made on them.
//
// Every call returns a Future immediately; nothing blocks unless the caller
// waits, not even a worker that is busy in a long method or hung (a worker
// reads its calls between methods): what its socket does not take waits in
// that worker's outgoing queue, which the driver's I/O thread writes as the
// worker reads. Calls on one group are sent, and run on each worker, in
// submission order, including calls that wait for future arguments (see
// call()).
//
// Failure policy (fail-stop): if any worker of a group dies, the runtime kills
// the rest of the group. Pending calls on every worker of the group fail at
// once with WorkerDiedError, and so do later calls. The call the dead worker
// was running gets "worker C rank 1 (pid 7) was killed by signal 9 (SIGKILL)
// during C.step"; calls behind it, and later ones, "C.other refused: <that>";
// the other workers' calls name their group's failure. Recovery means
// spawning a new group (and loading a checkpoint).
//
// Thread safety: calls may be made from any thread.
//
// Example:
//   auto group = baton::WorkerGroup::spawn("Adder", pool, {10});
//   baton::Value sums = group.call("add", {5}).get();   // ONE_TO_ALL: a list, one per rank
//   auto first = group.call_rank(0, "add", {1}).get().as<int64_t>();
//
//   // Colocated roles: one process per slot hosts an ActorWorker and a RefWorker.
//   auto ar = baton::WorkerGroup::spawn_colocated(
//       {{"actor", "ActorWorker", {cfg}}, {"ref", "RefWorker", {cfg}}}, pool);
//   ar.call("actor_compute_log_prob", {batch});       // prefixed name, or
//   ar.role("ref").call("compute_ref_log_prob", {batch});  // a role's own name
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/parallel_layout.h"
#include "base/profiler.h"
#include "runtime/call_args.h"
#include "runtime/future.h"
#include "runtime/method_table.h"
#include "runtime/resource_pool.h"
#include "runtime/role_set.h"
#include "runtime/value.h"

namespace baton {

struct CallOptions {
  // The future fails with TimeoutError if no result arrives in time, counted
  // from the call (for a call that waits for future arguments, from when it
  // is handed to its workers: see WorkerGroup::call), time spent queued
  // behind a busy worker included. The worker is not interrupted: the call
  // is still sent, and the worker finishes it and runs later calls.
  std::optional<std::chrono::milliseconds> timeout;

  CallOptions& set_timeout_ms(int64_t ms) {
    timeout = std::chrono::milliseconds(ms);
    return *this;
  }
};

// A mesh as the driver sees it: per rank, its data-parallel chunk and
// whether its result is collected.
struct MeshInfo {
  std::vector<int> dp_rank;
  std::vector<bool> collect;
  int dp_size = 0;  // max dp_rank + 1
};

struct WorkerGroupOptions {
  std::string name;  // default: the class name plus a counter
  std::chrono::milliseconds start_timeout = std::chrono::seconds(120);
  // The tp x cp x dp x pp grid of the ranks; its size must be the pool's.
  // Default: every rank data parallel.
  std::optional<ParallelLayout> layout;
  // How long the destructor (and move-assignment over a group) lets workers
  // finish the calls already made before it kills them. A group destroyed
  // with a call still running (say, returning from main without waiting for
  // it) therefore takes up to this long. Groups still alive when the process
  // exits (static or leaked ones) get 1 s. See shutdown().
  std::chrono::milliseconds shutdown_grace = std::chrono::seconds(10);

  WorkerGroupOptions& set_layout(ParallelLayout l) {
    layout = l;
    return *this;
  }
  WorkerGroupOptions& set_name(std::string n) {
    name = std::move(n);
    return *this;
  }
  WorkerGroupOptions& set_shutdown_grace(std::chrono::milliseconds grace) {
    shutdown_grace = grace;
    return *this;
  }
};

class WorkerGroup {
 public:
  // Starts one worker per slot of `pool` and constructs `class_name` in each
  // with `init_args`. Blocks until every worker is constructed. Throws
  // CallError for an unregistered class, Error if a worker fails to start or
  // its constructor throws (the message names the rank and the reason).
  static WorkerGroup spawn(const std::string& class_name, ResourcePool& pool, List init_args = {},
                           WorkerGroupOptions options = {});

  // As spawn, but each worker process hosts one instance of every role's
  // class, constructed in the order given, each with its own init arguments
  // and all with the same WorkerInfo (rank, layout, device slot). Methods are
  // reached as "<role>_<method>" on this group, or by their own names through
  // role(). Each role keeps its own mesh registrations. Throws CallError for
  // no roles, a repeated or malformed role name, an unregistered class (naming
  // the role), or two roles whose prefixed method names collide; Error naming
  // the rank and the role if a constructor throws.
  static WorkerGroup spawn_colocated(std::vector<RoleSpec> roles, ResourcePool& pool,
                                     WorkerGroupOptions options = {});

  WorkerGroup(WorkerGroup&&) noexcept;
  WorkerGroup& operator=(WorkerGroup&&) noexcept;
  // Shuts the group down, unless this is a role view: shutdown(grace) with
  // WorkerGroupOptions::shutdown_grace (10 s unless set), so it blocks while
  // a call already made is still running, up to that grace.
  ~WorkerGroup();

  // A view of one role of a colocated group: the same processes, the role's
  // methods by their own names, the role's meshes, its registered dispatch
  // modes. Destroying a view leaves the group running; the view must not
  // outlive the use of the group (calls on it fail once the group is shut
  // down). Throws CallError naming the roles there are for an unknown role,
  // or if this group is not colocated or is already a view.
  WorkerGroup role(const std::string& role) const;
  // The roles of a colocated group, in spawn order; empty for a plain group.
  std::vector<std::string> roles() const;

  int world_size() const;
  // The class of a plain group; "ActorWorker+RefWorker" for a colocated one;
  // the role's class for a role view.
  const std::string& class_name() const;
  const std::string& name() const;
  const ParallelLayout& layout() const;
  // Each worker's registration of `mesh` (for a role view: the role's), asked
  // for once and then cached. Blocks on the first call. Throws Error naming
  // the mesh and the rank if a worker never registered it; CallError on a
  // colocated group itself (meshes belong to roles: use role(name).mesh()).
  MeshInfo mesh(const std::string& mesh) const;
  std::vector<pid_t> pids() const;
  // False once any worker has died or the group was shut down.
  bool alive() const;

  // Calls `method` the way it was registered (dispatch and execute mode).
  // ONE_TO_ALL and ALL_TO_ALL with execute ALL give a list with one result per
  // rank; execute RANK_ZERO gives rank 0's result. Throws CallError at once for
  // an unknown method, and, when no argument is a future, for arguments that
  // do not fit its signature or mode.
  //
  // If the method raises on some ranks, the future fails with one RemoteError
  // once every rank has answered (or 1 s after the first raised): "C.m failed
  // on rank 0, 1, 3 (3 of 4 ranks): rank 0, 1: <message>; rank 3: <other>",
  // its rank() and remote_message() those of the lowest rank. A worker's
  // death or a timeout fails the call at once.
  //
  // Future arguments (CallArgs): the call returns at once and is sent when
  // every future argument has completed; the group's later calls are sent
  // after it, so submission order holds. The runtime, not the user's thread,
  // waits: the driver's dispatch thread then plans the call with the futures'
  // values and sends it. The data does pass through the driver process: a
  // DataProto result of another group was concatenated in the driver when
  // that call was collected, and each chunk of it is copied once more into
  // the driver's shared memory for the receiving workers (the same two
  // copies as get() followed by call(), minus the user's thread). A failed
  // future fails this call with UpstreamError (naming this call, carrying the
  // failed call's message, the original nested); errors of the dispatch
  // (wrong types, sizes) fail the returned future instead of being thrown.
  // Either way nothing is sent. A per-call timeout counts from when the call
  // is handed to the workers: at once, or once its future arguments (and the
  // group's earlier such calls) have completed.
  Future<Value> call(const std::string& method, CallArgs args = {}, CallOptions options = {});

  // Lower-level calls that ignore the registered modes (futures as in call()).
  Future<List> call_all(const std::string& method, CallArgs args = {}, CallOptions options = {});
  Future<Value> call_rank(int rank, const std::string& method, CallArgs args = {},
                          CallOptions options = {});
  // per_rank_args[r] goes to rank r; its size must equal world_size().
  Future<List> call_per_rank(const std::string& method, std::vector<List> per_rank_args,
                             CallOptions options = {});

  // Profiling (base/profiler.h). While the driver's recording is on
  // (profiler::set_enabled), each call on the group records its driver-side
  // spans on the driver's "calls <group>" track. set_profiling turns recording
  // on or off in every worker process of the group (of every role, for a
  // colocated one), in submission order with the group's calls; blocks until
  // every worker has. Throws as a failed call does.
  void set_profiling(bool on);
  // Takes the events every worker process of the group recorded, each
  // process's part of a Chrome trace (profiler::chrome_trace): trace pid the
  // process's stable id, name "<class>:rank <r>", times in microseconds since
  // `origin_ns` of the driver's clock. Each worker's clock offset is estimated
  // first from a few round trips (profiler::estimate_clock_offset) and its
  // events shifted by it, unless it shares the driver's clock. Blocks; meant
  // for an idle group (a round trip that waits behind a method only makes the
  // estimate less certain). Throws as a failed call does.
  std::vector<profiler::ProcessProfile> collect_profile(int64_t origin_ns);

  // Asks every worker to exit after the calls already sent, waits for them
  // (killing any still alive after `grace`, a stopped or hung one included;
  // their unfinished calls then fail with WorkerDiedError), and fails nothing
  // that has already completed. Calls still waiting for future arguments fail
  // with CallError. On a role view, shuts down the whole group. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(10));

  struct State;  // internal

 private:
  WorkerGroup(std::shared_ptr<State> s, int role, bool owner);
  static WorkerGroup spawn_roles(std::vector<RoleSpec> roles, ResourcePool& pool,
                                 WorkerGroupOptions options);
  RoleSet::Target target(const std::string& method) const;

  std::shared_ptr<State> s_;
  int role_ = -1;      // a role view: the role's index
  bool owner_ = true;  // false for views: they never shut the group down
};

}  // namespace baton
