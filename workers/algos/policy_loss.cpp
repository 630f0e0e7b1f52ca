#include "workers/algos/policy_loss.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "base/errors.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/clamp.h"
#include "workers/algos/masked_reductions.h"

namespace baton::algos {
namespace {

constexpr double kLogRatioClamp = 20;

void check_inputs(std::string_view name, const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                  const at::Tensor& advantages, const at::Tensor& mask,
                  const std::optional<at::Tensor>& weights) {
  const auto bad = [&](const char* what, const at::Tensor& t) {
    throw baton::InvalidArgument("policy loss '" + std::string(name) + "': " + what + " is " +
                                c10::str(t.sizes()) + " but log_prob is " +
                                c10::str(log_prob.sizes()) + " (all must be [B, L])");
  };
  if (log_prob.dim() != 2)
    throw baton::InvalidArgument("policy loss '" + std::string(name) + "': log_prob must be " +
                                "[B, L], got " + c10::str(log_prob.sizes()));
  if (old_log_prob.sizes() != log_prob.sizes()) bad("old_log_prob", old_log_prob);
  if (advantages.sizes() != log_prob.sizes()) bad("advantages", advantages);
  if (mask.sizes() != log_prob.sizes()) bad("mask", mask);
  if (weights && weights->sizes() != log_prob.sizes()) bad("rollout_is_weights", *weights);
}

double clip_low(const PolicyLossOptions& o) { return o.clip_ratio_low.value_or(o.clip_ratio); }
double clip_high(const PolicyLossOptions& o) { return o.clip_ratio_high.value_or(o.clip_ratio); }

// A metric: masked mean of a (detached) condition or value, on the host.
double metric(const at::Tensor& values, const at::Tensor& mask) {
  c10::NoGradGuard no_grad;
  return masked_mean(values.detach().to(at::kFloat), mask).item<double>();
}

at::Tensor weighted(const at::Tensor& loss, const std::optional<at::Tensor>& weights) {
  return weights ? loss * *weights : loss;
}

at::Tensor aggregate(const at::Tensor& loss, const at::Tensor& mask, const PolicyLossOptions& o,
                     const std::optional<at::Tensor>& weights) {
  return agg_loss(weighted(loss, weights), mask, o.agg, o.global);
}

at::Tensor clamped_log_ratio(const at::Tensor& old_log_prob, const at::Tensor& log_prob) {
  return clamp_inclusive(log_prob - old_log_prob, -kLogRatioClamp, kLogRatioClamp);
}

}  // namespace

PolicyLossResult policy_loss(std::string_view name, const at::Tensor& old_log_prob,
                             const at::Tensor& log_prob, const at::Tensor& advantages,
                             const at::Tensor& mask, const PolicyLossOptions& options,
                             const std::optional<at::Tensor>& rollout_is_weights) {
  return find_policy_loss(name)(old_log_prob, log_prob, advantages, mask, options,
                                rollout_is_weights);
}

PolicyLossResult vanilla_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                     const at::Tensor& advantages, const at::Tensor& mask,
                                     const PolicyLossOptions& o,
                                     const std::optional<at::Tensor>& w) {
  check_inputs("vanilla", old_log_prob, log_prob, advantages, mask, w);
  if (!(o.clip_ratio_c > 1))
    throw baton::InvalidArgument(
        "policy loss 'vanilla': clip_ratio_c must be > 1 (the dual-clip "
        "cap), got " +
        std::to_string(o.clip_ratio_c));
  const at::Tensor& A = advantages;
  const at::Tensor delta = clamped_log_ratio(old_log_prob, log_prob);
  const at::Tensor ratio = delta.exp();
  const at::Tensor l1 = -A * ratio;
  const at::Tensor l2 = -A * clamp_inclusive(ratio, 1 - clip_low(o), 1 + clip_high(o));
  const at::Tensor clipped = at::maximum(l1, l2);
  const at::Tensor l3 = -A * o.clip_ratio_c;
  const at::Tensor negative = A.lt(0);
  const at::Tensor loss = at::where(negative, at::minimum(clipped, l3), clipped);
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/pg_clipfrac"] = metric(l2.gt(l1), mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = metric(clipped.gt(l3).logical_and(negative), mask);
  return r;
}

