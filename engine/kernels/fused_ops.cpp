#include "engine/kernels/fused_ops.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include "engine/errors.h"
#include "engine/kernels/decode_kernels.h"
#include "engine/kernels/train_kernels.h"

namespace baton::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            double eps) {
    const at::Tensor xc = x.contiguous(), wc = w.contiguous();
    const int64_t h = x.size(-1);
    at::Tensor y = at::empty_like(xc);
    cpu::rms_norm(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), xc.numel() / h,
                  h, eps);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t h = x.size(-1), rows = x.numel() / h;
    at::Tensor dx = at::empty_like(x);
    at::Tensor dy_xhat = at::empty_like(x);
    cpu::rms_norm_backward(x.data_ptr<float>(), w.data_ptr<float>(), dy.data_ptr<float>(),
                           dx.data_ptr<float>(), dy_xhat.data_ptr<float>(), rows, h,
                           ctx->saved_data["eps"].toDouble());
    return {dx, dy_xhat.view({rows, h}).sum(0), at::Tensor()};
  }
};

struct SiluMulFn : torch::autograd::Function<SiluMulFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up) {
    const at::Tensor x = gate_up.contiguous();
    const int64_t n = x.size(-1) / 2;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = n;
    at::Tensor y = at::empty(shape, x.options());
    cpu::silu_mul(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() / (2 * n), n);
    ctx->save_for_backward({x});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t n = x.size(-1) / 2;
    at::Tensor dx = at::empty_like(x);
    cpu::silu_mul_backward(x.data_ptr<float>(), dy.data_ptr<float>(), dx.data_ptr<float>(),
                           x.numel() / (2 * n), n);
    return {dx};
  }
};

// cos and sin: contiguous [batch or 1, seq, head_dim].
cpu::QkvRotary layout_of(int64_t batch, int64_t seq, const at::Tensor& cos, const at::Tensor& sin,
                         int64_t groups, int64_t ratio, int64_t head_dim) {
  cpu::QkvRotary l;
  l.batch = batch;
  l.seq = seq;
  l.groups = groups;
  l.ratio = ratio;
  l.head_dim = head_dim;
  l.cos = cos.data_ptr<float>();
  l.sin = sin.data_ptr<float>();
  l.tables_per_row = cos.size(0) != 1 || l.batch == 1;
  return l;
}

struct QkvRotaryFn : torch::autograd::Function<QkvRotaryFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t groups, int64_t ratio,
                               int64_t head_dim) {
    const at::Tensor x = qkv.contiguous(), c = cos.contiguous(), s = sin.contiguous();
    const int64_t B = x.size(0), S = x.size(1);
    at::Tensor q = at::empty({B, groups * ratio, S, head_dim}, x.options());
    at::Tensor k = at::empty({B, groups, S, head_dim}, x.options());
    at::Tensor v = at::empty({B, groups, S, head_dim}, x.options());
    layout_of(B, S, c, s, groups, ratio, head_dim)
        .forward(x.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>());
    ctx->save_for_backward({c, s});
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["ratio"] = ratio;
    ctx->saved_data["head_dim"] = head_dim;
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const int64_t ratio = ctx->saved_data["ratio"].toInt();
    const int64_t head_dim = ctx->saved_data["head_dim"].toInt();
    const int64_t B = shape[0], S = shape[1];
    const auto opts = saved[0].options();
    auto grad_or_zeros = [&](const at::Tensor& g, int64_t heads) {
      return g.defined() ? g.contiguous() : at::zeros({B, heads, S, head_dim}, opts);
    };
    const at::Tensor dq = grad_or_zeros(grads[0], groups * ratio);
    const at::Tensor dk = grad_or_zeros(grads[1], groups);
    const at::Tensor dv = grad_or_zeros(grads[2], groups);
    at::Tensor dqkv = at::empty(shape, opts);
    layout_of(B, S, saved[0], saved[1], groups, ratio, head_dim)
        .backward(dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(),
                  dqkv.data_ptr<float>());
    return {dqkv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fusable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  ENGINE_CHECK(fusable(x) && fusable(w) && w.dim() == 1 && x.size(-1) == w.size(0),
               "fused_rms_norm: x [..., h] and w [h] must be CPU fp32, got ", x.toString(), " ",
               x.sizes(), " and ", w.toString(), " ", w.sizes());
  return RmsNormFn::apply(x, w, eps);
}

at::Tensor fused_silu_mul(const at::Tensor& gate_up) {
  ENGINE_CHECK(fusable(gate_up) && gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
               "fused_silu_mul: gate_up [..., 2n] must be CPU fp32, got ", gate_up.toString(), " ",
               gate_up.sizes());
  return SiluMulFn::apply(gate_up);
}

QkvHeads fused_qkv_rotary(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                          int64_t groups, int64_t ratio, int64_t head_dim) {
  ENGINE_CHECK(fusable(qkv) && fusable(cos) && fusable(sin) && qkv.dim() == 3 &&
                   qkv.size(2) == groups * (ratio + 2) * head_dim && head_dim % 2 == 0,
               "fused_qkv_rotary: qkv [B, S, ", groups * (ratio + 2) * head_dim,
               "] (CPU fp32, even head_dim ", head_dim, ") expected, got ", qkv.toString(), " ",
               qkv.sizes());
  ENGINE_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes() &&
                   (cos.size(0) == qkv.size(0) || cos.size(0) == 1) && cos.size(1) == qkv.size(1) &&
                   cos.size(2) == head_dim,
               "fused_qkv_rotary: rotary tables [", qkv.size(0), " or 1, ", qkv.size(1), ", ",
               head_dim, "] expected, got ", cos.sizes(), " and ", sin.sizes());
  variable_list out = QkvRotaryFn::apply(qkv, cos, sin, groups, ratio, head_dim);
  return {out[0], out[1], out[2]};
}

}  // namespace baton::engine
