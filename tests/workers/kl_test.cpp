// KL estimators (values and gradients, clamps, the straight-through '+'
// kinds), KL in the reward, and the fixed and adaptive controllers, against
// hand-derived values.
#include "workers/algos/kl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::Tolerance;

// d = logprob − ref = (0.5, −1, 0).
const at::Tensor kLogprob = at::tensor({-1.0f, -2.0f, -0.5f});
const at::Tensor kRef = at::tensor({-1.5f, -1.0f, -0.5f});

// Value and gradient w.r.t. logprob.
std::pair<at::Tensor, at::Tensor> kl_and_grad(const std::string& kind,
                                              const at::Tensor& logprob = kLogprob,
                                              const at::Tensor& ref = kRef) {
  const at::Tensor lp = logprob.clone().requires_grad_();
  const at::Tensor kl = kl_penalty(lp, ref, kind);
  kl.sum().backward();
  return {kl.detach(), lp.grad()};
}

const Tolerance kTol = Tolerance::fp32(4, 3);  // a subtraction and an exp or two

TEST(KlPenalty, EachKindMatchesItsFormulaAndGradient) {
  const at::Tensor d = at::tensor({0.5, -1.0, 0.0});
  for (const char* kind : {"kl", "k1"}) {
    const auto [v, g] = kl_and_grad(kind);
    expect_close(v, d, kTol, std::string(kind) + " value");
    expect_close(g, at::ones({3}), kTol, std::string(kind) + " gradient");
  }
  {
    const auto [v, g] = kl_and_grad("abs");
    expect_close(v, at::tensor({0.5, 1.0, 0.0}), kTol, "abs value");
    expect_close(g, at::tensor({1.0, -1.0, 0.0}), kTol, "abs gradient (sign d)");
  }
  for (const char* kind : {"mse", "k2"}) {
    const auto [v, g] = kl_and_grad(kind);
    expect_close(v, at::tensor({0.125, 0.5, 0.0}), kTol, std::string(kind) + " value");
    expect_close(g, d, kTol, std::string(kind) + " gradient (d)");
  }
  for (const char* kind : {"low_var_kl", "k3"}) {
    // x = −d = (−0.5, 1, 0): eˣ − x − 1; gradient w.r.t. logprob 1 − eˣ.
    const auto [v, g] = kl_and_grad(kind);
    expect_close(v, at::tensor({std::exp(-0.5) - 0.5, std::exp(1.0) - 2, 0.0}), kTol,
                 std::string(kind) + " value");
    expect_close(g, at::tensor({1 - std::exp(-0.5), 1 - std::exp(1.0), 0.0}), kTol,
                 std::string(kind) + " gradient");
  }
}

TEST(KlPenalty, LowVarKlClampsTheLogRatioAndTheResult) {
  // d = −30: x clamps to 20, e²⁰ − 21 clamps to 10. d = 30: x = −20,
  // e⁻²⁰ + 19 clamps to 10. d = −3: e³ − 4 = 16.1 clamps to 10. d = −2:
  // e² − 3 = 4.389 is inside. Gradients vanish wherever a clamp is active.
  const at::Tensor lp = at::tensor({-30.0f, 30.0f, -3.0f, -2.0f});
  const auto [v, g] = kl_and_grad("k3", lp, at::zeros({4}));
  expect_close(v, at::tensor({10.0, 10.0, 10.0, std::exp(2.0) - 3}), Tolerance::fp32(4, 8),
               "value");
  expect_close(g, at::tensor({0.0, 0.0, 0.0, 1 - std::exp(2.0)}), Tolerance::fp32(4, 8),
               "gradient");
}

TEST(KlPenalty, PlusKindsKeepTheValueButTakeTheGradientOfK2) {
  const at::Tensor d = at::tensor({0.5, -1.0, 0.0});
  for (const std::string base : {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}) {
    const auto [v, g] = kl_and_grad(base + "+");
    expect_close(v, kl_and_grad(base).first, kTol, base + "+ value");
    expect_close(g, d, kTol, base + "+ gradient");
  }
}

TEST(KlPenalty, FullAndUnknownKindsAreRefusedByName) {
  for (const char* kind : {"full", "kl2", "", "+", "k3++"}) {
    try {
      kl_penalty(kLogprob, kRef, kind);
      ADD_FAILURE() << "'" << kind << "' accepted";
    } catch (const baton::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'"), std::string::npos) << e.what();
    }
  }
}

TEST(ComputeRewards, SubtractsTheScaledLogRatio) {
  // old − ref = (0.5, 0, −0.5); ratio 0.1.
  const at::Tensor r =
      compute_rewards(at::tensor({0.0f, 0.0f, 1.0f}), at::full({3}, -1.0f), kRef, 0.1);
  expect_close(r, at::tensor({-0.05, 0.0, 1.05}), kTol, "rewards");
}

TEST(KlController, FixedNeverChanges) {
  FixedKLController c(0.001);
  c.update(5.0, 1000);
  EXPECT_EQ(c.value, 0.001);
}

TEST(KlController, AdaptiveMovesTowardTheTargetWithAClampedError) {
  AdaptiveKLController c(0.1, /*target_kl=*/0.05, /*horizon=*/100);
  c.update(0.06, 10);  // e = 0.06/0.05 − 1 = 0.2: ×(1 + 0.2·10/100)
  EXPECT_NEAR(c.value, 0.1 * 1.02, 1e-15);
  c.update(0.5, 10);  // e = 9, clamped to 0.2
  EXPECT_NEAR(c.value, 0.1 * 1.02 * 1.02, 1e-15);
  c.update(0.02, 50);  // e = −0.6, clamped to −0.2: ×(1 − 0.2·50/100)
  EXPECT_NEAR(c.value, 0.1 * 1.02 * 1.02 * 0.9, 1e-15);
  EXPECT_THROW(AdaptiveKLController(0.1, 0.05, 0), baton::InvalidArgument);
}

TEST(KlController, MadeFromOptionsByType) {
  KLControlOptions o;
  o.kl_coef = 0.2;
  EXPECT_NE(dynamic_cast<FixedKLController*>(make_kl_controller(o).get()), nullptr);
  o.type = "adaptive";
  const auto adaptive = make_kl_controller(o);
  EXPECT_NE(dynamic_cast<AdaptiveKLController*>(adaptive.get()), nullptr);
  EXPECT_EQ(adaptive->value, 0.2);
  o.type = "pid";
  try {
    make_kl_controller(o);
    FAIL() << "no throw";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'pid'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace baton::algos
