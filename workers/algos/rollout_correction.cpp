#include "workers/algos/rollout_correction.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>

#include "workers/algos/masked_reductions.h"

namespace baton::algos {
namespace {

constexpr double kBound = kRolloutCorrectionSafetyBound;

const std::vector<std::string>& rs_options() {
  static const std::vector<std::string> options = {
      "token_k1",    "token_k2",    "token_k3",    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
      "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"};
  return options;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string_view trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

// The non-empty, trimmed comma-separated parts of `text`.
std::vector<std::string> comma_parts(std::string_view text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string_view part = trimmed(text.substr(start, end - start));
    if (!part.empty()) parts.emplace_back(part);
    start = end + 1;
  }
  return parts;
}

// `text` as a number (the whole of it), or nullopt.
std::optional<double> number(std::string_view text) {
  const std::string s(trimmed(text));
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

bool is_k1(std::string_view option) {
  return option.size() >= 2 && option.substr(option.size() - 2) == "k1";
}

double item(const at::Tensor& t) { return t.item<double>(); }

at::Tensor float_mask(const at::Tensor& mask, const at::Tensor& like) {
  return mask.to(like.scalar_type());
}

// Largest / smallest of `values` where `valid`.
double masked_max(const at::Tensor& values, const at::Tensor& valid) {
  return item(values.masked_fill(valid.logical_not(), -INFINITY).max());
}
double masked_min(const at::Tensor& values, const at::Tensor& valid) {
  return item(values.masked_fill(valid.logical_not(), INFINITY).min());
}

// torch.std's default (Bessel-corrected) of a 1-D tensor; 0 for one element.
double sample_std(const at::Tensor& v) { return v.numel() > 1 ? item(v.std()) : 0.0; }

void check_mask_has_tokens(const at::Tensor& mask, const char* fn) {
  if (!mask.ne(0).any().item<bool>())
    throw baton::InvalidArgument(std::string(fn) +
                                 ": response_mask must contain at least one valid token (1)");
}

void check_same_shape(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                      const char* b_name, const char* fn) {
  if (a.dim() != 2 || a.sizes() != b.sizes())
    throw baton::InvalidArgument(std::string(fn) + ": " + a_name + " " + c10::str(a.sizes()) +
                                 " and " + b_name + " " + c10::str(b.sizes()) +
                                 " must both be [B, L]");
}

// verl's compute_is_metrics: the applied weights give mean, std and ESS; the
// raw ones (before TIS / IcePop) the fractions beyond the bounds.
CorrectionMetrics is_metrics(const at::Tensor& weights, const at::Tensor& raw,
                             const at::Tensor& log_ratio_for_metrics, const at::Tensor& mask,
                             RolloutIsLevel level, double upper, double lower) {
  CorrectionMetrics m;
  const at::Tensor valid = mask.ne(0);
  if (level == RolloutIsLevel::Sequence) {
    // Over every row's Σ log r (an empty row's is 0), in log space: the
    // maximum may be far beyond what a weight can hold.
    m["rollout_is_max"] = std::exp(std::min(item(log_ratio_for_metrics.max()), kBound));
    m["rollout_is_min"] = std::exp(item(log_ratio_for_metrics.min()));
    m["rollout_is_mean"] = item(masked_mean(weights, mask));
    m["rollout_is_ratio_fraction_high"] =
        item(log_ratio_for_metrics.gt(std::log(upper)).to(at::kDouble).mean());
    m["rollout_is_ratio_fraction_low"] =
        item(log_ratio_for_metrics.lt(std::log(lower)).to(at::kDouble).mean());
  } else {
    m["rollout_is_mean"] = item(masked_mean(weights, mask));
    m["rollout_is_ratio_fraction_high"] = item(masked_mean(raw.gt(upper).to(raw.dtype()), mask));
    m["rollout_is_ratio_fraction_low"] = item(masked_mean(raw.lt(lower).to(raw.dtype()), mask));
    m["rollout_is_max"] = masked_max(weights, valid);
    m["rollout_is_min"] = masked_min(weights, valid);
  }
  const at::Tensor bounded = weights.clamp(0.0, upper);
  const at::Tensor bounded_mean = masked_mean(bounded, mask);
  if (item(valid.sum()) > 1) {
    const at::Tensor var = masked_mean(bounded.square(), mask) - bounded_mean.square();
    m["rollout_is_std"] = std::sqrt(std::max(item(var), 0.0));
  } else {
    m["rollout_is_std"] = 0.0;
  }
  const at::Tensor normalized = bounded / (bounded_mean + 1e-8);
  m["rollout_is_eff_sample_size"] = 1.0 / item(masked_mean(normalized.square(), mask));

  const at::Tensor seq_mean = masked_mean(weights, mask, -1);
  m["rollout_is_seq_mean"] = item(seq_mean.mean());
  m["rollout_is_seq_std"] = sample_std(seq_mean);
  m["rollout_is_seq_max"] = item(seq_mean.max());
  m["rollout_is_seq_min"] = item(seq_mean.min());
  m["rollout_is_seq_max_deviation"] = item((seq_mean - 1.0).abs().max());
  // The raw per-sequence mean: a mean of truncated weights never exceeds
  // the bound, so the high fraction would always read 0.
  const at::Tensor raw_seq_mean = masked_mean(raw, mask, -1);
  m["rollout_is_seq_fraction_high"] = item(raw_seq_mean.gt(upper).to(at::kDouble).mean());
  m["rollout_is_seq_fraction_low"] = item(raw_seq_mean.lt(lower).to(at::kDouble).mean());
  return m;
}

// verl's compute_rs_metrics for one criterion. `stat`: the per-token
// statistic ([B, L]; a sequence criterion's value broadcast); `seq_stat`:
// the per-sequence one (undefined for token criteria: then each row's
// masked mean of `stat`).
void rs_metrics(CorrectionMetrics& m, const std::string& option, const at::Tensor& stat,
                const at::Tensor& seq_stat_or_none, const at::Tensor& mask,
                const at::Tensor& seq_valid, bool sequence_level, double upper, double lower,
                bool apply_lower) {
  const std::string p = "rollout_rs_" + option;
  const at::Tensor valid = mask.ne(0);
  const at::Tensor seq_stat =
      seq_stat_or_none.defined() ? seq_stat_or_none : masked_mean(stat, mask, -1);
  const at::Tensor seq_values = seq_stat.masked_select(seq_valid);
  const bool have_seqs = seq_values.numel() > 0;
  auto fraction = [](const at::Tensor& b) { return item(b.to(at::kDouble).mean()); };

  m[p + "_mean"] = item(masked_mean(stat, mask));
  if (sequence_level && have_seqs) {
    m[p + "_max"] = item(seq_values.max());
    m[p + "_min"] = item(seq_values.min());
    m[p + "_fraction_high"] = fraction(seq_values.gt(upper));
    m[p + "_fraction_low"] = apply_lower ? fraction(seq_values.lt(lower)) : 0.0;
  } else {
    m[p + "_max"] = masked_max(stat, valid);
    m[p + "_min"] = masked_min(stat, valid);
    m[p + "_fraction_high"] = item(masked_mean(stat.gt(upper).to(stat.dtype()), mask));
    m[p + "_fraction_low"] =
        apply_lower ? item(masked_mean(stat.lt(lower).to(stat.dtype()), mask)) : 0.0;
  }
  if (item(valid.sum()) > 1) {
    const at::Tensor bounded = stat.clamp(apply_lower ? lower : 0.0, upper);
    const at::Tensor mean = masked_mean(bounded, mask);
    const at::Tensor var = masked_mean(bounded.square(), mask) - mean.square();
    m[p + "_std"] = std::sqrt(std::max(item(var), 0.0));
  } else {
    m[p + "_std"] = 0.0;
  }
  if (have_seqs) {
    m[p + "_seq_mean"] = item(seq_values.mean());
    m[p + "_seq_std"] = sample_std(seq_values);
    m[p + "_seq_max"] = item(seq_values.max());
    m[p + "_seq_min"] = item(seq_values.min());
    m[p + "_seq_max_deviation"] = item(seq_values.abs().max());
    m[p + "_seq_fraction_high"] = fraction(seq_values.gt(upper));
    if (apply_lower) m[p + "_seq_fraction_low"] = fraction(seq_values.lt(lower));
  } else {
    for (const char* k : {"_seq_mean", "_seq_std", "_seq_max", "_seq_min", "_seq_max_deviation",
                          "_seq_fraction_high", "_seq_fraction_low"})
      m[p + k] = 0.0;
  }
}

}  // namespace

RolloutIsLevel parse_rollout_is_level(std::string_view level) {
  if (level == "token") return RolloutIsLevel::Token;
  if (level == "sequence") return RolloutIsLevel::Sequence;
  throw baton::InvalidArgument("rollout_is = '" + std::string(level) +
                               "' is not one of: token, sequence (or null: no weights)");
}

RolloutIsThreshold parse_rollout_is_threshold(std::string_view spec) {
  const std::string text(trimmed(spec));
  auto bad = [&](const std::string& why) {
    return baton::InvalidArgument("rollout_is_threshold = '" + std::string(spec) + "': " + why +
                                  " (a number U: truncate the weights at U; \"L_U\": zero "
                                  "weights outside [L, U])");
  };
  if (text.empty()) throw bad("empty");
  RolloutIsThreshold t;
  const size_t sep = text.find('_');
  const std::optional<double> upper =
      number(sep == std::string::npos ? text : text.substr(sep + 1));
  if (!upper) throw bad("not a number");
  t.upper = *upper;
  if (sep != std::string::npos) {
    const std::optional<double> lower = number(text.substr(0, sep));
    if (!lower) throw bad("not a number");
    t.lower = *lower;
  }
  if (!(t.upper > 0)) throw bad("the upper bound must be positive");
  if (t.lower && !(*t.lower > 0)) throw bad("the lower bound must be positive");
  if (t.lower && *t.lower > t.upper) throw bad("the lower bound must be <= the upper bound");
  return t;
}

std::vector<RejectionCriterion> parse_rollout_rs(std::string_view options,
                                                 std::string_view thresholds) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (std::string& o : comma_parts(options)) {
    if (std::find(rs_options().begin(), rs_options().end(), o) == rs_options().end())
      throw baton::InvalidArgument("rollout_rs option '" + o +
                                   "' is not one of: " + joined(rs_options()));
    if (seen.insert(o).second) names.push_back(std::move(o));
  }
  if (names.empty())
    throw baton::InvalidArgument("rollout_rs = '" + std::string(options) +
                                 "' names no option (one of: " + joined(rs_options()) + ")");
  std::vector<std::string> specs = comma_parts(thresholds);
  if (specs.empty())
    throw baton::InvalidArgument("rollout_rs_threshold must be given with rollout_rs = '" +
                                 std::string(options) + "'");
  if (specs.size() != 1 && specs.size() != names.size())
    throw baton::InvalidArgument("rollout_rs_threshold = '" + std::string(thresholds) + "' has " +
                                 std::to_string(specs.size()) + " values; rollout_rs has " +
                                 std::to_string(names.size()) +
                                 " options: give one threshold shared by all, or one per option");
  if (specs.size() == 1) specs.assign(names.size(), specs[0]);

