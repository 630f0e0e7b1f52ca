// Policy losses against hand-derived values: each loss's value, its gradient
// w.r.t. log_prob (where clamps and stop-gradients cut it), its metrics, and
// the edge cases of its contract (dual-clip cap, clamp bounds, empty rows,
// fixed aggregation modes, random selection in clip_cov).
#include "workers/algos/policy_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/tolerance.h"
#include "workers/algos/algo_registry.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::Tolerance;

at::Tensor row(std::vector<double> v) {
  return at::tensor(v, at::kDouble).unsqueeze(0).to(at::kFloat);
}

// A loss evaluated at log_prob, with its gradient w.r.t. log_prob.
struct Evaluated {
  PolicyLossResult result;
  at::Tensor grad;
};

Evaluated evaluate(const std::string& name, const at::Tensor& old_log_prob,
                   const at::Tensor& log_prob, const at::Tensor& advantages, const at::Tensor& mask,
                   const PolicyLossOptions& options = {},
                   const std::optional<at::Tensor>& weights = std::nullopt) {
  const at::Tensor lp = log_prob.clone().requires_grad_();
  Evaluated e{policy_loss(name, old_log_prob, lp, advantages, mask, options, weights), {}};
  EXPECT_EQ(e.result.loss.dim(), 0) << name;
  e.result.loss.backward();
  e.grad = lp.grad();
  return e;
}

void expect_metrics(const PolicyLossResult& r, const std::map<std::string, double>& expected,
                    const std::string& what) {
  ASSERT_EQ(r.metrics.size(), expected.size()) << what << ": metric keys differ";
  for (const auto& [key, value] : expected) {
    ASSERT_EQ(r.metrics.count(key), 1u) << what << ": no " << key;
    // Means over at most 10 tokens of values up to 20.
    expect_near(r.metrics.at(key), value, Tolerance::fp32(10, 20), what + " " + key);
  }
}

// --- vanilla -----------------------------------------------------------------

// Tokens (ρ, A) with old_log_prob 0 and log_prob = log ρ; the last is masked.
//   t0 (1, 1):    L1 = L2 = −1, gradient −Aρ = −1
//   t1 (1.5, 1):  L1 −1.5 < L2 −1.2: clipped, no gradient
//   t2 (0.5, −1): L1 0.5 < L2 0.8: clipped, no gradient
//   t3 (4, −1):   Lc = L1 = 4 > L3 = −A·3 = 3: capped at 3, no gradient
//   t4 (2, −2):   Lc = L1 = 4 < L3 = 6: 4, gradient −Aρ = 4
//   t5 (0.9, 2):  L1 = L2 = −1.8, gradient −1.8
//   t6 masked (100, 5)
struct VanillaCase {
  at::Tensor log_prob = row(
      {0, std::log(1.5), std::log(0.5), std::log(4), std::log(2), std::log(0.9), std::log(100)});
  at::Tensor old_log_prob = at::zeros({1, 7});
  at::Tensor advantages = row({1, 1, -1, -1, -2, 2, 5});
  at::Tensor mask = row({1, 1, 1, 1, 1, 1, 0}).to(at::kLong);
};

TEST(VanillaPolicyLoss, ClipsAndCapsNegativeAdvantagesAtClipRatioC) {
  const VanillaCase c;
  const Evaluated e = evaluate("vanilla", c.old_log_prob, c.log_prob, c.advantages, c.mask);
  // Token mean over 6: (−1 − 1.2 + 0.8 + 3 + 4 − 1.8)/6.
  expect_near(e.result.loss.item<double>(), 3.8 / 6, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad, row({-1, 0, 0, 0, 4, -1.8, 0}) / 6, Tolerance::fp32(4, 4), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 2.0 / 6},
                  {"actor/ppo_kl", -std::log(1.5 * 0.5 * 4 * 2 * 0.9) / 6},
                  {"actor/pg_clipfrac_lower", 1.0 / 6}},
                 "vanilla");
}

