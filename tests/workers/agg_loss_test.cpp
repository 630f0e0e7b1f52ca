// agg_loss in its five modes, locally and with GlobalBatchInfo, against
// hand-derived values; its refusals; and the promise of global normalisation:
// splitting a mini-batch into micro-batches on DP ranks (simulated in one
// process) gives the unsplit loss and gradient whatever the split.
#include "workers/algos/agg_loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::Tolerance;

// Rows: (1, 2 | 3 masked), (4 | 5, 6 masked), (7, 8, 9 all masked).
at::Tensor loss3x3() { return at::arange(1, 10, at::kFloat).reshape({3, 3}); }
at::Tensor mask3x3() { return at::tensor({1, 1, 0, 1, 0, 0, 0, 0, 0}, at::kLong).reshape({3, 3}); }

double agg(LossAggMode mode, const GlobalBatchInfo& info = {}) {
  return agg_loss(loss3x3(), mask3x3(), mode, info).item<double>();
}

// Sums of at most 3 small integers, then one or two divisions.
const Tolerance kTol = Tolerance::fp32(4, 9);

TEST(AggLoss, LocalModesMatchHandValues) {
  expect_near(agg(LossAggMode::TokenMean), (1 + 2 + 4) / 3.0, kTol, "token-mean: 7 / 3 tokens");
  expect_near(agg(LossAggMode::TokenSum), 7, kTol, "token-sum");
  // Row sums 3 and 4; the empty row is not counted: 7 / 2.
  expect_near(agg(LossAggMode::SeqMeanTokenSum), 3.5, kTol, "seq-mean-token-sum");
  // Row means 1.5 and 4: 5.5 / 2.
  expect_near(agg(LossAggMode::SeqMeanTokenMean), 2.75, kTol, "seq-mean-token-mean");
  // seq-mean-token-sum / L with L = 3, or / C.
  expect_near(agg(LossAggMode::SeqMeanTokenSumNorm), 3.5 / 3, kTol, "sum-norm by L");
  GlobalBatchInfo c;
  c.loss_scale_factor = 7;
  expect_near(agg(LossAggMode::SeqMeanTokenSumNorm, c), 0.5, kTol, "sum-norm by C");
}

TEST(AggLoss, GlobalInfoDividesByGlobalCountsAndMultipliesByDpSize) {
  GlobalBatchInfo info;
  info.dp_size = 2;
  info.batch_num_tokens = 14;
  info.global_batch_size = 4;  // includes empty rows elsewhere
  info.loss_scale_factor = 5;
  expect_near(agg(LossAggMode::TokenMean, info), 7.0 / 14 * 2, kTol, "token-mean");
  expect_near(agg(LossAggMode::TokenSum, info), 14, kTol, "token-sum");
  expect_near(agg(LossAggMode::SeqMeanTokenSum, info), 7.0 / 4 * 2, kTol, "seq-mean-token-sum");
  expect_near(agg(LossAggMode::SeqMeanTokenMean, info), 5.5 / 4 * 2, kTol, "seq-mean-token-mean");
  expect_near(agg(LossAggMode::SeqMeanTokenSumNorm, info), 7.0 / 4 * 2 / 5, kTol, "sum-norm");
}

