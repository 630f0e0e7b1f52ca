// LocalWorld: run one program as N cooperating processes on this machine, for
// tools and benchmarks that shard a model without the actor runtime (the
// runtime's worker groups do this for real jobs). The parent re-executes its
// own executable N times with the same arguments; each child learns its rank
// and gets a c10d FileStore shared by all, from which ParallelState builds
// the groups.
//
// Example:
//   int main(int argc, char** argv) {
//     auto me = baton::engine::local_world_rank();
//     if (!me && world > 1) return baton::engine::launch_local_world(argc, argv, world);
//     auto ps = me ? ParallelState::create(me->store, me->rank, pc) : ParallelState::single();
//     ...
//   }
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace baton::engine {

struct LocalRank {
  int64_t rank = 0;
  int64_t world_size = 1;
  c10::intrusive_ptr<c10d::Store> store;
};

// In a child started by launch_local_world: its rank and the shared store
// (intra-op threads are already set to cores / world). In any other process:
// nullopt.
std::optional<LocalRank> local_world_rank();

// Starts `world_size` copies of this executable with `argv`, waits for all of
// them, and returns 0 when every one exited 0. When one fails (non-zero exit,
// signal) or `timeout` passes, the others are killed and the first failure's
// status is printed to stderr; returns 1. Children inherit stdout/stderr.
int launch_local_world(int argc, char** argv, int64_t world_size,
                       std::chrono::seconds timeout = std::chrono::seconds(600));

}  // namespace baton::engine
