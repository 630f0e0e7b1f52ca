// ShmGroup: reduce-scatter and all-gather of one flat fp32 buffer among the
// ranks of a Group that share a host, through one shared-memory segment
// instead of the group's sockets. The distributed optimizer keeps its DP
// gradients in this rank's region of the segment (the backward accumulates
// straight into it), so a reduce-scatter is one pass that sums the ranks'
// regions, and an all-gather is one copy in and one copy out.
//
// Segment layout: one 64-byte control line per rank (its barrier counter and
// pid), then `numel` floats per rank (its region), then `numel` floats of
// gather area. `numel` is a multiple of the group size; rank r owns the
// shard [r·numel/size, (r+1)·numel/size).
//
// Example (every rank of `dp`):
//   auto shm = ShmGroup::create(dp, n);    // nullptr: not all on one host
//   at::Tensor grads = shm->region();      // [n], this rank's
//   ... backward accumulates into views of grads ...
//   shm->reduce_scatter(shard_grads);      // [n / size]: Σ over ranks
//   shm->all_gather(shard_params, params); // params[n] = every rank's shard
//
// Thread safety: one thread per rank calls the collectives, in the same order
// on every rank. A rank that dies or stops calling makes the others throw
// EngineError naming the group (its process group's name, "dp"), the
// operation and every rank that did not arrive: at once for a rank that
// exited (checked by pid every 50 ms when every peer's pid is visible from
// this process), after `timeout` (the collective deadline) in any case. A
// long wait sleeps in short naps after the first millisecond.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/parallel/parallel_state.h"

namespace baton::engine {

class ShmGroup {
 public:
  // Collective over `group` (its process group carries the setup). Returns
  // nullptr, on every rank alike, when the group has one rank, /dev/shm has
  // no room for the segment, or the ranks do not all see the segment rank 0
  // created (different hosts or /dev/shm namespaces). Throws EngineError when numel is not a positive multiple of
  // the group size.
  static std::unique_ptr<ShmGroup> create(
      const Group& group, int64_t numel,
      std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int64_t numel() const { return numel_; }
  int64_t shard_numel() const { return numel_ / size_; }
  // This rank's [numel] fp32 region; the tensor keeps the mapping alive.
  at::Tensor region() const { return region_; }

  // out[i] = Σ_r region_r[rank·shard + i], summed in rank order. Waits until every rank has called it (their regions are
  // final). `out`: contiguous fp32 [shard], possibly this rank's own slice of
  // region() (the reduction in place). Returns Σ out[i]² in double, taken in
  // the same pass (the distributed optimizer's share of the gradient norm).
  double reduce_scatter(at::Tensor& out);
  // out = every rank's `shard`, by rank. `shard` [shard], `out` [numel], both
  // contiguous fp32 on the CPU; `shard` may be out's own slice.
  void all_gather(const at::Tensor& shard, at::Tensor& out);
  // Σ_r x_r, summed in rank order (the same double on every rank).
  double all_reduce_sum(double x);
  void barrier();

 private:
  ShmGroup() = default;
  float* region_ptr(int64_t r) const;
  // The barrier of operation `op` (named in errors).
  void wait_all(const char* op);

  std::shared_ptr<void> mapping_;  // munmap when the last user goes
  void* base_ = nullptr;
  int64_t rank_ = 0, size_ = 1, numel_ = 0;
  std::string name_;             // the process group's ("dp"), for errors
  std::vector<int64_t> ranks_;   // global ranks by group rank, for errors
  uint64_t epoch_ = 0;
  bool check_pids_ = true;  // every peer's pid is visible from here
  std::chrono::milliseconds timeout_{0};
  at::Tensor region_;
};

}  // namespace baton::engine
