// The critic's clipped value loss and the entropy term, against
// hand-derived values.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "tests/tolerance.h"
#include "workers/algos/entropy.h"
#include "workers/algos/value_loss.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::Tolerance;

// ε = 0.5. Tokens (vpred, old value, return):
//   t0 (1, 0.8, 2):  vc = 1, both squares 1 (tie): gradient 2(vpred − R) = −2
//   t1 (2, 1, 3):    vc = 1.5: (1 vs 2.25) clipped wins, no gradient
//   t2 (0, 1, −1):   vc = 0.5: (1 vs 2.25) clipped wins, no gradient
//   t3 (2, 1, 1):    vc = 1.5: (1 vs 0.25) unclipped, gradient 2
//   t4 masked
struct ValueCase {
  at::Tensor vpreds = at::tensor({1.0f, 2.0f, 0.0f, 2.0f, 50.0f}).unsqueeze(0);
  at::Tensor values = at::tensor({0.8f, 1.0f, 1.0f, 1.0f, 0.0f}).unsqueeze(0);
  at::Tensor returns = at::tensor({2.0f, 3.0f, -1.0f, 1.0f, 0.0f}).unsqueeze(0);
  at::Tensor mask = at::tensor({1, 1, 1, 1, 0}, at::kLong).unsqueeze(0);
};

TEST(ValueLoss, TakesTheWorseOfClippedAndUnclippedSquaredErrors) {
  const ValueCase c;
  const at::Tensor v = c.vpreds.clone().requires_grad_();
  const ValueLossResult r =
      compute_value_loss(v, c.returns, c.values, c.mask, 0.5, LossAggMode::TokenMean);
  // 0.5 · (1 + 2.25 + 2.25 + 1)/4.
  expect_near(r.loss.item<double>(), 0.8125, Tolerance::fp32(6, 3), "loss");
  EXPECT_NEAR(r.clipfrac, 0.5, 1e-7);
  r.loss.backward();
  expect_close(v.grad(), at::tensor({-0.25, 0.0, 0.0, 0.25, 0.0}).unsqueeze(0),
               Tolerance::fp32(6, 3), "gradient 0.5·(−2, 0, 0, 2)/4");
}

TEST(ValueLoss, UsesGlobalBatchInfo) {
  const ValueCase c;
  GlobalBatchInfo info;
  info.dp_size = 2;
  info.batch_num_tokens = 16;
  const ValueLossResult r =
      compute_value_loss(c.vpreds, c.returns, c.values, c.mask, 0.5, LossAggMode::TokenMean, info);
  expect_near(r.loss.item<double>(), 0.5 * 6.5 / 16 * 2, Tolerance::fp32(6, 3), "loss");
  EXPECT_THROW(compute_value_loss(c.vpreds, c.returns.narrow(1, 0, 2), c.values, c.mask, 0.5,
                                  LossAggMode::TokenMean),
               baton::InvalidArgument);
}

TEST(Entropy, IsLogSumExpMinusExpectedLogit) {
  // Uniform over 4: log 4. Probabilities (1/4, 3/4): −(¼ log ¼ + ¾ log ¾) =
  // log 4 − ¾ log 3. Shifting the logits changes nothing.
  expect_close(entropy_from_logits(at::zeros({1, 4})), at::tensor({std::log(4.0)}),
               Tolerance::fp32(8, 2), "uniform");
  const at::Tensor shifted = at::tensor({5.0, 5.0 + std::log(3.0)}).to(at::kFloat);
  expect_close(entropy_from_logits(shifted),
               at::scalar_tensor(std::log(4.0) - 0.75 * std::log(3.0)), Tolerance::fp32(8, 6),
               "(1/4, 3/4)");
}

TEST(EntropyLoss, AggregatesTheEntropyOfValidTokens) {
  // [1, 2, 2]: token 0 uniform (log 2), token 1 masked.
  const at::Tensor logits = at::tensor({0.0f, 0.0f, 0.0f, 9.0f}).reshape({1, 2, 2});
  const at::Tensor mask = at::tensor({1, 0}, at::kLong).unsqueeze(0);
  expect_near(compute_entropy_loss(logits, mask).item<double>(), std::log(2.0),
              Tolerance::fp32(4, 1), "token-mean");
  GlobalBatchInfo info;
  info.dp_size = 2;
  info.global_batch_size = 4;
  expect_near(compute_entropy_loss(logits, mask, LossAggMode::SeqMeanTokenSum, info).item<double>(),
              std::log(2.0) / 4 * 2, Tolerance::fp32(4, 1), "seq-mean-token-sum, global");
}

}  // namespace
}  // namespace baton::algos
