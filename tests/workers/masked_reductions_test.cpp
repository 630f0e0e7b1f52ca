// Masked reductions against hand-derived values: what masked positions
// contribute (nothing, not even NaN or an infinite gradient), the 1e-8 in
// means, Bessel's correction and its refusals, whitening of every position.
#include "workers/algos/masked_reductions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "tests/tolerance.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::expect_near;
using test::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

at::Tensor t2(std::initializer_list<std::initializer_list<double>> rows,
              at::ScalarType dtype = at::kFloat) {
  std::vector<double> flat;
  int64_t cols = 0;
  for (const auto& r : rows) {
    cols = static_cast<int64_t>(r.size());
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return at::tensor(flat, at::kDouble).reshape({static_cast<int64_t>(rows.size()), cols}).to(dtype);
}

TEST(MaskedSum, SumsValidElementsOverAllOrOneDim) {
  const at::Tensor v = t2({{1, 2, 3}, {4, 5, 6}});
  const at::Tensor m = t2({{1, 0, 1}, {0, 1, 1}}, at::kLong);
  // 1 + 3 + 5 + 6; rows 1 + 3 and 5 + 6: small integers, exact in fp32.
  expect_close(masked_sum(v, m), at::scalar_tensor(15.0), Tolerance::exact(), "total");
  expect_close(masked_sum(v, m, -1), at::tensor({4.0, 11.0}), Tolerance::exact(), "per row");
  expect_close(masked_sum(v, m.to(at::kBool), 0), at::tensor({1.0, 5.0, 9.0}), Tolerance::exact(),
               "per column, bool mask");
}

TEST(MaskedSum, IgnoresNanAndInfAtMaskedPositionsWithZeroGradientThere) {
  const at::Tensor v = t2({{1, kNaN, kInf, -kInf}}).requires_grad_();
  const at::Tensor m = t2({{1, 0, 0, 0}});
  const at::Tensor s = masked_sum(v, m);
  EXPECT_EQ(s.item<double>(), 1.0);
  // An infinite upstream gradient (an empty mask's 1/0) still gives exactly 0
  // at masked positions: a select, not a product with 0 (inf·0 = NaN).
  s.backward(at::full({}, kInf));
  expect_close(v.grad(), t2({{kInf, 0, 0, 0}}), Tolerance::exact(), "gradient");
}

TEST(MaskedMean, DividesByValidCountPlusEpsilonAndGivesZeroForEmptyMask) {
  const at::Tensor v = t2({{1, 2, 3}, {4, 5, 6}});
  const at::Tensor m = t2({{1, 0, 1}, {0, 1, 1}});
  // 15/(4 + 1e-8) and (4, 11)/(2 + 1e-8): the 1e-8 is below fp32 resolution
  // here; one division each.
  expect_close(masked_mean(v, m), at::scalar_tensor(15.0 / 4), Tolerance::fp32(1, 4), "total");
  expect_close(masked_mean(v, m, 1), at::tensor({2.0, 5.5}), Tolerance::fp32(1, 6), "rows");
  EXPECT_EQ(masked_mean(v, at::zeros_like(m)).item<double>(), 0.0);
  expect_close(masked_mean(v, t2({{0, 0, 0}, {0, 1, 0}}), 1), at::tensor({0.0, 5.0}),
               Tolerance::fp32(1, 5), "an empty row gives 0");
}

TEST(MaskedVar, IsBesselCorrectedOverValidElements) {
  // Valid 1, 2, 3 (the masked 100 ignored): mean 2, Σ(x − 2)² = 2;
  // biased 2/3, unbiased 2/3 · 3/2 = 1.
  const at::Tensor v = t2({{1, 2}, {3, 100}});
  const at::Tensor m = t2({{1, 1}, {1, 0}}, at::kLong);
  expect_close(masked_var(v, m), at::scalar_tensor(1.0), Tolerance::fp32(6, 4), "unbiased");
  expect_close(masked_var(v, m, false), at::scalar_tensor(2.0 / 3), Tolerance::fp32(6, 4),
               "biased");
}

TEST(MaskedVar, UnbiasedRefusesFewerThanTwoValidElementsBiasedGivesZero) {
  const at::Tensor v = t2({{1, 2}, {3, 4}});
  const at::Tensor one = t2({{0, 1}, {0, 0}});
  const at::Tensor none = at::zeros_like(one);
  EXPECT_THROW(masked_var(v, one), baton::InvalidArgument);
  EXPECT_THROW(masked_var(v, none), baton::InvalidArgument);
  EXPECT_EQ(masked_var(v, one, false).item<double>(), 0.0);
  EXPECT_EQ(masked_var(v, none, false).item<double>(), 0.0);
  try {
    masked_var(v, one);
    FAIL() << "no throw";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("only 1 valid element"), std::string::npos) << e.what();
  }
}

TEST(MaskedWhiten, WhitensEveryPositionWithStatisticsOfValidOnes) {
  // Valid 2, 4, 6: mean 4, unbiased var (4 + 0 + 4)/2 = 4, so (x − 4)/2 at
  // every position, the masked 0 included: −2 (rsqrt(4 + 1e-8) = 1/2 in fp32).
  const at::Tensor v = t2({{2, 4}, {6, 0}});
  const at::Tensor m = t2({{1, 1}, {1, 0}}, at::kBool);
  const Tolerance tol = Tolerance::fp32(8, 6);  // 3-term mean and variance, a few ops after
  expect_close(masked_whiten(v, m), t2({{-1, 0}, {1, -2}}), tol, "shifted");
  expect_close(masked_whiten(v, m, false), t2({{3, 4}, {5, 2}}), tol, "mean added back");
  EXPECT_THROW(masked_whiten(v, t2({{0, 0}, {1, 0}})), baton::InvalidArgument);
}

}  // namespace
}  // namespace baton::algos
