// baton-agent: the node agent (runtime/cluster/cluster.h). Started on every node by
// whatever the cluster uses to start processes:
//
//   srun baton-agent --driver $DRIVER_HOST:29400          # Slurm, one per node
//   ssh node-b baton-agent --driver node-a:29400
//
// It connects to the driver, starts the workers the driver asks for, forwards
// their output, reports how they exit, and kills them and exits when the
// driver goes. The cluster token comes from BATON_CLUSTER_TOKEN_FILE (or
// BATON_CLUSTER_TOKEN), the same as the driver's; TLS from BATON_TLS_CA.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/cluster/agent.h"

namespace {

void usage(FILE* out) {
  std::fputs(
      "usage: baton-agent --driver HOST:PORT [--node-rank N] [--slots N] [--name NAME]\n"
      "                   [--connect-timeout SECONDS]\n"
      "  --driver           where the driver listens for agents (ClusterOptions::listen)\n"
      "  --node-rank        this node's index in the cluster (default: $SLURM_NODEID, else\n"
      "                     the order in which agents connect)\n"
      "  --slots            CPU slots to report (default: the usable cores)\n"
      "  --name             the node's name in messages (default: the host name)\n"
      "  --connect-timeout  how long to keep trying to reach the driver (default 300)\n"
      "environment: BATON_CLUSTER_TOKEN_FILE or BATON_CLUSTER_TOKEN (required, the driver's);\n"
      "             BATON_TLS_CA to connect over TLS\n",
      out);
}

bool parse_int(const char* s, int& out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < -1 || v > 1000000) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  baton::AgentOptions o;
  if (const char* id = std::getenv("SLURM_NODEID")) parse_int(id, o.node_rank);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "baton-agent: %s needs a value\n", a.c_str());
      usage(stderr);
      return 2;
    }
    const char* v = argv[++i];
    int n = 0;
    if (a == "--driver") {
      o.driver = v;
    } else if (a == "--name") {
      o.hostname = v;
    } else if (a == "--node-rank" && parse_int(v, n)) {
      o.node_rank = n;
    } else if (a == "--slots" && parse_int(v, n) && n > 0) {
      o.cpu_slots = n;
    } else if (a == "--connect-timeout" && parse_int(v, n) && n > 0) {
      o.connect_timeout = std::chrono::seconds(n);
    } else {
      std::fprintf(stderr, "baton-agent: bad argument %s %s\n", a.c_str(), v);
      usage(stderr);
      return 2;
    }
  }
  if (o.driver.empty()) {
    std::fputs("baton-agent: --driver HOST:PORT is required\n", stderr);
    usage(stderr);
    return 2;
  }
  return baton::run_agent(o);
}
