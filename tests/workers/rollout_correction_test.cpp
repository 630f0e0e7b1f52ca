// Rollout correction (verl's rollout_corr_helper.py): IS weights (TIS,
// IcePop, sequence level, batch normalisation), rejection sampling and the
// off-policy metrics, against verl's own test vectors
// (tests/trainer/ppo/test_rollout_corr*.py) where they pin numbers and hand-
// worked values otherwise. Inputs are fp32 like verl's; every expected value
// is computed in double. Reductions here sum a handful of terms (n ≤ 16)
// of magnitude ≤ 8, and masked means add verl's 1e-8 to their count
// (a relative 1e-8 < the fp32 tolerance), hence Tolerance::fp32(16, 8).
#include "workers/algos/rollout_correction.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/tensor_rows.h"
#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::rows;
using test::Tolerance;

const Tolerance kTol = Tolerance::fp32(16, 8);

RolloutCorrectionOptions token_is(const std::string& threshold) {
  RolloutCorrectionOptions o;
  o.rollout_is = RolloutIsLevel::Token;
  o.is_threshold = parse_rollout_is_threshold(threshold);
  return o;
}

double at_key(const CorrectionMetrics& m, const std::string& key) {
  const auto it = m.find(key);
  EXPECT_NE(it, m.end()) << "no metric " << key;
  return it == m.end() ? NAN : it->second;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const baton::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no baton::InvalidArgument";
  return "";
}

TEST(RolloutCorrection, RejectionMasksTokensWhileTheIsWeightsStayTheRawRatios) {
  // verl's test_mask_mode: log r = −1 (row 0, r ≈ 0.37) and 0.5 (row 1,
  // r ≈ 1.65); token_k1 "0.5_2.0" keeps −log r in [log 0.5, log 2], so row 0
  // (−log r = 1) leaves the mask; the TIS weights keep both rows' ratios.
  const at::Tensor old_lp = at::full({2, 5}, -2.0f);
  const at::Tensor rollout_lp = rows({{-1, -1, -1, -1, -1}, {-2.5, -2.5, -2.5, -2.5, -2.5}});
  const at::Tensor mask = at::ones({2, 5}, at::kLong);
  RolloutCorrectionOptions o = token_is("2.0");
  o.rejection = parse_rollout_rs("token_k1", "0.5_2.0");
  const RolloutCorrection c = compute_rollout_correction(old_lp, rollout_lp, mask, o);
  expect_close(c.rollout_is_weights,
               at::stack({at::full({5}, std::exp(-1.0), at::kDouble),
                          at::full({5}, std::exp(0.5), at::kDouble)}),
               kTol, "weights");
  EXPECT_TRUE(at::equal(c.response_mask, rows({{0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}}, at::kLong)));
  EXPECT_EQ(c.response_mask.scalar_type(), at::kLong);
  expect_near(at_key(c.metrics, "rollout_corr/rollout_rs_masked_fraction"), 0.5, kTol,
              "masked fraction");
  expect_near(at_key(c.metrics, "rollout_corr/rollout_rs_seq_masked_fraction"), 0.5, kTol,
              "sequence masked fraction");
}

TEST(RolloutCorrection, IcePopZeroesOutOfBoundWeightsAndKeepsTheMask) {
  // verl's test_exact_icepop_zeroes_weights_without_changing_mask.
  const at::Tensor raw = rows({{0.4, 0.8, 6.0}});
  const at::Tensor mask = at::ones({1, 3});
  const RolloutCorrection c =
      compute_rollout_correction(at::zeros({1, 3}), -raw.log(), mask, token_is("0.5_5.0"));
  expect_close(c.rollout_is_weights, rows({{0.0, 0.8, 0.0}}), kTol, "weights");
  EXPECT_TRUE(at::equal(c.response_mask, mask));
  expect_near(at_key(c.metrics, "rollout_corr/rollout_is_oob_ratio"), 2.0 / 3, kTol, "oob");
  expect_near(at_key(c.metrics, "rollout_corr/rollout_is_std"), 0.3771236, {1e-6, 0}, "std");
  expect_near(at_key(c.metrics, "rollout_corr/rollout_is_eff_sample_size"), 1.0 / 3, kTol, "ess");

  // verl's test_exact_icepop_matches_filtered_weighted_ppo_loss.
  const RolloutCorrection d = compute_rollout_correction(
      at::full({1, 3}, -1.0f), rows({{-0.5, -3.5, -0.8}}), mask, token_is("0.5_5.0"));
  expect_close(d.rollout_is_weights, rows({{0.60653067, 0.0, 0.81873075}}), {1e-6, 1e-6},
               "weights");
  expect_near(at_key(d.metrics, "rollout_corr/rollout_is_oob_ratio"), 1.0 / 3, kTol, "oob");
}

