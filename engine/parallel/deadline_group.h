// DeadlineGroup: a c10d process group whose every collective and
// point-to-point operation has a deadline, and whose failures say who is
// missing. When a rank's operation does not complete within the deadline, the
// rank throws EngineError naming the group, the operation (with its sequence
// number on the group) and the ranks that did not arrive:
//
//   group tp (ranks 0, 1, 2): all_reduce #4 on rank 0 failed (collective
//   deadline 2000 ms): rank 2 did not arrive (pid 4711, alive; its last
//   collective on this group: barrier #3) [... Timed out waiting 2000ms for
//   recv operation to complete]
//
// Every group the engine makes is one (ParallelState's TP/CP/DP/PP groups,
// the rollout layout's, weight sync's), so a rank that stops arriving fails
// the others within the deadline instead of leaving them waiting.
//
// How it works, and why this way:
//   - A ProcessGroup of its own, not a helper each call site must use: every
//     `pg->allreduce(...)->wait()` of the engine, and any added later, is
//     covered as it is written.
//   - The deadline itself is the backend's own timeout: the Gloo (or NCCL)
//     backend is built with the group's timeout, so Gloo's wait throws once
//     it has waited that long for a peer. No timer, no clock read.
//   - Who did not arrive: an arrival board, one 64-byte line per rank in a
//     small shared-memory segment per group and host. Before issuing a
//     collective a rank writes its sequence number and the operation into its
//     line (one relaxed store of one word: a few nanoseconds, besides a
//     relaxed counter increment and the small Work object that wraps the
//     backend's); before a send or receive, the peer and the tag. The ranks
//     issue a group's collectives in the same order (c10d's rule), so the
//     counts agree while all is well. A rank whose wait failed reads every
//     line: the ranks whose count is below its own have not entered this
//     collective. This names the missing rank even when it is alive and busy
//     elsewhere (a hung kernel, a method that never reaches the collective),
//     which neither Gloo's error ("timed out waiting for recv") nor the
//     store can tell: the missing rank is by definition not cooperating, and
//     only memory it wrote before can speak for it. Each line also holds the
//     rank's pid, so the message says whether it exited.
//   - Ranks on other hosts have no line on this host's board (the segment
//     lives in this host's /dev/shm); the message says they could not be
//     checked. A host without /dev/shm room has no board at all; the group
//     works the same and the message says who is missing is unknown.
//   - The segment is named only while the group forms: every rank maps it,
//     the ranks meet through the store (the join: a few store round trips
//     per rank, with the same deadline, naming who did not join), and every
//     rank unlinks the name, so nothing is left in /dev/shm however the
//     processes end later.
//   - After a failure the counts of the ranks that did and did not run the
//     failed operation stay apart; the group is unusable anyway (Gloo's
//     pairs are broken), and the job fails.
//   - On NCCL the backend's watchdog enforces the same deadline and ends the
//     process, logging the group's description (this group's name) and the
//     operation; the missing ranks are not named there (Work::wait of NCCL
//     does not block the host, so no error reaches this class).
//
// Example (what ParallelState does for each group):
//   DeadlineGroupOptions o;
//   o.name = "tp";
//   o.timeout = std::chrono::seconds(600);
//   auto pg = c10::make_intrusive<DeadlineGroup>(store, rank, size, o);  // joins: collective
//   pg->set_backend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
//                   c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options));
//   pg->allreduce(tensors)->wait();   // EngineError naming the missing ranks after 600 s
//
// Thread safety: as c10d::ProcessGroup: one thread issues a group's
// operations at a time, in the same order on every rank.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// The name of c10d's variable-split all-to-all: LibTorch 2.15 calls it
// all_to_all_single (alltoall_base stays as a deprecated alias that calls it);
// 2.11, the GPU machines' torch, has only alltoall_base. Overrides and calls
// use this name so that both compile and the override is the one called.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define BATON_C10D_ALL_TO_ALL_SINGLE all_to_all_single
#else
#define BATON_C10D_ALL_TO_ALL_SINGLE alltoall_base
#endif

namespace baton::engine {

namespace detail {
class GroupWatch;  // the board and what messages need (deadline_group.cpp)
}  // namespace detail

// The deadline of every collective, weight sync and group join unless a
// caller gives another (trainer.collective_timeout_s): long enough for any
// step's imbalance between ranks, short enough that a hang ends the job.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(10);

struct DeadlineGroupOptions {
  // The group's name in messages ("tp", "weight_sync:actor"); also its c10d
  // group description (NCCL's watchdog logs it).
  std::string name = "group";
  // How long a rank waits in one operation, or for the others to join, before
  // it throws. The backend must be built with the same timeout.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // The global rank of each group rank, shown in messages instead of group
  // ranks (ParallelState's groups). Empty: group ranks.
  std::vector<int64_t> global_ranks;

  DeadlineGroupOptions& set_name(std::string n) {
    name = std::move(n);
    return *this;
  }
  DeadlineGroupOptions& set_timeout(std::chrono::milliseconds t) {
    timeout = t;
    return *this;
  }
};

class DeadlineGroup final : public c10d::ProcessGroup {
 public:
  // Collective and blocking: every rank of the group calls it with the same
  // store (keys under "baton_board/") and options. Maps the arrival board and
  // waits until every rank has; throws EngineError naming the ranks that did
  // not join within options.timeout. A group of one touches neither the
  // store nor shared memory. Add the backend with set_backend() before use.
  DeadlineGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                DeadlineGroupOptions options);
  ~DeadlineGroup() override;

  // Makes `backend` the group's backend for tensors on `device` and the
  // default one, and gives it the group's name as its description.
  void set_backend(c10::DeviceType device, BackendType type,
                   c10::intrusive_ptr<c10d::Backend> backend);

  const std::string& name() const;
  std::chrono::milliseconds timeout() const;
  // Whether this rank's line is on a board other ranks can read (false for a
  // group of one, or without room in /dev/shm).
  bool has_board() const;

  // The operations baton uses, each recorded on the board before it is
  // issued; the Work returned rethrows a failure of wait() as EngineError
  // naming the group, the operation and the ranks missing (an error while
  // issuing gets the group and the operation). Other ProcessGroup
  // operations pass through unrecorded.
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> BATON_C10D_ALL_TO_ALL_SINGLE(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

 private:
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> record(uint8_t op, int peer, int tag, Issue&& issue);

  std::shared_ptr<detail::GroupWatch> watch_;
};

namespace detail {
// True when process `pid` has exited: it is gone, or a zombie its parent has
// not reaped yet. False for a process this one cannot see.
bool process_exited(int64_t pid);
// "rank 3" or "ranks 1, 2" (a list of group members in messages).
std::string rank_list(const std::vector<int64_t>& ranks);
}  // namespace detail

}  // namespace baton::engine
