// Linear layers with prepacked weights for the CPU generation step.
//
// LibTorch's fp32 `mm` (MKL) repacks the weight on every call; in a decode
// step each weight is used once and has left the cache by the next step, so
// that repacking reads it from memory in the GEMM's own blocked order and
// dominates the step (2–3× the multiply itself on some CPUs). oneDNN, which
// LibTorch ships, can pack a weight once into its inner-product layout
// (`mkldnn::_reorder_linear_weight`) and multiply by it directly
// (`mkldnn::_linear_pointwise`): strict fp32, another summation order than
// MKL's. Both are LibTorch operators reached through the dispatcher; where
// they are not registered (a LibTorch built without oneDNN) nothing is packed
// and callers keep `mm`.
//
// Example:
//   if (packed_linear_available()) {
//     at::Tensor w = pack_linear_weight(layer->weight);     // once per weight version
//     at::Tensor y = packed_linear(x, w, layer->bias);      // y = x·Wᵀ + b
//   }
#pragma once

#include <ATen/ATen.h>

namespace baton::engine {

// True when this LibTorch has oneDNN and its packed-linear operators.
bool packed_linear_available();

// `weight` [N, K] fp32 on the CPU → the same values in oneDNN's layout (an
// opaque tensor only packed_linear reads). A copy: later writes to `weight`
// do not reach it. REQUIRES packed_linear_available().
at::Tensor pack_linear_weight(const at::Tensor& weight);

// x [M, K] fp32, contiguous, on the CPU; `packed` from pack_linear_weight;
// bias [N] or undefined → x·Wᵀ + bias, [M, N] (a new tensor).
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias);

}  // namespace baton::engine