TEST(VanillaPolicyLoss, LowClipFallsBackToClipRatioAndBoundsPassGradient) {
  const VanillaCase c;
  PolicyLossOptions o;
  o.clip_ratio = 0;
  o.clip_ratio_low.reset();  // εl = clip_ratio = 0: the lower bound is 1
  const Evaluated e = evaluate("vanilla", c.old_log_prob, c.log_prob, c.advantages, c.mask, o);
  // t2: clamp(0.5, 1, 1.2) = 1: L2 = 1 > L1 = 0.5, so L = 1 (was 0.8).
  // t5: clamp(0.9) = 1: L2 = −2 < L1 = −1.8, unchanged. t0 (ρ exactly 1) sits
  // on the bound: the clamp passes gradient there, so it keeps −Aρ = −1.
  expect_near(e.result.loss.item<double>(), 4.0 / 6, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad, row({-1, 0, 0, 0, 4, -1.8, 0}) / 6, Tolerance::fp32(4, 4), "gradient");
  EXPECT_NEAR(e.result.metrics.at("actor/pg_clipfrac"), 2.0 / 6, 1e-6);
}

TEST(VanillaPolicyLoss, ClampsTheLogRatioAtTwentyAndScalesByRolloutWeights) {
  // ppo_kl sees the clamped Δ: log_prob 30 counts as 20.
  const Evaluated e =
      evaluate("vanilla", at::zeros({1, 2}), row({30, -30}), at::zeros({1, 2}), at::ones({1, 2}));
  EXPECT_NEAR(e.result.metrics.at("actor/ppo_kl"), 0.0, 1e-6);  // (−20 + 20)/2
  const Evaluated one =
      evaluate("vanilla", at::zeros({1, 2}), row({30, 0}), at::zeros({1, 2}), row({1, 0}));
  EXPECT_NEAR(one.result.metrics.at("actor/ppo_kl"), -20.0, 1e-5);
  const VanillaCase c;
  const at::Tensor w = row({2, 2, 2, 2, 2, 2, 2});
  const Evaluated weighted =
      evaluate("vanilla", c.old_log_prob, c.log_prob, c.advantages, c.mask, {}, w);
  expect_near(weighted.result.loss.item<double>(), 2 * 3.8 / 6, Tolerance::fp32(8, 8), "w = 2");
}

TEST(VanillaPolicyLoss, RefusesClipRatioCNotAboveOne) {
  const VanillaCase c;
  PolicyLossOptions o;
  o.clip_ratio_c = 1.0;
  EXPECT_THROW(policy_loss("vanilla", c.old_log_prob, c.log_prob, c.advantages, c.mask, o),
               baton::InvalidArgument);
  EXPECT_THROW(
      policy_loss("vanilla", c.old_log_prob, c.log_prob.narrow(1, 0, 3), c.advantages, c.mask, {}),
      baton::InvalidArgument);
}

TEST(VanillaPolicyLoss, UsesTheAggregationModeAndGlobalInfo) {
  const VanillaCase c;
  PolicyLossOptions o;
  o.agg = LossAggMode::TokenSum;
  o.global.dp_size = 2;
  const Evaluated e = evaluate("vanilla", c.old_log_prob, c.log_prob, c.advantages, c.mask, o);
  expect_near(e.result.loss.item<double>(), 3.8 * 2, Tolerance::fp32(8, 8), "token-sum · D");
}

// --- gspo ----------------------------------------------------------------------