TEST(RolloutCorrection, TokenIsTruncatesAndCountsBoundsOnTheRawWeights) {
  // verl's test_seq_fraction_high_uses_raw_weights: raw (1, 6) and (0.9, 1.1)
  // truncated at 2; row 0's raw mean 3.5 is above the bound, its truncated
  // mean 1.5 is not.
  const at::Tensor raw = rows({{1.0, 6.0}, {0.9, 1.1}});
  const RolloutIsWeights w =
      compute_rollout_is_weights(raw.log(), at::ones({2, 2}), RolloutIsLevel::Token, {2.0, {}});
  expect_close(w.weights, rows({{1.0, 2.0}, {0.9, 1.1}}), kTol, "weights");
  expect_near(at_key(w.metrics, "rollout_is_seq_fraction_high"), 0.5, kTol, "seq high");
  expect_near(at_key(w.metrics, "rollout_is_ratio_fraction_high"), 0.25, kTol, "token high");
  expect_near(at_key(w.metrics, "rollout_is_ratio_fraction_low"), 0.0, kTol, "token low");
  expect_near(at_key(w.metrics, "rollout_is_max"), 2.0, kTol, "max");
  expect_near(at_key(w.metrics, "rollout_is_min"), 0.9, kTol, "min");
  expect_near(at_key(w.metrics, "rollout_is_mean"), 5.0 / 4, kTol, "mean");
  // Per-sequence means of the applied weights: 1.5 and 1.
  expect_near(at_key(w.metrics, "rollout_is_seq_mean"), 1.25, kTol, "seq mean");
  expect_near(at_key(w.metrics, "rollout_is_seq_std"), std::sqrt(0.125), kTol, "seq std");
  expect_near(at_key(w.metrics, "rollout_is_seq_max_deviation"), 0.5, kTol, "seq deviation");
}

TEST(RolloutCorrection, SequenceIsWeighsEveryTokenByTheProductOfItsRatios) {
  // Row 0: Σ log r = 0.1 + 0.2 (5 is masked): e^0.3 on its two tokens.
  // Row 1: e^1.8 ≈ 6.05, truncated to 2.
  const at::Tensor lr = rows({{0.1, 0.2, 5.0}, {0.5, 0.6, 0.7}});
  const at::Tensor mask = rows({{1, 1, 0}, {1, 1, 1}}, at::kLong);
  const RolloutIsWeights w =
      compute_rollout_is_weights(lr, mask, RolloutIsLevel::Sequence, {2.0, {}});
  const double a = std::exp(0.3);
  expect_close(w.weights, rows({{a, a, 0}, {2, 2, 2}}, at::kDouble), kTol, "weights");
  // Max and min in log space over the rows, untruncated.
  expect_near(at_key(w.metrics, "rollout_is_max"), std::exp(1.8), kTol, "max");
  expect_near(at_key(w.metrics, "rollout_is_min"), a, kTol, "min");
  const double mean = (2 * a + 6) / 5;
  expect_near(at_key(w.metrics, "rollout_is_mean"), mean, kTol, "mean");
  expect_near(at_key(w.metrics, "rollout_is_ratio_fraction_high"), 0.5, kTol, "high");
  const double second_moment = (2 * a * a + 12) / 5;
  expect_near(at_key(w.metrics, "rollout_is_std"), std::sqrt(second_moment - mean * mean), kTol,
              "std");
  expect_near(at_key(w.metrics, "rollout_is_eff_sample_size"), mean * mean / second_moment, kTol,
              "ess");
}

