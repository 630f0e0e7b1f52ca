#include "engine/kernels/optimizer_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#define BATON_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace baton::engine::cpu {
namespace {

// About 64 KiB of each array per task: large enough to amortise a task,
// small enough to split a 4M-element tensor over the threads.
constexpr int64_t kGrain = 1 << 14;

// AdamWStep in fp32, each coefficient rounded once from its double value
// (1 − β2 = 0.001 computed in fp32 from β2 would be off by 1e-5 relative).
struct Coefficients {
  float lr_step, keep, b1, c1, b2, c2, inv_sqrt_bias2, eps, scale;
};

BATON_VECTOR_CLONES
void adamw_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                 const Coefficients& k) {
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i] * k.scale;
    const float mi = m[i] * k.b1 + gi * k.c1;
    const float vi = v[i] * k.b2 + gi * gi * k.c2;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * k.keep - k.lr_step * (mi / (std::sqrt(vi) * k.inv_sqrt_bias2 + k.eps));
  }
}

BATON_VECTOR_CLONES
double sum_of_squares_range(const float* g, int64_t begin, int64_t end) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double x = g[i + l];
      acc[l] += x * x;
    }
  double s = 0;
  for (; i < end; ++i) s += static_cast<double>(g[i]) * g[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// Summed through a small buffer, so `out` may alias any input: every input's
// block is read before out's block is written.
BATON_VECTOR_CLONES
void sum_range(float* out, const float* const* in, int64_t k, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = 512;
  alignas(64) float acc[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    const float* a = in[0] + b;
    for (int64_t i = 0; i < n; ++i) acc[i] = a[i];
    for (int64_t j = 1; j < k; ++j) {
      const float* c = in[j] + b;
      for (int64_t i = 0; i < n; ++i) acc[i] += c[i];
    }
    for (int64_t i = 0; i < n; ++i) out[b + i] = acc[i];
  }
}

// Each chunk summed while it is in cache, then squared from there.
double sum_range_squares(float* out, const float* const* in, int64_t k, int64_t begin,
                         int64_t end) {
  sum_range(out, in, k, begin, end);
  return sum_of_squares_range(out, begin, end);
}

// Σ over fixed chunks of [0, n), chunk c's part from part(begin, end), the
// parts added in chunk order: the result does not depend on the thread count.
template <typename Part>
double ordered_chunk_sum(int64_t n, const Part& part) {
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> parts(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) parts[c] = part(c * kGrain, std::min(n, (c + 1) * kGrain));
  });
  double total = 0;
  for (double x : parts) total += x;
  return total;
}

}  // namespace

double sum_arrays(float* out, const float* const* in, int64_t k, int64_t n) {
  if (k <= 0 || n <= 0) return 0;
  return ordered_chunk_sum(
      n, [&](int64_t begin, int64_t end) { return sum_range_squares(out, in, k, begin, end); });
}

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  auto f = [](double x) { return static_cast<float>(x); };
  const Coefficients k{
      f(s.lr / s.bias1), f(1.0 - s.lr * s.decay),     f(s.beta1), f(1.0 - s.beta1), f(s.beta2),
      f(1.0 - s.beta2),  f(1.0 / std::sqrt(s.bias2)), f(s.eps),   f(s.grad_scale)};
  at::parallel_for(0, n, kGrain,
                   [&](int64_t begin, int64_t end) { adamw_range(p, g, m, v, begin, end, k); });
}

double sum_of_squares(const float* g, int64_t n) {
  return ordered_chunk_sum(
      n, [&](int64_t begin, int64_t end) { return sum_of_squares_range(g, begin, end); });
}

}  // namespace baton::engine::cpu
