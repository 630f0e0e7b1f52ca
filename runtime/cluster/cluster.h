// Cluster: the machines beyond the driver's own, each served by a node agent.
//
// On every node, whatever the cluster already uses to start processes (srun
// in an sbatch script, a Kubernetes pod, ssh) starts `baton-agent --driver
// HOST:PORT`. The agent connects to the driver, proves it holds the cluster
// token (net/auth.h; TLS too when configured, net/tls.h), reports its
// slots, and from then on starts, supervises and kills the driver's workers on
// its node, forwards their output and reports their exit statuses. A
// ResourcePool with a cluster places its workers on the agents' nodes
// (ResourcePool::from_cluster), and WorkerGroup::spawn then works as on one
// machine: the workers' messages and tensors are relayed over TCP
// (runtime/cluster/relay.h), and their c10d groups meet at the driver's rendezvous
// store, which then listens on the cluster's address.
//
// Example (the driver; see examples/slurm/ for the agents' side):
//   baton::ClusterOptions o;
//   o.listen = "0.0.0.0:29400";
//   o.nodes = 2;
//   auto cluster = baton::Cluster::listen(o);
//   cluster->wait_for_nodes();           // both agents have connected
//   baton::ResourcePool pool = baton::ResourcePool::from_cluster(cluster, 2);
//   auto group = baton::WorkerGroup::spawn<MyWorker>(pool);
//
// Every node runs the driver's own executable, at the same path (a shared
// file system, or the same image). The cluster token must be configured
// (BATON_CLUSTER_TOKEN or BATON_CLUSTER_TOKEN_FILE) on the driver and on every
// agent: a random per-driver token cannot reach another machine.
//
// An agent that disconnects (killed, its node gone) fails every worker it ran
// with a message naming the node; an agent kills its workers when the driver
// goes, so nothing is left behind on any node. A new agent may take a lost
// node's place (the same --node-rank, or none): wait_for_nodes() counts it, so
// a trainer with trainer.max_restarts resumes on it.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace baton {

namespace tls {
class Context;
}  // namespace tls

struct ClusterOptions {
  // Where the driver listens for agents, "host:port". A port of 0 picks a free
  // one (tests); agents need to know it, so a job names one.
  std::string listen = "127.0.0.1:0";
  // The agents wait_for_nodes() waits for; more are refused.
  int nodes = 1;
  // How long wait_for_nodes() waits for them.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(5)};
  // How long an agent may take to start a worker.
  std::chrono::milliseconds spawn_timeout{std::chrono::seconds(30)};
  // The shared secret; empty: auth::cluster_token(), which must be configured.
  std::string token;
  // TLS (net/tls.h): this server context when set, else the environment's.
  std::shared_ptr<tls::Context> tls;
};

// What an agent reported about its node.
struct NodeInfo {
  int index = 0;               // the node's place in the cluster (ResourcePool's node)
  std::string hostname;        // as the agent's machine calls itself
  std::string address;         // the agent's address as the driver sees it
  std::string driver_address;  // the driver's address as the agent reached it
  int cpu_slots = 1;           // usable cores
  int gpus = 0;                // GPUs the agent may hand out
  int agent_pid = 0;
  // "node 1 (gpu-b, 10.0.0.2)"
  std::string describe() const;
};

// A worker started by an agent, as the driver's WorkerProcess sees it
// (internal).
class RemoteWorker {
 public:
  virtual ~RemoteWorker() = default;
  virtual pid_t pid() const = 0;
  virtual const NodeInfo& node() const = 0;
  // Asks the agent to SIGKILL the worker. Never blocks on the network for long.
  virtual void kill() = 0;
  enum class State { kRunning, kExited, kLost };
  // kExited: `wait_status` is its status; kLost: the agent is gone, `why` says so.
  virtual State state(int* wait_status, std::string* why) const = 0;
};

class Cluster {
 public:
  // Listens at once. Throws baton::Error when the address cannot be used or
  // no cluster token is configured.
  static std::shared_ptr<Cluster> listen(ClusterOptions options);
  // Tells every agent to stop its workers and exit, and stops listening.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  uint16_t port() const;
  // The host part of `listen`: where the workers' rendezvous store listens too.
  const std::string& bind_host() const;

  // Waits until options.nodes agents have connected. Throws baton::Error
  // naming the listen address and the nodes that did come when the wait times
  // out.
  void wait_for_nodes();
  // The connected nodes, by index (complete once wait_for_nodes returned).
  std::vector<NodeInfo> nodes() const;
  int size() const;

  // Starts a worker on `node` (internal: WorkerProcess). `relay_fd` is the
  // worker's end of the driver's socket pair; `out_fd` and `err_fd` receive
  // its output. Takes ownership of the three fds. Throws baton::Error naming
  // the node when the agent is gone or cannot start it.
  std::shared_ptr<RemoteWorker> spawn(int node, const std::string& label, const std::string& exe,
                                      const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env, int relay_fd,
                                      int out_fd, int err_fd);

  struct Impl;

 private:
  explicit Cluster(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton
