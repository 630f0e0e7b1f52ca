// Advantage estimators against hand-derived values, with the edge cases of
// their contract: singleton groups, ties, rows whose mask is empty, holes in
// masks, rewards at masked positions, interleaved groups.
#include "workers/algos/advantage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "tests/tensor_rows.h"
#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::rows;
using test::Tolerance;

// a_i broadcast over a row, times the mask.
at::Tensor per_row(const std::vector<double>& a, const at::Tensor& mask) {
  return at::tensor(a, at::kDouble).unsqueeze(-1) * mask.to(at::kDouble);
}

// --- GAE ---------------------------------------------------------------------

TEST(Gae, ScansBackwardSkippingMaskedTokensThenWhitens) {
  // γ = λ = 0.5 (γλ = 0.25). Row 0 has trailing padding (its reward 5 and
  // value 8 are ignored); row 1 has a hole at t = 1 (reward 3, value 6
  // ignored, the scan carries across it).
  const at::Tensor r = rows({{0, 0, 1, 5}, {0, 3, 2, 2}});
  const at::Tensor v = rows({{1, 2, 4, 8}, {2, 6, 4, 1}});
  const at::Tensor m = rows({{1, 1, 1, 0}, {1, 0, 1, 1}}, at::kLong);
  // Row 0: t=3 masked, raw 0. t=2: δ = 1 + 0 − 4 = −3, raw −3, next_v 4.
  //   t=1: δ = 0 + 0.5·4 − 2 = 0, raw 0.25·(−3) = −0.75, next_v 2.
  //   t=0: δ = 0 + 0.5·2 − 1 = 0, raw 0.25·(−0.75) = −0.1875.
  // Row 1: t=3: δ = 2 + 0 − 1 = 1, raw 1, next_v 1.
  //   t=2: δ = 2 + 0.5·1 − 4 = −1.5, raw −1.5 + 0.25·1 = −1.25, next_v 4.
  //   t=1 hole: raw −1.25 carried, next_v stays 4.
  //   t=0: δ = 0 + 0.5·4 − 2 = 0, raw 0.25·(−1.25) = −0.3125.
  const at::Tensor raw = rows({{-0.1875, -0.75, -3, 0}, {-0.3125, -1.25, -1.25, 1}}, at::kDouble);
  // Whitening over the 6 valid raws: mean −4.5/6 = −0.75; deviations
  // 0.5625, 0, −2.25, 0.4375, −0.5, 1.75; Σ squares 8.8828125; unbiased var
  // 8.8828125/5. Masked positions are whitened too (not zeroed).
  const double var = 8.8828125 / 5;
  const at::Tensor expected_adv = (raw + 0.75) / std::sqrt(var + 1e-8);
  const at::Tensor expected_ret = raw + v.to(at::kDouble);
  const AdvantageResult out = compute_gae(r, v, m, 0.5, 0.5);
  // A scan of 4 steps, then 6-term mean and variance.
  const Tolerance tol = Tolerance::fp32(20, 8);
  expect_close(out.returns, expected_ret, tol, "returns (raw + values, before whitening)");
  expect_close(out.advantages, expected_adv, tol, "advantages");
  EXPECT_EQ(out.advantages.scalar_type(), at::kFloat);
}

TEST(Gae, WithGammaLambdaOneIsTheUndiscountedReturnMinusValue) {
  // γ = λ = 1, one row + one single-token row: raw_t = Σ_{t' ≥ t} r − V_t.
  const at::Tensor r = rows({{0, 0, 1}, {2, 0, 0}});
  const at::Tensor v = rows({{0.5, 0.25, 0.75}, {1, 0, 0}});
  const at::Tensor m = rows({{1, 1, 1}, {1, 0, 0}});
  // Row 0: 1 − 0.5, 1 − 0.25, 1 − 0.75; row 1: 2 − 1, then padding 0, 0.
  const at::Tensor raw = rows({{0.5, 0.75, 0.25}, {1, 0, 0}}, at::kDouble);
  expect_close(compute_gae(r, v, m, 1, 1).returns, raw + v.to(at::kDouble), Tolerance::fp32(6, 2),
               "returns");
}

TEST(Gae, RefusesFewerThanTwoValidTokensAndMismatchedShapes) {
  const at::Tensor r = rows({{1, 0}});
  EXPECT_THROW(compute_gae(r, r, rows({{1, 0}}), 1, 1), baton::InvalidArgument);
  EXPECT_THROW(compute_gae(r, rows({{1, 0, 0}}), rows({{1, 1}}), 1, 1), baton::InvalidArgument);
}

// --- GRPO --------------------------------------------------------------------

// Six rows in interleaved groups a (rows 0, 2, 5), b (1, 4; tied) and c (3,
// singleton). Scores are summed over ALL positions: row 5's reward at its
// masked last token counts. Row 2's mask is empty; it still counts in a.
struct GroupBatch {
  at::Tensor rewards = rows({{0, 0, 1},    // a: s = 1
                             {0, 2, 0},    // b: s = 2
                             {0, 0, 0},    // a: s = 0 (empty mask)
                             {0, 0, 3},    // c: s = 3
                             {2, 0, 0},    // b: s = 2
                             {1, 0, 1}});  // a: s = 2 (1 at a masked token)
  at::Tensor mask =
      rows({{1, 1, 1}, {1, 1, 0}, {0, 0, 0}, {1, 0, 1}, {1, 0, 0}, {1, 1, 0}}, at::kLong);
  Uids uids = {"a", "b", "a", "c", "b", "a"};
};

TEST(Grpo, NormalisesWithinInterleavedGroupsByBesselStd) {
  const GroupBatch g;
  // a: {1, 0, 2}, mean 1, Bessel var (0 + 1 + 1)/2 = 1, std 1.
  // b: tied, exactly 0. c: singleton, mean 0 and std 1: 3/(1 + ε).
  const double e = 1 + 1e-6;
  const at::Tensor expected = per_row({0, 0, -1 / e, 3 / e, 0, 1 / e}, g.mask);
  const AdvantageResult out = compute_grpo(g.rewards, g.mask, g.uids);
  expect_close(out.advantages, expected, Tolerance::fp32(6, 3), "advantages");
  EXPECT_TRUE(at::equal(out.returns, out.advantages));
  expect_close(out.advantages.index({at::indexing::Slice(1, 5, 3)}), at::zeros({2, 3}),
               Tolerance::exact(), "a fully tied group gets exactly 0");
}

TEST(Grpo, WithoutStdNormalisationSubtractsTheGroupMean) {
  const GroupBatch g;
  GrpoOptions dr;
  dr.norm_adv_by_std = false;
  // Dr.GRPO: s − mean; the singleton keeps its raw score 3.
  expect_close(compute_grpo(g.rewards, g.mask, g.uids, dr).advantages,
               per_row({0, 0, -1, 3, 0, 1}, g.mask), Tolerance::fp32(6, 3), "advantages");
}

TEST(Grpo, EpsilonIsAddedToTheStd) {
  // One group {0, 2}: mean 1, std √2; with ε = 0.5: ±1/(√2 + 0.5).
  const at::Tensor r = rows({{0}, {2}});
  const at::Tensor m = rows({{1}, {1}});
  GrpoOptions o;
  o.epsilon = 0.5;
  const double d = std::sqrt(2.0) + 0.5;
  expect_close(compute_grpo(r, m, {"x", "x"}, o).advantages, rows({{-1 / d}, {1 / d}}),
               Tolerance::fp32(6, 2), "advantages");
}

TEST(GrpoVectorized, EqualsTheLoopVersion) {
  const GroupBatch g;
  for (bool norm : {true, false}) {
    GrpoOptions o;
    o.norm_adv_by_std = norm;
    const at::Tensor loop = compute_grpo(g.rewards, g.mask, g.uids, o).advantages;
    const AdvantageResult vec = compute_grpo_vectorized(g.rewards, g.mask, g.uids, o);
    expect_close(vec.advantages, loop, Tolerance::fp32(6, 3), norm ? "normalised" : "Dr.GRPO");
    EXPECT_TRUE(at::equal(vec.returns, vec.advantages));
  }
  // Random 0/1 rewards in groups of sizes 1..4 against the loop version:
  // |s| + |mean| <= 8 and a non-tied group's std is >= 0.5, so |a| and the
  // terms behind it stay below 16.
  at::manual_seed(3);
  const at::Tensor r = at::randint(0, 2, {10, 4}, at::kFloat);
  const at::Tensor m = at::randint(0, 2, {10, 4}, at::kLong);
  const Uids uids = {"p", "q", "p", "r", "s", "q", "p", "s", "p", "t"};
  expect_close(compute_grpo_vectorized(r, m, uids).advantages, compute_grpo(r, m, uids).advantages,
               Tolerance::fp32(16, 16), "random");
}

TEST(Grpo, RefusesAUidListOfTheWrongLength) {
  const GroupBatch g;
  EXPECT_THROW(compute_grpo(g.rewards, g.mask, {"a", "b"}), baton::InvalidArgument);
  EXPECT_THROW(compute_grpo_vectorized(g.rewards, g.mask, {"a"}), baton::InvalidArgument);
}

// --- GRPO pass@k ---------------------------------------------------------------

TEST(GrpoPassk, OnlyTheBestRowGetsTheGapToTheSecondAndTiesGetZero) {
  // x (rows 0, 2, 4): {1, 3, 2}: best row 2, gap 3 − 2 = 1, Bessel std 1.
  // y (rows 1, 3): tied {2, 2}: 0 everywhere.
  const at::Tensor r = rows({{1, 0}, {0, 2}, {3, 0}, {2, 0}, {0, 2}});
  const at::Tensor m = rows({{1, 1}, {1, 1}, {1, 0}, {1, 1}, {1, 1}});
  const Uids uids = {"x", "y", "x", "y", "x"};
  expect_close(compute_grpo_passk(r, m, uids).advantages, per_row({0, 0, 1 / (1 + 1e-6), 0, 0}, m),
               Tolerance::fp32(6, 3), "normalised");
  GrpoOptions raw;
  raw.norm_adv_by_std = false;
  const AdvantageResult out = compute_grpo_passk(r, m, uids, raw);
  expect_close(out.advantages, per_row({0, 0, 1, 0, 0}, m), Tolerance::exact(), "raw gap");
  EXPECT_TRUE(at::equal(out.returns, out.advantages));
}

TEST(GrpoPassk, RefusesASingletonGroup) {
  try {
    compute_grpo_passk(rows({{1}, {2}, {3}}), rows({{1}, {1}, {1}}), {"a", "a", "lonely"});
    FAIL() << "no throw";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'lonely'"), std::string::npos) << e.what();
  }
}

// --- RLOO ----------------------------------------------------------------------

TEST(Rloo, SubtractsTheMeanOfTheOthersAndKeepsASingletonsRawScore) {
  const GroupBatch g;
  // a {1, 0, 2}: 1 − 1, 0 − 1.5, 2 − 0.5; b tied: 0; c singleton: 3.
  expect_close(compute_rloo(g.rewards, g.mask, g.uids).advantages,
               per_row({0, 0, -1.5, 3, 0, 1.5}, g.mask), Tolerance::fp32(6, 3), "advantages");
}

TEST(RlooVectorized, GivesZeroToASingleton) {
  const GroupBatch g;
  const AdvantageResult out = compute_rloo_vectorized(g.rewards, g.mask, g.uids);
  expect_close(out.advantages, per_row({0, 0, -1.5, 0, 0, 1.5}, g.mask), Tolerance::fp32(6, 3),
               "advantages");
  EXPECT_TRUE(at::equal(out.returns, out.advantages));
}

// --- REINFORCE++ ---------------------------------------------------------------

