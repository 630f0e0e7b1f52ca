// Tolerances for floating-point comparisons in tests, derived from what was
// computed rather than picked, and comparisons that say where they failed.
//
// Two results that are one mathematical value computed two ways (another BLAS
// kernel or vector width, another summation order or thread count, a
// tensor-parallel split, another library) differ by rounding only, by an
// amount that grows with the number of terms summed on the way to the value
// and with their magnitude:
//
//   - A sum of n fp32 terms is within γ(n)·Σ|terms| of the exact sum, where
//     γ(n) = n·u/(1 − n·u) and u = 2^-24 (Higham, "Accuracy and Stability of
//     Numerical Algorithms", 2nd ed., §3.1); two summation orders therefore
//     differ by at most about n·ε·Σ|terms|, ε = 2u = 2^-23 ≈ 1.19e-7.
//   - That bound is reached only when every rounding error has the same sign.
//     Rounding errors of long reductions behave as independent zero-mean
//     variables (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019): the error
//     stays within λ·√n·u·Σ|terms| except with probability about
//     n·exp(−λ²/2), i.e. 1.5e-8·n for λ = 6.
//
// Tolerance::fp32(n, m) is the smaller of the two, min(n, 6·√n)·ε (the
// deterministic bound up to n = 36), as the relative tolerance, and that times
// m as the absolute one. n counts every term summed on the way to the value:
// the lengths of all dot products, norms and softmax sums along the chain
// (rounding errors of successive stages add up, so a chain counts as one
// reduction of the total length, assuming the stages neither shrink nor
// amplify errors much, which normalisation layers see to). m bounds the
// magnitude of those terms: below m the absolute part applies (a small result
// of large terms), above it the relative part.
//
// Exactness stays exact: copies, conversions, round trips and reruns of one
// computation in one layout compare with Tolerance::exact() (or at::equal).
//
// Set BATON_TOLERANCE_LOG=<file> to have every expect_close / expect_near
// append "test <TAB> what <TAB> worst |diff| / allowed" to that file, passing
// or not: how much of each tolerance a run used (scripts/test_kernels.sh
// reports the largest per kernel).
//
// Header-only: included by test executables of every directory, which link no
// common test library.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::test {

// Spacing of floating-point numbers at 1 (twice the unit roundoff).
inline constexpr double kFp32Eps = 0x1p-23;  // 1.19e-7
inline constexpr double kBf16Eps = 0x1p-7;   // 7.8e-3

// |actual − expected| ≤ atol + rtol·|expected|, elementwise.
struct Tolerance {
  double atol = 0;
  double rtol = 0;

  // Bit-for-bit (up to -0.0 == 0.0).
  static constexpr Tolerance exact() { return {0, 0}; }

  // Two fp32 computations of one value through `terms` summed terms of
  // magnitude up to `magnitude` (see the top of this file).
  static Tolerance fp32(double terms, double magnitude) {
    const double k = std::min(terms, 6 * std::sqrt(terms)) * kFp32Eps;
    return {k * magnitude, k};
  }

  // A value computed with bf16 storage against another computation of it:
  // each of `roundings` independent roundings to bf16 on the way (weights,
  // stored activations; products accumulate in fp32) adds a relative error
  // up to u = kBf16Eps / 2 = 2^-8, so together they stay within 4·√roundings·u
  // (at least 4 standard deviations) of values up to `magnitude`.
  static Tolerance bf16(double roundings, double magnitude) {
    const double k = 4 * std::sqrt(roundings) * kBf16Eps / 2;
    return {k * magnitude, k};
  }
};

namespace detail {

inline std::string format_index(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = sizes[d] ? flat % sizes[d] : 0;
    flat = sizes[d] ? flat / sizes[d] : 0;
  }
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < idx.size(); ++i) out << (i ? ", " : "") << idx[i];
  out << "]";
  return out.str();
}

// Worst |diff| / allowed over the compared elements (infinite for NaN or an
// exact tolerance that is not met); the comparison passes iff it is <= 1.
struct Comparison {
  int64_t compared = 0, failed = 0;
  double worst_ratio = 0;
  std::string message;  // set when failed > 0
};