TEST(AggLoss, DataParallelWithoutGlobalCountsIsRefused) {
  GlobalBatchInfo info;
  info.dp_size = 2;
  for (LossAggMode mode : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum,
                           LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm}) {
    try {
      agg(mode, info);
      ADD_FAILURE() << to_string(mode) << " accepted dp_size 2 without global counts";
    } catch (const baton::InvalidArgument& e) {
      const std::string field =
          mode == LossAggMode::TokenMean ? "batch_num_tokens" : "global_batch_size";
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  EXPECT_DOUBLE_EQ(agg(LossAggMode::TokenSum, info), 14);  // needs no count
  info.dp_size = 0;
  EXPECT_THROW(agg(LossAggMode::TokenSum, info), baton::InvalidArgument);
  EXPECT_THROW(agg_loss(loss3x3(), mask3x3().narrow(1, 0, 2), LossAggMode::TokenMean),
               baton::InvalidArgument);
}

TEST(AggLoss, LocalEmptyMaskGivesNanLossButZeroGradient) {
  for (LossAggMode mode :
       {LossAggMode::TokenMean, LossAggMode::TokenSum, LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm}) {
    const at::Tensor loss = loss3x3().requires_grad_();
    const at::Tensor value = agg_loss(loss, at::zeros({3, 3}, at::kLong), mode);
    if (mode == LossAggMode::TokenSum)
      EXPECT_EQ(value.item<double>(), 0.0);
    else
      EXPECT_TRUE(std::isnan(value.item<double>())) << to_string(mode);
    value.backward();
    expect_close(loss.grad(), at::zeros({3, 3}), Tolerance::exact(),
                 std::string(to_string(mode)) + " gradient");
  }
}

TEST(AggLoss, GlobalEmptyMicroBatchContributesZeroAndNoNan) {
  GlobalBatchInfo info;
  info.dp_size = 2;
  info.batch_num_tokens = 10;
  info.global_batch_size = 4;
  for (LossAggMode mode : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum,
                           LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm}) {
    const at::Tensor loss = loss3x3().requires_grad_();
    const at::Tensor value = agg_loss(loss, at::zeros({3, 3}), mode, info);
    EXPECT_EQ(value.item<double>(), 0.0) << to_string(mode);
    value.backward();
    expect_close(loss.grad(), at::zeros({3, 3}), Tolerance::exact(),
                 std::string(to_string(mode)) + " gradient");
  }
}

TEST(AggLoss, IgnoresNonFiniteLossAtMaskedPositionsInTokenModes) {
  at::Tensor loss = loss3x3();
  loss.index_put_({2, 2}, std::numeric_limits<float>::quiet_NaN());
  loss.index_put_({0, 2}, std::numeric_limits<float>::infinity());
  expect_near(agg_loss(loss, mask3x3(), LossAggMode::TokenMean).item<double>(), 7.0 / 3, kTol,
              "token-mean");
}

TEST(ParseLossAggMode, RoundTripsEveryModeAndNamesAnUnknownOne) {
  for (LossAggMode mode :
       {LossAggMode::TokenMean, LossAggMode::TokenSum, LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm})
    EXPECT_EQ(parse_loss_agg_mode(to_string(mode)), mode);
  EXPECT_EQ(parse_loss_agg_mode("seq-mean-token-sum-norm"), LossAggMode::SeqMeanTokenSumNorm);
  try {
    parse_loss_agg_mode("token_mean");
    FAIL() << "no throw";
  } catch (const baton::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'token_mean'"), std::string::npos) << what;
    EXPECT_NE(what.find("token-mean"), std::string::npos) << what;
  }
}

// --- Global normalisation whatever the split --------------------------------

// A mini-batch of 7 rows of unequal lengths, one of them empty, with a hole.
struct MiniBatch {
  at::Tensor loss, mask;
  GlobalBatchInfo global(int64_t dp) const {
    GlobalBatchInfo info;
    info.dp_size = dp;
    info.batch_num_tokens = mask.sum().item<double>();
    info.global_batch_size = static_cast<double>(mask.size(0));
    info.loss_scale_factor = 4;
    return info;
  }
};

MiniBatch mini_batch() {
  at::manual_seed(12);
  MiniBatch b;
  b.loss = at::randn({7, 5}, at::kFloat);
  b.mask = at::tensor({1, 1, 1, 1, 1,  //
                       1, 1, 0, 0, 0,  //
                       0, 0, 0, 0, 0,  // empty
                       1, 0, 1, 1, 0,  // hole
                       1, 0, 0, 0, 0,  //
                       1, 1, 1, 1, 0,  //
                       1, 1, 1, 0, 0},
                      at::kLong)
               .reshape({7, 5});
  return b;
}

