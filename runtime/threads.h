// Thread discipline: how many LibTorch intra-op threads each process runs,
// and how its OpenMP threads wait between parallel regions.
//
// The rule (docs/architecture.md, "Threads"):
//   - The driver does little tensor work (rewards, advantages, metrics):
//     baton::init gives it one intra-op thread, so it never forms an OpenMP
//     team and never spins at a barrier. Call at::set_num_threads after init
//     to change that.
//   - A worker gets its share of the node's usable cores (usable_cores() /
//     workers on the node, at least 1), or ResourcePoolOptions::threads.
//   - A worker's OpenMP threads wait passively (sleep at once at the end of
//     a parallel region) unless ResourcePoolOptions::wait says otherwise.
//     LibTorch's OpenMP (libgomp) spins first by default, about 300,000
//     pause instructions: when another process holds the core of a thread's
//     sibling, every barrier burns that spin, and a 2-thread worker beside one
//     busy process ran 9x slower instead of at most 2x. libgomp reads its
//     wait policy once, when it is loaded, and has no call to change it, so
//     the runtime sets it in the environment it starts each worker with
//     (OMP_WAIT_POLICY, and GOMP_SPINCOUNT/KMP_BLOCKTIME removed), over any
//     value the driver's environment holds; WaitPolicy::kInherit keeps that.
#pragma once

#include <string>
#include <vector>

namespace baton {

enum class WaitPolicy {
  kPassive,  // OMP_WAIT_POLICY=PASSIVE: sleep at once (the default)
  kActive,   // OMP_WAIT_POLICY=ACTIVE: spin (only for a machine no one shares)
  kInherit,  // the driver's environment, or libgomp's default (spin, then sleep)
};

// Cores this process may run on: its CPU affinity mask, capped by a cgroup
// v2 CPU quota (cpu.max) when one is set. At least 1.
int usable_cores();

// Sets this process's LibTorch intra-op threads (OpenMP and MKL): what
// at::set_num_threads does, with n clamped to at least 1.
void set_intra_op_threads(int n);

// Rewrites a child process's environment ("KEY=value" entries) for `policy`:
// drops the wait-policy variables it inherited and, unless kInherit, adds
// OMP_WAIT_POLICY.
void apply_wait_policy(WaitPolicy policy, std::vector<std::string>& env);

}  // namespace baton