inline Comparison compare(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol,
                          const at::Tensor& where) {
  Comparison c;
  if (!std::isfinite(tol.atol) || !std::isfinite(tol.rtol) || tol.atol < 0 || tol.rtol < 0) {
    std::ostringstream out;
    out << "the tolerance (atol " << tol.atol << ", rtol " << tol.rtol
        << ") is not finite and non-negative";
    c.failed = 1;
    c.worst_ratio = std::numeric_limits<double>::infinity();
    c.message = out.str();
    return c;
  }
  if (!actual.defined() || !expected.defined()) {
    c.failed = 1;
    c.worst_ratio = std::numeric_limits<double>::infinity();
    c.message = std::string(actual.defined() ? "expected" : "actual") + " tensor is undefined";
    return c;
  }
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream out;
    out << "shape " << actual.sizes() << " differs from the expected " << expected.sizes();
    c.failed = 1;
    c.worst_ratio = std::numeric_limits<double>::infinity();
    c.message = out.str();
    return c;
  }
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble).contiguous();
  at::Tensor mask = at::ones(a.sizes(), at::kBool);
  if (where.defined()) {
    at::Tensor m = where.detach().to(at::kCPU, at::kBool);
    while (m.dim() < a.dim()) m = m.unsqueeze(-1);
    mask = m.expand(a.sizes()).contiguous();
  }
  const at::Tensor fa = a.reshape(-1), fe = e.reshape(-1), fm = mask.reshape(-1);
  c.compared = fm.sum().item<int64_t>();
  if (c.compared == 0) return c;
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor diff = (fa - fe).abs().nan_to_num(inf, inf, inf);
  const at::Tensor allowed = fe.abs() * tol.rtol + tol.atol;
  // Equal values (infinities included) always pass; NaN never does.
  const at::Tensor same = fa.eq(fe);
  const at::Tensor nan = fa.isnan().logical_or(fe.isnan());
  at::Tensor ratio = at::where(same, at::zeros_like(diff), diff / allowed);  // x/0 = inf
  ratio = at::where(nan, at::full_like(diff, inf), ratio).nan_to_num(inf, inf, inf);
  ratio = at::where(fm, ratio, at::zeros_like(ratio));
  const int64_t worst = ratio.argmax().item<int64_t>();
  c.worst_ratio = ratio[worst].item<double>();
  c.failed = ratio.gt(1).sum().item<int64_t>();
  if (c.failed == 0) return c;
  const at::Tensor masked_diff = at::where(fm, diff, at::zeros_like(diff));
  const at::Tensor rel = masked_diff / fe.abs();
  const double max_rel =
      at::where(fm, rel, at::zeros_like(rel)).nan_to_num(0, inf, inf).max().item<double>();
  std::ostringstream out;
  out.precision(6);
  out << c.failed << " of " << c.compared << " compared elements differ beyond atol " << tol.atol
      << " + rtol " << tol.rtol << " * |expected|; worst at " << format_index(worst, a.sizes())
      << ": actual " << fa[worst].item<double>() << ", expected " << fe[worst].item<double>()
      << ", |diff| " << diff[worst].item<double>() << " (allowed " << allowed[worst].item<double>()
      << "); max |diff| " << masked_diff.max().item<double>() << ", max |diff|/|expected| "
      << max_rel;
  c.message = out.str();
  return c;
}

inline std::string current_test() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? std::string(info->test_suite_name()) + "." + info->name() : "";
}

// Appends one line to $BATON_TOLERANCE_LOG, if set (see the top).
inline void log_use(const std::string& what, double ratio) {
  const char* path = std::getenv("BATON_TOLERANCE_LOG");
  if (!path || !*path) return;
  std::FILE* f = std::fopen(path, "a");
  if (!f) return;
  std::fprintf(f, "%s\t%s\t%.3g\n", current_test().c_str(), what.c_str(), ratio);
  std::fclose(f);
}

}  // namespace detail

// Success iff `actual` and `expected` have the same shape and
// |actual − expected| <= atol + rtol·|expected| (compared in double) at every
// element where `where` is true; `where` is a bool/int mask broadcast from the
// leading dimensions (e.g. an attention mask [B, S] for logits [B, S, V]),
// every element when undefined. NaN never matches. A failure says how many
// elements differ and gives the worst one: its index, both values, the
// difference and what was allowed, and the max abs and rel differences.
inline ::testing::AssertionResult tensors_close(const at::Tensor& actual,
                                                const at::Tensor& expected, Tolerance tol,
                                                const at::Tensor& where = {}) {
  const detail::Comparison c = detail::compare(actual, expected, tol, where);
  if (c.failed == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.message;
}

inline ::testing::AssertionResult tensors_close(const at::Tensor& actual,
                                                const at::Tensor& expected, double atol,
                                                double rtol) {
  return tensors_close(actual, expected, Tolerance{atol, rtol});
}

// EXPECT_TRUE(tensors_close(..)) << what; logs the use of the tolerance.
inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol,
                         const std::string& what, const at::Tensor& where = {}) {
  const detail::Comparison c = detail::compare(actual, expected, tol, where);
  detail::log_use(what, c.worst_ratio);
  EXPECT_TRUE(c.failed == 0) << what << ": " << c.message;
}

inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, double atol,
                         double rtol, const std::string& what) {
  expect_close(actual, expected, Tolerance{atol, rtol}, what);
}

// The same for sequences of numbers (log-probs from a tool's JSON, a
// generation's per-token log-probs).
template <typename T>
requires std::is_floating_point_v<T>
void expect_close(const std::vector<T>& actual, const std::vector<T>& expected, Tolerance tol,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  expect_close(at::tensor(std::vector<double>(actual.begin(), actual.end()), at::kDouble),
               at::tensor(std::vector<double>(expected.begin(), expected.end()), at::kDouble), tol,
               what);
}

// One scalar.
inline void expect_near(double actual, double expected, Tolerance tol, const std::string& what) {
  expect_close(at::scalar_tensor(actual, at::kDouble), at::scalar_tensor(expected, at::kDouble),
               tol, what);
}

// Largest finite |element| where `where` is true (as in tensors_close), 0 if
// none: the magnitude argument of a Tolerance. Infinities (a masked-out
// vocabulary padding) are not magnitudes of summed terms.
inline double max_abs(const at::Tensor& t, const at::Tensor& where = {}) {
  at::Tensor a = t.detach().to(at::kCPU, at::kDouble).abs();
  a = at::where(a.isfinite(), a, at::zeros_like(a));
  if (where.defined()) {
    at::Tensor m = where.detach().to(at::kCPU, at::kBool);
    while (m.dim() < a.dim()) m = m.unsqueeze(-1);
    a = a * m.expand(a.sizes()).to(at::kDouble);
  }
  return a.numel() ? a.max().item<double>() : 0.0;
}

}  // namespace baton::test