PolicyLossResult gspo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& mask,
                                  const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs("gspo", old_log_prob, log_prob, advantages, mask, w);
  const at::Tensor& A = advantages;
  const at::Tensor delta = log_prob - old_log_prob;
  const at::Tensor lengths = at::clamp_min(mask.ne(0).sum(-1), 1);
  const at::Tensor seq_delta = masked_sum(delta, mask, -1) / lengths;
  // Value exp(δ_i) at every token of row i, gradient exp(δ_i) w.r.t. log_prob.
  const at::Tensor log_ratio = log_prob - log_prob.detach() + seq_delta.detach().unsqueeze(-1);
  const at::Tensor ratio = clamp_inclusive(log_ratio, std::nullopt, 10).exp();
  const at::Tensor l1 = -A * ratio;
  const at::Tensor l2 = -A * clamp_inclusive(ratio, 1 - clip_low(o), 1 + clip_high(o));
  const at::Tensor loss = at::maximum(l1, l2);
  PolicyLossResult r{agg_loss(weighted(loss, w), mask, LossAggMode::SeqMeanTokenMean, o.global),
                     {}};
  r.metrics["actor/pg_clipfrac"] = metric(l2.gt(l1), mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = 0.0;
  return r;
}

PolicyLossResult sapo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                  const at::Tensor& advantages, const at::Tensor& mask,
                                  const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs("sapo", old_log_prob, log_prob, advantages, mask, w);
  const at::Tensor& A = advantages;
  const at::Tensor delta = clamped_log_ratio(old_log_prob, log_prob);
  const at::Tensor ratio = delta.exp();
  const at::Tensor tau = at::where(A.gt(0), at::full({}, o.tau_pos, A.options()),
                                   at::full({}, o.tau_neg, A.options()));
  const at::Tensor gate = at::sigmoid(tau * (ratio - 1)) * (4.0 / tau);
  const at::Tensor loss = -gate * A;
  PolicyLossResult r{agg_loss(weighted(loss, w), mask, LossAggMode::SeqMeanTokenMean, o.global),
                     {}};
  r.metrics["actor/pg_clipfrac"] = 0.0;
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = 0.0;
  return r;
}

PolicyLossResult gpg_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& mask,
                                 const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs("gpg", old_log_prob, log_prob, advantages, mask, w);
  return {aggregate(-advantages * log_prob, mask, o, w), {}};
}

PolicyLossResult cispo_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                   const at::Tensor& advantages, const at::Tensor& mask,
                                   const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs("cispo", old_log_prob, log_prob, advantages, mask, w);
  const at::Tensor delta = clamped_log_ratio(old_log_prob, log_prob);
  const at::Tensor ratio = delta.exp();
  const at::Tensor clipped = at::clamp(ratio, 1 - clip_low(o), 1 + clip_high(o));
  const at::Tensor loss = -clipped.detach() * advantages * log_prob;
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/pg_clipfrac"] = metric(ratio.ne(clipped), mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = 0.0;
  return r;
}

PolicyLossResult dro_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                 const at::Tensor& advantages, const at::Tensor& mask,
                                 const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs("dro", old_log_prob, log_prob, advantages, mask, w);
  if (!o.dro_beta || !(*o.dro_beta > 0))
    throw baton::InvalidArgument("policy loss 'dro': dro_beta must be set and > 0, got " +
                                (o.dro_beta ? std::to_string(*o.dro_beta) : std::string("none")));
  const at::Tensor delta = log_prob - old_log_prob;
  const at::Tensor loss = -(advantages * log_prob - 0.5 * *o.dro_beta * delta.square());
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  return r;
}

