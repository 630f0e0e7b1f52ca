// clamp_inclusive: at::clamp's value, with gradient 1 on the closed range.
#include "workers/algos/clamp.h"

#include <gtest/gtest.h>

#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::Tolerance;

TEST(ClampInclusive, HasClampsValueAndPassesGradientAtTheBounds) {
  const at::Tensor x = at::tensor({0.5f, 0.8f, 1.0f, 1.2f, 1.5f}).requires_grad_();
  const at::Tensor y = clamp_inclusive(x, 0.8, 1.2);
  expect_close(y, at::clamp(x.detach(), 0.8, 1.2), Tolerance::exact(), "value");
  y.sum().backward();
  // 0.8f and 1.2f compare equal to the double bounds only after rounding to
  // float: the bounds are converted to x's dtype, so both ends pass.
  expect_close(x.grad(), at::tensor({0.0f, 1.0f, 1.0f, 1.0f, 0.0f}), Tolerance::exact(),
               "gradient");
}

TEST(ClampInclusive, AnAbsentBoundIsOpen) {
  const at::Tensor x = at::tensor({-100.0f, 10.0f, 11.0f}).requires_grad_();
  const at::Tensor y = clamp_inclusive(x, std::nullopt, 10);
  expect_close(y, at::tensor({-100.0f, 10.0f, 10.0f}), Tolerance::exact(), "value");
  y.sum().backward();
  expect_close(x.grad(), at::tensor({1.0f, 1.0f, 0.0f}), Tolerance::exact(), "gradient");
}

}  // namespace
}  // namespace baton::algos
