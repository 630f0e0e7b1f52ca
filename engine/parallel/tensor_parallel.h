// Tensor-parallel regions: the collectives at the edges of Megatron's column-
// and row-parallel layers, each a differentiable function whose backward runs
// the matching collective.
//
// All functions are collective over `tp` and blocking: every rank of the group
// calls them in the same order with tensors of the same shape (their own
// shards). A group of size 1 runs no collective and returns `x` itself. The
// backward of a function runs its collective too, so every rank of the group
// must run backward through the same graph.
//
// Example (a column-parallel then row-parallel MLP, see parallel_linear.h):
//   at::Tensor h = copy_to_tp_region(x, tp);          // [B, S, H], replicated
//   h = at::linear(h, w1_shard);                      // [B, S, F/tp]
//   at::Tensor y = reduce_from_tp_region(at::linear(h, w2_shard), tp);  // [B, S, H]
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "engine/parallel/parallel_state.h"

namespace torch::autograd {
struct AutogradContext;
}

namespace baton::engine {

// Forward identity (the result shares x's storage: do not modify it in place);
// backward all-reduce (sum) of the gradient.
at::Tensor copy_to_tp_region(const at::Tensor& x, const Group& tp);
// Forward all-reduce (sum); backward identity.
at::Tensor reduce_from_tp_region(const at::Tensor& x, const Group& tp);
// Forward all-gather along the last dim ([.., n] -> [.., n·tp], rank order);
// backward keeps this rank's slice of the gradient.
at::Tensor gather_from_tp_region(const at::Tensor& x, const Group& tp);
// Forward keeps this rank's slice of the last dim ([.., n] -> [.., n/tp]);
// backward all-gathers the gradient. REQUIRES: n % tp == 0 (EngineError).
at::Tensor scatter_to_tp_region(const at::Tensor& x, const Group& tp);

// Sequence parallelism, along dim 1 of [B, S, H] activations; rank k holds
// sequence positions [k·S/tp, (k+1)·S/tp).
// Forward all-gather dim 1 ([B, S/tp, H] -> [B, S, H]); backward reduce-scatter.
at::Tensor gather_from_sequence_region(const at::Tensor& x, const Group& tp);
// Forward reduce-scatter dim 1 ([B, S, H] -> [B, S/tp, H]); backward all-gather.
// REQUIRES: S % tp == 0 (EngineError).
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const Group& tp);
// Forward keeps this rank's slice of dim 1; backward all-gathers dim 1.
// REQUIRES: S % tp == 0 (EngineError).
at::Tensor scatter_to_sequence_region(const at::Tensor& x, const Group& tp);

// Sums each tensor's .grad() over `group` in place (one flattened all-reduce;
// tensors without a gradient are skipped, and every rank must skip the same
// ones). With sequence parallelism, parameters replicated over tp that see only
// this rank's part of the sequence (norm weights, RowParallelLinear's bias)
// have partial gradients; call this over tp after backward to complete them.
// Collective over `group`, blocking.
void all_reduce_grads(const std::vector<at::Tensor>& params, const Group& group);

// Plain (non-differentiable) collectives on tensors of any layout. Collective
// over `group`, blocking; size 1 returns the input.
namespace collective {
// Sum (or max with `max`) over the group; returns a new tensor.
at::Tensor all_reduce(const at::Tensor& x, const Group& group,
                      c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM);
// Concatenation of every rank's `x` along `dim`, in group-rank order.
at::Tensor all_gather(const at::Tensor& x, int64_t dim, const Group& group);
// This rank's 1/size slice along `dim` of the sum over the group.
at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const Group& group);
// This rank's 1/size slice along `dim` (a contiguous copy); EngineError if
// the dim does not divide.
at::Tensor split(const at::Tensor& x, int64_t dim, const Group& group);
}  // namespace collective

namespace detail {
// Keep a Group in a custom autograd function's context for its backward.
void save_group(torch::autograd::AutogradContext* ctx, const Group& group);
// REQUIRES: save_group was called on ctx. Valid while ctx lives.
const Group& saved_group(torch::autograd::AutogradContext* ctx);
}  // namespace detail

}  // namespace baton::engine