TEST(ReinforcePlusPlus, DiscountsOverValidTokensBridgingHolesThenWhitens) {
  // γ = 0.5. Row 0: padding at t = 3 (its reward 2 is ignored):
  //   t=2: G 0; t=1: G 1; t=0: 0 + 0.5·1 = 0.5 → returns (0.5, 1, 0, 0).
  // Row 1: hole at t = 1 (reward 9 ignored, G carried):
  //   t=3: 5; t=2: 2 + 2.5 = 4.5; t=1: 0 (masked); t=0: 1 + 0.5·4.5 = 3.25.
  const at::Tensor r = rows({{0, 1, 0, 2}, {1, 9, 2, 5}});
  const at::Tensor m = rows({{1, 1, 1, 0}, {1, 0, 1, 1}});
  const at::Tensor ret = rows({{0.5, 1, 0, 0}, {3.25, 0, 4.5, 5}}, at::kDouble);
  // Valid returns 0.5, 1, 0, 3.25, 4.5, 5: mean 14.25/6 = 2.375; Σ(x − mean)²
  // = 23.21875; unbiased var 23.21875/5.
  const at::Tensor adv = (ret - 2.375) / std::sqrt(23.21875 / 5 + 1e-8) * m.to(at::kDouble);
  const AdvantageResult out = compute_reinforce_plus_plus(r, m, 0.5);
  const Tolerance tol = Tolerance::fp32(20, 9);
  expect_close(out.returns, ret, tol, "returns");
  expect_close(out.advantages, adv, tol, "advantages");
}

TEST(ReinforcePlusPlusBaseline, SubtractsTheGroupMeanThenWhitensOverTokens) {
  const GroupBatch g;
  // Per row s − group mean: a (1, 0, 2) − 1; b 0; c singleton 3 − 0:
  // rows (0, 0, −1, 3, 0, 1). Over the 10 valid tokens: 0 ×6 (rows 0, 1, 4),
  // 3 ×2 (row 3), 1 ×2 (row 5); row 2 has none. Mean 8/10; Σ(x − 0.8)² =
  // 6·0.64 + 2·4.84 + 2·0.04 = 13.6; unbiased var 13.6/9.
  const at::Tensor a = per_row({0, 0, -1, 3, 0, 1}, g.mask);
  const at::Tensor expected = (a - 0.8) / std::sqrt(13.6 / 9 + 1e-8) * g.mask.to(at::kDouble);
  const AdvantageResult out = compute_reinforce_plus_plus_baseline(g.rewards, g.mask, g.uids);
  expect_close(out.advantages, expected, Tolerance::fp32(24, 4), "advantages");
  EXPECT_TRUE(at::equal(out.returns, out.advantages));
}

// --- ReMax, OPO, GPG ---------------------------------------------------------------

TEST(Remax, ReturnsAreSuffixSumsOfMaskedRewardsMinusTheGreedyBaseline) {
  // Masked rewards (0, 1, 0) and (3, 0, 1): suffix sums (1, 1, 0), (4, 1, 1);
  // minus b·mask with b = (0.5, 2).
  const at::Tensor r = rows({{0, 1, 2}, {3, 5, 1}});
  const at::Tensor m = rows({{1, 1, 0}, {1, 0, 1}});
  const AdvantageResult out = compute_remax(r, at::tensor({0.5, 2.0}), m);
  expect_close(out.returns, rows({{1, 1, 0}, {4, 1, 1}}), Tolerance::exact(), "returns");
  expect_close(out.advantages, rows({{0.5, 0.5, 0}, {2, 1, -1}}), Tolerance::exact(), "advantages");
  EXPECT_THROW(compute_remax(r, at::tensor({1.0}), m), baton::InvalidArgument);
}

TEST(Opo, UsesALengthWeightedGroupBaseline) {
  const GroupBatch g;
  // Lengths (3, 2, 0, 2, 1, 2). a: (3·1 + 0·0 + 2·2)/5 = 1.4; b: (2·2 + 1·2)/3
  // = 2; c singleton: 0.
  expect_close(compute_opo(g.rewards, g.mask, g.uids).advantages,
               per_row({1 - 1.4, 0, -1.4, 3, 0, 2 - 1.4}, g.mask), Tolerance::fp32(8, 4),
               "advantages");
  // A group whose rows are all empty: 0/0, NaN as in verl.
  const at::Tensor out = compute_opo(rows({{1}, {2}}), rows({{0}, {0}}), {"e", "e"}).advantages;
  EXPECT_TRUE(out.isnan().all().item<bool>());
}