TEST(GspoPolicyLoss, UsesTheSequenceRatioAndAlwaysSeqMeanTokenMean) {
  // Row 0: Δ (0.2, 0, masked 5): δ = 0.1, s = e^0.1 in [0.8, 1.2]: L = −s per
  //   token, gradient −s per token (ds/dlog_prob = s).
  // Row 1: Δ (0.5, 0.3, 0.4): δ = 0.4, s = e^0.4 > 1.2: clipped, L = −1.2, no
  //   gradient. A = 1 everywhere.
  // seq-mean-token-mean: (−e^0.1 − 1.2)/2; gradient −e^0.1/(2 rows · 2 tokens).
  const at::Tensor old = at::zeros({2, 3});
  const at::Tensor lp = at::tensor({0.2f, 0.0f, 5.0f, 0.5f, 0.3f, 0.4f}).reshape({2, 3});
  const at::Tensor m = at::tensor({1, 1, 0, 1, 1, 1}, at::kLong).reshape({2, 3});
  PolicyLossOptions o;
  o.agg = LossAggMode::TokenSum;  // ignored
  const Evaluated e = evaluate("gspo", old, lp, at::ones({2, 3}), m, o);
  const double s = std::exp(0.1);
  expect_near(e.result.loss.item<double>(), (-s - 1.2) / 2, Tolerance::fp32(8, 2), "loss");
  expect_close(e.grad, at::tensor({-s / 4, -s / 4, 0.0, 0.0, 0.0, 0.0}).reshape({2, 3}),
               Tolerance::fp32(8, 2), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 3.0 / 5},
                  {"actor/ppo_kl", -1.4 / 5},
                  {"actor/pg_clipfrac_lower", 0.0}},
                 "gspo");
}

// --- sapo ----------------------------------------------------------------------

TEST(SapoPolicyLoss, GatesWithTemperaturesBySignOfAdvantage) {
  // Row 0: (A 1, ρ 1): τ = 1, gate σ(0)·4 = 2, L = −2, gradient
  //   −4A·σ(1 − σ)·ρ = −1. (A −1, ρ 2): τ = 1.05, L = σ(1.05)·4/1.05,
  //   gradient 4·σ(1.05)(1 − σ(1.05))·2.
  // Row 1: (A 0, ρ 1): τ = tau_neg, L = 0, gradient 0; masked token ignored.
  const at::Tensor old = at::zeros({2, 2});
  const at::Tensor lp = at::tensor({0.0f, std::log(2.0f), 0.0f, 3.0f}).reshape({2, 2});
  const at::Tensor a = at::tensor({1.0f, -1.0f, 0.0f, 7.0f}).reshape({2, 2});
  const at::Tensor m = at::tensor({1, 1, 1, 0}, at::kLong).reshape({2, 2});
  const Evaluated e = evaluate("sapo", old, lp, a, m);
  const double sig = 1 / (1 + std::exp(-1.05));
  const double l01 = sig * 4 / 1.05;
  // seq-mean-token-mean: row means (−2 + l01)/2 and 0, over 2 rows.
  expect_near(e.result.loss.item<double>(), (-2 + l01) / 2 / 2, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad,
               at::tensor({-1.0 / 4, 4 * sig * (1 - sig) * 2 / 4, 0.0, 0.0}).reshape({2, 2}),
               Tolerance::fp32(8, 4), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 0.0},
                  {"actor/ppo_kl", -std::log(2.0) / 3},
                  {"actor/pg_clipfrac_lower", 0.0}},
                 "sapo");
}

// --- gpg, reinforce, cispo, dro ---------------------------------------------------

TEST(GpgPolicyLoss, IsMinusAdvantageTimesLogProbWithNoMetrics) {
  // L = (0.5, −2); token mean −0.75; gradient −A/2.
  const Evaluated e =
      evaluate("gpg", row({-9, -9}), row({-0.5, -1}), row({1, -2}), at::ones({1, 2}));
  expect_near(e.result.loss.item<double>(), -0.75, Tolerance::fp32(4, 2), "loss");
  expect_close(e.grad, row({-0.5, 1}), Tolerance::fp32(4, 2), "gradient");
  EXPECT_TRUE(e.result.metrics.empty());
}

