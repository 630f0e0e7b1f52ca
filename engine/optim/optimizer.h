// Optimizer: one training step after forward_backward — reduce gradients
// (sequence-parallel params over TP, tied embeddings over the embedding group,
// everything over DP in buckets), clip by the global norm across TP × PP × DP,
// then AdamW with a learning-rate schedule. Parameters that are not fp32 (bf16
// on GPU) keep fp32 master weights here.
//
// Distributed optimizer (`OptimizerOptions::distributed`, ZeRO-1): the
// parameters and gradients of a rank live in two flat buffers (each
// parameter is a view of one), the DP group reduce-scatters the gradient
// buffer so each DP rank holds the summed gradients of its 1/dp shard, the
// rank updates only that shard (its AdamW moments and fp32 masters are the
// shard's: 1/dp of the state per rank), and an all-gather brings every
// rank's updated shard back. When the DP ranks share a host and the model is
// on the CPU, the gradient buffer is this rank's region of a shared-memory
// segment (engine/parallel/shm_group.h) and both collectives go through it; otherwise
// they are the group's reduce_scatter_single / all_gather_single. The
// update is the same AdamW either way, on gradients summed in another order
// (rounding differs, not the formula); checkpoints are interchangeable:
// state_dict() gathers the full state.
//
// Overlapped reduction (`overlap_grad_reduce`, the plain optimizer), as
// DDP and Megatron do it: the gradients live in buckets of about
// `bucket_bytes` (each parameter's gradient a view of its bucket), filled in
// reverse parameter order, the order backward produces them. forward_backward
// arms the optimizer before the last micro-batch's backward
// (Transformer::set_backward_hook); from then on a hook after each
// parameter's gradient accumulation counts the bucket down, and a bucket
// whose gradients are all final starts its asynchronous all-reduce over DP —
// buckets always start in index order, so every rank issues the same
// collectives in the same order. reduce_gradients() starts the buckets that
// did not start (gradients produced outside forward_backward, unused
// parameters) and waits for all. Parameters reduced over TP or the embedding
// group first (sequence-parallel norms, tied embeddings across stages) stay
// out of the buckets and are reduced in step() as without overlap, so every
// sum is the blocking path's (the same all-reduce of the same elements, in
// buckets cut elsewhere, after the same reductions).
//
// Expert parallelism (ParallelConfig::ep > 1): an expert's gradient already
// sums every EP rank's tokens (the all-to-all's backward brought them), so
// expert parameters are summed over the expert-data group (dp·cp / ep ranks)
// instead of dp·cp, and the global norm adds each EP rank's experts once.
// The distributed optimizer does not shard expert parameters and refuses EP.
//
// Gradient convention: gradients are SUMMED over DP ranks (and over
// micro-batches), not averaged — the loss function scales by the global
// token count (docs/architecture.md, "The RL layer in one paragraph":
// token-mean is the true mean over the mini-batch whatever the split). Use
// `OptimizerOptions::average_dp` for a per-rank-mean loss instead.
//
// Example:
//   Optimizer opt(model, OptimizerOptions().set_lr(1e-5).set_warmup_cosine(10, 1000, 1e-6));
//   opt.zero_grad();
//   forward_backward(*model, mbs, loss);
//   auto stats = opt.step();   // stats.grad_norm, stats.lr
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/parallel/shm_group.h"

namespace baton::engine {

enum class LrSchedule { kConstant, kWarmupCosine };

struct OptimizerOptions {
  double lr = 1e-5;     // peak learning rate
  double min_lr = 0.0;  // cosine floor
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;  // linear warm-up from 0 (both schedules)
  int64_t total_steps = 0;   // cosine decay ends here (kWarmupCosine)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // not applied to 1-D parameters (norms, biases)
  double clip_grad = 1.0;      // global-norm clip; <= 0 disables
  bool average_dp = false;     // divide DP-summed gradients by the DP size
  int64_t bucket_bytes = 25 << 20;
  bool distributed = false;   // ZeRO-1: optimizer state sharded over DP (above)
  bool shared_memory = true;  // distributed: DP ranks on one host use shared memory
  // Plain optimizer over DP > 1: each bucket's all-reduce starts, without
  // waiting, as soon as the last micro-batch's backward has produced its
  // gradients (below); step() waits for them.
  bool overlap_grad_reduce = false;

  OptimizerOptions& set_lr(double v) {
    lr = v;
    return *this;
  }
  OptimizerOptions& set_warmup_cosine(int64_t warmup, int64_t total, double floor) {
    schedule = LrSchedule::kWarmupCosine;
    warmup_steps = warmup;
    total_steps = total;
    min_lr = floor;
    return *this;
  }
  OptimizerOptions& set_clip_grad(double v) {
    clip_grad = v;
    return *this;
  }
  OptimizerOptions& set_weight_decay(double v) {
    weight_decay = v;
    return *this;
  }
};

// The learning rate of step `step` (0 = the first step).
double learning_rate(const OptimizerOptions& options, int64_t step);

struct StepStats {
  double grad_norm = 0;  // before clipping, over every rank's gradients
  double lr = 0;
  bool skipped = false;  // non-finite gradient norm: no update was applied
};

class Optimizer {
 public:
  Optimizer(std::shared_ptr<Transformer> model, OptimizerOptions options);