TEST(Gpg, ScalesTheGroupCentredScoreByBatchOverNonzeroScores) {
  const GroupBatch g;
  // Scores (1, 2, 0, 3, 2, 2): 5 nonzero of 6, α = 1.2. a: 1.2·(s − 1);
  // b: 0; c singleton: 1.2·3. With f_norm 2 all halve.
  const std::vector<double> a = {0, 0, -1.2, 3.6, 0, 1.2};
  expect_close(compute_gpg(g.rewards, g.mask, g.uids).advantages, per_row(a, g.mask),
               Tolerance::fp32(6, 4), "f_norm 1");
  expect_close(compute_gpg(g.rewards, g.mask, g.uids, 2).advantages, per_row(a, g.mask) / 2,
               Tolerance::fp32(6, 4), "f_norm 2");
  // All scores 0: α = B / 1, advantages 0.
  expect_close(compute_gpg(at::zeros({2, 2}), at::ones({2, 2}), {"u", "u"}).advantages,
               at::zeros({2, 2}), Tolerance::exact(), "all zero");
}

// --- Optimal token baseline ----------------------------------------------------
// verl has no test vectors for these estimators; the expected values are
// worked out by hand from verl's definition (core_algos.py): G = reward-to-go
// of the masked rewards, w = 1 − 2π + Σπ² (times ρ̄²), W = cumsum(w·mask),
// B_t = Σ_i G·W·mask / (Σ_i W·mask + 1e-8) per group. The inputs give w
// directly: π and Σπ² are chosen so that w is a short binary fraction.

// log π for the given π, in fp32 (exp of it is π to one rounding).
at::Tensor log_of(std::initializer_list<std::initializer_list<double>> pi) {
  return rows(pi, at::kDouble).log().to(at::kFloat);
}

// Group a = rows 0, 1; row 2 is a singleton. Row 1's reward 9 sits at a masked
// position (ignored).
struct TokenBaselineBatch {
  at::Tensor rewards = rows({{0, 0, 1}, {0, 2, 9}, {3, 0, 0}});
  at::Tensor mask = rows({{1, 1, 1}, {1, 1, 0}, {1, 0, 0}}, at::kLong);
  Uids uids = {"a", "a", "b"};
  // w: row 0 (0.5, 0.25, 1), row 1 (1, 0.25, ·), row 2 (1, ·, ·).
  TokenBaselineInputs policy{log_of({{0.5, 0.5, 0.5}, {0.25, 0.75, 0.5}, {0.5, 0.5, 0.5}}),
                             rows({{0.5, 0.25, 1.0}, {0.5, 0.75, 0.5}, {1.0, 0.5, 0.5}}),
                             at::Tensor()};
};

// Baselines ~ 2, a chain of a few terms each.
const Tolerance kOtbTol = Tolerance::fp32(8, 4);

TEST(OptimalTokenBaseline, WeighsTheGroupsReturnsByTheirRealizedEnergyPerColumn) {
  const TokenBaselineBatch b;
  // G: row 0 (1, 1, 1), row 1 (2, 2, 0), row 2 (3, 0, 0).
  // W: row 0 (0.5, 0.75, 1.75), row 1 (1, 1.25, 1.25).
  // B: t0 (1·0.5 + 2·1)/1.5 = 5/3; t1 (0.75 + 2·1.25)/2 = 1.625;
  //    t2 (1.75 + 0)/1.75 = 1 (row 1 is masked there).
  const at::Tensor returns = rows({{1, 1, 1}, {2, 2, 0}, {3, 0, 0}}, at::kDouble);
  TokenBaselineOptions no_tail;
  no_tail.handle_zero_tail = false;
  const AdvantageResult plain =
      compute_optimal_token_baseline(b.rewards, b.mask, b.uids, b.policy, no_tail);
  expect_close(
      plain.advantages,
      rows({{1 - 5.0 / 3, 1 - 1.625, 0}, {2 - 5.0 / 3, 2 - 1.625, 0}, {3, 0, 0}}, at::kDouble),
      kOtbTol, "advantages");
  expect_close(plain.returns, returns, Tolerance::exact(), "returns");
  // Zero tail (the default): row 0 is the only longest (3 > 2), so its
  // baseline is 0 from column 2 on and its advantage there is G = 1.
  const AdvantageResult tail = compute_optimal_token_baseline(b.rewards, b.mask, b.uids, b.policy);
  expect_close(
      tail.advantages,
      rows({{1 - 5.0 / 3, 1 - 1.625, 1}, {2 - 5.0 / 3, 2 - 1.625, 0}, {3, 0, 0}}, at::kDouble),
      kOtbTol, "advantages with zero tail");
  expect_close(tail.returns, returns, Tolerance::exact(), "returns with zero tail");
}

