// The model against HF transformers (fixtures made by fixtures/make_fixtures.py),
// one process. Tolerances: HF and baton compute the same fp32 values with
// other kernels and summation orders, so each comparison allows the rounding
// of every term summed on the way (model_tolerance.h) at the magnitude of
// the logits (or values, gradients); positions HF pads are not compared
// (their outputs are arbitrary, fixtures/README.md).
#include "engine/model/transformer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include <torch/csrc/autograd/function.h>

#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/vocab_parallel.h"
#include "tests/engine/model_tolerance.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::expect_near;
using test::max_abs;
using test::Tolerance;

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

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, LogitsLogProbsAndEntropyMatchHf) {
  auto f = load_fixture(GetParam());
  auto model = build(f);
  auto logits =
      model->forward(f.ref.at("input_ids"), f.ref.at("position_ids"), f.ref.at("attention_mask"));
  ASSERT_EQ(logits.sizes(), f.ref.at("logits").sizes());
  const auto& valid = f.ref.at("attention_mask");
  const int64_t seq = logits.size(1);
  // The fixtures' logits reach 6-7; a chain of 2064 terms (4 layers, 10
  // tokens) allows ~2e-4 on them, ~3e-4 on log-probs and entropies.
  const double m = max_abs(f.ref.at("logits"), valid);
  expect_close(logits, f.ref.at("logits"), Tolerance::fp32(test::logit_terms(f.config, seq), m),
               "logits", valid);

  const Group& tp = model->parallel().tp();
  const Tolerance lp_tol = Tolerance::fp32(test::log_prob_terms(f.config, seq), m);
  auto lp = next_token_log_probs(logits, f.ref.at("input_ids"), tp);
  expect_close(lp, f.ref.at("log_probs"), lp_tol, "log_probs", f.ref.at("response_mask"));
  auto ent = vocab_parallel_entropy(logits.narrow(1, 0, logits.size(1) - 1), tp);
  expect_close(ent, f.ref.at("entropy"), lp_tol, "entropy", f.ref.at("response_mask"));

  // Row 0 alone without a mask (positions 0..S-1) gives the same logits.
  auto ids0 = f.ref.at("input_ids").narrow(0, 0, 1);
  auto pos0 = at::arange(ids0.size(1), at::kLong).unsqueeze(0);
  auto alone = model->forward(ids0, pos0, at::ones_like(ids0));
  expect_close(alone, f.ref.at("logits_row0_nomask"),
               Tolerance::fp32(test::logit_terms(f.config, seq), m), "row 0 alone");
}

