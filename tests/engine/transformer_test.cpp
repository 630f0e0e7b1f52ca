// The model against HF transformers (fixtures made by fixtures/make_fixtures.py),
// one process. Tolerances: fp32, atol 1e-4 on logits/values (HF's own batched
// vs unbatched runs differ by ~1e-5), 1e-5 on log-probs' gradients relative
// to their scale.
#include "engine/transformer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include <torch/csrc/autograd/function.h>

#include "engine/errors.h"
#include "engine/safetensors.h"
#include "engine/vocab_parallel.h"
#include "engine/weight_conversion.h"

namespace baton::engine {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

struct Fixture {
  ModelConfig config;
  TensorMap hf;
  TensorMap ref;
};

Fixture load_fixture(const std::string& name) {
  auto dir = kFixtures + "/" + name;
  return {ModelConfig::load(dir), read_hf_weights(dir),
          read_safetensors(dir + "/reference.safetensors")};
}

std::shared_ptr<Transformer> build(const Fixture& f, bool value_model = false) {
  auto model = std::make_shared<Transformer>(f.config, ParallelState::single(),
                                             TransformerOptions().set_value_model(value_model));
  auto spec = ShardSpec::for_rank(f.config, 0, 1, 0, {f.config.num_layers}, value_model);
  model->load_state_dict(hf_to_shard(f.hf, f.config, spec));
  return model;
}

double max_diff_where(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  auto m = mask.to(at::kBool);
  while (m.dim() < a.dim()) m = m.unsqueeze(-1);
  return ((a - b).abs() * m.to(a.scalar_type())).max().item<double>();
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsLogProbsAndEntropyMatchHf) {
  auto f = load_fixture(GetParam());
  auto model = build(f);
  auto logits =
      model->forward(f.ref.at("input_ids"), f.ref.at("position_ids"), f.ref.at("attention_mask"));
  ASSERT_EQ(logits.sizes(), f.ref.at("logits").sizes());
  EXPECT_LT(max_diff_where(logits, f.ref.at("logits"), f.ref.at("attention_mask")), 1e-4);

  const Group& tp = model->parallel().tp();
  auto lp = next_token_log_probs(logits, f.ref.at("input_ids"), tp);
  EXPECT_LT(max_diff_where(lp, f.ref.at("log_probs"), f.ref.at("response_mask")), 1e-4);
  auto ent = vocab_parallel_entropy(logits.narrow(1, 0, logits.size(1) - 1), tp);
  EXPECT_LT(max_diff_where(ent, f.ref.at("entropy"), f.ref.at("response_mask")), 1e-4);

  // Row 0 alone without a mask (positions 0..S-1) gives the same logits.
  auto ids0 = f.ref.at("input_ids").narrow(0, 0, 1);
  auto pos0 = at::arange(ids0.size(1), at::kLong).unsqueeze(0);
  auto alone = model->forward(ids0, pos0, at::ones_like(ids0));
  EXPECT_LT((alone - f.ref.at("logits_row0_nomask")).abs().max().item<double>(), 1e-4);
}

TEST_P(HfParity, GradientsMatchHf) {
  auto f = load_fixture(GetParam());
  auto model = build(f);
  const auto& ids = f.ref.at("input_ids");
  auto logits = model->forward(ids, f.ref.at("position_ids"), f.ref.at("attention_mask"));
  auto lp = next_token_log_probs(logits, ids, model->parallel().tp());
  auto mask = f.ref.at("response_mask").to(at::kFloat);
  auto loss = (lp * mask).sum() / mask.sum();
  EXPECT_NEAR(loss.item<double>(), f.ref.at("loss_masked").item<double>(), 1e-5);
  loss.backward();

  TensorMap grads;
  for (const auto& [name, p] : model->named_params()) grads[name] = p.grad();
  auto hf_grads = shards_to_hf({{grads}}, f.config, {f.config.num_layers}, false);
  int compared = 0;
  for (const auto& [key, expected] : f.ref) {
    if (key.rfind("grad_masked.", 0) != 0) continue;
    auto name = key.substr(std::string("grad_masked.").size());
    ASSERT_TRUE(hf_grads.count(name)) << name;
    double scale = expected.abs().max().item<double>();
    EXPECT_LT((hf_grads.at(name) - expected).abs().max().item<double>(), 1e-5 * (1 + scale))
        << name;
    ++compared;
  }
  EXPECT_GE(compared, 3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity, ::testing::Values("tiny-llama", "tiny-qwen2"));

TEST(ValueModel, ValuesMatchHfTokenClassification) {
  auto f = load_fixture("tiny-qwen2-value");
  auto lm = load_fixture("tiny-qwen2");
  auto model = build(f, /*value_model=*/true);
  auto values = model->forward(lm.ref.at("input_ids"), lm.ref.at("position_ids"),
                               lm.ref.at("attention_mask"));
  ASSERT_EQ(values.sizes(), f.ref.at("values").sizes());
  EXPECT_LT(max_diff_where(values, f.ref.at("values"), lm.ref.at("attention_mask")), 1e-4);
}

TEST(ValueModel, LoadingAnLmCheckpointKeepsTheFreshHead) {
  auto f = load_fixture("tiny-qwen2");
  auto model = std::make_shared<Transformer>(f.config, ParallelState::single(),
                                             TransformerOptions().set_value_model(true));
  auto before = model->state_dict().at("value_head.weight");
  auto spec = ShardSpec::for_rank(f.config, 0, 1, 0, {f.config.num_layers}, true);
  model->load_state_dict(hf_to_shard(f.hf, f.config, spec));
  auto after = model->state_dict();
  EXPECT_TRUE(at::equal(after.at("value_head.weight"), before));
  EXPECT_FALSE(after.count("output_layer.weight"));
  auto values =
      model->forward(f.ref.at("input_ids"), f.ref.at("position_ids"), f.ref.at("attention_mask"));
  EXPECT_EQ(values.sizes(), (at::IntArrayRef{2, 10, 1}));
}

TEST(Transformer, LoadStateDictNamesMissingUnexpectedAndMisshapedKeys) {
  auto f = load_fixture("tiny-llama");
  auto model = std::make_shared<Transformer>(f.config, ParallelState::single());
  auto weights = model->state_dict();
  weights.erase("decoder.layers.2.mlp.linear_fc2.weight");
  weights["decoder.layers.9.bogus"] = at::zeros({1});
  weights["decoder.final_layernorm.weight"] = at::zeros({3});
  try {
    model->load_state_dict(weights);
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing: decoder.layers.2.mlp.linear_fc2.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected: decoder.layers.9.bogus"), std::string::npos) << m;
    EXPECT_NE(m.find("decoder.final_layernorm.weight (checkpoint [3], model [64])"),
              std::string::npos)
        << m;
  }
}

TEST(Transformer, ForwardRejectsMismatchedShapes) {
  auto f = load_fixture("tiny-llama");
  auto model = build(f);
  auto ids = f.ref.at("input_ids");
  EXPECT_THROW(
      model->forward(ids, f.ref.at("position_ids").narrow(1, 0, 5), f.ref.at("attention_mask")),
      EngineError);
  EXPECT_THROW(
      model->forward(ids.to(at::kInt), f.ref.at("position_ids"), f.ref.at("attention_mask")),
      EngineError);
}

}  // namespace
}  // namespace baton::engine

