// Training kernels: the CPU fp32 forward and backward passes of the small
// elementwise pieces of a transformer layer, fused so that each is one pass
// over its rows instead of one LibTorch dispatch (and one temporary) per
// elementwise operation. engine/kernels/fused_ops.h wraps them as autograd functions.
//   - rms_norm_backward: HF's RMSNorm (the forward is cpu::rms_norm);
//   - silu_mul_backward: silu(gate) * up (the forward is cpu::silu_mul);
//   - qkv_rotary / qkv_rotary_backward: the fused qkv projection's output
//     split into q, k, v in attention's [B, heads, S, d] layout, with HF's
//     rotary embedding applied to q and k, and its exact adjoint.
// Each kernel computes a row from that row's inputs only; rows are split over
// LibTorch's intra-op threads (at::parallel_for) when there are enough.
// Inner loops are built as x86-64 ISA clones, as the decode kernels are.
#pragma once

#include <cstdint>

namespace baton::engine::cpu {

// For y = x / sqrt(mean(x²) + eps) * w over `rows` rows of `h` floats and the
// gradient dy of y: dx, and dy_xhat = dy * x / sqrt(mean(x²) + eps) (whose sum
// over the rows is w's gradient). dx may alias dy.
void rms_norm_backward(const float* x, const float* w, const float* dy, float* dx, float* dy_xhat,
                       int64_t rows, int64_t h, double eps);

// For y = silu(gate) * up with x [rows, 2n] = (gate, up) and the gradient dy
// [rows, n]: dx [rows, 2n].
void silu_mul_backward(const float* x, const float* dy, float* dx, int64_t rows, int64_t n);

// The layout of a fused qkv projection: per token, `groups` kv groups of
// `ratio` query heads, one key head and one value head, `head_dim` floats
// each (TransformerLayer's layout). cos / sin: the rotary tables [B', S,
// head_dim] with B' = batch or 1 (then shared by every row).
struct QkvRotary {
  int64_t batch = 0, seq = 0, groups = 0, ratio = 0, head_dim = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  bool tables_per_row = true;  // B' = batch

  // qkv [B, S, groups·(ratio+2)·head_dim] → q [B, groups·ratio, S, d],
  // k and v [B, groups, S, d]; q and k rotated.
  void forward(const float* qkv, float* q, float* k, float* v) const;
  // The adjoint: dq, dk, dv (the layouts above) → dqkv (qkv's layout).
  void backward(const float* dq, const float* dk, const float* dv, float* dqkv) const;
};

}  // namespace baton::engine::cpu