TEST(ReinforcePolicyLoss, IsMinusAdvantageTimesLogProbWithPpoKl) {
  // As gpg, ·w = (2, 1): L = (1, −2), mean −0.5; ppo_kl = −(Δ) mean with
  // Δ = (−0.5 + 1, −1 + 2).
  const Evaluated e = evaluate("reinforce", row({-1, -2}), row({-0.5, -1}), row({1, -2}),
                               at::ones({1, 2}), {}, row({2, 1}));
  expect_near(e.result.loss.item<double>(), -0.5, Tolerance::fp32(4, 2), "loss");
  expect_close(e.grad, row({-1, 1}), Tolerance::fp32(4, 2), "gradient");
  expect_metrics(e.result, {{"actor/ppo_kl", -0.75}}, "reinforce");
}

TEST(CispoPolicyLoss, WeightsLogProbByTheStoppedClippedRatio) {
  // t0: ρ 1.5 → clip 1.2, A 1, log_prob −1: L = 1.2, gradient −1.2.
  // t1: ρ 1, A 2, log_prob −0.5: L = 1, gradient −2. Token mean.
  const Evaluated e = evaluate("cispo", row({-1 - std::log(1.5), -0.5}), row({-1, -0.5}),
                               row({1, 2}), at::ones({1, 2}));
  expect_near(e.result.loss.item<double>(), 1.1, Tolerance::fp32(4, 2), "loss");
  expect_close(e.grad, row({-0.6, -1}), Tolerance::fp32(4, 2), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 0.5},
                  {"actor/ppo_kl", -std::log(1.5) / 2},
                  {"actor/pg_clipfrac_lower", 0.0}},
                 "cispo");
}

TEST(DroPolicyLoss, PenalisesTheSquaredLogRatioAndNeedsBeta) {
  // β = 0.5. t0: A 1, log_prob −1, Δ 0.5: L = −(−1 − 0.25·0.25) = 1.0625,
  //   gradient −(A − βΔ) = −0.75. t1: A −1, log_prob −2, Δ 0: L = −2,
  //   gradient 1. Token mean.
  PolicyLossOptions o;
  o.dro_beta = 0.5;
  const Evaluated e =
      evaluate("dro", row({-1.5, -2}), row({-1, -2}), row({1, -1}), at::ones({1, 2}), o);
  expect_near(e.result.loss.item<double>(), -0.46875, Tolerance::fp32(4, 2), "loss");
  expect_close(e.grad, row({-0.375, 0.5}), Tolerance::fp32(4, 2), "gradient");
  expect_metrics(e.result, {{"actor/ppo_kl", -0.25}}, "dro");
  o.dro_beta.reset();
  EXPECT_THROW(policy_loss("dro", row({0}), row({0}), row({1}), row({1}), o),
               baton::InvalidArgument);
  o.dro_beta = 0;
  EXPECT_THROW(policy_loss("dro", row({0}), row({0}), row({1}), row({1}), o),
               baton::InvalidArgument);
}

// --- geo_mean ------------------------------------------------------------------

