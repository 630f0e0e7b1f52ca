// Per-token entropy of the policy's distribution, and the entropy bonus term
// of the actor objective (loss − entropy_coeff · compute_entropy_loss).
//
// Example:
//   at::Tensor h = compute_entropy_loss(logits, response_mask);   // 0-dim
#pragma once

#include <ATen/ATen.h>

#include "workers/algos/agg_loss.h"

namespace baton::algos {

// logsumexp(z) − Σ softmax(z)·z over the last dim: [..., V] → [...].
at::Tensor entropy_from_logits(const at::Tensor& logits);

// agg_loss(entropy_from_logits(logits), mask, mode, info); logits [B, L, V].
at::Tensor compute_entropy_loss(const at::Tensor& logits, const at::Tensor& mask,
                                LossAggMode mode = LossAggMode::TokenMean,
                                const GlobalBatchInfo& info = {});

}  // namespace baton::algos