TEST(RolloutCorrection, BatchNormalizationDividesByTheMeanWeight) {
  // Token level: raw (1, 3 → 2) and (0.5, masked); mean over valid 3.5/3.
  const at::Tensor lr = rows({{0.0, std::log(3.0)}, {std::log(0.5), 4.0}});
  const at::Tensor mask = rows({{1, 1}, {1, 0}});
  const RolloutIsWeights t =
      compute_rollout_is_weights(lr, mask, RolloutIsLevel::Token, {2.0, {}}, true);
  expect_close(t.weights, rows({{6.0 / 7, 12.0 / 7}, {3.0 / 7, 0}}, at::kDouble), kTol, "token");
  expect_near(at_key(t.metrics, "rollout_is_batch_norm_factor"), 3.5 / 3, kTol, "token factor");
  // Sequence level: row weights 3 → 2 and 0.5 (the masked 4 is not summed);
  // the mean over sequences is 1.25.
  const RolloutIsWeights s =
      compute_rollout_is_weights(lr, mask, RolloutIsLevel::Sequence, {2.0, {}}, true);
  expect_close(s.weights, rows({{1.6, 1.6}, {0.4, 0}}, at::kDouble), kTol, "sequence");
  expect_near(at_key(s.metrics, "rollout_is_batch_norm_factor"), 1.25, kTol, "sequence factor");
  // Without normalisation there is no factor.
  EXPECT_EQ(compute_rollout_is_weights(lr, mask, RolloutIsLevel::Token, {2.0, {}})
                .metrics.count("rollout_is_batch_norm_factor"),
            0u);
}

// log r with k2 = ½(log r)²: row 0 (0.02, 0.08, 0.005), row 1 (0.5, 0,
// masked 40.5), row 2 (0, 0, 2).
struct RejectionBatch {
  at::Tensor lr = rows({{0.2, -0.4, 0.1}, {1.0, 0.0, 9.0}, {0.0, 0.0, -2.0}});
  at::Tensor mask = rows({{1, 1, 1}, {1, 1, 0}, {1, 1, 1}}, at::kLong);
};

TEST(RolloutCorrection, EveryRejectionCriterionMustKeepAToken) {
  const RejectionBatch b;
  // token_k2 ≤ 1 drops row 2's last token; seq_sum_k2 ≤ 0.4 (sums 0.105,
  // 0.5, 2) drops rows 1 and 2.
  const RolloutRejection r = compute_rollout_rejection_mask(
      b.lr, b.mask, parse_rollout_rs("token_k2,seq_sum_k2", "1.0,0.4"));
  EXPECT_TRUE(at::equal(r.response_mask, rows({{1, 1, 1}, {0, 0, 0}, {0, 0, 0}}, at::kLong)));
  const CorrectionMetrics& m = r.metrics;
  expect_near(at_key(m, "rollout_rs_token_k2_masked_fraction"), 1.0 / 8, kTol, "token k2");
  expect_near(at_key(m, "rollout_rs_token_k2_seq_masked_fraction"), 1.0 / 3, kTol, "token k2 seq");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_masked_fraction"), 5.0 / 8, kTol, "seq sum");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_seq_masked_fraction"), 2.0 / 3, kTol, "seq sum seq");
  expect_near(at_key(m, "rollout_rs_masked_fraction"), 5.0 / 8, kTol, "all");
  expect_near(at_key(m, "rollout_rs_seq_masked_fraction"), 2.0 / 3, kTol, "all seq");
  // Token statistics over valid tokens only (the masked 40.5 is not the max).
  expect_near(at_key(m, "rollout_rs_token_k2_mean"), 2.605 / 8, kTol, "token mean");
  expect_near(at_key(m, "rollout_rs_token_k2_max"), 2.0, kTol, "token max");
  expect_near(at_key(m, "rollout_rs_token_k2_fraction_high"), 1.0 / 8, kTol, "token high");
  // Sequence statistics: the token-weighted mean of the row values, their
  // max, min and share above the bound over rows.
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_mean"), (3 * 0.105 + 2 * 0.5 + 3 * 2.0) / 8, kTol,
              "seq mean");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_max"), 2.0, kTol, "seq max");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_min"), 0.105, kTol, "seq min");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_fraction_high"), 2.0 / 3, kTol, "seq high");
  expect_near(at_key(m, "rollout_rs_seq_sum_k2_seq_mean"), 2.605 / 3, kTol, "seq seq mean");
  EXPECT_EQ(m.count("rollout_rs_seq_sum_k2_seq_fraction_low"), 0u);  // k1 only
}