TEST(GeoMeanPolicyLoss, ClipsTheLogRatioBySignOfAdvantageAndAveragesOverAllRows) {
  // εl = εh = 0.2. Row 0: A (1, 1, masked), Δ (0.1, 0.5, 9): Δc (0.1, 0.2);
  //   σ = 1: Δ* = min(Δ, Δc) = (0.1, 0.2); r = e^(0.3/2); Ā = 1; L = −e^0.15.
  //   Gradient: t0 Δ = Δc (min splits, both slopes 1): 1; t1 takes Δc: 0.
  // Row 1: A (−1, −1, −1), Δ (−0.5, 0.1, 0.3): Δc (−0.2, 0.1, 0.2); σ = −1:
  //   Δ* = max(Δ, Δc) = (−0.2, 0.1, 0.3); r = e^(0.2/3); Ā = −1; L = e^(1/15).
  //   Gradient: t0 0, t1 and t2 1.
  // Row 2: empty: r = 1, Ā = 0, L = 0, but it counts in the mean over 3 rows.
  const at::Tensor old = at::zeros({3, 3});
  const at::Tensor lp =
      at::tensor({0.1f, 0.5f, 9.0f, -0.5f, 0.1f, 0.3f, 1.0f, 1.0f, 1.0f}).reshape({3, 3});
  const at::Tensor a =
      at::tensor({1.0f, 1.0f, 1.0f, -1.0f, -1.0f, -1.0f, 2.0f, 2.0f, 2.0f}).reshape({3, 3});
  const at::Tensor m = at::tensor({1, 1, 0, 1, 1, 1, 0, 0, 0}, at::kLong).reshape({3, 3});
  const Evaluated e = evaluate("geo_mean", old, lp, a, m);
  const double l0 = -std::exp(0.15), l1 = std::exp(1.0 / 15);
  expect_near(e.result.loss.item<double>(), (l0 + l1) / 3, Tolerance::fp32(8, 2), "loss");
  // dL_i/dΔ_t = L_i·(slope)/n_i, over 3 rows.
  const at::Tensor grad =
      at::tensor({l0 / 2 / 3, 0.0, 0.0, 0.0, l1 / 3 / 3, l1 / 3 / 3, 0.0, 0.0, 0.0})
          .reshape({3, 3});
  expect_close(e.grad, grad, Tolerance::fp32(8, 2), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 1.0 / 5},
                  {"actor/ppo_kl", -0.1},
                  {"actor/pg_clipfrac_lower", 2.0 / 5}},
                 "geo_mean");
  // With weights: the geometric mean over valid tokens, row 0 (2, 8) → 4.
  PolicyLossOptions o;
  o.agg = LossAggMode::TokenSum;  // ignored
  const at::Tensor w =
      at::tensor({2.0f, 8.0f, 100.0f, 1.0f, 1.0f, 1.0f, 5.0f, 5.0f, 5.0f}).reshape({3, 3});
  const Evaluated ew = evaluate("geo_mean", old, lp, a, m, o, w);
  expect_near(ew.result.loss.item<double>(), (4 * l0 + l1) / 3, Tolerance::fp32(8, 8),
              "weighted loss");
}

// --- dppo ----------------------------------------------------------------------

// Tokens (q = e^old, p = e^log_prob, A):
//   t0 (0.5, 0.6, 1):  ρ 1.2
//   t1 (0.2, 0.5, 1):  ρ 2.5
//   t2 (0.5, 0.25, −1): ρ 0.5
//   t3 (0.1, 0.4, −1): ρ 4, truncated to 3
//   t4 (0.1, 0.6, 1):  ρ 6
struct DppoCase {
  at::Tensor old = row({std::log(0.5), std::log(0.2), std::log(0.5), std::log(0.1), std::log(0.1)});
  at::Tensor lp = row({std::log(0.6), std::log(0.5), std::log(0.25), std::log(0.4), std::log(0.6)});
  at::Tensor a = row({1, 1, -1, -1, 1});
  at::Tensor m = at::ones({1, 5});
  // L = −A·ρt·log_prob where valid; gradient −A·ρt.
  static double loss(double a, double rho_t, double p) { return -a * rho_t * std::log(p); }
};

TEST(DppoTvPolicyLoss, MasksTokensWhoseProbabilityMovedPastTheThreshold) {
  // TV, ε = 0.2: t0 p − q = 0.1 ≤ 0.2 valid; t1 0.3 > 0.2 not; t2 −0.25 < −0.2
  // not; t3 0.3 ≥ −0.2 valid; t4 0.5 not.
  const DppoCase c;
  const Evaluated e = evaluate("dppo_tv", c.old, c.lp, c.a, c.m);
  const double sum = DppoCase::loss(1, 1.2, 0.6) + DppoCase::loss(-1, 3, 0.4);
  expect_near(e.result.loss.item<double>(), sum / 5, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad, row({-1.2, 0, 0, 3, 0}) / 5, Tolerance::fp32(8, 4), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 3.0 / 5},
                  {"actor/ppo_kl", -std::log(36.0) / 5},
                  {"actor/pg_clipfrac_lower", 1.0 / 5}},
                 "dppo_tv");
}

