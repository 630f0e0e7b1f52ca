#include "workers/algos/agg_loss.h"

#include <stdexcept>
#include <string>

#include "base/errors.h"
#include "workers/algos/masked_reductions.h"

namespace baton::algos {
namespace {

struct ModeName {
  LossAggMode mode;
  std::string_view name;
};
constexpr ModeName kModes[] = {
    {LossAggMode::TokenMean, "token-mean"},
    {LossAggMode::TokenSum, "token-sum"},
    {LossAggMode::SeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggMode::SeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggMode::SeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
};

// Without global info a DP rank would normalise by its own share only, and the
// all-reduce would then average means of unequal parts: refuse instead.
[[noreturn]] void missing_global(std::string_view mode, std::string_view field, int64_t dp) {
  throw baton::InvalidArgument("agg_loss(" + std::string(mode) + "): dp_size is " +
                              std::to_string(dp) + " but GlobalBatchInfo::" + std::string(field) +
                              " is not set; the engine must pass the mini-batch's global " +
                              std::string(field) + " when data parallelism is used");
}

// Σ_i nonempty_i · per_row_i / S · D.
at::Tensor seq_mean(const at::Tensor& per_row, const at::Tensor& mask, LossAggMode mode,
                    const GlobalBatchInfo& info) {
  const at::Tensor nonempty = mask.ne(0).any(-1);
  const at::Tensor total = at::where(nonempty, per_row, at::zeros({}, per_row.options())).sum();
  if (info.global_batch_size) return total / *info.global_batch_size * info.dp_size;
  if (info.dp_size > 1) missing_global(to_string(mode), "global_batch_size", info.dp_size);
  return total / nonempty.sum();
}

}  // namespace

LossAggMode parse_loss_agg_mode(std::string_view name) {
  for (const ModeName& m : kModes)
    if (m.name == name) return m.mode;
  std::string known;
  for (const ModeName& m : kModes) known += (known.empty() ? "" : ", ") + std::string(m.name);
  throw baton::InvalidArgument("unknown loss_agg_mode '" + std::string(name) + "'; known: " + known);
}

std::string_view to_string(LossAggMode mode) {
  for (const ModeName& m : kModes)
    if (m.mode == mode) return m.name;
  throw baton::InvalidArgument("to_string: invalid LossAggMode " +
                              std::to_string(static_cast<int>(mode)));
}

at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    const GlobalBatchInfo& info) {
  if (loss_mat.sizes() != mask.sizes() || loss_mat.dim() != 2)
    throw baton::InvalidArgument("agg_loss: loss_mat and mask must both be [B, L]; got loss_mat " +
                                c10::str(loss_mat.sizes()) + " and mask " + c10::str(mask.sizes()));
  if (info.dp_size < 1)
    throw baton::InvalidArgument("agg_loss: GlobalBatchInfo::dp_size must be >= 1, got " +
                                std::to_string(info.dp_size));
  const double dp = static_cast<double>(info.dp_size);
  switch (mode) {
    case LossAggMode::TokenMean: {
      const at::Tensor total = masked_sum(loss_mat, mask);
      if (info.batch_num_tokens) return total / *info.batch_num_tokens * dp;
      if (info.dp_size > 1) missing_global(to_string(mode), "batch_num_tokens", info.dp_size);
      return total / mask.ne(0).sum();
    }
    case LossAggMode::TokenSum:
      return masked_sum(loss_mat, mask) * dp;
    case LossAggMode::SeqMeanTokenSum:
      return seq_mean(masked_sum(loss_mat, mask, -1), mask, mode, info);
    case LossAggMode::SeqMeanTokenMean:
      return seq_mean(masked_mean(loss_mat, mask, -1), mask, mode, info);
    case LossAggMode::SeqMeanTokenSumNorm: {
      const double scale = info.loss_scale_factor.value_or(static_cast<double>(loss_mat.size(-1)));
      return seq_mean(masked_sum(loss_mat, mask, -1), mask, mode, info) / scale;
    }
  }
  throw baton::InvalidArgument("agg_loss: invalid LossAggMode " +
                              std::to_string(static_cast<int>(mode)));
}

}  // namespace baton::algos
