// bf16 parameters with fp32 master weights (the GPU setting), run on the CPU
// here; the same on a GPU in the _CUDA test (skipped without a device).
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <cmath>
#include <map>
#include <string>

#include "engine/errors.h"
#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::test::expect_near;
using baton::test::Tolerance;

const std::string kDir = std::string(BATON_FIXTURES_DIR) + "/tiny-llama";

// The loss in bf16 against fp32 (tests/tolerance.h, Tolerance::bf16): a
// log-prob goes through ~100 bf16 roundings (4 layers × ~24 stored
// activations and weights, then the final norm and the head), and the loss
// averages the log-probs of the fixture's 15 tokens, which dilutes their
// independent errors: 100 / 15 roundings' worth, relative to the loss (~4%).
constexpr double kBf16Roundings = 100.0 / 15;

std::shared_ptr<Transformer> load_model() {
  auto cfg = ModelConfig::load(kDir);
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  model->load_state_dict(
      hf_to_shard(read_hf_weights(kDir), cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
  return model;
}

MicroBatch batch(const at::Device& device) {
  auto ref = read_safetensors(kDir + "/reference.safetensors");
  MicroBatch mb;
  mb.input_ids = ref.at("input_ids").to(device);
  mb.position_ids = ref.at("position_ids").to(device);
  mb.attention_mask = ref.at("attention_mask").to(device);
  mb.extra["mask"] = ref.at("response_mask").to(at::kFloat).to(device);
  return mb;
}

// Trains `steps` steps; returns the losses. Checks the master-weight
// invariant after every step: parameters are their fp32 masters rounded.
std::vector<double> train_bf16(const at::Device& device, int steps) {
  auto model = load_model();
  model->to(device, at::kBFloat16);
  Optimizer opt(model, OptimizerOptions().set_lr(1e-3));
  auto mb = batch(device);
  const Group& tp = model->parallel().tp();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto l = forward_backward(*model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
      auto lp = next_token_log_probs(logits, m.input_ids, tp);
      return -(lp * m.extra.at("mask")).sum() / m.extra.at("mask").sum();
    });
    opt.step();
    losses.push_back(l.at(0).item<double>());
    auto state = opt.state_dict();
    for (const auto& [name, p] : model->named_params()) {
      EXPECT_EQ(p.scalar_type(), at::kBFloat16) << name;
      auto master = state.at("master." + name);
      EXPECT_EQ(master.scalar_type(), at::kFloat) << name;
      EXPECT_TRUE(at::equal(master.to(at::kBFloat16), p.detach())) << name;
    }
  }
  return losses;
}

TEST(MixedPrecision, Bf16ParametersTrainWithFp32MasterWeights) {
  auto losses = train_bf16(at::kCPU, 4);
  // The bf16 model's first loss is the fp32 model's within bf16 rounding,
  // and training lowers it.
  auto ref = read_safetensors(kDir + "/reference.safetensors");
  double fp32_loss = -ref.at("loss_masked").item<double>();
  expect_near(losses[0], fp32_loss, Tolerance::bf16(kBf16Roundings, std::abs(fp32_loss)),
              "first loss");
  EXPECT_LT(losses.back(), losses.front());
}

TEST(MixedPrecision, Bf16TrainingOnTheGpu_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: the GPU half of this comparison needs one";
  auto cpu = train_bf16(at::kCPU, 3);
  auto gpu = train_bf16(at::Device(at::kCUDA, 0), 3);
  // Both sides round to bf16, each in its own way: twice the roundings.
  for (size_t i = 0; i < cpu.size(); ++i)
    expect_near(gpu[i], cpu[i], Tolerance::bf16(2 * kBf16Roundings, std::abs(cpu[i])),
                "loss " + std::to_string(i));
}

// Two bf16 steps, with the optimizer state offloaded and reloaded between
// them or not: the same parameters bit for bit (offload only moves memory).
// Returns the parameters after the steps and checks where the state was.
std::map<std::string, at::Tensor> two_steps(const at::Device& device, bool offload) {
  auto model = load_model();
  model->to(device, at::kBFloat16);
  Optimizer opt(model, OptimizerOptions().set_lr(1e-3));
  auto mb = batch(device);
  const Group& tp = model->parallel().tp();
  auto step = [&] {
    opt.zero_grad();
    forward_backward(*model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
      auto lp = next_token_log_probs(logits, m.input_ids, tp);
      return -(lp * m.extra.at("mask")).sum() / m.extra.at("mask").sum();
    });
    opt.step();
  };
  step();
  if (offload) {
    opt.offload();
    const bool gpu = !device.is_cpu();
    EXPECT_EQ(opt.offloaded(), gpu);
    for (const auto& [name, t] : opt.state_dict()) {
      if (name == "step") continue;
      EXPECT_EQ(t.device(), gpu ? at::Device(at::kCPU) : device) << name;
    }
    if (gpu) {
      EXPECT_THROW(opt.step(), EngineError);
    }
    opt.reload();
    EXPECT_FALSE(opt.offloaded());
    for (const auto& [name, t] : opt.state_dict()) {
      if (name != "step") {
        EXPECT_EQ(t.device(), device) << name;
      }
    }
  }
  step();
  return model->state_dict();
}

void expect_same(const std::map<std::string, at::Tensor>& a,
                 const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t.cpu(), b.at(name).cpu())) << name;
}

TEST(MixedPrecision, OffloadOnTheCpuLeavesTheStateWhereItIs) {
  expect_same(two_steps(at::kCPU, true), two_steps(at::kCPU, false));
}

TEST(MixedPrecision, OffloadMovesTheStateToTheHostAndBack_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: offload moves GPU state to the host";
  expect_same(two_steps(at::Device(at::kCUDA, 0), true),
              two_steps(at::Device(at::kCUDA, 0), false));
}

}  // namespace
}  // namespace baton::engine
