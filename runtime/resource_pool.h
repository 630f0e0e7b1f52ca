// ResourcePool: the device slots worker groups are placed on.
//
// Example:
//   baton::ResourcePool pool(baton::ResourcePoolOptions().set_processes_on_nodes({4}));
//   auto group = baton::WorkerGroup::spawn<MyWorker>(pool);
//
// A pool is a shared handle: copies refer to the same slots. Each slot can be
// shared by at most `max_colocate_count` groups (e.g. actor and critic placed
// on the same GPUs); spawning one more group fails.
#pragma once

#include <memory>
#include <vector>

#include "runtime/threads.h"

namespace baton {

struct ResourcePoolOptions {
  std::vector<int> processes_on_nodes = {1};  // workers per node; one entry per node
  bool use_gpu = false;                        // one GPU per worker (CUDA_VISIBLE_DEVICES)
  int max_colocate_count = 1;                  // groups that may share a slot
  // LibTorch intra-op threads of each worker; 0: usable_cores() / workers on
  // the node (at least 1). See runtime/threads.h for the rule.
  int intra_op_threads = 0;
  // How the workers' OpenMP threads wait between parallel regions.
  WaitPolicy wait_policy = WaitPolicy::kPassive;

  ResourcePoolOptions& set_processes_on_nodes(std::vector<int> n) {
    processes_on_nodes = std::move(n);
    return *this;
  }
  ResourcePoolOptions& set_use_gpu(bool on) {
    use_gpu = on;
    return *this;
  }
  ResourcePoolOptions& set_max_colocate_count(int count) {
    max_colocate_count = count;
    return *this;
  }
  ResourcePoolOptions& set_intra_op_threads(int n) {
    intra_op_threads = n;
    return *this;
  }
  ResourcePoolOptions& set_wait_policy(WaitPolicy policy) {
    wait_policy = policy;
    return *this;
  }
};

struct Placement {
  int rank;
  int node;
  int local_rank;
  int local_world_size;
};

class ResourcePool {
 public:
  // Throws baton::Error for empty or non-positive sizes. Only one node is
  // supported until node agents exist; more is an error that says so.
  explicit ResourcePool(ResourcePoolOptions options);
  // `n` CPU workers on this node.
  static ResourcePool cpu(int n);

  int world_size() const;
  const ResourcePoolOptions& options() const;
  std::vector<Placement> placements() const;

  // Claims one colocation share of every slot; throws baton::Error when
  // max_colocate_count groups already use the pool. release() returns it.
  void claim();
  void release();

 private:
  struct State;
  std::shared_ptr<State> s_;
};

}  // namespace baton