  std::vector<RejectionCriterion> criteria;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& spec = specs[i];
    auto bad = [&](const std::string& why) {
      return baton::InvalidArgument("rollout_rs_threshold '" + spec + "' for option '" + names[i] +
                                    "': " + why);
    };
    RejectionCriterion c;
    c.option = names[i];
    const size_t sep = spec.find('_');
    if (is_k1(c.option)) {
      const std::optional<double> upper =
          number(sep == std::string::npos ? spec : spec.substr(sep + 1));
      const std::optional<double> lower =
          sep == std::string::npos ? (upper ? std::optional<double>(1.0 / *upper) : std::nullopt)
                                   : number(spec.substr(0, sep));
      if (!upper || !lower) throw bad("not a number (k1 options take \"L_U\" or U)");
      if (!(*upper > 0) || !(*lower > 0)) throw bad("the bounds must be positive");
      if (*lower > *upper) throw bad("the lower bound must be <= the upper bound");
      c.upper = *upper;
      c.lower = *lower;
    } else {
      if (sep != std::string::npos)
        throw bad("a single upper bound without '_' (only k1 options take \"L_U\")");
      const std::optional<double> upper = number(spec);
      if (!upper) throw bad("not a number");
      if (!(*upper > 0)) throw bad("the bound must be positive");
      c.upper = *upper;
    }
    criteria.push_back(std::move(c));
  }
  return criteria;
}