TEST(OptimalTokenBaseline, RolloutIsWeightsScaleTheEnergyByTheirSquare) {
  TokenBaselineBatch b;
  b.policy.rollout_is_weights = rows({{1, 1, 1}, {2, 1, 1}, {1, 1, 1}});
  // Row 1's w becomes (4, 0.25): W (4, 4.25). B: t0 (0.5 + 2·4)/4.5 = 17/9;
  // t1 (0.75 + 2·4.25)/5 = 1.85; t2 1 (row 0 is the longest: 0 there).
  expect_close(
      compute_optimal_token_baseline(b.rewards, b.mask, b.uids, b.policy).advantages,
      rows({{1 - 17.0 / 9, 1 - 1.85, 1}, {2 - 17.0 / 9, 2 - 1.85, 0}, {3, 0, 0}}, at::kDouble),
      kOtbTol, "advantages");
}

TEST(OptimalTokenBaseline, EqualLengthsKeepTheWholeBaselineAndGroupsInterleave) {
  // Rows 0 and 2 form a group (lengths 2 and 2: no zero tail), row 1 is a
  // singleton between them. w = 1 − 2·0.5 + 0.5 = 0.5 everywhere: W (0.5, 1).
  const at::Tensor r = rows({{0, 1}, {0, 4}, {0, 3}});
  const at::Tensor m = at::ones({3, 2}, at::kLong);
  const TokenBaselineInputs policy{log_of({{0.5, 0.5}, {0.5, 0.5}, {0.5, 0.5}}),
                                   at::full({3, 2}, 0.5f), at::Tensor()};
  // B: t0 (1·0.5 + 3·0.5)/1 = 2, t1 (1 + 3)/2 = 2.
  expect_close(compute_optimal_token_baseline(r, m, {"x", "y", "x"}, policy).advantages,
               rows({{-1, -1}, {4, 4}, {1, 1}}, at::kDouble), kOtbTol, "advantages");
}

TEST(TirOptimalTokenBaseline, PacksEachRowsValidTokensSoHolesDoNotShiftTheBaseline) {
  // Row 0 has a hole at t = 1 (a tool's output: its reward 5 is ignored),
  // row 1 trailing padding. w: row 0 (0.5, ·, 0.25, 1), row 1 (1, 0.25, 0.5, ·).
  const at::Tensor r = rows({{0, 5, 0, 1}, {0, 0, 2, 0}});
  const at::Tensor m = rows({{1, 0, 1, 1}, {1, 1, 1, 0}}, at::kLong);
  const Uids uids = {"a", "a"};
  const TokenBaselineInputs policy{log_of({{0.5, 0.5, 0.5, 0.5}, {0.25, 0.75, 0.5, 0.5}}),
                                   rows({{0.5, 0.5, 0.25, 1.0}, {0.5, 0.75, 0.5, 0.5}}),
                                   at::Tensor()};
  // G: row 0 (1, 1, 1, 1), row 1 (2, 2, 2, 0). W (carried over the hole):
  // row 0 (0.5, 0.5, 0.75, 1.75), row 1 (1, 1.25, 1.75, 1.75).
  // Packed: row 0 W (0.5, 0.75, 1.75), row 1 W (1, 1.25, 1.75), G 1s and 2s;
  // b*: (0.5 + 2)/1.5 = 5/3, (0.75 + 2.5)/2 = 1.625, (1.75 + 3.5)/3.5 = 1.5.
  // Equal lengths (3, 3): no zero tail. Row 0's packed advantages go back to
  // t = 0, 2, 3.
  const AdvantageResult tir = compute_tir_optimal_token_baseline(r, m, uids, policy);
  expect_close(tir.advantages,
               rows({{1 - 5.0 / 3, 0, 1 - 1.625, 1 - 1.5}, {2 - 5.0 / 3, 2 - 1.625, 2 - 1.5, 0}},
                    at::kDouble),
               kOtbTol, "tir advantages");
  expect_close(tir.returns, rows({{1, 1, 1, 1}, {2, 2, 2, 0}}, at::kDouble), Tolerance::exact(),
               "tir returns");
  // The column-wise estimator pairs row 0's third token with row 1's second:
  // B t1 = 2·1.25/1.25 = 2, t2 = (0.75 + 3.5)/2.5 = 1.7, t3 = 1.75/1.75 = 1.
  expect_close(compute_optimal_token_baseline(r, m, uids, policy).advantages,
               rows({{1 - 5.0 / 3, 0, 1 - 1.7, 0}, {2 - 5.0 / 3, 0, 2 - 1.7, 0}}, at::kDouble),
               kOtbTol, "column-wise advantages");
}

