// Optimizer::step's AdamW on the CPU (engine/kernels/optimizer_kernels.h, one fused
// pass per tensor) against AdamW written out in double-precision LibTorch
// operations: two steps with weight decay (matrices only) and global-norm
// clipping active, parameters, both moments and the gradient norm.
#include "engine/optim/optimizer.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <string>

#include "engine/io/model_config.h"
#include "engine/model/transformer.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::test::expect_close;
using baton::test::expect_near;
using baton::test::Tolerance;

TEST(Optimizer, AdamWStepsMatchTheFormulaInDouble) {
  auto cfg = ModelConfig::load(std::string(BATON_FIXTURES_DIR) + "/tiny-llama");
  at::manual_seed(5);
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  OptimizerOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;
  Optimizer opt(model, o);

  // The reference state, in double.
  std::map<std::string, at::Tensor> p, m, v;
  for (const auto& [name, t] : model->named_params()) {
    p[name] = t.detach().to(at::kDouble);
    m[name] = at::zeros_like(p[name]);
    v[name] = at::zeros_like(p[name]);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  for (int t = 1; t <= 2; ++t) {
    double norm2 = 0;
    std::map<std::string, at::Tensor> grads;
    for (const auto& [name, param] : model->named_params()) {
      auto g = at::randn(param.sizes(), gen) * 0.05;
      param.mutable_grad() = g;
      grads[name] = g.to(at::kDouble);
      norm2 += grads[name].pow(2).sum().item<double>();
    }
    const StepStats stats = opt.step();
    const double norm = std::sqrt(norm2);
    // A sum of squares of ~10^5 values, in double on both sides.
    expect_near(stats.grad_norm, norm, Tolerance{0, 1e-12}, "grad norm, step " + std::to_string(t));
    ASSERT_GT(norm, o.clip_grad) << "clipping was meant to be active";
    const double scale = o.clip_grad / (norm + 1e-6);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    const auto state = opt.state_dict();
    for (const auto& [name, param] : model->named_params()) {
      auto g = grads[name] * scale;
      if (param.dim() > 1) p[name] *= 1 - stats.lr * o.weight_decay;
      m[name] = o.beta1 * m[name] + (1 - o.beta1) * g;
      v[name] = o.beta2 * v[name] + (1 - o.beta2) * g * g;
      p[name] -= stats.lr / bc1 * m[name] / (v[name].sqrt() / std::sqrt(bc2) + o.eps);
      // fp32 against double: each of the few products and sums on the way
      // rounds once (8 terms), at the scale of the values compared; the
      // moments' ratio m / √v is at most ~1 / √(1 − β2) and is covered by
      // the parameter's magnitude plus one step.
      const std::string where = name + " step " + std::to_string(t);
      expect_close(param.detach().to(at::kDouble), p[name],
                   Tolerance::fp32(8, test::max_abs(p[name]) + stats.lr / bc1 * 40), where);
      expect_close(state.at("exp_avg." + name).to(at::kDouble), m[name],
                   Tolerance::fp32(4, test::max_abs(m[name])), where + " exp_avg");
      expect_close(state.at("exp_avg_sq." + name).to(at::kDouble), v[name],
                   Tolerance::fp32(4, test::max_abs(v[name])), where + " exp_avg_sq");
    }
  }
}

}  // namespace
}  // namespace baton::engine
