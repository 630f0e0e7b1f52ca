// WorkerGroup: N worker processes of one class, spawned on a ResourcePool,
// and the calls made on them.
//
// Every call returns a Future immediately; nothing blocks unless the caller
// waits. Calls on one worker run in submission order.
//
// Failure policy (fail-stop): if any worker of a group dies, the runtime kills
// the rest of the group. Pending and later calls on the group fail with
// WorkerDiedError naming the worker that died and its exit status. Recovery
// means spawning a new group (and loading a checkpoint).
//
// Example:
//   auto group = baton::WorkerGroup::spawn<Adder>(pool, {10});
//   baton::Value sums = group.call("add", {5}).get();   // ONE_TO_ALL: a list, one per rank
//   auto first = group.call_rank(0, "add", {1}).get().as<int64_t>();
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/future.h"
#include "runtime/method_table.h"
#include "runtime/parallel_layout.h"
#include "runtime/resource_pool.h"
#include "runtime/value.h"

namespace baton {

struct CallOptions {
  // The future fails with TimeoutError if no result arrives in time. The
  // worker is not interrupted: it finishes the method and runs later calls.
  std::optional<std::chrono::milliseconds> timeout;

  CallOptions& timeout_ms(int64_t ms) {
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

  WorkerGroupOptions& set_layout(ParallelLayout l) {
    layout = l;
    return *this;
  }
  WorkerGroupOptions& set_name(std::string n) {
    name = std::move(n);
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

  WorkerGroup(WorkerGroup&&) noexcept;
  WorkerGroup& operator=(WorkerGroup&&) noexcept;
  // Shuts the group down (see shutdown()).
  ~WorkerGroup();

  int world_size() const;
  const std::string& class_name() const;
  const std::string& name() const;
  const ParallelLayout& layout() const;
  // Each worker's registration of `mesh`, asked for once and then cached.
  // Blocks on the first call. Throws Error naming the mesh and the rank if a
  // worker never registered it.
  MeshInfo mesh(const std::string& mesh) const;
  std::vector<pid_t> pids() const;
  // False once any worker has died or the group was shut down.
  bool alive() const;

  // Calls `method` the way it was registered (dispatch and execute mode).
  // ONE_TO_ALL and ALL_TO_ALL with execute ALL give a list with one result per
  // rank; execute RANK_ZERO gives rank 0's result. Throws CallError at once for
  // an unknown method or arguments that do not fit its signature or mode.
  Future<Value> call(const std::string& method, List args = {}, CallOptions options = {});

  // Lower-level calls that ignore the registered modes.
  Future<List> call_all(const std::string& method, List args = {}, CallOptions options = {});
  Future<Value> call_rank(int rank, const std::string& method, List args = {},
                          CallOptions options = {});
  // per_rank_args[r] goes to rank r; its size must equal world_size().
  Future<List> call_per_rank(const std::string& method, std::vector<List> per_rank_args,
                             CallOptions options = {});

  // Asks every worker to exit after the calls already submitted, waits for
  // them (killing any still alive after `grace`), and fails nothing that has
  // already completed. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(10));

  struct State;  // internal

 private:
  explicit WorkerGroup(std::shared_ptr<State> s);
  std::shared_ptr<State> s_;
};

}  // namespace baton
