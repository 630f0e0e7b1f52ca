// Fused training ops: the RMSNorm, SwiGLU and qkv-split-plus-rotary pieces of
// a transformer layer as autograd functions over the CPU fp32 kernels of
// engine/kernels/train_kernels.h, each one pass forward and one pass backward instead
// of a chain of small LibTorch ops (and their temporaries and backward nodes).
// They compute what the composite ops of TransformerLayer compute, to fp32
// rounding (the silu's exp is within 2 ulp). Use fusable() first: GPU and
// bf16 tensors keep the composite path.
//
// Example:
//   if (fusable(x) && fusable(w)) y = fused_rms_norm(x, w, eps);
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace baton::engine {

// A CPU fp32 tensor: what the fused ops take.
bool fusable(const at::Tensor& t);

// w * x / sqrt(mean(x², -1) + eps), x [..., h], w [h].
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// silu(gate) * up for gate_up [..., 2n] = (gate, up): [..., n].
at::Tensor fused_silu_mul(const at::Tensor& gate_up);

struct QkvHeads {
  at::Tensor q;  // [B, groups·ratio, S, d]
  at::Tensor k;  // [B, groups, S, d]
  at::Tensor v;  // [B, groups, S, d]
};

// The fused qkv projection qkv [B, S, groups·(ratio+2)·d] split into heads,
// q and k rotated by HF's rotary embedding with tables cos, sin [B or 1, S, d].
// Every output is contiguous. REQUIRES: d even.
QkvHeads fused_qkv_rotary(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                          int64_t groups, int64_t ratio, int64_t head_dim);

}  // namespace baton::engine