RolloutIsWeights compute_rollout_is_weights(const at::Tensor& log_ratio, const at::Tensor& mask,
                                            RolloutIsLevel level,
                                            const RolloutIsThreshold& threshold,
                                            bool batch_normalize) {
  check_same_shape(log_ratio, "log_ratio", mask, "mask", "compute_rollout_is_weights");
  check_mask_has_tokens(mask, "compute_rollout_is_weights");
  c10::NoGradGuard no_grad;
  const at::Tensor lr = log_ratio.detach();
  const at::Tensor m = float_mask(mask, lr);
  at::Tensor for_metrics, raw;
  if (level == RolloutIsLevel::Token) {
    for_metrics = lr;
    raw = lr.clamp(-kBound, kBound).exp();
  } else {
    for_metrics = masked_sum(lr, mask, -1).unsqueeze(-1);  // [B, 1]
    raw = for_metrics.clamp(-kBound, kBound).exp().expand_as(lr);
  }
  raw = raw * m;
  const double upper = threshold.upper;
  const double lower = threshold.lower.value_or(1.0 / upper);
  at::Tensor weights = threshold.lower ? at::where(raw.ge(lower).logical_and(raw.le(upper)), raw,
                                                   at::zeros({}, raw.options()))
                                       : raw.clamp_max(upper);
  RolloutIsWeights out;
  out.metrics = is_metrics(weights, raw, for_metrics, mask, level, upper, lower);
  if (threshold.lower)
    out.metrics["rollout_is_oob_ratio"] =
        item(masked_mean(raw.lt(lower).logical_or(raw.gt(upper)).to(raw.dtype()), mask));
  if (batch_normalize) {
    at::Tensor mean;
    if (level == RolloutIsLevel::Token) {
      mean = masked_mean(weights, mask);
    } else {
      const at::Tensor seq_weights = masked_mean(weights, mask, -1);
      const at::Tensor seq_mask = mask.ne(0).sum(-1).gt(0).to(weights.dtype());
      mean = (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8);
    }
    const double factor = item(mean);
    if (factor > 1e-8) {
      weights = weights / mean;
      out.metrics["rollout_is_batch_norm_factor"] = factor;
    } else {
      out.metrics["rollout_is_batch_norm_factor"] = 1.0;
    }
  }
  out.weights = weights.contiguous();
  return out;
}

