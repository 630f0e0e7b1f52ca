// Megatron-style tensor-parallel layers: ColumnParallelLinear (output features
// split over tp), RowParallelLinear (input features split over tp) and
// VocabParallelEmbedding (vocabulary rows split over tp).
//
// Each layer holds only this rank's shard, registered as "weight" (and "bias"),
// with the per-rank shapes of docs/engine.md. Parameters start as a seeded
// normal(0, 0.02) (the global generator; biases zero): the model loads real
// weights by name. Forward calls are collective over the layer's tp group
// (see tensor_parallel.h): every tp rank runs the same layers in the same
// order, forward and backward.
//
// Example (the MLP of one transformer layer, sequence parallel off):
//   ColumnParallelLinear fc1(ColumnParallelLinearOptions{.in_features = H, .out_features = F},
//                            ps->tp());
//   RowParallelLinear fc2(RowParallelLinearOptions{.in_features = F, .out_features = H},
//                         ps->tp());
//   at::Tensor y = fc2(at::gelu(fc1(x)));  // x, y: [B, S, H] on every tp rank
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "engine/parallel/parallel_state.h"

namespace baton::engine {

// While one is alive on this thread, new parallel layers leave their weights
// uninitialised (at::empty instead of N(0, 0.02)): for a model whose every
// weight is about to be overwritten, such as the HybridEngine's rollout model
// (its random initialisation cost as much as the reshard that follows).
class SkipWeightInit {
 public:
  SkipWeightInit();
  ~SkipWeightInit();
  SkipWeightInit(const SkipWeightInit&) = delete;
  SkipWeightInit& operator=(const SkipWeightInit&) = delete;

 private:
  bool previous_;
};

struct ColumnParallelLinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;  // global; must divide by tp
  bool bias = false;
  // Return the full [.., out_features] output on every rank (an all-gather);
  // otherwise this rank's [.., out_features/tp] slice.
  bool gather_output = false;
  // Input is this rank's part of the sequence, [B, S/tp, in]; it is
  // all-gathered to [B, S, in] first. Excludes gather_output.
  bool sequence_parallel = false;
};

// y = x Wᵀ + b with W split by rows (output features): rank k holds
// rows [k·out/tp, (k+1)·out/tp).
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // Throws EngineError if out_features % tp != 0, or for sequence_parallel
  // with gather_output.
  ColumnParallelLinearImpl(ColumnParallelLinearOptions options, Group tp);

  // x: [.., in] (sequence_parallel: [B, S/tp, in]) -> [.., out/tp], or
  // [.., out] with gather_output.
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  const ColumnParallelLinearOptions& options() const { return options_; }
  const Group& tp() const { return tp_; }

  at::Tensor weight;  // [out/tp, in]
  at::Tensor bias;    // [out/tp], or undefined

 private:
  ColumnParallelLinearOptions options_;
  Group tp_;
};

struct RowParallelLinearOptions {
  int64_t in_features = 0;  // global; must divide by tp
  int64_t out_features = 0;
  bool bias = false;
  // The input is already split over tp ([.., in/tp], e.g. from a
  // ColumnParallelLinear); otherwise the full [.., in] is split here.
  bool input_is_parallel = true;
  // Reduce-scatter the output along the sequence: [B, S, out] partial sums ->
  // [B, S/tp, out]. Requires input_is_parallel. The bias then sees only this
  // rank's positions: all-reduce its gradient over tp (all_reduce_grads).
  bool sequence_parallel = false;
};

// y = x Wᵀ + b with W split by columns (input features): rank k holds
// columns [k·in/tp, (k+1)·in/tp). The bias is replicated and added once,
// after the reduction.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  // Throws EngineError if in_features % tp != 0, or for sequence_parallel
  // without input_is_parallel.
  RowParallelLinearImpl(RowParallelLinearOptions options, Group tp);

  // x: [.., in/tp] (or [.., in] without input_is_parallel) -> [.., out]
  // (sequence_parallel: [B, S/tp, out]).
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  const RowParallelLinearOptions& options() const { return options_; }
  const Group& tp() const { return tp_; }

  at::Tensor weight;  // [out, in/tp]
  at::Tensor bias;    // [out], or undefined

 private:
  RowParallelLinearOptions options_;
  Group tp_;
};

struct VocabParallelEmbeddingOptions {
  int64_t vocab_size = 0;  // global; must divide by tp
  int64_t hidden_size = 0;
  // Return this rank's part of the sequence, [B, S/tp, H] (a reduce-scatter
  // instead of an all-reduce). S must divide by tp.
  bool sequence_parallel = false;
};

// An embedding table split by vocabulary rows: rank k holds token ids
// [vocab_start(), vocab_end()) = [k·V/tp, (k+1)·V/tp). Each rank looks up the
// ids it holds (zeros for the others) and the partial results are summed.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  // Throws EngineError if vocab_size % tp != 0.
  VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options, Group tp);

  // ids: [B, S] int64 global token ids in [0, vocab_size) (EngineError
  // otherwise) -> [B, S, H] (sequence_parallel: [B, S/tp, H]).
  // check_range false: the ids are not read on the host (no synchronisation:
  // the device decode loop feeds back tokens it sampled from the vocabulary).
  at::Tensor forward(const at::Tensor& ids, bool check_range = true);
  void pretty_print(std::ostream& stream) const override;

  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_end_; }
  const VocabParallelEmbeddingOptions& options() const { return options_; }
  const Group& tp() const { return tp_; }

  at::Tensor weight;  // [V/tp, H]

 private:
  VocabParallelEmbeddingOptions options_;
  Group tp_;
  int64_t vocab_start_ = 0, vocab_end_ = 0;
};

TORCH_MODULE(ColumnParallelLinear);
TORCH_MODULE(RowParallelLinear);
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace baton::engine
