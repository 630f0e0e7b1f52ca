// The node agent (baton-agent, agent_main.cpp): one on every node of a
// multi-node job. It connects to the driver's Cluster (cluster.h), proves it
// holds the cluster token, reports its slots, and from then on starts,
// supervises and kills the driver's workers on its node, relaying their
// messages and tensors (relay.h) and forwarding their output. It kills its
// workers and exits when the driver goes.
//
// Example (what agent_main.cpp does with its flags):
//   baton::AgentOptions o;
//   o.driver = "10.0.0.1:29400";
//   o.node_rank = 1;
//   return baton::run_agent(o);
#pragma once

#include <chrono>
#include <string>

namespace baton {

// The node agent's main loop (baton-agent): connects to `driver`
// ("host:port"), then serves it until it goes. Returns the process's exit
// code. Errors (no token, no driver within `connect_timeout`) are printed.
struct AgentOptions {
  std::string driver;       // "host:port"
  int node_rank = -1;       // the node's index; -1: in order of arrival
  int cpu_slots = 0;        // 0: the usable cores
  std::string hostname;     // empty: the machine's
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
};
int run_agent(const AgentOptions& options);

}  // namespace baton
