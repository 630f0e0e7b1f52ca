// compute_data_metrics, compute_timing_metrics, compute_throughput_metrics
// and reduce_metrics on a hand-built batch of two rows (P = 3, R = 4) whose
// expected values are worked out below.
#include "trainer/metric_utils.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/errors.h"
#include "dispatch/data_proto.h"
#include "tests/tolerance.h"

namespace baton::trainer {
namespace {

using test::Tolerance;

at::Tensor f32(std::vector<float> v) { return at::tensor(v, at::kFloat).reshape({2, 4}); }

// Row 0: prompt length 2 (left-padded), response length 3; row 1: 3 and 4.
// Column 3 of row 0 is padding: its advantages/returns/values (100, 50, -50)
// must not count.
DataProto batch() {
  const at::Tensor mask =
      at::tensor(std::vector<int64_t>{0, 1, 1, 1, 1, 1, 0, /**/ 1, 1, 1, 1, 1, 1, 1}, at::kLong)
          .reshape({2, 7});
  return DataProto({
      {"responses", at::ones({2, 4}, at::kLong)},
      {"attention_mask", mask},
      {"response_mask", mask.narrow(1, 3, 4).clone()},
      // Σ per row: 1 and 0.5.
      {"token_level_scores", f32({0, 0, 1, 0, /**/ 0, 0, 0, 0.5})},
      // Σ per row: 0.8 and 0.6.
      {"token_level_rewards", f32({0, -0.1f, 0.9f, 0, /**/ 0.1f, 0, 0, 0.5})},
      // Valid: 1 2 3 −1 0 0 4 → mean 9/7, max 4, min −1.
      {"advantages", f32({1, 2, 3, 100, /**/ -1, 0, 0, 4})},
      // Valid: 2 2 2 1 1 1 1 → mean 10/7.
      {"returns", f32({2, 2, 2, 50, /**/ 1, 1, 1, 1})},
      // Valid: 1 2 3 1 1 1 1 → mean 10/7, max 3, min 1.
      {"values", f32({1, 2, 3, -50, /**/ 1, 1, 1, 1})},
  });
}

// Values that are exact in fp32 and double (small integers, their sums and
// ratios computed once in double) compare to a few double roundings.
void expect_exactish(const std::map<std::string, double>& m, const std::string& key,
                     double expected) {
  ASSERT_TRUE(m.count(key)) << key << " is missing";
  EXPECT_NEAR(m.at(key), expected, 1e-12 * std::max(1.0, std::abs(expected))) << key;
}

TEST(MetricUtils, DataMetricsMatchHandDerivedValues) {
  const auto m = compute_data_metrics(batch(), /*use_critic=*/true, /*max_response_length=*/4);
  expect_exactish(m, "critic/score/mean", 0.75);
  expect_exactish(m, "critic/score/max", 1.0);
  expect_exactish(m, "critic/score/min", 0.5);
  // fp32 row sums of 4 terms of magnitude ≤ 1 (−0.1 + 0.9 is not exact).
  const Tolerance sum4 = Tolerance::fp32(4, 1);
  test::expect_near(m.at("critic/rewards/mean"), 0.7, sum4, "critic/rewards/mean");
  test::expect_near(m.at("critic/rewards/max"), 0.8, sum4, "critic/rewards/max");
  test::expect_near(m.at("critic/rewards/min"), 0.6, sum4, "critic/rewards/min");
  expect_exactish(m, "critic/advantages/mean", 9.0 / 7);
  expect_exactish(m, "critic/advantages/max", 4);
  expect_exactish(m, "critic/advantages/min", -1);
  expect_exactish(m, "critic/returns/mean", 10.0 / 7);
  expect_exactish(m, "critic/returns/max", 2);
  expect_exactish(m, "critic/returns/min", 1);
  expect_exactish(m, "critic/values/mean", 10.0 / 7);
  expect_exactish(m, "critic/values/max", 3);
  expect_exactish(m, "critic/values/min", 1);
  // returns − values = 1 0 −1 0 0 0 0: unbiased variance 2/6 = 1/3.
  // returns: deviations from 10/7 are 4/7 (×3) and −3/7 (×4): Σ² = 84/49 = 12/7,
  // unbiased variance 2/7.
  expect_exactish(m, "critic/vf_explained_var", 1.0 - (1.0 / 3) / (2.0 / 7 + 1e-5));
  expect_exactish(m, "response_length/mean", 3.5);
  expect_exactish(m, "response_length/max", 4);
  expect_exactish(m, "response_length/min", 3);
  expect_exactish(m, "response_length/clip_ratio", 0.5);
  expect_exactish(m, "prompt_length/mean", 2.5);
  expect_exactish(m, "prompt_length/max", 3);
  expect_exactish(m, "prompt_length/min", 2);
  expect_exactish(m, "prompt_length/clip_ratio", 0.5);
  EXPECT_EQ(m.size(), 24u);
}

TEST(MetricUtils, ResponseClipRatioComparesWithTheGivenMaxLengthNotTheWidth) {
  const auto m = compute_data_metrics(batch(), true, /*max_response_length=*/8);
  EXPECT_EQ(m.at("response_length/clip_ratio"), 0.0);
  const auto m3 = compute_data_metrics(batch(), true, /*max_response_length=*/3);
  EXPECT_EQ(m3.at("response_length/clip_ratio"), 0.5);
}

TEST(MetricUtils, MissingKeysOmitTheirMetrics) {
  DataProto b = batch();
  b.pop({"values", "advantages", "token_level_rewards"});
  const auto m = compute_data_metrics(b, /*use_critic=*/true, 4);
  for (const char* absent : {"critic/values/mean", "critic/vf_explained_var",
                             "critic/advantages/mean", "critic/rewards/mean"}) {
    EXPECT_EQ(m.count(absent), 0u) << absent;
  }
  EXPECT_EQ(m.count("critic/score/mean"), 1u);
  EXPECT_EQ(m.count("critic/returns/mean"), 1u);
}

TEST(MetricUtils, WithoutCriticValuesAreNotReported) {
  const auto m = compute_data_metrics(batch(), /*use_critic=*/false, 4);
  EXPECT_EQ(m.count("critic/values/mean"), 0u);
  EXPECT_EQ(m.count("critic/vf_explained_var"), 0u);
  EXPECT_EQ(m.size(), 20u);
}

// Multi-turn rollouts report each row's turns and tool use
// (workers/roles/agent_loop.h): logged as multi_turn/<name>/{mean,max,min}.
TEST(MetricUtils, MultiTurnRowsGiveTheirTurnsAndToolUse) {
  DataProto b = batch();
  EXPECT_EQ(compute_data_metrics(b, true, 4).count("multi_turn/turns/mean"), 0u);
  b.set_tensor("multi_turn_turns", at::tensor({1.0f, 3.0f}));
  b.set_tensor("multi_turn_tool_calls", at::tensor({0.0f, 4.0f}));
  b.set_tensor("multi_turn_tool_errors", at::tensor({0.0f, 1.0f}));
  b.set_tensor("multi_turn_tool_time_s", at::tensor({0.0f, 0.5f}));
  b.set_tensor("multi_turn_user_turns", at::tensor({2.0f, 0.0f}));
  const auto m = compute_data_metrics(b, true, 4);
  expect_exactish(m, "multi_turn/turns/mean", 2);
  expect_exactish(m, "multi_turn/turns/max", 3);
  expect_exactish(m, "multi_turn/tool_calls/mean", 2);
  expect_exactish(m, "multi_turn/tool_errors/max", 1);
  expect_exactish(m, "multi_turn/tool_time_s/mean", 0.25);
  expect_exactish(m, "multi_turn/user_turns/max", 2);
}

TEST(MetricUtils, ResponseMaskSelectsTheTokensOfAdvantages) {
  DataProto b = batch();
  // Mask out row 1's last token: valid advantages 1 2 3 −1 0 0 → max 3.
  at::Tensor rm = b.tensor("response_mask").clone();
  rm[1][3] = 0;
  b.set_tensor("response_mask", rm);
  auto m = compute_data_metrics(b, true, 4);
  expect_exactish(m, "critic/advantages/max", 3);
  expect_exactish(m, "critic/advantages/mean", 5.0 / 6);
  // Lengths still come from the attention mask, as verl's.
  expect_exactish(m, "response_length/mean", 3.5);
  // Without response_mask, the attention mask's response part is used.
  b.pop({"response_mask"});
  m = compute_data_metrics(b, true, 4);
  expect_exactish(m, "critic/advantages/max", 4);
}

TEST(MetricUtils, DataMetricsRejectAnEmptyBatchOrMissingResponses) {
  EXPECT_THROW(compute_data_metrics(DataProto(), true, 4), Error);
  DataProto b = batch();
  b.pop({"responses"});
  try {
    compute_data_metrics(b, true, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("responses"), std::string::npos) << e.what();
  }
}

TEST(MetricUtils, TimingMetricsNormaliseGenByResponseTokensAndOthersByAllTokens) {
  // Response tokens 3 + 4 = 7; prompt tokens 2 + 3 = 5; all 12.
  const auto m = compute_timing_metrics(
      batch(), {{"gen", 0.7}, {"ref", 1.2}, {"update_actor", 2.4}, {"reward", 0.5}, {"step", 3}});
  expect_exactish(m, "timing_s/gen", 0.7);
  expect_exactish(m, "timing_s/reward", 0.5);
  expect_exactish(m, "timing_s/step", 3);
  expect_exactish(m, "timing_per_token_ms/gen", 700.0 / 7);
  expect_exactish(m, "timing_per_token_ms/ref", 1200.0 / 12);
  expect_exactish(m, "timing_per_token_ms/update_actor", 2400.0 / 12);
  EXPECT_EQ(m.count("timing_per_token_ms/reward"), 0u);
  EXPECT_EQ(m.count("timing_per_token_ms/step"), 0u);
  EXPECT_EQ(m.size(), 8u);
}

TEST(MetricUtils, ThroughputIsTokensPerSecondPerWorker) {
  const auto m = compute_throughput_metrics(batch(), {{"step", 3.0}, {"gen", 1.0}}, 2);
  expect_exactish(m, "perf/total_num_tokens", 12);
  expect_exactish(m, "perf/time_per_step", 3);
  expect_exactish(m, "perf/throughput", 12.0 / (3 * 2));
  EXPECT_THROW(compute_throughput_metrics(batch(), {{"gen", 1.0}}, 2), Error);
  EXPECT_THROW(compute_throughput_metrics(batch(), {{"step", 1.0}}, 0), Error);
}

TEST(MetricUtils, ReduceMetricsTakesMeansAndKeepsExtremaOfMaxAndMinKeys) {
  const auto m = reduce_metrics({{"actor/pg_loss", {1, 2, 6}},
                                 {"critic/values/max", {1, 5, 2}},
                                 {"critic/values/min", {3, -1, 2}},
                                 {"actor/grad_max", {0.5, 0.25}},
                                 {"actor/maximal_thing", {1, 3}},
                                 {"empty", {}}});
  EXPECT_EQ(m.at("actor/pg_loss"), 3.0);
  EXPECT_EQ(m.at("critic/values/max"), 5.0);
  EXPECT_EQ(m.at("critic/values/min"), -1.0);
  EXPECT_EQ(m.at("actor/grad_max"), 0.5);
  EXPECT_EQ(m.at("actor/maximal_thing"), 2.0);  // "max" not at the end: a mean
  EXPECT_TRUE(std::isnan(m.at("empty")));
}

}  // namespace
}  // namespace baton::trainer
