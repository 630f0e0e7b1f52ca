// Advantage estimators: from token-level rewards (and values, for GAE) to the
// advantages and returns that the policy and value losses train on, with
// verl's semantics. They run without gradient (each opens its own
// at::NoGradGuard) on [B, L] float tensors; results have the rewards' dtype
// and device.
//
// Unless stated, s_i = Σ_t rewards[i, t] over ALL positions (not masked), the
// result is a_i·mask[i, t] and returns == advantages. A group is the set of
// rows with equal uid, wherever they sit in the batch; rows whose mask is all
// zero still count in their group's statistics. Bad shapes or a uid list of
// the wrong length throw baton::InvalidArgument naming the argument.
//
// Example:
//   Uids uids = {"p0", "p0", "p1", "p1"};               // 2 prompts, n = 2
//   AdvantageResult r = compute_grpo(token_level_rewards, response_mask, uids);
//   r.advantages;  // [4, L]
//
// The estimators can also be selected by name (algo_registry.h).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "base/errors.h"

namespace baton::algos {

struct AdvantageResult {
  at::Tensor advantages, returns;  // [B, L]
};

// One uid per row: the rows sampled from one prompt share it.
using Uids = std::vector<std::string>;

// GAE (Schulman et al.) over the response tokens: scan t = L−1 … 0 with
// next_v = 0, last = 0: delta = r_t + γ·next_v − V_t, cand = delta + γλ·last;
// where mask is 1, next_v = V_t and last = cand; where it is 0 both are kept
// (observation tokens are skipped, not reset). raw[:, t] = last.
// returns = raw + values (before whitening); advantages = masked_whiten(raw,
// mask) over the batch, at every position (trailing padding has raw = 0; a
// hole carries the advantage of the next valid token). Throws with fewer than
// 2 valid tokens.
AdvantageResult compute_gae(const at::Tensor& rewards, const at::Tensor& values,
                            const at::Tensor& mask, double gamma, double lam);

struct GrpoOptions {
  double epsilon = 1e-6;        // added to the std
  bool norm_adv_by_std = true;  // false: Dr.GRPO (s_i − mean)
};

// GRPO: a_i = (s_i − mean)/(std + ε) per group, with the Bessel-corrected std
// (n − 1); a singleton group uses mean 0 and std 1 (it keeps s/(1 + ε)); a
// fully tied group gets exactly 0.
AdvantageResult compute_grpo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids,
                             const GrpoOptions& options = {});

// GRPO computed with scatter operations (sum/count, Σ(s − mean)²/max(n − 1, 1));
// the same result as compute_grpo up to rounding.
AdvantageResult compute_grpo_vectorized(const at::Tensor& rewards, const at::Tensor& mask,
                                        const Uids& uids, const GrpoOptions& options = {});

// Pass@k GRPO: only the row with the group's best score gets r_max − r_second
// (divided by std_bessel(group) + ε when normalising); every other row, and
// every row of a group whose best score is tied, gets 0. Every group needs at
// least 2 rows (throws otherwise).
AdvantageResult compute_grpo_passk(const at::Tensor& rewards, const at::Tensor& mask,
                                   const Uids& uids, const GrpoOptions& options = {});

// RLOO: a_i = n/(n − 1)·(s_i − mean) = s_i − mean of the others in the group;
// a singleton keeps its raw score s_i.
AdvantageResult compute_rloo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids);

// RLOO computed with scatter operations; the same for n > 1, but 0 for
// singletons.
AdvantageResult compute_rloo_vectorized(const at::Tensor& rewards, const at::Tensor& mask,
                                        const Uids& uids);

// REINFORCE++: discounted return-to-go, scan t = L−1 … 0 with G = 0:
// G' = r_t + γG, returns[:, t] = G'·mask_t, and G = G' only where mask is 1
// (rewards at masked positions are ignored, holes are bridged).
// advantages = masked_whiten(returns, mask)·mask over the whole batch (no
// grouping). Throws with fewer than 2 valid tokens.
AdvantageResult compute_reinforce_plus_plus(const at::Tensor& rewards, const at::Tensor& mask,
                                            double gamma);

// REINFORCE++ with a group baseline: a_i = s_i − group mean (singleton mean
// 0), broadcast times mask, then masked_whiten(·, mask)·mask over all valid
// tokens of the batch (token-weighted). Throws with fewer than 2 valid tokens.
AdvantageResult compute_reinforce_plus_plus_baseline(const at::Tensor& rewards,
                                                     const at::Tensor& mask, const Uids& uids);

// ReMax: returns[i, t] = Σ_{t' ≥ t} rewards[i, t']·mask[i, t'] (defined at
// masked positions too), advantages = returns − b_i·mask[i, t] with
// b = reward_baselines [B] (the greedy response's score).
AdvantageResult compute_remax(const at::Tensor& rewards, const at::Tensor& reward_baselines,
                              const at::Tensor& mask);

// OPO: length-weighted group baseline Σ len·s / Σ len with len_i = Σ_t mask
// (singleton baseline 0); a_i = s_i − baseline. A group whose rows are all
// empty gives NaN, as in verl.
AdvantageResult compute_opo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids);

// GPG: a_i = α·(s_i − group mean)/f_norm (singleton mean 0) with
// α = B / max(1, #{i : s_i ≠ 0}) over the whole batch.
AdvantageResult compute_gpg(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids,
                            double f_norm = 1.0);

// The policy-side inputs of the optimal-token-baseline estimators, [B, L]
// like the rewards.
struct TokenBaselineInputs {
  at::Tensor old_log_probs;       // log π(y_t) of the sampled tokens
  at::Tensor sum_pi_squared;      // Σ_v π(v)² of each position's distribution
  at::Tensor rollout_is_weights;  // ρ̄ of rollout correction; undefined: none
};

struct TokenBaselineOptions {
  // In a group whose longest row is strictly longer than every other, that
  // row's baseline is 0 from the second-longest length on (verl's default,
  // true for both estimators).
  bool handle_zero_tail = true;
  double epsilon = 1e-8;  // added to the baseline's denominator
};

// Optimal token baseline (OTB, verl's compute_optimal_token_baseline_advantage).
// G = Σ_{t' ≥ t} rewards·mask (reward-to-go; also at masked positions),
// w_t = (1 − 2·exp(old_log_probs) + sum_pi_squared)·ρ̄_t², W_t = Σ_{j ≤ t} w_j·mask_j
// (the realized energy, carried across holes). Per group and column t, the
// baseline is B_t = Σ_i G·W·mask / (Σ_i W·mask + ε), the same for every row
// of the group (a singleton's is 0); with handle_zero_tail the longest row's
// B is 0 from column `second-longest length` on (lengths are Σ_t mask).
// advantages = (G − B)·mask, returns = G.
AdvantageResult compute_optimal_token_baseline(const at::Tensor& rewards, const at::Tensor& mask,
                                               const Uids& uids, const TokenBaselineInputs& policy,
                                               const TokenBaselineOptions& options = {});

// OTB for multi-turn (tool-interleaved) responses (verl's
// compute_multi_turn_optimal_token_baseline_advantage): as above, but each
// row's valid tokens are first packed to the left in order (holes removed),
// so that the baseline's k-th entry pairs the k-th generated token of every
// row of the group; rows without a valid token take no part (and get 0).
// The advantages are scattered back to the valid positions.
AdvantageResult compute_tir_optimal_token_baseline(const at::Tensor& rewards,
                                                   const at::Tensor& mask, const Uids& uids,
                                                   const TokenBaselineInputs& policy,
                                                   const TokenBaselineOptions& options = {});

}  // namespace baton::algos
