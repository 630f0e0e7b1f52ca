// agg_loss: how a per-token loss matrix [B, L] becomes the scalar a micro-batch
// calls backward on, in verl's five loss_agg_modes, locally or normalised over
// the whole optimizer mini-batch across micro-batches and DP ranks.
//
// Global normalisation (what the engine does): T = valid tokens of the whole
// mini-batch summed over DP ranks, S = its number of sequences (empty ones
// included), D = DP size. Each micro-batch calls backward on its own
// agg_loss(..., info); gradients add up over micro-batches and the DP
// all-reduce divides by D, so the update is the global mean whatever the
// split: Σ_micro-batches agg_loss / D equals the unsplit value.
//
// Example:
//   GlobalBatchInfo info;  info.dp_size = 2;  info.batch_num_tokens = 4096;
//   at::Tensor loss = agg_loss(pg_losses, response_mask, LossAggMode::TokenMean, info);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/errors.h"

namespace baton::algos {

enum class LossAggMode {
  TokenMean,
  TokenSum,
  SeqMeanTokenSum,
  SeqMeanTokenMean,
  SeqMeanTokenSumNorm
};

// "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
// "seq-mean-token-sum-norm"; anything else throws baton::InvalidArgument naming
// the value and the known modes.
LossAggMode parse_loss_agg_mode(std::string_view name);
// The config spelling of a mode (inverse of parse_loss_agg_mode).
std::string_view to_string(LossAggMode mode);

// Filled by the engine for each optimizer mini-batch; all empty (and
// dp_size 1) means local normalisation within the micro-batch.
struct GlobalBatchInfo {
  int64_t dp_size = 1;
  std::optional<double> batch_num_tokens;   // valid tokens in the whole mini-batch, all DP ranks
  std::optional<double> global_batch_size;  // sequences in the whole mini-batch, all DP ranks
  std::optional<double> loss_scale_factor;  // only for seq-mean-token-sum-norm
};

// With D = dp_size, T = batch_num_tokens, S = global_batch_size,
// C = loss_scale_factor, seq_i = Σ_t loss·mask, nonempty_i = Σ_t mask > 0:
//   token-mean               Σ loss·mask / T · D   (T absent: local Σ mask; throws if D > 1)
//   token-sum                Σ loss·mask · D
//   seq-mean-token-sum       Σ_i nonempty_i·seq_i / S · D
//                            (S absent: local count of nonempty rows; throws if D > 1)
//   seq-mean-token-mean      the same with seq_i / (Σ_t mask + 1e-8)
//   seq-mean-token-sum-norm  seq-mean-token-sum / C   (C absent: L, the padded width)
// Local normalisation of an all-zero mask gives NaN (0/0) in every mode but
// token-sum, with a zero gradient. Loss values at masked positions are ignored.
// Throws baton::InvalidArgument for mismatched shapes or dp_size < 1.
at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    const GlobalBatchInfo& info = {});

}  // namespace baton::algos
