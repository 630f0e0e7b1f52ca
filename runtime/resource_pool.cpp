#include "runtime/resource_pool.h"

#include <mutex>
#include <numeric>
#include <string>

#include "base/errors.h"

namespace baton {

struct ResourcePool::State {
  ResourcePoolOptions options;
  std::mutex mu;
  int groups = 0;
};

ResourcePool::ResourcePool(ResourcePoolOptions options) : s_(std::make_shared<State>()) {
  if (options.processes_on_nodes.empty()) throw Error("ResourcePool: no nodes given");
  for (size_t i = 0; i < options.processes_on_nodes.size(); ++i) {
    if (options.processes_on_nodes[i] <= 0) {
      throw Error("ResourcePool: node " + std::to_string(i) + " has " +
                  std::to_string(options.processes_on_nodes[i]) + " processes; need at least 1");
    }
  }
  if (options.processes_on_nodes.size() > 1 && !options.cluster) {
    throw Error("ResourcePool: " + std::to_string(options.processes_on_nodes.size()) +
                " nodes requested without a cluster: workers beyond this machine need node "
                "agents (ResourcePool::from_cluster, runtime/cluster/cluster.h)");
  }
  if (options.cluster &&
      static_cast<int>(options.processes_on_nodes.size()) > options.cluster->size()) {
    throw Error("ResourcePool: " + std::to_string(options.processes_on_nodes.size()) +
                " nodes requested, the cluster has " + std::to_string(options.cluster->size()));
  }
  if (options.max_colocate_count < 1) throw Error("ResourcePool: max_colocate_count must be >= 1");
  s_->options = std::move(options);
}

ResourcePool ResourcePool::cpu(int n) {
  return ResourcePool(ResourcePoolOptions().set_processes_on_nodes({n}));
}

ResourcePool ResourcePool::from_cluster(std::shared_ptr<Cluster> cluster, int per_node,
                                        bool use_gpu) {
  if (!cluster) throw Error("ResourcePool::from_cluster: no cluster given");
  cluster->wait_for_nodes();
  ResourcePoolOptions o;
  o.processes_on_nodes.clear();
  for (const NodeInfo& n : cluster->nodes()) {
    const int slots = per_node > 0 ? per_node : (use_gpu ? n.gpus : n.cpu_slots);
    if (slots < 1)
      throw Error("ResourcePool::from_cluster: " + n.describe() + " has no " +
                  (use_gpu ? "GPU" : "core") + " to place a worker on");
    o.processes_on_nodes.push_back(slots);
  }
  o.use_gpu = use_gpu;
  o.cluster = std::move(cluster);
  return ResourcePool(std::move(o));
}

int ResourcePool::node_cores(int node) const {
  if (s_->options.cluster) {
    for (const NodeInfo& n : s_->options.cluster->nodes())
      if (n.index == node) return n.cpu_slots;
  }
  return usable_cores();
}

int ResourcePool::world_size() const {
  const auto& n = s_->options.processes_on_nodes;
  return std::accumulate(n.begin(), n.end(), 0);
}

const ResourcePoolOptions& ResourcePool::options() const { return s_->options; }

std::vector<Placement> ResourcePool::placements() const {
  std::vector<Placement> out;
  int rank = 0;
  const auto& nodes = s_->options.processes_on_nodes;
  for (int node = 0; node < static_cast<int>(nodes.size()); ++node) {
    for (int local = 0; local < nodes[node]; ++local) {
      out.push_back(Placement{rank++, node, local, nodes[node]});
    }
  }
  return out;
}

void ResourcePool::claim() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->groups >= s_->options.max_colocate_count) {
    throw Error("ResourcePool: already used by " + std::to_string(s_->groups) +
                " group(s), its max_colocate_count; raise it to colocate more groups");
  }
  ++s_->groups;
}

void ResourcePool::release() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (s_->groups > 0) --s_->groups;
}

}  // namespace baton