TEST(DppoKlPolicyLoss, MasksTokensWhoseBinaryKlPassedTheThresholdInTheirDirection) {
  // b = q·log(q/p) + (1 − q)·log((1 − q)/(1 − p)):
  //   t0 0.5·log(5/6) + 0.5·log(5/4) = 0.0204 ≤ 0.2: valid.
  //   t1 0.2·log(0.4) + 0.8·log(1.6) = 0.1927 ≤ 0.2: valid (TV refused it).
  //   t2 0.5·log 2 + 0.5·log(2/3) = 0.1438 ≤ 0.2: valid.
  //   t3 A < 0 and p ≥ q: valid.
  //   t4 0.1·log(1/6) + 0.9·log(9/4) = 0.5507 > 0.2 and p > q: not.
  const DppoCase c;
  const Evaluated e = evaluate("dppo_kl", c.old, c.lp, c.a, c.m);
  const double sum = DppoCase::loss(1, 1.2, 0.6) + DppoCase::loss(1, 2.5, 0.5) +
                     DppoCase::loss(-1, 0.5, 0.25) + DppoCase::loss(-1, 3, 0.4);
  expect_near(e.result.loss.item<double>(), sum / 5, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad, row({-1.2, -2.5, 0.5, 3, 0}) / 5, Tolerance::fp32(8, 4), "gradient");
  expect_metrics(e.result,
                 {{"actor/pg_clipfrac", 1.0 / 5},
                  {"actor/ppo_kl", -std::log(36.0) / 5},
                  {"actor/pg_clipfrac_lower", 1.0 / 5}},
                 "dppo_kl");
}

// --- clip_cov --------------------------------------------------------------------

TEST(ClipCovPolicyLoss, ZeroesUnclippedValidTokensWithCovarianceInRange) {
  // A (2, −2, 2, −2 | masked 100), log_prob (−1, −3, −1.5, −2.5 | 0): means 0
  // and −2, cov (2, 2, 1, 1): t2, t3 are not > lb = 1. t0 has ρ 1.5 with A 2:
  // clipped (L2 −2.4 > L1 −3), so not a candidate. Candidates {t1}; wanted
  // max(⌊0.5·4⌋, 1) = 2; picked min(2, 1) = 1: t1's loss is zeroed.
  // Losses: t0 −2.4 (no gradient), t1 0, t2 −2 (gradient −2), t3 2 (gradient 2).
  const at::Tensor lp = row({-1, -3, -1.5, -2.5, 0});
  const at::Tensor old = lp - row({std::log(1.5), 0, 0, 0, 0});
  const at::Tensor a = row({2, -2, 2, -2, 100});
  const at::Tensor m = row({1, 1, 1, 1, 0});
  PolicyLossOptions o;
  o.clip_cov_ratio = 0.5;
  at::manual_seed(0);
  const Evaluated e = evaluate("clip_cov", old, lp, a, m, o);
  expect_near(e.result.loss.item<double>(), -2.4 / 4, Tolerance::fp32(8, 4), "loss");
  expect_close(e.grad, row({0, 0, -0.5, 0.5, 0}), Tolerance::fp32(8, 4), "gradient");
  expect_metrics(e.result, {{"actor/pg_clipfrac", 0.25}, {"actor/ppo_kl", -std::log(1.5) / 4}},
                 "clip_cov");
  o.clip_cov_ratio = 0;  // verl asserts clip_cov_ratio > 0
  EXPECT_THROW(policy_loss("clip_cov", old, lp, a, m, o), baton::InvalidArgument);
}

