// Policy losses: the actor's objective per token, aggregated with agg_loss,
// and its metrics under verl's keys ("actor/pg_clipfrac", "actor/ppo_kl",
// "actor/pg_clipfrac_lower"). Every loss is differentiable with respect to
// log_prob through LibTorch autograd; old_log_prob and advantages are data.
//
// Notation: ρ = exp(Δ) with Δ = log_prob − old_log_prob, A = advantages,
// m = mask, εl / εh = clip_ratio_low / clip_ratio_high (each falling back to
// clip_ratio when unset), sg = stop-gradient, w = rollout_is_weights (when
// given, the per-token loss is multiplied by it right before aggregation).
// "agg" = agg_loss(L, m, options.agg, options.global). Losses are 0-dim
// tensors; metrics hold exactly the keys named below ("none" = empty map).
// Every clamp passes gradient on its closed range, bounds included
// (clamp_inclusive, clamp.h); min/max split the gradient of ties.
//
// Example:
//   PolicyLossOptions o;  o.clip_ratio_high = 0.28;  o.agg = LossAggMode::TokenMean;
//   PolicyLossResult r = policy_loss("vanilla", old_log_prob, log_prob, advantages, mask, o);
//   r.loss.backward();  r.metrics["actor/pg_clipfrac"];
//
// policy_loss(name, ...) selects a registered loss (algo_registry.h), so a
// user's own loss registered there is selected by its name the same way.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/errors.h"
#include "workers/algos/agg_loss.h"