TEST(RolloutCorrection, K1BoundsAreLogsOfTheGivenRatiosAndOneValueImpliesItsReciprocal) {
  const RejectionBatch b;
  // seq_mean_k1: −mean log r = 0.0333, −0.5, 0.6667 against [log 0.5, log 1.5]
  // = [−0.693, 0.405]: row 2 leaves.
  const RolloutRejection mean_k1 =
      compute_rollout_rejection_mask(b.lr, b.mask, parse_rollout_rs("seq_mean_k1", "0.5_1.5"));
  EXPECT_TRUE(at::equal(mean_k1.response_mask, rows({{1, 1, 1}, {1, 1, 0}, {0, 0, 0}}, at::kLong)));
  expect_near(at_key(mean_k1.metrics, "rollout_rs_seq_mean_k1_seq_fraction_low"), 0.0, kTol, "low");
  expect_near(at_key(mean_k1.metrics, "rollout_rs_seq_mean_k1_fraction_high"), 1.0 / 3, kTol,
              "high");
  // token_k1 "2": bounds [1/2, 2], i.e. |log r| ≤ log 2: row 1's log r = 1
  // and row 2's −2 leave.
  const std::vector<RejectionCriterion> c = parse_rollout_rs("token_k1", "2");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_DOUBLE_EQ(*c[0].lower, 0.5);
  const RolloutRejection token_k1 = compute_rollout_rejection_mask(b.lr, b.mask, c);
  EXPECT_TRUE(
      at::equal(token_k1.response_mask, rows({{1, 1, 1}, {0, 1, 0}, {1, 1, 0}}, at::kLong)));
  // seq_max_k2 ≤ 0.6: maxima 0.08, 0.5, 2 (the masked 40.5 ignored).
  const RolloutRejection max_k2 =
      compute_rollout_rejection_mask(b.lr, b.mask, parse_rollout_rs("seq_max_k2", "0.6"));
  EXPECT_TRUE(at::equal(max_k2.response_mask, rows({{1, 1, 1}, {1, 1, 0}, {0, 0, 0}}, at::kLong)));
  // seq_mean_k3: r − 1 − log r per token, averaged; row 2's is
  // (e^−2 + 1)/3 ≈ 0.378 > 0.37, row 1's (e − 2)/2 ≈ 0.359 and row 0's 0.032
  // are below.
  const RolloutRejection mean_k3 =
      compute_rollout_rejection_mask(b.lr, b.mask, parse_rollout_rs("seq_mean_k3", "0.37"));
  EXPECT_TRUE(at::equal(mean_k3.response_mask, rows({{1, 1, 1}, {1, 1, 0}, {0, 0, 0}}, at::kLong)));
  expect_near(at_key(mean_k3.metrics, "rollout_rs_seq_mean_k3_max"), (std::exp(-2.0) + 1) / 3, kTol,
              "k3 max");
}

TEST(RolloutCorrection, OffPolicyMetricsCompareTheTwoPolicies) {
  // log r = (0.5, 0) and (0.5, masked). Per-row mean log-probs: training
  // −1.5, −0.5; rollout −1.75, −1.
  const at::Tensor old_lp = rows({{-1.0, -2.0}, {-0.5, 0.0}});
  const at::Tensor rollout_lp = rows({{-1.5, -2.0}, {-1.0, 0.0}});
  const at::Tensor mask = rows({{1, 1}, {1, 0}});
  const CorrectionMetrics m = compute_offpolicy_metrics(old_lp, rollout_lp, mask);
  const double e = std::exp(1.0);
  expect_near(at_key(m, "training_ppl"), (std::exp(1.5) + std::exp(0.5)) / 2, kTol, "training_ppl");
  expect_near(at_key(m, "training_log_ppl"), 1.0, kTol, "training_log_ppl");
  expect_near(at_key(m, "kl"), -1.0 / 3, kTol, "kl");
  expect_near(at_key(m, "k3_kl"), 2 * (std::exp(0.5) - 1.5) / 3, kTol, "k3_kl");
  expect_near(at_key(m, "rollout_ppl"), (std::exp(1.75) + e) / 2, kTol, "rollout_ppl");
  expect_near(at_key(m, "rollout_log_ppl"), 1.375, kTol, "rollout_log_ppl");
  expect_near(at_key(m, "log_ppl_diff"), -0.375, kTol, "log_ppl_diff");
  expect_near(at_key(m, "log_ppl_abs_diff"), 0.375, kTol, "log_ppl_abs_diff");
  expect_near(at_key(m, "log_ppl_diff_max"), -0.25, kTol, "log_ppl_diff_max");
  expect_near(at_key(m, "log_ppl_diff_min"), -0.5, kTol, "log_ppl_diff_min");
  expect_near(at_key(m, "ppl_ratio"), (std::exp(-0.25) + std::exp(-0.5)) / 2, kTol, "ppl_ratio");
  expect_near(at_key(m, "chi2_token"), (2 * e + 1) / 3 - 1, kTol, "chi2_token");
  expect_near(at_key(m, "chi2_seq"), e - 1, kTol, "chi2_seq");
}

