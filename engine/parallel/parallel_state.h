// ParallelState: this rank's place in a Megatron-style tensor × context × data
// × pipeline parallel world, and the c10d groups it talks over.
//
// Rank order is Megatron's, tp fastest, then cp, dp, pp (docs/engine.md):
//   rank = ((pp·dp_size + dp)·cp_size + cp)·tp_size + tp
//
// Example (every rank of an 8-process world):
//   ParallelConfig cfg;
//   cfg.tp = 2; cfg.dp = 2; cfg.pp = 2;
//   cfg.validate(world_size);                        // EngineError if 8 != world_size
//   auto ps = ParallelState::create(store, rank, cfg);  // collective, blocking
//   ps->set_num_layers(model.num_layers);            // layer ranges of this stage
//   ps->tp().pg->allreduce(tensors)->wait();
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/parallel_layout.h"
#include "engine/parallel/deadline_group.h"
#include "engine/parallel/vocab_padding.h"

namespace baton::engine {

// A layout (base/parallel_layout.h: tp, cp, dp, pp and the rank arithmetic)
// plus how the model is split over it. CP groups are built but no layer uses
// context parallelism yet.
struct ParallelConfig : ParallelLayout {
  // Layers per pipeline stage, one count per stage summing to the model's layer
  // count (a stage may hold 0 layers). Empty: an even split, the remainder going
  // to the first stages ([2, 1, 1] for 4 layers on 3 stages).
  std::vector<int64_t> layer_split;
  // Megatron's make_vocab_size_divisible_by: the embedding and LM head hold
  // padded_vocab_size() rows, a multiple of this × tp (vocab_padding.h), so
  // any vocabulary splits over any tp. 1 pads only as far as tp needs.
  int64_t make_vocab_size_divisible_by = kDefaultVocabDivisibleBy;
  // Expert parallelism (Megatron's expert_model_parallel_size): a MoE model's
  // experts are split over `ep` ranks carved from the data-parallel ranks —
  // dp ranks [b·ep, (b+1)·ep) of one (tp, cp, pp) form an EP group, each
  // holding num_experts / ep experts, and tokens travel to their experts'
  // ranks by all-to-all. Dense parameters stay data-parallel over all dp·cp
  // ranks; expert parameters are data-parallel over the dp·cp / ep ranks
  // that hold the same experts (GroupKind::kExpertData). 1: no EP.
  int64_t ep = 1;

  // This layout's EP rank of data-parallel rank `dp`.
  int64_t ep_rank_of(int64_t dp_rank) const { return dp_rank % ep; }

  // Rows of this layout's embedding and LM head for a vocabulary of
  // `vocab_size` (all TP ranks together).
  int64_t padded_vocab_size(int64_t vocab_size) const {
    return engine::padded_vocab_size(vocab_size, tp, make_vocab_size_divisible_by);
  }
  // Throws EngineError for a size (or make_vocab_size_divisible_by) below 1,
  // a layer_split whose length is not pp, or (when world_size >= 0) a
  // world_size() that differs from world_size; the message names both.
  void validate(int64_t world_size = -1) const;
  // "tp=2 cp=1 dp=2 pp=2" (plus " layer_split=[..]" when given and
  // " make_vocab_size_divisible_by=N" when not the default, " ep=N" when
  // not 1).
  std::string to_string() const;