namespace baton::algos {

// actor_rollout_ref.actor.* (policy_loss.* and clip_ratio*), with verl's defaults.
struct PolicyLossOptions {
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low = 0.2, clip_ratio_high = 0.2;   // nullopt → clip_ratio
  double clip_ratio_c = 3.0;                                           // dual-clip; DPPO truncation
  double tau_pos = 1.0, tau_neg = 1.05;                                // sapo
  double clip_cov_ratio = 2e-4, clip_cov_lb = 1.0, clip_cov_ub = 5.0;  // clip_cov
  double kl_cov_ratio = 2e-4, ppo_kl_coef = 0.1;                       // kl_cov
  std::optional<double> dro_beta;                                      // dro (required)
  LossAggMode agg = LossAggMode::TokenMean;
  GlobalBatchInfo global;
};

struct PolicyLossResult {
  at::Tensor loss;                        // 0-dim
  std::map<std::string, double> metrics;  // verl's keys
};

// The registered loss `name` (built-in or the user's); an unknown name throws
// baton::InvalidArgument naming it, the closest known name and all known ones.
PolicyLossResult policy_loss(std::string_view name, const at::Tensor& old_log_prob,
                             const at::Tensor& log_prob, const at::Tensor& advantages,
                             const at::Tensor& mask, const PolicyLossOptions& options,
                             const std::optional<at::Tensor>& rollout_is_weights = std::nullopt);

// The built-in losses (registered under the names in quotes). All take
// [B, L] tensors and throw baton::InvalidArgument on mismatched shapes.
#define BATON_DECLARE_POLICY_LOSS(fn)                                             \
  PolicyLossResult fn(const at::Tensor& old_log_prob, const at::Tensor& log_prob, \
                      const at::Tensor& advantages, const at::Tensor& mask,       \
                      const PolicyLossOptions& options,                           \
                      const std::optional<at::Tensor>& rollout_is_weights = std::nullopt)

// "vanilla" (PPO with dual clip): Δ clamped to ±20; L1 = −Aρ,
// L2 = −A·clamp(ρ, 1−εl, 1+εh), Lc = max(L1, L2); where A < 0 the loss is
// capped at −A·clip_ratio_c (L = min(Lc, −A·c), no gradient past the cap).
// Throws unless clip_ratio_c > 1. Metrics: pg_clipfrac = mean(L2 > L1),
// ppo_kl = mean(−Δ), pg_clipfrac_lower = mean(Lc > −A·c ∧ A < 0).
BATON_DECLARE_POLICY_LOSS(vanilla_policy_loss);
// "gspo": sequence ratio s = exp(δ_i), δ_i = Σ_t Δ·m / max(Σ_t m, 1), applied per
// token as exp(min(log_prob − sg(log_prob) + sg(δ_i), 10)) (gradient s
// w.r.t. log_prob), clipped as vanilla without dual clip; always
// seq-mean-token-mean (options.agg ignored). Metrics: pg_clipfrac, ppo_kl,
// pg_clipfrac_lower = 0.
BATON_DECLARE_POLICY_LOSS(gspo_policy_loss);
// "sapo": Δ clamped ±20, τ = tau_pos where A > 0 else tau_neg,
// L = −A·sigmoid(τ(ρ − 1))·4/τ; always seq-mean-token-mean. Metrics:
// pg_clipfrac = 0, ppo_kl, pg_clipfrac_lower = 0.
BATON_DECLARE_POLICY_LOSS(sapo_policy_loss);
// "gpg": L = −A·log_prob. No metrics.
BATON_DECLARE_POLICY_LOSS(gpg_policy_loss);
// "cispo": L = −sg(clamp(ρ, 1−εl, 1+εh))·A·log_prob (Δ clamped ±20).
// Metrics: pg_clipfrac = mean(ρ clipped), ppo_kl, pg_clipfrac_lower = 0.
BATON_DECLARE_POLICY_LOSS(cispo_policy_loss);
// "dro": L = −(A·log_prob − dro_beta/2·Δ²); throws unless dro_beta > 0.
// Metrics: ppo_kl.
BATON_DECLARE_POLICY_LOSS(dro_policy_loss);
// "geo_mean" (GMPO): σ = sign(A), Δc = clamp(Δ, −εl, εh),
// Δ* = σ·min(σΔ, σΔc); per row r_i = exp(Σ Δ*·m/(n_i + 1e-8)),
// Ā_i = Σ A·m/(n_i + 1e-8), L_i = −Ā_i·r_i (times exp(Σ log(w + 1e-10)·m /
// (n_i + 1e-8)) with w); the mean over rows: Σ L_i / S · D with the global
// sequence count S (options.global.global_batch_size) and dp_size D, else
// over the B rows here (options.agg is not used; verl takes the local mean,
// whose gradient grows with the number of micro-batches). Metrics: pg_clipfrac = mean(Δ ≠ Δc ∧ A > 0),
// pg_clipfrac_lower = the same with A < 0, ppo_kl.
BATON_DECLARE_POLICY_LOSS(geo_mean_policy_loss);
// "dppo_tv" / "dppo_kl": εl, εh are divergence thresholds. Δ clamped ±20,
// ρt = sg(min(ρ, clip_ratio_c)), p = e^log_prob, q = e^old_log_prob.
// TV: valid = p − q ≤ εh where A > 0, p − q ≥ −εl elsewhere.
// KL: b = q·(old − log_prob) + (1 − q)·log((1 − q + 1e-8)/(1 − p + 1e-8));
// valid = b ≤ εh ∨ p ≤ q where A > 0, b ≤ εl ∨ p ≥ q elsewhere.
// L = −A·ρt·log_prob·sg(valid). Metrics: pg_clipfrac = mean(¬valid),
// pg_clipfrac_lower = mean(ρ > c ∧ valid), ppo_kl.
BATON_DECLARE_POLICY_LOSS(dppo_tv_policy_loss);
BATON_DECLARE_POLICY_LOSS(dppo_kl_policy_loss);
// "clip_cov": L1, L2 as vanilla (no ±20 clamp); among valid unclipped tokens
// with clip_cov_lb < (A − mean A)(log_prob − mean log_prob) < clip_cov_ub,
// min(max(⌊clip_cov_ratio·Σm⌋, 1), #candidates) drawn uniformly at random
// (LibTorch's default CPU generator: at::manual_seed makes it repeatable)
// get zero loss; L = max(L1, L2) elsewhere. Throws unless clip_cov_ratio > 0.
// Metrics: pg_clipfrac = mean(zeroed), ppo_kl.
BATON_DECLARE_POLICY_LOSS(clip_cov_policy_loss);
// "kl_cov": over the N valid tokens (row-major), the max(1, ⌊N·kl_cov_ratio⌋)
// with the largest (A − mean A)(log_prob − mean log_prob) get
// L = −Aρ + ppo_kl_coef·|Δ|, the rest L = −Aρ (no ±20 clamp). Throws unless
// kl_cov_ratio > 0. Metrics: ppo_kl = mean(|Δ|).
BATON_DECLARE_POLICY_LOSS(kl_cov_policy_loss);
// "reinforce" (verl's bypass_mode with old_log_prob = the rollout's):
// L = −A·log_prob. Metrics: ppo_kl.
BATON_DECLARE_POLICY_LOSS(reinforce_policy_loss);

#undef BATON_POLICY_LOSS

}  // namespace baton::algos