  void zero_grad();
  // Collective over the model's TP, PP, DP and embedding groups.
  StepStats step();

  // Global norm of the current gradients, counted once per distinct
  // parameter across the layout. Collective. Call after gradient reduction
  // (step() does); exposed for tests and logging.
  double global_grad_norm();
  // The gradient reduction step() does first. Collective.
  void reduce_gradients();

  int64_t steps_done() const { return steps_; }
  const OptimizerOptions& options() const { return options_; }

  // Offload: moves the optimizer state (exp_avg, exp_avg_sq, fp32 masters)
  // of a GPU model to pinned host memory, freeing its device memory while a
  // rollout runs (HybridEngine); reload() moves it back to the parameters'
  // device. Both are no-ops for a model on the CPU and when already done.
  // Blocking copies. step() while offloaded throws EngineError. The
  // distributed optimizer's flat gradient buffer stays where it is.
  void offload();
  void reload();
  bool offloaded() const { return offloaded_; }

  // "exp_avg.<param>", "exp_avg_sq.<param>", "master.<param>" (non-fp32
  // params) and "step" (int64 0-dim). Distributed: the full tensors,
  // gathered over DP — collective over the DP group.
  std::map<std::string, at::Tensor> state_dict() const;
  // Throws EngineError naming missing or mis-shaped entries. Distributed:
  // each rank takes its shard of the full tensors.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

  // Bytes of optimizer state this rank holds (moments, masters; with the
  // distributed optimizer also its gradient shard).
  int64_t state_bytes() const;
  // The tensors behind state_bytes() (handles, not copies): what a role's
  // optimizer offload moves (engine/optim/offload.h).
  std::vector<at::Tensor> state_tensor_handles() const;
  // True when the distributed optimizer's collectives use shared memory.
  bool shared_memory_collectives() const { return flat_ && flat_->shm != nullptr; }
  // Overlapped reduction: buckets, and how many of them the last
  // reduce_gradients() found already started during the backward.
  int64_t grad_buckets() const;
  int64_t buckets_started_in_backward() const;

  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

 private:
  struct Slot {
    std::string name;
    at::Tensor param;
    at::Tensor master;  // fp32 copy when param is not fp32, else undefined
    at::Tensor exp_avg, exp_avg_sq;
    bool tp_replicated = false;
    bool tp_partial = false;  // Transformer::tp_partial_grad: all-reduced over TP first
    bool tied_copy = false;   // the last stage's copy of tied embeddings (pp > 1)
    // A MoE layer's experts under expert parallelism (ParallelConfig::ep > 1):
    // reduced over the expert-data group, counted in the norm over EP.
    bool expert = false;
  };
  // The distributed optimizer's flat buffers: slot i's elements are
  // [offset[i], offset[i] + numel) of `params` and `grads`; this rank's shard
  // is [shard_begin, shard_begin + shard).
  struct Segment {
    size_t slot;
    int64_t begin;  // in the flat buffers
    int64_t length;
  };
  struct Flat {
    at::Tensor params, grads;                // [padded], the model's dtype and device
    at::Tensor grad_shard;                   // [shard] fp32: the reduced gradients
    at::Tensor exp_avg, exp_avg_sq, master;  // [shard] fp32; master: non-fp32 params
    std::vector<int64_t> offset;             // per slot
    std::vector<Segment> segments;           // slots' pieces inside this rank's shard
    int64_t numel = 0, padded = 0, shard = 0, shard_begin = 0;
    std::optional<double> shard_squares;  // Σ grad_shard² from the last reduction
    std::unique_ptr<ShmGroup> shm;
  };

  // The overlapped reduction's state; the gradient hooks hold it weakly.
  struct Overlap;

  void all_reduce_buckets(std::vector<at::Tensor> grads, const Group& group);
  // The embedding or the tied output layer, on different stages: their
  // gradients are summed over the embedding group.
  bool tied_across_stages(const Slot& s) const;
  // Whether the slot's gradient is reduced over TP (sequence parallelism)
  // or the embedding group before DP, or not over DP at all (EP experts):
  // the overlapped reduction leaves it out.
  bool reduced_before_dp(const Slot& s) const;
  void build_overlap();
  void build_flat();
  void attach_grads();
  void reduce_scatter_flat();
  void distributed_update(const StepStats& stats, double scale, double bc1, double bc2);
  // Every DP rank's shard `mine` into `full` ([padded]); `mine` may be
  // full's own slice. Collective over DP.
  void all_gather_into(const at::Tensor& mine, at::Tensor& full) const;
  at::Tensor gather_shard(const at::Tensor& shard) const;
  // Moments and masters, the defined ones.
  std::vector<const at::Tensor*> state_tensors() const;
  std::vector<at::Tensor*> state_tensors();

  std::shared_ptr<Transformer> model_;
  OptimizerOptions options_;
  std::unique_ptr<Flat> flat_;
  std::shared_ptr<Overlap> overlap_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
  bool offloaded_ = false;
};

}  // namespace baton::engine
