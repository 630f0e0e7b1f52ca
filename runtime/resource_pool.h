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

#include "runtime/cluster/cluster.h"

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
  // The node agents that run the workers (runtime/cluster/cluster.h): node i of
  // processes_on_nodes is the cluster's node i. Null: every worker runs on
  // this machine, and only one node may be given.
  std::shared_ptr<Cluster> cluster;

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
  ResourcePoolOptions& set_cluster(std::shared_ptr<Cluster> c) {
    cluster = std::move(c);
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
  // Throws baton::Error for empty or non-positive sizes, and for more than
  // one node without a cluster or more nodes than the cluster has.
  explicit ResourcePool(ResourcePoolOptions options);
  // `n` CPU workers on this node.
  static ResourcePool cpu(int n);
  // `per_node` workers on every node of `cluster` (0: as many as each node
  // has slots: its GPUs with `use_gpu`, else its cores). Waits for the
  // cluster's nodes first (Cluster::wait_for_nodes).
  static ResourcePool from_cluster(std::shared_ptr<Cluster> cluster, int per_node = 0,
                                   bool use_gpu = false);

  int world_size() const;
  const ResourcePoolOptions& options() const;
  std::vector<Placement> placements() const;
  // The usable cores of `node` (this machine's without a cluster).
  int node_cores(int node) const;

  // Claims one colocation share of every slot; throws baton::Error when
  // max_colocate_count groups already use the pool. release() returns it.
  void claim();
  void release();

 private:
  struct State;
  std::shared_ptr<State> s_;
};

}  // namespace baton