  bool operator==(const ParallelConfig&) const = default;
};

// One rank's coordinates along the four dimensions.
using Coords = ParallelCoords;

// config.coords(rank), checked.
// REQUIRES: 0 <= rank < config.world_size() (EngineError otherwise).
Coords coords_of(int64_t rank, const ParallelConfig& config);
// config.rank_of(coords), checked.
// REQUIRES: each coordinate within its size (EngineError otherwise).
int64_t rank_of(const Coords& coords, const ParallelConfig& config);

// The kinds of groups a ParallelState builds. Each kind partitions the world:
// every rank is in exactly one group of each kind.
enum class GroupKind {
  kWorld,
  kTensor,       // same cp, dp, pp: the tp ranks
  kContext,      // same tp, dp, pp
  kData,         // same tp, cp, pp
  kDataContext,  // same tp, pp: dp × cp ranks, over which gradients are all-reduced
  kPipeline,     // same tp, cp, dp: the stages, in stage order
  // Same cp, dp: tp × pp ranks, one full copy of the model. Grad-norm clipping
  // sums squared norms over this group (after the dp×cp gradient all-reduce,
  // gradients are equal across dp and cp, so counting them once per copy is
  // right; parameters replicated over tp must be counted on tp rank 0 only,
  // and a tied output_layer once, as Megatron does).
  kModel,
  // First and last stage of one pipeline (same tp, cp, dp): the tied
  // embedding's gradient is all-reduced over it. pp == 1: the rank alone; a
  // middle stage (pp > 2): the rank alone.
  kEmbedding,
  // Expert parallelism (ParallelConfig::ep): the ep ranks of one (tp, cp, pp)
  // whose dp ranks lie in the same block [b·ep, (b+1)·ep), in dp order; the
  // tokens' all-to-all runs over it. ep == 1: the rank alone.
  kExpert,
  // Same tp, pp and EP rank: the dp·cp / ep ranks holding the same experts,
  // over which the expert parameters' gradients are all-reduced.
  kExpertData,
};

const char* to_string(GroupKind kind);

// Global ranks of the group of `kind` that holds `rank`, ordered by group rank
// (ascending global rank; for kPipeline that is stage order).
std::vector<int64_t> group_ranks(GroupKind kind, int64_t rank, const ParallelConfig& config);
// Every group of `kind`, ordered by their lowest rank.
std::vector<std::vector<int64_t>> all_group_ranks(GroupKind kind, const ParallelConfig& config);

// Global layers [begin, end) of pipeline stage `stage` for a model of
// `num_layers` layers. Throws EngineError if layer_split does not sum to
// num_layers, or if the even split would leave a stage without layers.
std::pair<int64_t, int64_t> stage_layer_range(int64_t stage, int64_t num_layers,
                                              const ParallelConfig& config);

// One c10d group and this rank's place in it. `pg` is never null: a size-1
// group is a real process group of one (region functions skip collectives
// when size == 1). Groups with the same ranks share one process group. A
// ParallelState's `pg` is a DeadlineGroup (deadline_group.h) named after the
// kinds that share it ("tp", or "world/tp/model_parallel" when tp is the
// whole world), with global ranks in its messages.
struct Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  int64_t rank = 0;            // this rank's index in `ranks`
  int64_t size = 1;            // ranks.size()
  std::vector<int64_t> ranks;  // global ranks by group rank
};

// Returns once every member of `group` has called it; a group of one returns
// at once (a one-rank NCCL group is never asked for a barrier). Collective
// and blocking.
void barrier(const Group& group);

// A Gloo process group of `size` ranks over `store`, bound like a
// ParallelState's groups (GLOO_SOCKET_IFNAME, else BATON_NODE_ADDR, else
// loopback): for groups
// outside a ParallelState, such as weight sync to separate rollout workers.
// A DeadlineGroup called `name` in its messages, every operation and the
// forming itself limited to `timeout`. Collective and blocking: every member
// calls it.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(c10::intrusive_ptr<c10d::Store> store,
                                                       int64_t rank, int64_t size,
                                                       std::chrono::milliseconds timeout,
                                                       const std::string& name = "gloo");

// Process-group implementation. kNccl exists only in BATON_CUDA builds
// (EngineError otherwise).
enum class CollectiveBackend { kGloo, kNccl };