TEST_P(HfParity, GradientsMatchHf) {
  auto f = load_fixture(GetParam());
  auto model = build(f);
  const auto& ids = f.ref.at("input_ids");
  auto logits = model->forward(ids, f.ref.at("position_ids"), f.ref.at("attention_mask"));
  auto lp = next_token_log_probs(logits, ids, model->parallel().tp());
  auto mask = f.ref.at("response_mask").to(at::kFloat);
  auto loss = (lp * mask).sum() / mask.sum();
  const int64_t seq = ids.size(1), tokens = mask.sum().item<int64_t>();
  const double m = max_abs(f.ref.at("logits"), f.ref.at("attention_mask"));
  // The mean of `tokens` log-probs: their terms and the sum over positions.
  expect_near(loss.item<double>(), f.ref.at("loss_masked").item<double>(),
              Tolerance::fp32(test::log_prob_terms(f.config, seq) + tokens, m), "loss");
  loss.backward();

  TensorMap grads;
  for (const auto& [name, p] : model->named_params()) grads[name] = p.grad();
  auto hf_grads = shards_to_hf({{grads}}, f.config, {f.config.num_layers}, false);
  int compared = 0;
  for (const auto& [key, expected] : f.ref) {
    if (key.rfind("grad_masked.", 0) != 0) continue;
    auto name = key.substr(std::string("grad_masked.").size());
    ASSERT_TRUE(hf_grads.count(name)) << name;
    // Forward, backward and the sum over positions, at the gradient's scale.
    expect_close(hf_grads.at(name), expected,
                 Tolerance::fp32(test::gradient_terms(f.config, seq, tokens), max_abs(expected)),
                 name);
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
  // The value head sums as many terms as the LM head; values are O(1).
  const auto& valid = lm.ref.at("attention_mask");
  expect_close(values, f.ref.at("values"),
               Tolerance::fp32(test::logit_terms(f.config, values.size(1)),
                               std::max(1.0, max_abs(f.ref.at("values"), valid))),
               "values", valid);
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

using NodePtr = decltype(torch::autograd::Edge::function);  // intrusive_ptr in LibTorch 2.x

bool graph_has(const NodePtr& root, const std::string& name) {
  std::vector<NodePtr> stack{root};
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
  // Recomputation reruns the same forward, same kernels, same inputs: the
  // gradients are bit-identical.
  auto a = plain->named_params(), b = recomputed->named_params();
  for (size_t i = 0; i < a.size(); ++i)
    expect_close(b[i].second.grad(), a[i].second.grad(), Tolerance::exact(), a[i].first);
}

// The fixture's padded rows packed into one row: their real tokens back to
// back, positions as in the padded rows; `index` [B, S] is where each padded
// column's token lands (padding: -1).
struct Packed {
  at::Tensor ids, pos;
  std::vector<int64_t> lengths;
  at::Tensor index;
};

Packed pack_rows(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& mask) {
  Packed p;
  const at::Tensor real = mask.ne(0);
  p.ids = ids.masked_select(real).unsqueeze(0);
  p.pos = pos.masked_select(real).unsqueeze(0);
  p.index = at::full(ids.sizes(), -1, at::kLong);
  int64_t next = 0;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    int64_t len = 0;
    for (int64_t c = 0; c < ids.size(1); ++c) {
      if (real[r][c].item<bool>()) {
        p.index[r][c] = next++;
        ++len;
      }
    }
    p.lengths.push_back(len);
  }
  return p;
}

// Rows of a packed output [1, T, ...] at the padded layout's real columns,
// and the padded output [B, S, ...] at the same columns, both [tokens, ...].
std::pair<at::Tensor, at::Tensor> at_real_tokens(const at::Tensor& packed, const at::Tensor& padded,
                                                 const Packed& p) {
  const at::Tensor real = p.index.ge(0);
  const at::Tensor from_packed = packed.select(0, 0).index_select(0, p.index.masked_select(real));
  const at::Tensor from_padded = padded.flatten(0, 1).index_select(
      0, at::arange(real.numel(), at::kLong).masked_select(real.flatten()));
  return {from_packed, from_padded};
}

TEST(Transformer, PackedSequencesGiveThePaddedRowsLogitsAndGradients) {
  auto f = load_fixture("tiny-qwen2");
  auto padded_model = build(f);
  const auto& ids = f.ref.at("input_ids");
  const auto& pos = f.ref.at("position_ids");
  const auto& mask = f.ref.at("attention_mask");
  const Packed p = pack_rows(ids, pos, mask);
  ASSERT_GT(p.lengths.size(), 1u);
  ASSERT_LT(p.ids.size(1), ids.numel()) << "the fixture has padding to remove";

  // Each sequence sees itself only: the same logits as its padded row, up to
  // the summation order of attention over a shorter key range.
  at::Tensor padded = padded_model->forward(ids, pos, mask);
  at::Tensor packed = padded_model->forward(p.ids, p.pos, at::ones_like(p.ids), p.lengths);
  ASSERT_EQ(packed.size(1), p.ids.size(1));
  auto [a, b] = at_real_tokens(packed, padded, p);
  const int64_t seq = ids.size(1);
  const double m = std::max(1.0, b.abs().max().item<double>());
  expect_close(a, b, Tolerance::fp32(test::logit_terms(f.config, seq), m), "packed logits");

  // The gradient of a loss over the real tokens, through plain and
  // recomputed layers, equals the padded one's.
  auto recomputed = std::make_shared<Transformer>(
      f.config, ParallelState::single(), TransformerOptions().set_recompute_activations(true));
  recomputed->load_state_dict(padded_model->state_dict());
  auto padded_loss = [&](Transformer& model) {
    auto out = model.forward(ids, pos, mask).log_softmax(-1);
    return (out.select(-1, 3) * mask.to(at::kFloat)).sum();
  };
  auto packed_loss = [&](Transformer& model) {
    return model.forward(p.ids, p.pos, at::ones_like(p.ids), p.lengths)
        .log_softmax(-1)
        .select(-1, 3)
        .sum();
  };
  padded_loss(*padded_model).backward();
  packed_loss(*recomputed).backward();
  const int64_t tokens = p.ids.size(1);
  auto x = padded_model->named_params(), y = recomputed->named_params();
  for (size_t i = 0; i < x.size(); ++i) {
    const double gm = std::max(1e-3, x[i].second.grad().abs().max().item<double>());
    expect_close(y[i].second.grad(), x[i].second.grad(),
                 Tolerance::fp32(test::gradient_terms(f.config, seq, tokens), gm), x[i].first);
  }
}

TEST(Transformer, PackedAttentionByBiasEqualsItSequenceBySequence) {
  auto f = load_fixture("tiny-llama");
  auto per_sequence = build(f);
  auto dense = std::make_shared<Transformer>(
      f.config, ParallelState::single(),
      TransformerOptions().set_packed_attention(PackedAttention::kDenseBias));
  dense->load_state_dict(per_sequence->state_dict());
  const Packed p =
      pack_rows(f.ref.at("input_ids"), f.ref.at("position_ids"), f.ref.at("attention_mask"));
  at::NoGradGuard no_grad;
  const at::Tensor a = per_sequence->forward(p.ids, p.pos, at::ones_like(p.ids), p.lengths);
  const at::Tensor b = dense->forward(p.ids, p.pos, at::ones_like(p.ids), p.lengths);
  const double m = std::max(1.0, a.abs().max().item<double>());
  expect_close(b, a, Tolerance::fp32(test::logit_terms(f.config, p.ids.size(1)), m),
               "dense-bias packed logits");
  // The bias itself: causal, and blind across sequences.
  const at::Tensor bias = packed_attention_bias({2, 3}, at::kFloat, at::kCPU);
  ASSERT_EQ(bias.sizes(), (at::IntArrayRef{1, 1, 5, 5}));
  const at::Tensor open = bias.view({5, 5}).eq(0).to(at::kLong);
  EXPECT_TRUE(at::equal(open, at::tensor({1, 0, 0, 0, 0,  //
                                          1, 1, 0, 0, 0,  //
                                          0, 0, 1, 0, 0,  //
                                          0, 0, 1, 1, 0,  //
                                          0, 0, 1, 1, 1},
                                         at::kLong)
                                  .view({5, 5})));
}

// On a GPU a packed row attends in one call with a block-diagonal bias
// (PackedAttention::kAuto): the same logits as the padded rows there.
TEST(Transformer, PackedRowsOnTheGpuGiveThePaddedLogits_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto f = load_fixture("tiny-qwen2");
  auto model = build(f);
  model->to(at::Device(at::kCUDA));
  const auto& ids = f.ref.at("input_ids");
  const auto& pos = f.ref.at("position_ids");
  const auto& mask = f.ref.at("attention_mask");
  const Packed p = pack_rows(ids, pos, mask);
  at::NoGradGuard no_grad;
  const at::Tensor padded = model->forward(ids, pos, mask).cpu();
  const at::Tensor packed = model->forward(p.ids, p.pos, at::ones_like(p.ids), p.lengths).cpu();
  auto [a, b] = at_real_tokens(packed, padded, p);
  const double m = std::max(1.0, b.abs().max().item<double>());
  expect_close(a, b, Tolerance::fp32(test::logit_terms(f.config, ids.size(1)), m),
               "packed logits on the GPU");
}

TEST(Transformer, PackedLengthsMustFillOneRow) {
  auto f = load_fixture("tiny-llama");
  auto model = build(f);
  const at::Tensor ids = at::zeros({1, 6}, at::kLong), pos = at::zeros({1, 6}, at::kLong);
  EXPECT_NO_THROW(model->forward(ids, pos, at::ones_like(ids), {2, 4}));
  EXPECT_THROW(model->forward(ids, pos, at::ones_like(ids), {2, 3}), EngineError);
  EXPECT_THROW(model->forward(ids, pos, at::ones_like(ids), {6, 0}), EngineError);
  const at::Tensor two = at::zeros({2, 3}, at::kLong);
  EXPECT_THROW(model->forward(two, two, at::ones_like(two), {3, 3}), EngineError);
}

}  // namespace
}  // namespace baton::engine