TEST(RolloutCorrection, PrefixesEveryMetricAndLeavesWhatIsOffUntouched) {
  const at::Tensor old_lp = rows({{-1.0, -2.0}, {-0.5, 0.0}});
  const at::Tensor rollout_lp = rows({{-1.5, -2.0}, {-1.0, 0.0}});
  const at::Tensor mask = rows({{1, 1}, {1, 0}}, at::kLong);
  RolloutCorrectionOptions rs_only;
  rs_only.rejection = parse_rollout_rs("seq_sum_k3", "10");
  const RolloutCorrection c = compute_rollout_correction(old_lp, rollout_lp, mask, rs_only);
  EXPECT_FALSE(c.rollout_is_weights.defined());
  EXPECT_TRUE(at::equal(c.response_mask, mask));  // nothing above the bound
  for (const auto& [k, v] : c.metrics) EXPECT_EQ(k.rfind("rollout_corr/", 0), 0u) << k;
  EXPECT_EQ(c.metrics.count("rollout_corr/chi2_seq"), 1u);
  EXPECT_EQ(c.metrics.count("rollout_corr/rollout_is_mean"), 0u);
  EXPECT_TRUE(error_of([&] {
                compute_rollout_correction(old_lp, rollout_lp, at::zeros({2, 2}), rs_only);
              }).find("at least one valid token") != std::string::npos);
  EXPECT_THROW(compute_rollout_correction(old_lp, rollout_lp.narrow(1, 0, 1), mask, rs_only),
               baton::InvalidArgument);
}

TEST(RolloutCorrection, SpecsAreParsedAsVerlReadsThemAndBadOnesNamed) {
  const RolloutIsThreshold tis = parse_rollout_is_threshold("2.0");
  EXPECT_DOUBLE_EQ(tis.upper, 2.0);
  EXPECT_FALSE(tis.lower);
  const RolloutIsThreshold icepop = parse_rollout_is_threshold("0.5_5.0");
  EXPECT_DOUBLE_EQ(*icepop.lower, 0.5);
  EXPECT_DOUBLE_EQ(icepop.upper, 5.0);
  for (const char* bad : {"", "true", "0", "-1", "5_0.5", "x_2", "2.0abc"})
    EXPECT_THROW(parse_rollout_is_threshold(bad), baton::InvalidArgument) << bad;
  EXPECT_EQ(parse_rollout_is_level("sequence"), RolloutIsLevel::Sequence);
  EXPECT_NE(error_of([] { parse_rollout_is_level("geometric"); }).find("token, sequence"),
            std::string::npos);

  // Duplicates dropped in order; one threshold shared; per-option thresholds.
  const auto shared = parse_rollout_rs(" seq_mean_k3 , token_k2,seq_mean_k3", "0.5");
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared[0].option, "seq_mean_k3");
  EXPECT_EQ(shared[1].option, "token_k2");
  EXPECT_DOUBLE_EQ(shared[1].upper, 0.5);
  const auto each = parse_rollout_rs("seq_mean_k1,seq_max_k3", "0.8_1.2,3.0");
  EXPECT_DOUBLE_EQ(*each[0].lower, 0.8);
  EXPECT_DOUBLE_EQ(each[0].upper, 1.2);
  EXPECT_DOUBLE_EQ(each[1].upper, 3.0);
  EXPECT_NE(error_of([] { parse_rollout_rs("geometric", "2"); }).find("seq_max_k3"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_rollout_rs("token_k1", ""); }).find("rollout_rs_threshold"),
            std::string::npos);
  for (const auto& [options, spec] : std::vector<std::pair<std::string, std::string>>{
           {"token_k1,token_k2,token_k3", "1,2"},  // neither one nor one per option
           {"token_k2", "0.5_2"},                  // '_' only for k1
           {"token_k2", "-1"},
           {"token_k1", "2_0.5"},  // lower above upper
           {"token_k1", "0_2"},
           {",", "2"}})
    EXPECT_THROW(parse_rollout_rs(options, spec), baton::InvalidArgument) << options << " " << spec;
}

}  // namespace
}  // namespace baton::algos