class ParallelState {
 public:
  // Collective over the world and blocking: every rank of config.world_size()
  // calls it with the same config and a store they share, and it returns once
  // every group this rank belongs to is connected. Uses store keys under
  // "baton/parallel_state/"; to build a second ParallelState over the same
  // store, wrap the store in a c10d::PrefixStore.
  // Throws EngineError for an invalid config, a rank outside it, or a config
  // that differs from rank 0's (checked through the store).
  // Gloo binds to the interface named by GLOO_SOCKET_IFNAME when it is set,
  // else to BATON_NODE_ADDR (set by a node agent, runtime/cluster/cluster.h:
  // the address its node reached the driver at), else to loopback (one
  // host). `timeout` is the collective deadline: every operation on the
  // groups, and the groups' forming, throws EngineError naming the group,
  // the operation and the ranks that did not arrive once it has waited that
  // long (deadline_group.h).
  // kNccl: make this process's GPU the current CUDA device first (a baton
  // worker's is, WorkerInfo::device); every group is bound to it.
  static std::shared_ptr<ParallelState> create(
      c10::intrusive_ptr<c10d::Store> store, int64_t rank, ParallelConfig config,
      std::chrono::milliseconds timeout = kDefaultCollectiveTimeout,
      CollectiveBackend backend = CollectiveBackend::kGloo);
  // A world of one, no store: tools and single-process tests. Every group is
  // the same size-1 Gloo group. `config` describes one rank (EngineError
  // otherwise), e.g. its vocabulary padding.
  static std::shared_ptr<ParallelState> single(ParallelConfig config = {});

  ParallelState(const ParallelState&) = delete;
  ParallelState& operator=(const ParallelState&) = delete;
  ~ParallelState();

  const ParallelConfig& config() const { return config_; }
  int64_t rank() const { return rank_; }
  // The groups' implementation (kGloo for single()).
  CollectiveBackend backend() const { return backend_; }
  // The deadline of the groups' operations (create()'s `timeout`): groups
  // made for this state's model (the optimizer's shared-memory group, the
  // rollout layout's) take it too.
  std::chrono::milliseconds collective_timeout() const { return timeout_; }
  // Where the groups take the tensors they carry: for kNccl the CUDA device
  // that was current at create() (the groups are bound to it), for kGloo the
  // CPU. The engine makes its flags, bucket buffers and pipeline messages
  // there, so a GPU model on Gloo groups sends those through host memory;
  // its TP/DP collectives of activations and gradients need kNccl (the Gloo
  // groups take CPU tensors only).
  at::Device device() const { return device_; }
  const Coords& coords() const { return coords_; }

  const Group& group(GroupKind kind) const;
  const Group& world() const { return group(GroupKind::kWorld); }
  const Group& tp() const { return group(GroupKind::kTensor); }
  const Group& cp() const { return group(GroupKind::kContext); }
  const Group& dp() const { return group(GroupKind::kData); }
  const Group& dp_cp() const { return group(GroupKind::kDataContext); }
  const Group& pp() const { return group(GroupKind::kPipeline); }
  const Group& model_parallel() const { return group(GroupKind::kModel); }
  const Group& embedding() const { return group(GroupKind::kEmbedding); }
  const Group& ep() const { return group(GroupKind::kExpert); }
  const Group& expert_dp() const { return group(GroupKind::kExpertData); }
  // This rank's place in its EP group: it holds experts
  // [ep_rank · E / ep, (ep_rank + 1) · E / ep).
  int64_t ep_rank() const { return config_.ep_rank_of(coords_.dp); }

  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp == config_.pp - 1; }

  // The model's layer count, needed by the layer ranges. Not thread-safe: call
  // once after create(), before the model is built. Throws EngineError when
  // the config's layer_split does not fit `num_layers`.
  void set_num_layers(int64_t num_layers);
  // REQUIRES: set_num_layers() was called (std::logic_error otherwise).
  int64_t num_layers() const;
  int64_t layer_begin() const;  // this stage's global layers [begin, end)
  int64_t layer_end() const;

 private:
  ParallelState(ParallelConfig config, int64_t rank);

  ParallelConfig config_;
  int64_t rank_ = 0;
  CollectiveBackend backend_ = CollectiveBackend::kGloo;
  std::chrono::milliseconds timeout_ = kDefaultCollectiveTimeout;
  at::Device device_ = at::kCPU;
  Coords coords_;
  std::vector<Group> groups_;  // indexed by GroupKind
  int64_t num_layers_ = -1;
  std::pair<int64_t, int64_t> layers_{0, 0};
};

}  // namespace baton::engine