PolicyLossResult geo_mean_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const PolicyLossOptions& o,
                                      const std::optional<at::Tensor>& w) {
  check_inputs("geo_mean", old_log_prob, log_prob, advantages, mask, w);
  const at::Tensor& A = advantages;
  const at::Tensor delta = log_prob - old_log_prob;
  const at::Tensor sign = A.sign();
  const at::Tensor delta_clamped = clamp_inclusive(delta, -clip_low(o), clip_high(o));
  const at::Tensor delta_min = sign * at::minimum(sign * delta, sign * delta_clamped);
  const at::Tensor lengths = mask.ne(0).sum(-1) + 1e-8;
  const at::Tensor ratio = (masked_sum(delta_min, mask, -1) / lengths).exp();
  const at::Tensor seq_advantage = masked_sum(A, mask, -1) / lengths;
  at::Tensor loss = -seq_advantage * ratio;
  if (w) loss = loss * (masked_sum(at::log(*w + 1e-10), mask, -1) / lengths).exp();
  // A mean over sequences: over the mini-batch's S sequences (all DP ranks,
  // times D for the DP gradient average) when the engine gives the global
  // counts, so the gradient does not depend on the micro-batch split.
  const at::Tensor total = o.global.global_batch_size
                               ? loss.sum() / *o.global.global_batch_size *
                                     static_cast<double>(o.global.dp_size)
                               : loss.mean();
  PolicyLossResult r{total, {}};
  const at::Tensor clipped = delta.ne(delta_clamped);
  r.metrics["actor/pg_clipfrac"] = metric(clipped.logical_and(A.gt(0)), mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = metric(clipped.logical_and(A.lt(0)), mask);
  return r;
}

namespace {

enum class Divergence { TotalVariation, KL };

PolicyLossResult dppo(Divergence kind, const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                      const at::Tensor& advantages, const at::Tensor& mask,
                      const PolicyLossOptions& o, const std::optional<at::Tensor>& w) {
  check_inputs(kind == Divergence::KL ? "dppo_kl" : "dppo_tv", old_log_prob, log_prob, advantages,
               mask, w);
  const at::Tensor& A = advantages;
  const at::Tensor delta = clamped_log_ratio(old_log_prob, log_prob);
  const at::Tensor ratio = delta.exp();
  const at::Tensor truncated = at::clamp_max(ratio, o.clip_ratio_c).detach();
  at::Tensor valid;
  {
    c10::NoGradGuard no_grad;
    const at::Tensor p = log_prob.detach().exp(), q = old_log_prob.exp();
    const at::Tensor positive = A.gt(0);
    if (kind == Divergence::TotalVariation) {
      valid = at::where(positive, (p - q).le(clip_high(o)), (p - q).ge(-clip_low(o)));
    } else {
      const at::Tensor b = q * (old_log_prob - log_prob.detach()) +
                           (1 - q) * at::log((1 - q + 1e-8) / (1 - p + 1e-8));
      valid = at::where(positive, b.le(clip_high(o)).logical_or(p.le(q)),
                        b.le(clip_low(o)).logical_or(p.ge(q)));
    }
  }
  const at::Tensor valid_f = valid.to(log_prob.scalar_type());
  const at::Tensor loss = -A * truncated * log_prob * valid_f;
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/pg_clipfrac"] = metric(1 - valid_f, mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  r.metrics["actor/pg_clipfrac_lower"] = metric(ratio.gt(o.clip_ratio_c).logical_and(valid), mask);
  return r;
}

}  // namespace

PolicyLossResult dppo_tv_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                     const at::Tensor& advantages, const at::Tensor& mask,
                                     const PolicyLossOptions& o,
                                     const std::optional<at::Tensor>& w) {
  return dppo(Divergence::TotalVariation, old_log_prob, log_prob, advantages, mask, o, w);
}

PolicyLossResult dppo_kl_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                     const at::Tensor& advantages, const at::Tensor& mask,
                                     const PolicyLossOptions& o,
                                     const std::optional<at::Tensor>& w) {
  return dppo(Divergence::KL, old_log_prob, log_prob, advantages, mask, o, w);
}

