// LoRA adapters in the engine (engine/model/lora.h) on a tiny Qwen3 (fused
// q/k/v with GQA, per-head norms) and a tiny Llama: a fresh adapter changes
// nothing, training moves the adapters only, the merged weights compute what
// the adapted model computes, and with the adapters off the model is its base.
// The tensor-parallel split of the adapters is in parallel_model_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/fixture_model.h"
#include "tests/engine/model_tolerance.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::max_abs;
using test::Tolerance;
using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

std::shared_ptr<Transformer> load(const std::string& fixture, TransformerOptions options = {}) {
  return test::load_fixture_model(fixture, options);
}

TransformerOptions with_lora(std::vector<std::string> targets, int64_t rank = 4) {
  TransformerOptions o;
  o.lora.rank = rank;
  o.lora.alpha = 8;
  o.lora.targets = std::move(targets);
  return o;
}

at::Tensor logits_of(Transformer& model, const TensorMap& ref) {
  at::NoGradGuard no_grad;
  return model.forward(ref.at("input_ids"), ref.at("position_ids"), ref.at("attention_mask"));
}

// `steps` AdamW steps of the mean log-prob of the reference rows.
void train(const std::shared_ptr<Transformer>& model, const TensorMap& ref, int steps) {
  OptimizerOptions oo;
  oo.lr = 2e-2;
  oo.distributed = false;
  Optimizer opt(model, oo);
  MicroBatch mb;
  mb.input_ids = ref.at("input_ids");
  mb.position_ids = ref.at("position_ids");
  mb.attention_mask = ref.at("attention_mask");
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    forward_backward(*model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
      return -next_token_log_probs(logits, m.input_ids, model->parallel().tp()).mean();
    });
    opt.step();
  }
}

class Lora : public ::testing::TestWithParam<std::string> {};

TEST_P(Lora, AFreshAdapterChangesNothingAndOnlyTheAdaptersTrain) {
  const std::string fixture = GetParam();
  const TensorMap ref = read_safetensors(kFixtures + "/" + fixture + "/reference.safetensors");
  auto base = load(fixture);
  auto model = load(fixture, with_lora({"all-linear"}));
  // B starts at zero: the same logits, bit for bit.
  EXPECT_TRUE(at::equal(logits_of(*model, ref), logits_of(*base, ref)));
  // 7 modules × 2 tensors per layer, and nothing else trains.
  const auto trainable = model->trainable_params();
  EXPECT_EQ(trainable.size(), static_cast<size_t>(14 * model->config().num_layers));
  for (const auto& [name, p] : model->named_params()) EXPECT_FALSE(p.requires_grad()) << name;

  const auto before = model->state_dict();
  train(model, ref, 3);
  const auto after = model->state_dict();
  int moved = 0;
  for (const auto& [name, t] : before) {
    if (name.find(".lora.") == std::string::npos) {
      EXPECT_TRUE(at::equal(t, after.at(name))) << name << " is frozen but changed";
    } else if (!at::equal(t, after.at(name))) {
      ++moved;
    }
  }
  EXPECT_EQ(moved, static_cast<int>(trainable.size()));  // every A and B moved
  // Off, the model is its base again.
  model->set_lora_enabled(false);
  EXPECT_TRUE(at::equal(logits_of(*model, ref), logits_of(*base, ref)));
}

TEST_P(Lora, TheMergedWeightsComputeWhatTheAdaptedModelComputes) {
  const std::string fixture = GetParam();
  const TensorMap ref = read_safetensors(kFixtures + "/" + fixture + "/reference.safetensors");
  auto model = load(fixture, with_lora({"q_proj", "v_proj", "o_proj", "down_proj"}));
  train(model, ref, 3);
  const at::Tensor adapted = logits_of(*model, ref);
  auto merged = std::make_shared<Transformer>(model->config(), ParallelState::single());
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, t] : model->merged_params()) weights[name] = t;
  merged->load_state_dict(weights);
  const at::Tensor& mask = ref.at("attention_mask");
  // The same sums, with W + s·B A rounded once instead of two products added:
  // one more rounding per weight, so the logit's terms once more.
  expect_close(logits_of(*merged, ref), adapted,
               Tolerance::fp32(2 * test::logit_terms(model->config(), adapted.size(1)),
                               max_abs(adapted, mask)),
               "merged vs adapted logits", mask);
  // The merge moved the adapted weights (and only those).
  const auto base = model->named_params();
  const auto merged_params = model->merged_params();
  for (size_t i = 0; i < base.size(); ++i) {
    const std::string& name = base[i].first;
    const bool adapted_weight = name.ends_with("linear_qkv.weight") ||
                                name.ends_with("linear_proj.weight") ||
                                name.ends_with("linear_fc2.weight");
    EXPECT_EQ(!at::equal(base[i].second, merged_params[i].second), adapted_weight) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Lora, ::testing::Values("tiny-qwen3", "tiny-llama"),
                         [](const auto& info) { return info.param.substr(5); });

TEST(LoraOptions, AnUnknownTargetIsRefusedNamingIt) {
  const ModelConfig cfg = ModelConfig::load(kFixtures + "/tiny-llama");
  expect_error([&] { Transformer(cfg, ParallelState::single(), with_lora({"qkv_proj"})); },
               {"LoRA target \"qkv_proj\"", "q_proj", "all-linear"});
}

}  // namespace
}  // namespace baton::engine
