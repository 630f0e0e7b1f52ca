// Optimizer kernels: AdamW's update and the squared gradient norm as single
// passes over fp32 host memory, for Optimizer::step. Written as one loop per
// element instead of LibTorch's chain of in-place operations (eight passes
// over the parameter's memory and three temporaries per parameter), split
// over LibTorch's intra-op threads. Compiled like engine/kernels/decode_kernels.cpp
// (-O3, OpenMP, ISA clones).
//
// Example:
//   cpu::AdamWStep s{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
//                    .decay = 0.01, .bias1 = 1 - pow(0.9, t), .bias2 = 1 - pow(0.999, t)};
//   cpu::adamw_update(p, g, m, v, n, s);
//   double ss = cpu::sum_of_squares(g, n);
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>

namespace baton::engine::cpu {

struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double decay = 0;             // decoupled weight decay (0: none for this tensor)
  double bias1 = 1, bias2 = 1;  // 1 - beta^t
  double grad_scale = 1;        // clipping factor applied to g
};

// One AdamW step over n elements, in the order of Optimizer's formula:
//   g' = g · grad_scale;  p ← p · (1 − lr · decay)
//   m ← β1 · m + (1 − β1) · g';  v ← β2 · v + (1 − β2) · g'²
//   p ← p − (lr / bias1) · m / (√v / √bias2 + eps)
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);

// Σ g² in double.
double sum_of_squares(const float* g, int64_t n);

// out[i] = Σ_j in[j][i] for j < k, summed in order j = 0, 1, …; `out` may be
// any one of the inputs.
// Returns Σ out[i]² in double (as sum_of_squares(out, n)).
double sum_arrays(float* out, const float* const* in, int64_t k, int64_t n);

}  // namespace baton::engine::cpu