// Each DP rank runs its micro-batches (lists of rows), calls backward on each
// micro-batch loss and sums the gradients; the DP all-reduce then averages the
// ranks' gradients. Returns {Σ micro losses / D, averaged gradient}.
std::pair<double, at::Tensor> split_run(
    const MiniBatch& b, LossAggMode mode,
    const std::vector<std::vector<std::vector<int64_t>>>& ranks) {
  const int64_t dp = static_cast<int64_t>(ranks.size());
  const GlobalBatchInfo info = b.global(dp);
  at::Tensor grad_sum = at::zeros_like(b.loss);
  double loss_sum = 0;
  for (const auto& micro_batches : ranks) {
    at::Tensor rank_grad = at::zeros_like(b.loss);
    for (const std::vector<int64_t>& rows : micro_batches) {
      const at::Tensor leaf = b.loss.clone().requires_grad_();
      const at::Tensor idx = at::tensor(rows, at::kLong);
      const at::Tensor value =
          agg_loss(leaf.index_select(0, idx), b.mask.index_select(0, idx), mode, info);
      value.backward();
      rank_grad += leaf.grad();
      loss_sum += value.item<double>();
    }
    grad_sum += rank_grad;  // all-reduce (sum) ...
  }
  return {loss_sum / static_cast<double>(dp), grad_sum / static_cast<double>(dp)};  // ... / D
}

TEST(AggLoss, GlobalNormalisationGivesTheUnsplitGradientWhateverTheSplit) {
  const MiniBatch b = mini_batch();
  const std::vector<std::vector<std::vector<std::vector<int64_t>>>> splits = {
      {{{0, 1, 2, 3, 4, 5, 6}}},          // one rank, one micro-batch
      {{{0, 1}, {2, 3, 4}, {5, 6}}},      // one rank, three micro-batches
      {{{0, 1}, {2, 3}}, {{4, 5}, {6}}},  // two ranks, two micro-batches each
      {{{6, 0, 3}}, {{2}}, {{1, 4, 5}}},  // three ranks, one holds the empty row only
  };
  for (LossAggMode mode :
       {LossAggMode::TokenMean, LossAggMode::TokenSum, LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm}) {
    // The unsplit loss with the mini-batch's counts (dp_size 1).
    const at::Tensor leaf = b.loss.clone().requires_grad_();
    const at::Tensor whole = agg_loss(leaf, b.mask, mode, b.global(1));
    whole.backward();
    // Hand-derived gradient: token-mean 1/T at valid tokens, token-sum 1,
    // seq-mean-token-sum 1/S, seq-mean-token-mean 1/(S·n_i), sum-norm 1/(S·C).
    const at::Tensor m = b.mask.to(at::kFloat);
    const double T = m.sum().item<double>(), S = 7, C = 4;
    const at::Tensor n = m.sum(1, true);
    at::Tensor expected;
    switch (mode) {
      case LossAggMode::TokenMean:
        expected = m / T;
        break;
      case LossAggMode::TokenSum:
        expected = m;
        break;
      case LossAggMode::SeqMeanTokenSum:
        expected = m / S;
        break;
      case LossAggMode::SeqMeanTokenMean:
        expected = m / (S * at::clamp_min(n, 1));
        break;
      case LossAggMode::SeqMeanTokenSumNorm:
        expected = m / (S * C);
        break;
    }
    const std::string name(to_string(mode));
    // One or two divisions per element.
    expect_close(leaf.grad(), expected, Tolerance::fp32(3, 1), name + " unsplit gradient");
    if (mode == LossAggMode::TokenMean) {  // = the plain local token mean
      expect_near(whole.item<double>(), agg_loss(b.loss, b.mask, mode).item<double>(),
                  Tolerance::fp32(35, test::max_abs(b.loss)), "token-mean local");
    }
    for (size_t s = 0; s < splits.size(); ++s) {
      const auto [value, grad] = split_run(b, mode, splits[s]);
      const std::string what = name + " split " + std::to_string(s);
      // A gradient element comes from one micro-batch: a few operations, then
      // the ·D and /D of the all-reduce.
      expect_close(grad, leaf.grad(), Tolerance::fp32(6, 1), what + " gradient");
      // Sums of up to 35 terms, each |loss| times at most D = 3, in another order.
      expect_near(value, whole.item<double>(), Tolerance::fp32(35, 3 * test::max_abs(b.loss)),
                  what + " loss");
    }
  }
}

}  // namespace
}  // namespace baton::algos