RolloutRejection compute_rollout_rejection_mask(const at::Tensor& log_ratio, const at::Tensor& mask,
                                                const std::vector<RejectionCriterion>& criteria) {
  check_same_shape(log_ratio, "log_ratio", mask, "mask", "compute_rollout_rejection_mask");
  if (criteria.empty())
    throw baton::InvalidArgument("compute_rollout_rejection_mask: no rejection criterion");
  RolloutRejection out;
  if (log_ratio.size(0) == 0) {
    out.response_mask = mask;
    return out;
  }
  c10::NoGradGuard no_grad;
  const at::Tensor lr = log_ratio.detach().clamp(-kBound, kBound);
  const at::Tensor m = float_mask(mask, lr);
  const at::Tensor valid = mask.ne(0);
  const at::Tensor seq_valid = valid.any(-1);
  const at::Tensor k1 = -lr;
  const at::Tensor k2 = 0.5 * lr.square();
  const at::Tensor k3 = lr.exp() - 1.0 - lr;
  at::Tensor combined = at::ones_like(lr);
  for (const RejectionCriterion& c : criteria) {
    const std::string& o = c.option;
    const bool k1_option = is_k1(o);
    const at::Tensor& token_stat = k1_option ? k1 : (o.back() == '2' ? k2 : k3);
    // k1 bounds compare in log space; the others as given.
    const double upper = k1_option ? std::log(c.upper) : c.upper;
    const double lower = k1_option ? std::log(*c.lower) : 0.0;
    auto keep_of = [&](const at::Tensor& s) {
      return k1_option ? s.ge(lower).logical_and(s.le(upper)) : s.le(upper);
    };
    at::Tensor stat, seq_stat, keep;
    const bool token_level = o.rfind("token_", 0) == 0;
    if (token_level) {
      stat = token_stat;
      keep = keep_of(stat);
    } else {
      if (o.rfind("seq_sum_", 0) == 0) {
        seq_stat = masked_sum(token_stat, mask, -1);
      } else if (o.rfind("seq_mean_", 0) == 0) {
        seq_stat = masked_mean(token_stat, mask, -1);
      } else {  // seq_max_: rows without a valid token get 0
        const at::Tensor mx = token_stat.masked_fill(valid.logical_not(), -INFINITY).amax(-1);
        seq_stat = at::where(mx.isneginf(), at::zeros_like(mx), mx);
      }
      keep = keep_of(seq_stat).unsqueeze(-1).expand_as(valid);
      stat = seq_stat.unsqueeze(-1).expand_as(lr);
    }
    const at::Tensor keep_f = keep.to(lr.dtype());
    combined = combined * keep_f;
    rs_metrics(out.metrics, o, stat, seq_stat, mask, seq_valid, !token_level, upper, lower,
               k1_option);
    const at::Tensor seq_keep = keep.logical_not().logical_and(valid).any(-1).logical_not();
    out.metrics["rollout_rs_" + o + "_masked_fraction"] = item(masked_mean(1.0 - keep_f, mask));
    const at::Tensor sv = seq_valid.to(lr.dtype());
    const double nonempty = item(sv.sum());
    out.metrics["rollout_rs_" + o + "_seq_masked_fraction"] =
        nonempty > 0 ? item(((1.0 - seq_keep.to(lr.dtype())) * sv).sum()) / nonempty : 0.0;
  }
  out.metrics["rollout_rs_masked_fraction"] = item(masked_mean(1.0 - combined, mask));
  const at::Tensor final_keep = combined.gt(0.5).logical_and(valid);
  out.metrics["rollout_rs_seq_masked_fraction"] =
      item(final_keep.logical_not().logical_and(valid).any(-1).to(at::kDouble).mean());
  out.response_mask = (m * combined).to(mask.scalar_type());
  return out;
}

