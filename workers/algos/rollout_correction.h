// Rollout correction (verl's algorithm.rollout_correction, "decoupled" mode):
// the rollout engine samples with its own log-probs π_rollout, the trainer
// recomputes π_old; per token, log r = old_log_prob − rollout_log_prob. From
// it come
//   - importance-sampling weights (rollout_is): token-level r, or
//     sequence-level Π r, truncated at an upper bound (TIS) or zeroed outside
//     [lower, upper] (IcePop), for the policy loss to multiply by
//     (the batch's `rollout_is_weights`);
//   - rejection sampling (rollout_rs): tokens or whole sequences whose
//     divergence estimate is out of bounds leave the response mask;
//   - off-policy diagnostics (KL, perplexities, χ²).
// Every metric has verl's name under "rollout_corr/". Weights and masks are
// data (computed without gradient); results have the log-probs' dtype and
// device, the mask keeps its dtype.
//
// Example (the trainer's advantage phase):
//   RolloutCorrectionOptions o;
//   o.rollout_is = RolloutIsLevel::Token;                       // TIS
//   o.is_threshold = parse_rollout_is_threshold("2.0");
//   o.rejection = parse_rollout_rs("seq_mean_k3", "0.01");      // MIS
//   RolloutCorrection c = compute_rollout_correction(old_lp, rollout_lp, mask, o);
//   batch.set_tensor("rollout_is_weights", c.rollout_is_weights);
//   batch.set_tensor("response_mask", c.response_mask);
//
// Errors (bad specs, shapes, an empty mask) throw baton::InvalidArgument
// naming the argument and what is accepted.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace baton::algos {

// log-ratios are clamped to ±20 before exponentiating (verl's SAFETY_BOUND).
inline constexpr double kRolloutCorrectionSafetyBound = 20.0;

// rollout_is: one weight per token, or Π_t r_t broadcast over the sequence.
enum class RolloutIsLevel { Token, Sequence };

// "token" | "sequence"; throws otherwise.
RolloutIsLevel parse_rollout_is_level(std::string_view level);

// rollout_is_threshold: "U" (a number: TIS, weights clamped to ≤ U) or
// "L_U" (IcePop: weights outside [L, U] become 0). 0 < L ≤ U.
struct RolloutIsThreshold {
  double upper = 2.0;
  std::optional<double> lower;  // set: IcePop
};
RolloutIsThreshold parse_rollout_is_threshold(std::string_view spec);

// One rejection criterion of rollout_rs. `option` is one of
//   token_k1, token_k2, token_k3, seq_sum_k1, seq_sum_k2, seq_sum_k3,
//   seq_mean_k1, seq_mean_k2, seq_mean_k3, seq_max_k2, seq_max_k3
// with the per-token divergences k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r
// (log r clamped to ±20), taken per token or summed / averaged / maximised
// over the sequence's valid tokens. k2/k3 keep a token or sequence when the
// statistic is ≤ upper; k1 keeps it when log(lower) ≤ statistic ≤ log(upper)
// (verl compares −log r with the log of the bounds as given).
struct RejectionCriterion {
  std::string option;
  double upper = 0;
  std::optional<double> lower;  // k1 only
};

// rollout_rs: a comma-separated list of options (duplicates dropped, order
// kept); rollout_rs_threshold: one spec shared by every option or one per
// option, comma-separated. A k1 spec is "L_U" or "U" (then L = 1/U); others
// take one positive upper bound. Throws naming the bad option or spec.
std::vector<RejectionCriterion> parse_rollout_rs(std::string_view options,
                                                 std::string_view thresholds);

using CorrectionMetrics = std::map<std::string, double>;

struct RolloutIsWeights {
  at::Tensor weights;         // [B, L], 0 on padding
  CorrectionMetrics metrics;  // rollout_is_* (no "rollout_corr/" prefix)
};

// IS weights from `log_ratio` = old − rollout [B, L] (verl's
// compute_rollout_correction_weights): raw weights exp(clamp(log r)) per
// token, or exp(clamp(Σ_t log r·mask)) per sequence, times mask; then TIS or
// IcePop; with `batch_normalize` divided by their mean (over valid tokens,
// or over the non-empty sequences' per-sequence means) when it exceeds 1e-8.
// Metrics: rollout_is_{mean,max,min,std,eff_sample_size,ratio_fraction_high,
// ratio_fraction_low,seq_mean,seq_std,seq_max,seq_min,seq_max_deviation,
// seq_fraction_high,seq_fraction_low}, rollout_is_oob_ratio (IcePop) and
// rollout_is_batch_norm_factor (batch_normalize). Throws for an all-zero mask.
RolloutIsWeights compute_rollout_is_weights(const at::Tensor& log_ratio, const at::Tensor& mask,
                                            RolloutIsLevel level,
                                            const RolloutIsThreshold& threshold,
                                            bool batch_normalize = false);

struct RolloutRejection {
  at::Tensor response_mask;   // mask with every rejected token set to 0, mask's dtype
  CorrectionMetrics metrics;  // rollout_rs_* (no prefix)
};

// Rejection sampling (verl's compute_rollout_rejection_mask): a token stays
// only where every criterion keeps it (a sequence criterion keeps or drops
// all of a row's tokens). Metrics per option rollout_rs_<option>_{mean,max,
// min,fraction_high,fraction_low,std,seq_mean,seq_std,seq_max,seq_min,
// seq_max_deviation,seq_fraction_high,masked_fraction,seq_masked_fraction}
// (and _seq_fraction_low for k1), and rollout_rs_masked_fraction,
// rollout_rs_seq_masked_fraction over all criteria.
RolloutRejection compute_rollout_rejection_mask(const at::Tensor& log_ratio, const at::Tensor& mask,
                                                const std::vector<RejectionCriterion>& criteria);

// verl's compute_offpolicy_metrics (no prefix): training_ppl,
// training_log_ppl, kl, k3_kl, rollout_ppl, rollout_log_ppl, log_ppl_diff,
// log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min, ppl_ratio,
// chi2_token, chi2_seq. Per-sequence values are means over every row (an
// empty row counts with log-prob mean 0).
CorrectionMetrics compute_offpolicy_metrics(const at::Tensor& old_log_prob,
                                            const at::Tensor& rollout_log_prob,
                                            const at::Tensor& mask);

struct RolloutCorrectionOptions {
  std::optional<RolloutIsLevel> rollout_is;  // none: no weights
  RolloutIsThreshold is_threshold;
  bool batch_normalize = false;               // rollout_is_batch_normalize
  std::vector<RejectionCriterion> rejection;  // empty: no rejection

  bool enabled() const { return rollout_is.has_value() || !rejection.empty(); }
};

struct RolloutCorrection {
  at::Tensor rollout_is_weights;  // undefined without rollout_is
  at::Tensor response_mask;       // after rejection (the input's values without it)
  CorrectionMetrics metrics;      // every key prefixed "rollout_corr/"
};

// verl's compute_rollout_correction_and_rejection_mask: weights and rejection
// are both computed from the given mask, then the off-policy metrics. Throws
// for mismatched shapes or an all-zero mask.
RolloutCorrection compute_rollout_correction(const at::Tensor& old_log_prob,
                                             const at::Tensor& rollout_log_prob,
                                             const at::Tensor& mask,
                                             const RolloutCorrectionOptions& options);

}  // namespace baton::algos
