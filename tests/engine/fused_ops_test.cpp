// The fused training ops (engine/kernels/fused_ops.h) against the composite LibTorch
// ops they replace, forward and backward: RMSNorm, silu(gate) · up, and the
// qkv split with rotary embedding (one, two and four query heads per kv head;
// rotary tables per row and shared by every row), with the gradients of a
// random upstream gradient. A wrong index or a missing term of a backward
// formula is off by O(1), far outside the fp32 tolerances used here.
#include "engine/kernels/fused_ops.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

#include "engine/model/transformer_layer.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::test::expect_close;
using baton::test::Tolerance;

at::Tensor leaf(at::IntArrayRef shape) { return at::randn(shape).requires_grad_(true); }

at::Tensor grad_of(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& x) {
  return torch::autograd::grad({y}, {x}, {dy}, /*retain_graph=*/true)[0];
}

TEST(FusedOps, RmsNormMatchesTheCompositeOpsForwardAndBackward) {
  at::manual_seed(1);
  for (int64_t h : {8, 13, 128}) {
    SCOPED_TRACE("h " + std::to_string(h));
    at::Tensor x = leaf({3, 5, h});
    at::Tensor w = (at::rand({h}) + 0.5).requires_grad_(true);
    const at::Tensor dy = at::randn({3, 5, h});
    const at::Tensor want = w * (x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6));
    const at::Tensor got = fused_rms_norm(x, w, 1e-6);
    const Tolerance tol = Tolerance::fp32(h, 4.0);
    expect_close(got, want, tol, "rms_norm forward");
    expect_close(grad_of(got, dy, x), grad_of(want, dy, x), tol, "rms_norm dx");
    // w's gradient sums 15 rows.
    expect_close(grad_of(got, dy, w), grad_of(want, dy, w), Tolerance::fp32(15 * h, 8.0),
                 "rms_norm dw");
  }
}

TEST(FusedOps, SiluMulMatchesTheCompositeOpsForwardAndBackward) {
  at::manual_seed(2);
  for (int64_t n : {8, 11, 256}) {
    SCOPED_TRACE("n " + std::to_string(n));
    at::Tensor x = (4 * at::randn({2, 7, 2 * n})).requires_grad_(true);
    const at::Tensor dy = at::randn({2, 7, n});
    auto parts = x.chunk(2, -1);
    const at::Tensor want = at::silu(parts[0]) * parts[1];
    const at::Tensor got = fused_silu_mul(x);
    // The kernel's exp is within 2 ulp: a few roundings of values up to ~|x|².
    const Tolerance tol = Tolerance::fp32(8, 200.0);
    expect_close(got, want, tol, "silu_mul forward");
    expect_close(grad_of(got, dy, x), grad_of(want, dy, x), tol, "silu_mul backward");
  }
}

TEST(FusedOps, QkvRotaryMatchesSplitAndRotateForwardAndBackward) {
  at::manual_seed(3);
  const int64_t B = 3, S = 6, d = 8, groups = 2;
  for (int64_t ratio : {1, 2, 4}) {
    for (bool shared_tables : {false, true}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + (shared_tables ? " shared" : " per row"));
      at::Tensor qkv = leaf({B, S, groups * (ratio + 2) * d});
      at::Tensor positions = at::arange(S).repeat({shared_tables ? 1 : B, 1}) +
                             (shared_tables ? at::zeros({1, 1}, at::kLong)
                                            : at::arange(B).unsqueeze(1) * 3);
      const Rotary rot = rotary_tables(positions, d, 10000.0, at::kFloat);
      // The composite path of TransformerLayer::attention.
      auto grouped = qkv.view({B, S, groups, ratio + 2, d});
      auto rotate = [&](const at::Tensor& x) {
        auto cos = rot.cos.unsqueeze(1), sin = rot.sin.unsqueeze(1);
        auto half = d / 2;
        return x * cos + at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
      };
      const at::Tensor q = rotate(grouped.narrow(3, 0, ratio).reshape({B, S, groups * ratio, d}).transpose(1, 2));
      const at::Tensor k = rotate(grouped.select(3, ratio).transpose(1, 2));
      const at::Tensor v = grouped.select(3, ratio + 1).transpose(1, 2);
      const QkvHeads got = fused_qkv_rotary(qkv, rot.cos, rot.sin, groups, ratio, d);
      const Tolerance tol = Tolerance::fp32(2, 4.0);
      expect_close(got.q, q, tol, "q");
      expect_close(got.k, k, tol, "k");
      expect_close(got.v, v, Tolerance::exact(), "v");
      EXPECT_TRUE(got.q.is_contiguous() && got.k.is_contiguous() && got.v.is_contiguous());
      const at::Tensor dq = at::randn(q.sizes()), dk = at::randn(k.sizes()), dv = at::randn(v.sizes());
      const at::Tensor want = torch::autograd::grad({q, k, v}, {qkv}, {dq, dk, dv}, true)[0];
      const at::Tensor have = torch::autograd::grad({got.q, got.k, got.v}, {qkv}, {dq, dk, dv}, true)[0];
      expect_close(have, want, tol, "dqkv");
      // Only q's gradient flowing: k's and v's rows of dqkv are zero.
      const at::Tensor only_q = torch::autograd::grad({got.q}, {qkv}, {dq}, true)[0];
      const at::Tensor want_q = torch::autograd::grad({q}, {qkv}, {dq}, true)[0];
      expect_close(only_q, want_q, tol, "dqkv from q alone");
    }
  }
}

TEST(FusedOps, RefuseTensorsTheyDoNotTake) {
  EXPECT_FALSE(fusable(at::ones({2}, at::kDouble)));
  EXPECT_FALSE(fusable(at::ones({2}, at::kBFloat16)));
  EXPECT_TRUE(fusable(at::ones({2})));
  EXPECT_THROW(fused_rms_norm(at::ones({2, 4}), at::ones({3}), 1e-6), std::exception);
  EXPECT_THROW(fused_silu_mul(at::ones({2, 3})), std::exception);
  EXPECT_THROW(fused_qkv_rotary(at::ones({1, 2, 7}), at::ones({1, 2, 2}), at::ones({1, 2, 2}), 1, 1, 2),
               std::exception);
}

}  // namespace
}  // namespace baton::engine
