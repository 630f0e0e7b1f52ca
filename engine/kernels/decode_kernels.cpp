#include "engine/kernels/decode_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/errors.h"
#include "engine/kernels/kernel_simd.h"

namespace baton::engine::cpu {
namespace {

using namespace simd;  // NOLINT: the helpers are this file's vocabulary

BATON_VECTOR_CLONES
void rms_norm_rows(const float* x, const float* w, float* y, int64_t begin, int64_t end, int64_t h,
                   float eps) {
  for (int64_t i = begin; i < end; ++i) {
    const float* xi = x + i * h;
    float* yi = y + i * h;
    float inv = 1.0f / std::sqrt(dot(xi, xi, h) / static_cast<float>(h) + eps);
    for (int64_t j = 0; j < h; ++j) yi[j] = w[j] * (xi[j] * inv);
  }
}

BATON_VECTOR_CLONES
void silu_mul_rows(const float* x, float* y, int64_t begin, int64_t end, int64_t n) {
  for (int64_t i = begin; i < end; ++i) {
    const float* gate = x + i * 2 * n;
    const float* up = gate + n;
    float* yi = y + i * n;
    for (int64_t j = 0; j < n; ++j) yi[j] = gate[j] / (1.0f + exp_approx(-gate[j])) * up[j];
  }
}

// HF's rotary embedding of one head: x * cos + rotate_half(x) * sin.
BATON_INLINE void rotate(float* x, const float* cos, const float* sin, int64_t d) {
  int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

BATON_VECTOR_CLONES
void rotate_and_store_tokens(const PagedAttention& a, float* qkv, int64_t begin, int64_t end) {
  const int64_t d = a.head_dim, r = a.ratio, group = (r + 2) * d;
  for (int64_t t = begin; t < end; ++t) {
    const float* cos = a.cos + a.positions[t] * d;
    const float* sin = a.sin + a.positions[t] * d;
    float* row = qkv + t * a.groups * group;
    int64_t slot = a.write_slots[t];
    for (int64_t g = 0; g < a.groups; ++g) {
      float* heads = row + g * group;
      for (int64_t h = 0; h <= r; ++h) rotate(heads + h * d, cos, sin, d);  // r queries, the key
      std::memcpy(a.k_cache + (slot * a.groups + g) * d, heads + r * d, d * sizeof(float));
      std::memcpy(a.v_cache + (slot * a.groups + g) * d, heads + (r + 1) * d, d * sizeof(float));
    }
  }
}

// Attention of token t's query heads over its sequence. `scratch` holds
// groups · ratio × n floats of scores and n offsets (n = positions[t] + 1).
// The cache row of each position (all kv groups, contiguous) is located once
// through the block table; then per query head: scores q · k for eight
// positions at a time (lane sums by one transpose), their softmax, and the
// weighted sum of the values eight output features at a time, kept in a
// register across the positions. Head sizes that are not a multiple of 8 take
// the plain loops. kChunks: head_dim / 8 known when compiling (the query
// head then stays in registers), or 0.
template <int kChunks>
BATON_INLINE void attend_token_impl(const PagedAttention& a, const float* qkv, int64_t t,
                                    float* out, float* scratch) {
  // d is the template's constant when it has one (attend_token chose the
  // instantiation by head_dim): the loops over it then have known bounds.
  const int64_t d = kChunks > 0 ? 8 * kChunks : a.head_dim;
  const int64_t r = a.ratio, bs = a.block_size, G = a.groups;
  const int64_t heads = G * r, row = G * d;
  const int64_t n = a.positions[t] + 1;
  const float* q = qkv + t * G * (r + 2) * d;
  const int64_t* table = a.block_tables + a.rows[t] * a.table_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* scores = scratch;
  int64_t* off = reinterpret_cast<int64_t*>(scratch + heads * n);  // n floats' worth each
  // Each position's cache row, block by block: no division per position.
  for (int64_t j0 = 0, b = 0; j0 < n; j0 += bs, ++b) {
    const int64_t base = table[b] * bs, m = std::min(bs, n - j0);
    for (int64_t i = 0; i < m; ++i) off[j0 + i] = (base + i) * row;
  }
  const bool wide = kChunks > 0 || d % 8 == 0;
  const int64_t chunks = kChunks > 0 ? kChunks : d / 8;
  for (int64_t g = 0; g < G; ++g) {
    const float* k = a.k_cache + g * d;
    for (int64_t h = 0; h < r; ++h) {
      const float* qh = q + (g * (r + 2) + h) * d;
      float* s = scores + (g * r + h) * n;
      int64_t j = 0;
      if (wide) {
        for (; j + 8 <= n; j += 8) {
          v8 acc[8];
          for (int p = 0; p < 8; ++p) {
            const float* kj = k + off[j + p];
            v8 x = load8(qh) * load8(kj);
            for (int64_t i = 1; i < chunks; ++i) x += load8(qh + 8 * i) * load8(kj + 8 * i);
            acc[p] = x;
          }
          store8(s + j, lane_sums(acc) * scale);
        }
      }
      for (; j < n; ++j) s[j] = dot(qh, k + off[j], d) * scale;
    }
  }
  for (int64_t h = 0; h < heads; ++h) {  // softmax of each head's scores
    float* s = scores + h * n;
    const float mx = max_of(s, n);
    for (int64_t j = 0; j < n; ++j) s[j] = exp_approx(s[j] - mx);
    const float inv_sum = 1.0f / sum_of(s, n);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv_sum;
  }
  for (int64_t g = 0; g < G; ++g) {
    const float* v = a.v_cache + g * d;
    for (int64_t h = 0; h < r; ++h) {
      const float* s = scores + (g * r + h) * n;
      float* o = out + (t * heads + g * r + h) * d;
      if (wide) {
        for (int64_t i = 0; i < 8 * chunks; i += 8) {
          // Four independent sums: one chain would wait out each add's latency.
          v8 acc[4] = {};
          int64_t j = 0;
          for (; j + 4 <= n; j += 4)
            for (int u = 0; u < 4; ++u) acc[u] += s[j + u] * load8(v + off[j + u] + i);
          for (; j < n; ++j) acc[0] += s[j] * load8(v + off[j] + i);
          store8(o + i, (acc[0] + acc[1]) + (acc[2] + acc[3]));
        }
      } else {
        std::fill(o, o + d, 0.0f);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < d; ++i) o[i] += s[j] * v[off[j] + i];
      }
    }
  }
}

BATON_VECTOR_CLONES
void attend_token(const PagedAttention& a, const float* qkv, int64_t t, float* out,
                  float* scratch) {
  switch (a.head_dim) {
    case 32:
      return attend_token_impl<4>(a, qkv, t, out, scratch);
    case 64:
      return attend_token_impl<8>(a, qkv, t, out, scratch);
    case 128:
      return attend_token_impl<16>(a, qkv, t, out, scratch);
    default:
      return attend_token_impl<0>(a, qkv, t, out, scratch);
  }
}

BATON_VECTOR_CLONES
void argmax_log_sum_exp_rows(const float* x, int64_t begin, int64_t end, int64_t v,
                             float temperature, int64_t* argmax, float* lse) {
  const float inv = 1.0f / temperature;
  for (int64_t i = begin; i < end; ++i) {
    const float* xi = x + i * v;
    const float m = max_of(xi, v);
    int64_t first = 0;
    while (first < v - 1 && !(xi[first] == m)) ++first;
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= v; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += exp_approx((xi[j + l] - m) * inv);
    float sum = 0;
    for (; j < v; ++j) sum += exp_approx((xi[j] - m) * inv);
    for (int l = 0; l < kLanes; ++l) sum += acc[l];
    argmax[i] = first;
    lse[i] = m * inv + std::log(sum);
  }
}

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t h, double eps) {
  at::parallel_for(0, rows, grain_for(3 * h), [&](int64_t begin, int64_t end) {
    rms_norm_rows(x, w, y, begin, end, h, static_cast<float>(eps));
  });
}

void silu_mul(const float* x, float* y, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, grain_for(20 * n),
                   [&](int64_t begin, int64_t end) { silu_mul_rows(x, y, begin, end, n); });
}