namespace baton::engine {
namespace {

bool graph_has(const std::shared_ptr<torch::autograd::Node>& root, const std::string& name) {
  std::vector<std::shared_ptr<torch::autograd::Node>> stack{root};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    auto n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n.get()).second) continue;
    if (n->name().find(name) != std::string::npos) return true;
    for (const auto& e : n->next_edges()) stack.push_back(e.function);
  }
  return false;
}

TEST(Transformer, RecomputedActivationsGiveTheSameGradients) {
  auto f = load_fixture("tiny-qwen2");
  auto plain = build(f);
  auto recomputed = std::make_shared<Transformer>(
      f.config, ParallelState::single(), TransformerOptions().set_recompute_activations(true));
  recomputed->load_state_dict(plain->state_dict());
  const auto& ids = f.ref.at("input_ids");
  auto mask = f.ref.at("response_mask").to(at::kFloat);
  for (auto* m : {plain.get(), recomputed.get()}) {
    auto logits = m->forward(ids, f.ref.at("position_ids"), f.ref.at("attention_mask"));
    if (m == recomputed.get()) {
      EXPECT_TRUE(graph_has(logits.grad_fn(), "RecomputedLayer"));
    } else {
      EXPECT_FALSE(graph_has(logits.grad_fn(), "RecomputedLayer"));
    }
    ((next_token_log_probs(logits, ids, m->parallel().tp()) * mask).sum()).backward();
  }
  auto a = plain->named_params(), b = recomputed->named_params();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::allclose(a[i].second.grad(), b[i].second.grad(), 1e-6, 1e-6)) << a[i].first;
}

}  // namespace
}  // namespace baton::engine