CorrectionMetrics compute_offpolicy_metrics(const at::Tensor& old_log_prob,
                                            const at::Tensor& rollout_log_prob,
                                            const at::Tensor& mask) {
  check_same_shape(old_log_prob, "old_log_prob", rollout_log_prob, "rollout_log_prob",
                   "compute_offpolicy_metrics");
  check_same_shape(old_log_prob, "old_log_prob", mask, "response_mask",
                   "compute_offpolicy_metrics");
  check_mask_has_tokens(mask, "compute_offpolicy_metrics");
  c10::NoGradGuard no_grad;
  const at::Tensor old = old_log_prob.detach(), rollout = rollout_log_prob.detach();
  CorrectionMetrics m;
  const at::Tensor train_mean = masked_mean(old, mask, -1);  // [B]
  m["training_ppl"] = item((-train_mean).exp().mean());
  m["training_log_ppl"] = item((-train_mean).mean());
  m["kl"] = item(masked_mean(rollout - old, mask));
  const at::Tensor lr = old - rollout;
  m["k3_kl"] = item(masked_mean(lr.exp() - lr - 1.0, mask));
  const at::Tensor rollout_mean = masked_mean(rollout, mask, -1);
  m["rollout_ppl"] = item((-rollout_mean).exp().mean());
  m["rollout_log_ppl"] = item((-rollout_mean).mean());
  const at::Tensor diff = rollout_mean - train_mean;
  m["log_ppl_diff"] = item(diff.mean());
  m["log_ppl_abs_diff"] = item(diff.abs().mean());
  m["log_ppl_diff_max"] = item(diff.max());
  m["log_ppl_diff_min"] = item(diff.min());
  m["ppl_ratio"] = item(diff.exp().mean());
  m["chi2_token"] = item(masked_mean(lr.clamp(-kBound, kBound).exp().square(), mask)) - 1.0;
  const at::Tensor seq_sum = masked_sum(lr, mask, -1).clamp(-kBound, kBound);
  m["chi2_seq"] = item((2.0 * seq_sum).exp().mean()) - 1.0;
  return m;
}

RolloutCorrection compute_rollout_correction(const at::Tensor& old_log_prob,
                                             const at::Tensor& rollout_log_prob,
                                             const at::Tensor& mask,
                                             const RolloutCorrectionOptions& options) {
  check_same_shape(old_log_prob, "old_log_prob", rollout_log_prob, "rollout_log_prob",
                   "compute_rollout_correction");
  check_same_shape(old_log_prob, "old_log_prob", mask, "response_mask",
                   "compute_rollout_correction");
  check_mask_has_tokens(mask, "compute_rollout_correction");
  c10::NoGradGuard no_grad;
  const at::Tensor log_ratio = old_log_prob.detach() - rollout_log_prob.detach();
  RolloutCorrection out;
  CorrectionMetrics metrics;
  if (options.rollout_is) {
    RolloutIsWeights w = compute_rollout_is_weights(log_ratio, mask, *options.rollout_is,
                                                    options.is_threshold, options.batch_normalize);
    out.rollout_is_weights = w.weights;
    metrics.merge(w.metrics);
  }
  out.response_mask = mask;
  if (!options.rejection.empty()) {
    RolloutRejection r = compute_rollout_rejection_mask(log_ratio, mask, options.rejection);
    out.response_mask = r.response_mask;
    metrics.merge(r.metrics);
  }
  metrics.merge(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, mask));
  for (const auto& [k, v] : metrics) out.metrics["rollout_corr/" + k] = v;
  return out;
}

}  // namespace baton::algos