TEST(TirOptimalTokenBaseline, ZeroesTheLongestRowsTailAndLeavesEmptyRowsOut) {
  // Group a: row 0 (length 3), row 1 (length 1) and row 2 (empty: no part in
  // the baseline, advantage 0). w: row 0 (0.5, 0.25, 1), row 1 (1, ·, ·).
  const at::Tensor r = rows({{0, 0, 1}, {2, 0, 0}, {7, 0, 0}});
  const at::Tensor m = rows({{1, 1, 1}, {1, 0, 0}, {0, 0, 0}}, at::kLong);
  const TokenBaselineInputs policy{log_of({{0.5, 0.5, 0.5}, {0.25, 0.5, 0.5}, {0.5, 0.5, 0.5}}),
                                   rows({{0.5, 0.25, 1.0}, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}}),
                                   at::Tensor()};
  // Packed W: row 0 (0.5, 0.75, 1.75), row 1 (1, 0, 0); G row 0 1s, row 1 (2, 0, 0).
  // b*: 2.5/1.5 = 5/3, 0.75/0.75 = 1, 1.75/1.75 = 1; row 0 is the only
  // longest (3 > 1): its baseline is 0 from packed column 1 on.
  const AdvantageResult out = compute_tir_optimal_token_baseline(r, m, {"a", "a", "a"}, policy);
  expect_close(out.advantages,
               rows({{1 - 5.0 / 3, 1, 1}, {2 - 5.0 / 3, 0, 0}, {0, 0, 0}}, at::kDouble), kOtbTol,
               "advantages");
  // Alone in its group after the empty row leaves, a row keeps its return.
  const AdvantageResult single = compute_tir_optimal_token_baseline(r, m, {"a", "b", "b"}, policy);
  expect_close(single.advantages.narrow(0, 1, 1), rows({{2, 0, 0}}, at::kDouble), kOtbTol,
               "singleton after the empty row");
}

TEST(OptimalTokenBaseline, RefusesMissingOrMisshapenPolicyInputs) {
  const TokenBaselineBatch b;
  TokenBaselineInputs no_sum = b.policy;
  no_sum.sum_pi_squared = at::Tensor();
  EXPECT_THROW(compute_optimal_token_baseline(b.rewards, b.mask, b.uids, no_sum),
               baton::InvalidArgument);
  TokenBaselineInputs narrow = b.policy;
  narrow.old_log_probs = narrow.old_log_probs.narrow(1, 0, 2);
  EXPECT_THROW(compute_tir_optimal_token_baseline(b.rewards, b.mask, b.uids, narrow),
               baton::InvalidArgument);
  TokenBaselineInputs bad_weights = b.policy;
  bad_weights.rollout_is_weights = at::ones({1, 3});
  EXPECT_THROW(compute_optimal_token_baseline(b.rewards, b.mask, b.uids, bad_weights),
               baton::InvalidArgument);
  EXPECT_THROW(compute_optimal_token_baseline(b.rewards, b.mask, {"a"}, b.policy),
               baton::InvalidArgument);
}

}  // namespace
}  // namespace baton::algos