TEST(ClipCovPolicyLoss, PicksTheWantedNumberOfCandidatesAtRandomRepeatably) {
  // All four tokens are candidates (cov 2 each, ρ = 1); 2 are picked.
  const at::Tensor lp = row({-1, -3, -1, -3});
  const at::Tensor a = row({2, -2, 2, -2});
  PolicyLossOptions o;
  o.clip_cov_ratio = 0.5;
  auto zeroed = [&](uint64_t seed) {
    at::manual_seed(seed);
    const Evaluated e = evaluate("clip_cov", lp, lp, a, at::ones({1, 4}), o);
    EXPECT_NEAR(e.result.metrics.at("actor/pg_clipfrac"), 0.5, 1e-7);
    return e.grad.eq(0);
  };
  const at::Tensor first = zeroed(7);
  EXPECT_EQ(first.sum().item<int64_t>(), 2);
  EXPECT_TRUE(at::equal(zeroed(7), first));
  bool another = false;
  for (uint64_t seed = 0; seed < 20 && !another; ++seed) another = !at::equal(zeroed(seed), first);
  EXPECT_TRUE(another) << "the same tokens for 20 seeds: not random";
}

// --- kl_cov ------------------------------------------------------------------------

TEST(KlCovPolicyLoss, PenalisesTheLargestCovarianceTokensWithAbsKl) {
  // A (1, −1, 1, −1 | masked 50), log_prob (−1, −1, −3, −2 | 9): means 0 and
  // −1.75; cov (0.75, −0.75, −1.25, 0.25 | -). Δ (0.1, 0.2, −0.3, −0.4 | 0).
  // ratio 0.5: k = 2 → t0 and t3 get + 0.1·|Δ|.
  const at::Tensor lp = row({-1, -1, -3, -2, 9});
  const at::Tensor delta = row({0.1, 0.2, -0.3, -0.4, 0});
  const at::Tensor a = row({1, -1, 1, -1, 50});
  const at::Tensor m = row({1, 1, 1, 1, 0});
  PolicyLossOptions o;
  o.kl_cov_ratio = 0.5;
  const Evaluated e = evaluate("kl_cov", lp - delta, lp, a, m, o);
  const double e1 = std::exp(0.1), e2 = std::exp(0.2), e3 = std::exp(-0.3), e4 = std::exp(-0.4);
  const double sum = (-e1 + 0.01) + e2 + (-e3) + (e4 + 0.04);
  expect_near(e.result.loss.item<double>(), sum / 4, Tolerance::fp32(8, 2), "loss");
  expect_close(e.grad, row({-e1 + 0.1, e2, -e3, e4 - 0.1, 0}) / 4, Tolerance::fp32(8, 2),
               "gradient");
  expect_metrics(e.result, {{"actor/ppo_kl", 0.25}}, "kl_cov");
  // The default ratio 2e-4: k = max(1, 0) = 1, only t0.
  const Evaluated d = evaluate("kl_cov", lp - delta, lp, a, m);
  expect_near(d.result.loss.item<double>(), (sum - 0.04) / 4, Tolerance::fp32(8, 2),
              "default ratio");
  o.kl_cov_ratio = 0;  // verl asserts kl_cov_ratio > 0
  EXPECT_THROW(policy_loss("kl_cov", lp - delta, lp, a, m, o), baton::InvalidArgument);
}

// --- every loss -------------------------------------------------------------------