void argmax_log_sum_exp(const float* x, int64_t rows, int64_t v, double temperature,
                        int64_t* argmax, float* lse) {
  ENGINE_CHECK(v >= 1 && temperature > 0,
               "argmax_log_sum_exp: need v >= 1 and temperature > 0, got ", v, " and ",
               temperature);
  at::parallel_for(0, rows, grain_for(20 * v), [&](int64_t begin, int64_t end) {
    argmax_log_sum_exp_rows(x, begin, end, v, static_cast<float>(temperature), argmax, lse);
  });
}

void PagedAttention::rotate_and_store(float* qkv, int64_t tokens) const {
  at::parallel_for(
      0, tokens, grain_for(3 * groups * (ratio + 2) * head_dim),
      [&](int64_t begin, int64_t end) { rotate_and_store_tokens(*this, qkv, begin, end); });
}

void PagedAttention::attend(const float* qkv, int64_t tokens, float* out) const {
  ENGINE_CHECK(ratio >= 1 && groups >= 1 && head_dim >= 1,
               "PagedAttention: kv heads, query heads per kv head and head size must be >= 1, got ",
               groups, ", ", ratio, " and ", head_dim);
  int64_t longest = 0;
  for (int64_t t = 0; t < tokens; ++t) longest = std::max(longest, positions[t] + 1);
  at::parallel_for(0, tokens, grain_for(4 * longest * groups * ratio * head_dim),
                   [&](int64_t begin, int64_t end) {
                     // Scores, then the positions' cache offsets (int64 in
                     // float pairs).
                     std::vector<float> scratch((groups * ratio + 2) * longest);
                     for (int64_t t = begin; t < end; ++t)
                       attend_token(*this, qkv, t, out, scratch.data());
                   });
}

}  // namespace baton::engine::cpu
