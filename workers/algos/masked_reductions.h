// Masked reductions over [B, L] tensors with 0/1 masks (int, float or bool;
// "valid" means mask != 0), with verl's constants and edge cases. Every RL
// kernel in baton::algos (advantages, losses, metrics) reduces through these.
//
// Values at masked positions never reach a result: they are selected away
// (at::where), not multiplied by 0, so NaN or Inf there are ignored and the
// gradient there is exactly 0 even when the upstream gradient is infinite.
//
// Example:
//   at::Tensor m = masked_mean(loss, response_mask);            // scalar
//   at::Tensor per_row = masked_sum(loss, response_mask, -1);   // [B]
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "base/errors.h"

namespace baton::algos {

// Σ values·mask over `dim` (every element when absent).
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask,
                      std::optional<int64_t> dim = std::nullopt);

// masked_sum / (Σ mask + 1e-8) over the same dim; an all-zero mask gives 0.
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask,
                       std::optional<int64_t> dim = std::nullopt);

// Variance over all valid elements: masked_mean((values − m)²) with
// m = masked_mean(values). `unbiased` multiplies by M/(M−1), M = Σ mask, and
// throws baton::InvalidArgument when M is 0 or 1 (this reads M back to the
// host). Without it there are no checks (M = 0 or 1 gives 0).
at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased = true);

// (values − m)·rsqrt(masked_var(unbiased) + 1e-8) over the whole tensor, applied
// to every position (masked ones are transformed, not zeroed); with
// !shift_mean the mean m is added back. Throws when fewer than 2 elements are
// valid.
at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean = true);

}  // namespace baton::algos
