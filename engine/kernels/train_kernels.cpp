#include "engine/kernels/train_kernels.h"

#include <ATen/Parallel.h>

#include "engine/kernels/kernel_simd.h"

namespace baton::engine::cpu {
namespace {

using namespace simd;  // NOLINT: the helpers are this file's vocabulary

BATON_VECTOR_CLONES
void rms_norm_backward_rows(const float* x, const float* w, const float* dy, float* dx,
                            float* dy_xhat, int64_t begin, int64_t end, int64_t h, float eps) {
  const float inv_h = 1.0f / static_cast<float>(h);
  for (int64_t i = begin; i < end; ++i) {
    const float* xi = x + i * h;
    const float* dyi = dy + i * h;
    float* dxi = dx + i * h;
    float* gi = dy_xhat + i * h;
    const float inv = 1.0f / std::sqrt(dot(xi, xi, h) * inv_h + eps);
    // Σ_j w_j dy_j x_j, with the lanes of dot().
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= h; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += w[j + l] * dyi[j + l] * xi[j + l];
    float s = 0;
    for (; j < h; ++j) s += w[j] * dyi[j] * xi[j];
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    const float c = inv * inv * inv * s * inv_h;
    for (j = 0; j < h; ++j) {
      const float d = dyi[j];
      gi[j] = d * xi[j] * inv;
      dxi[j] = inv * w[j] * d - c * xi[j];
    }
  }
}

BATON_VECTOR_CLONES
void silu_mul_backward_rows(const float* x, const float* dy, float* dx, int64_t begin, int64_t end,
                            int64_t n) {
  for (int64_t i = begin; i < end; ++i) {
    const float* gate = x + i * 2 * n;
    const float* up = gate + n;
    const float* dyi = dy + i * n;
    float* dgate = dx + i * 2 * n;
    float* dup = dgate + n;
    for (int64_t j = 0; j < n; ++j) {
      const float a = gate[j];
      const float sig = 1.0f / (1.0f + exp_approx(-a));
      dup[j] = dyi[j] * a * sig;
      dgate[j] = dyi[j] * up[j] * sig * (1.0f + a * (1.0f - sig));
    }
  }
}

// out = x * cos + rotate_half(x) * sin (HF), from x to out.
BATON_INLINE void rotate_copy(const float* x, float* out, const float* cos, const float* sin,
                              int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    out[i] = a * cos[i] - b * sin[i];
    out[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// The adjoint of rotate_copy: dx from dout.
BATON_INLINE void rotate_copy_adjoint(const float* dout, float* dx, const float* cos,
                                      const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = dout[i], b = dout[i + half];
    dx[i] = a * cos[i] + b * sin[i + half];
    dx[i + half] = b * cos[i + half] - a * sin[i];
  }
}

BATON_INLINE void copy(const float* x, float* out, int64_t d) { std::memcpy(out, x, d * sizeof(float)); }

// Token t = b·S + s of the batch: its qkv row, and where each head goes.
template <bool kBackward>
BATON_INLINE void qkv_token(const QkvRotary& l, int64_t t, const float* qkv_or_dq,
                            const float* dk, const float* dv, float* q_or_dqkv, float* k, float* v) {
  const int64_t S = l.seq, d = l.head_dim, r = l.ratio, G = l.groups;
  const int64_t b = t / S, s = t % S;
  const int64_t table = ((l.tables_per_row ? b : 0) * S + s) * d;
  const float* cos = l.cos + table;
  const float* sin = l.sin + table;
  const int64_t row = t * G * (r + 2) * d;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t h = 0; h < r + 2; ++h) {
      const int64_t fused = row + (g * (r + 2) + h) * d;
      int64_t split;
      if (h < r) {
        split = ((b * G * r + g * r + h) * S + s) * d;
      } else {
        split = ((b * G + g) * S + s) * d;
      }
      if constexpr (!kBackward) {
        const float* src = qkv_or_dq + fused;
        if (h < r) rotate_copy(src, q_or_dqkv + split, cos, sin, d);
        else if (h == r) rotate_copy(src, k + split, cos, sin, d);
        else copy(src, v + split, d);
      } else {
        float* dst = q_or_dqkv + fused;
        if (h < r) rotate_copy_adjoint(qkv_or_dq + split, dst, cos, sin, d);
        else if (h == r) rotate_copy_adjoint(dk + split, dst, cos, sin, d);
        else copy(dv + split, dst, d);
      }
    }
  }
}

BATON_VECTOR_CLONES
void qkv_forward_tokens(const QkvRotary& l, const float* qkv, float* q, float* k, float* v,
                        int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) qkv_token<false>(l, t, qkv, nullptr, nullptr, q, k, v);
}

BATON_VECTOR_CLONES
void qkv_backward_tokens(const QkvRotary& l, const float* dq, const float* dk, const float* dv,
                         float* dqkv, int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) qkv_token<true>(l, t, dq, dk, dv, dqkv, nullptr, nullptr);
}

}  // namespace

void rms_norm_backward(const float* x, const float* w, const float* dy, float* dx, float* dy_xhat,
                       int64_t rows, int64_t h, double eps) {
  at::parallel_for(0, rows, grain_for(8 * h), [&](int64_t begin, int64_t end) {
    rms_norm_backward_rows(x, w, dy, dx, dy_xhat, begin, end, h, static_cast<float>(eps));
  });
}

void silu_mul_backward(const float* x, const float* dy, float* dx, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, grain_for(30 * n), [&](int64_t begin, int64_t end) {
    silu_mul_backward_rows(x, dy, dx, begin, end, n);
  });
}

void QkvRotary::forward(const float* qkv, float* q, float* k, float* v) const {
  const int64_t per_token = groups * (ratio + 2) * head_dim * 3;
  at::parallel_for(0, batch * seq, grain_for(per_token), [&](int64_t begin, int64_t end) {
    qkv_forward_tokens(*this, qkv, q, k, v, begin, end);
  });
}

void QkvRotary::backward(const float* dq, const float* dk, const float* dv, float* dqkv) const {
  const int64_t per_token = groups * (ratio + 2) * head_dim * 3;
  at::parallel_for(0, batch * seq, grain_for(per_token), [&](int64_t begin, int64_t end) {
    qkv_backward_tokens(*this, dq, dk, dv, dqkv, begin, end);
  });
}

}  // namespace baton::engine::cpu