PolicyLossResult clip_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const PolicyLossOptions& o,
                                      const std::optional<at::Tensor>& w) {
  check_inputs("clip_cov", old_log_prob, log_prob, advantages, mask, w);
  if (!(o.clip_cov_ratio > 0))
    throw baton::InvalidArgument("policy loss 'clip_cov': clip_cov_ratio must be > 0, got " +
                                std::to_string(o.clip_cov_ratio));
  const at::Tensor& A = advantages;
  const at::Tensor delta = log_prob - old_log_prob;
  const at::Tensor ratio = delta.exp();
  const at::Tensor l1 = -A * ratio;
  const at::Tensor l2 = -A * clamp_inclusive(ratio, 1 - clip_low(o), 1 + clip_high(o));
  at::Tensor keep = at::ones_like(A);
  {
    c10::NoGradGuard no_grad;
    const at::Tensor lp = log_prob.detach();
    const at::Tensor cov = (A - masked_mean(A, mask)) * (lp - masked_mean(lp, mask));
    const at::Tensor candidates = mask.ne(0)
                                      .logical_and(l2.gt(l1).logical_not())
                                      .logical_and(cov.gt(o.clip_cov_lb))
                                      .logical_and(cov.lt(o.clip_cov_ub))
                                      .reshape(-1)
                                      .nonzero()
                                      .squeeze(-1);
    const int64_t wanted = std::max<int64_t>(
        static_cast<int64_t>(o.clip_cov_ratio * mask.ne(0).sum().item<double>()), 1);
    const int64_t picked = std::min(wanted, candidates.numel());
    if (picked > 0) {
      const at::Tensor order = at::randperm(candidates.numel(), at::kLong).to(A.device());
      keep.view(-1).index_fill_(0, candidates.index_select(0, order.narrow(0, 0, picked)), 0);
    }
  }
  const at::Tensor loss = at::maximum(l1, l2) * keep;
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/pg_clipfrac"] = metric(keep.eq(0), mask);
  r.metrics["actor/ppo_kl"] = metric(-delta, mask);
  return r;
}

PolicyLossResult kl_cov_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                    const at::Tensor& advantages, const at::Tensor& mask,
                                    const PolicyLossOptions& o,
                                    const std::optional<at::Tensor>& w) {
  check_inputs("kl_cov", old_log_prob, log_prob, advantages, mask, w);
  if (!(o.kl_cov_ratio > 0))
    throw baton::InvalidArgument("policy loss 'kl_cov': kl_cov_ratio must be > 0, got " +
                                std::to_string(o.kl_cov_ratio));
  const at::Tensor& A = advantages;
  const at::Tensor delta = log_prob - old_log_prob;
  const at::Tensor ratio = delta.exp();
  const at::Tensor plain = -A * ratio;
  at::Tensor penalised = at::zeros_like(A, at::kBool);
  {
    c10::NoGradGuard no_grad;
    const at::Tensor valid_index = mask.ne(0).reshape(-1).nonzero().squeeze(-1);
    const int64_t n = valid_index.numel();
    if (n > 0) {
      const at::Tensor a = A.reshape(-1).index_select(0, valid_index);
      const at::Tensor lp = log_prob.detach().reshape(-1).index_select(0, valid_index);
      const at::Tensor cov = (a - a.mean()) * (lp - lp.mean());
      const int64_t k =
          std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * o.kl_cov_ratio));
      const at::Tensor top = std::get<1>(cov.topk(std::min(k, n)));
      penalised.view(-1).index_fill_(0, valid_index.index_select(0, top), true);
    }
  }
  const at::Tensor loss = at::where(penalised, plain + o.ppo_kl_coef * delta.abs(), plain);
  PolicyLossResult r{aggregate(loss, mask, o, w), {}};
  r.metrics["actor/ppo_kl"] = metric(delta.abs(), mask);
  return r;
}

PolicyLossResult reinforce_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                       const at::Tensor& advantages, const at::Tensor& mask,
                                       const PolicyLossOptions& o,
                                       const std::optional<at::Tensor>& w) {
  check_inputs("reinforce", old_log_prob, log_prob, advantages, mask, w);
  PolicyLossResult r{aggregate(-advantages * log_prob, mask, o, w), {}};
  r.metrics["actor/ppo_kl"] = metric(-(log_prob - old_log_prob), mask);
  return r;
}

}  // namespace baton::algos
