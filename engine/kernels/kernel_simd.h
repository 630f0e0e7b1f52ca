// Inline helpers of the CPU fp32 kernels (decode_kernels.cpp,
// train_kernels.cpp): SIMD-friendly reductions, an 8-float vector type and a
// vectorisable exp. Internal to the engine; include it only from a kernel
// file compiled with -O3 (engine/CMakeLists.txt), inside no namespace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// Each hot function is compiled for the baseline, x86-64-v3 (AVX2 + FMA) and
// x86-64-v4 (AVX-512); the dynamic loader picks the clone the CPU runs (GCC's
// ifunc dispatch). The helpers below are force-inlined so that they take
// their caller's target.
#define BATON_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define BATON_INLINE inline __attribute__((always_inline))

namespace baton::engine::cpu::simd {

// Independent accumulators: the vectoriser turns them into SIMD lanes without
// reassociating a single sum (which it may not do without -ffast-math).
constexpr int kLanes = 8;

// About 10 µs of work: below this a parallel_for runs inline.
constexpr int64_t kGrainFlops = 1 << 15;

// The parallel_for grain (items) for items of `flops_per_item` work each.
inline int64_t grain_for(int64_t flops_per_item) {
  return std::max<int64_t>(1, kGrainFlops / std::max<int64_t>(1, flops_per_item));
}

BATON_INLINE float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

BATON_INLINE float sum_of(const float* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// REQUIRES: n >= 1.
BATON_INLINE float max_of(const float* a, int64_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = a[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] > a[i + l] ? acc[l] : a[i + l];
  float m = a[0];
  for (; i < n; ++i) m = m > a[i] ? m : a[i];
  for (int l = 0; l < kLanes; ++l) m = m > acc[l] ? m : acc[l];
  return m;
}

// Eight floats as one value (GCC's vector extension): the ISA clone of the
// caller decides whether that is one AVX register or two SSE ones.
typedef float v8 __attribute__((vector_size(32)));

BATON_INLINE v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

BATON_INLINE void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }

// The sums of the lanes of a[0], ..., a[7], in that order: a transpose by
// pairwise shuffles and adds (three levels) instead of eight reductions.
BATON_INLINE v8 lane_sums(const v8* a) {
  v8 b[4];
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
  v8 c0 = __builtin_shufflevector(b[0], b[1], 0, 1, 8, 9, 4, 5, 12, 13) +
          __builtin_shufflevector(b[0], b[1], 2, 3, 10, 11, 6, 7, 14, 15);
  v8 c1 = __builtin_shufflevector(b[2], b[3], 0, 1, 8, 9, 4, 5, 12, 13) +
          __builtin_shufflevector(b[2], b[3], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}

// exp(x) for float, within 2 ulp over [-87, 88] (Cephes' expf: Cody-Waite
// range reduction by ln 2 and a degree-6 polynomial), in branch-free
// arithmetic the vectoriser can widen. Below -87.3 the result is the
// smallest normal, above 88 it saturates near FLT_MAX: softmax and silu
// only need the first to be negligible and the second to be huge.
BATON_INLINE float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  float t = x * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(t);
  n -= t < static_cast<float>(n);  // floor
  float fn = static_cast<float>(n);
  float r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

}  // namespace baton::engine::cpu::simd
