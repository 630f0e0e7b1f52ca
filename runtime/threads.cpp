#include "runtime/threads.h"

#include <sched.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

namespace baton {

namespace {

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// The cgroup v2 quota in cores ("max 100000" or "200000 100000"), or 0.
int quota_cores() {
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota;
  double period = 0;
  if (!(f >> quota >> period) || quota == "max" || period <= 0) return 0;
  try {
    return static_cast<int>(std::ceil(std::stod(quota) / period));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

int usable_cores() {
  int n = affinity_cores();
  if (const int q = quota_cores(); q > 0) n = std::min(n, q);
  return std::max(1, n);
}

void set_intra_op_threads(int n) { at::set_num_threads(std::max(1, n)); }

void apply_wait_policy(WaitPolicy policy, std::vector<std::string>& env) {
  static const char* const kWaitVars[] = {"OMP_WAIT_POLICY=", "GOMP_SPINCOUNT=", "KMP_BLOCKTIME="};
  if (policy == WaitPolicy::kInherit) return;
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const std::string& kv) {
                             for (const char* k : kWaitVars)
                               if (kv.rfind(k, 0) == 0) return true;
                             return false;
                           }),
            env.end());
  env.push_back(policy == WaitPolicy::kPassive ? "OMP_WAIT_POLICY=PASSIVE"
                                               : "OMP_WAIT_POLICY=ACTIVE");
}

}  // namespace baton