TEST(PolicyLoss, AnEmptyMicroBatchWithGlobalInfoGivesZeroLossAndGradientNeverNan) {
  // A micro-batch whose response mask is all zero (the engine passes the
  // mini-batch's global counts): it must contribute nothing, not NaN.
  PolicyLossOptions o;
  o.dro_beta = 0.1;
  o.global.dp_size = 2;
  o.global.batch_num_tokens = 10;
  o.global.global_batch_size = 4;
  at::manual_seed(1);
  const at::Tensor old = at::randn({2, 3}) - 2;
  const at::Tensor lp = at::randn({2, 3}) - 2;
  const at::Tensor a = at::randn({2, 3});
  for (const char* name : {"vanilla", "gspo", "sapo", "gpg", "cispo", "dro", "geo_mean", "dppo_tv",
                           "dppo_kl", "clip_cov", "kl_cov", "reinforce"}) {
    for (LossAggMode mode : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenMean}) {
      o.agg = mode;
      const Evaluated e = evaluate(name, old, lp, a, at::zeros({2, 3}, at::kLong), o);
      const std::string what = std::string(name) + " " + std::string(to_string(mode));
      EXPECT_EQ(e.result.loss.item<double>(), 0.0) << what;
      expect_close(e.grad, at::zeros({2, 3}), Tolerance::exact(), what + " gradient");
      for (const auto& [key, value] : e.result.metrics)
        EXPECT_TRUE(std::isfinite(value)) << what << " " << key;
    }
  }
}

TEST(PolicyLoss, EveryRegisteredLossIsInvariantToTheMicroBatchSplit) {
  // One mini-batch of 6 ragged rows, evaluated whole and as micro-batches of
  // 2 and 4 rows with the mini-batch's global counts (as the engine passes
  // them): the summed losses and the gradients must be the whole batch's.
  // clip_cov and kl_cov pick their tokens within each micro-batch (as
  // verl's do), so they are compared with a ratio too small to pick a token
  // (clip_cov) and a zero penalty weight (kl_cov picks at least one).
  at::manual_seed(3);
  const int64_t B = 6, L = 5;
  const at::Tensor old = at::randn({B, L}) * 0.3 - 1.5;
  const at::Tensor lp = old + at::randn({B, L}) * 0.15;
  const at::Tensor adv = at::randn({B, L});
  const at::Tensor lengths = at::tensor({5, 3, 1, 4, 2, 5}, at::kLong);
  const at::Tensor mask = (at::arange(L).unsqueeze(0) < lengths.unsqueeze(1)).to(at::kLong);
  PolicyLossOptions o;
  o.dro_beta = 0.1;
  o.clip_cov_ratio = 1e-6;
  o.kl_cov_ratio = 1e-6;
  o.ppo_kl_coef = 0;
  o.global.dp_size = 1;
  o.global.batch_num_tokens = mask.sum().item<double>();
  o.global.global_batch_size = static_cast<double>(B);
  const std::vector<std::string> names = policy_loss_names();
  ASSERT_GE(names.size(), 12u);
  for (const std::string& name : names) {
    for (LossAggMode mode : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum,
                             LossAggMode::SeqMeanTokenMean, LossAggMode::TokenSum}) {
      o.agg = mode;
      const std::string what = name + " " + std::string(to_string(mode));
      const Evaluated whole = evaluate(name, old, lp, adv, mask, o);
      double split_loss = 0;
      std::vector<at::Tensor> grads;
      for (const auto& [start, rows] : {std::pair<int64_t, int64_t>{0, 2}, {2, 4}}) {
        const Evaluated part = evaluate(name, old.narrow(0, start, rows), lp.narrow(0, start, rows),
                                        adv.narrow(0, start, rows), mask.narrow(0, start, rows), o);
        split_loss += part.result.loss.item<double>();
        grads.push_back(part.grad);
      }
      // Sums of at most B·L terms of magnitude up to ~10 (ratios near 1, |A| < 4).
      const Tolerance tol = Tolerance::fp32(static_cast<double>(B * L), 10);
      expect_near(split_loss, whole.result.loss.item<double>(), tol, what + " loss");
      expect_close(at::cat(grads, 0), whole.grad, tol, what + " gradient");
    }
  }
}

}  // namespace
}  // namespace baton::algos
