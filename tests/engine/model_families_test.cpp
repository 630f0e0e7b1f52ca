// The model families and RoPE types beyond Llama / Qwen2 with the default
// RoPE, against what HF transformers 5.23 computes on tiny random
// checkpoints it saved itself (tests/engine/fixtures/make_family_fixtures.py):
// Qwen3 (per-head q/k norms, head_dim ≠ hidden / heads, tied), Llama with
// the llama3, yarn, linear and dynamic RoPEs (16-token rows over an original
// context of 8), Mistral (decoupled head_dim, a sliding window), Qwen3-MoE
// (4 experts, top 2, a dense first layer). Teacher-forced
// logits and log-probs within the fp32 tolerance of the computation, greedy
// generation token for token as HF's generate, through both of the
// generation engine's step paths. The parallel layouts (TP, PP, sequence
// parallelism) are compared with this single-process model in
// parallel_model_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/rollout/generation.h"
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

// The fixture in `dir` with `cfg` (its own, or one a test altered).
std::shared_ptr<Transformer> load(const ModelConfig& cfg, const std::string& dir) {
  return test::load_fixture_model(dir.substr(dir.rfind('/') + 1), cfg);
}

struct Fixture {
  std::string dir;
  ModelConfig cfg;
  TensorMap ref;
};

Fixture fixture(const std::string& name) {
  const std::string dir = kFixtures + "/" + name;
  return {dir, ModelConfig::load(dir), read_safetensors(dir + "/reference.safetensors")};
}

// baton's logits [B, S, V] of the reference rows (whole vocabulary, tp 1).
at::Tensor logits_of(Transformer& model, const TensorMap& ref) {
  at::NoGradGuard no_grad;
  return model.forward(ref.at("input_ids"), ref.at("position_ids"), ref.at("attention_mask"));
}

std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  const at::Tensor x = t[r].contiguous();
  return {x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel()};
}

class ModelFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelFamily, LogitsAndLogProbsMatchHf) {
  const Fixture f = fixture(GetParam());
  auto model = load(f.cfg, f.dir);
  const at::Tensor logits = logits_of(*model, f.ref);
  const at::Tensor& mask = f.ref.at("attention_mask");
  const int64_t seq = logits.size(1);
  const double scale = max_abs(f.ref.at("logits"), mask);
  expect_close(logits, f.ref.at("logits"), Tolerance::fp32(test::logit_terms(f.cfg, seq), scale),
               "logits", mask);
  const at::Tensor log_probs =
      next_token_log_probs(logits, f.ref.at("input_ids"), model->parallel().tp());
  expect_close(log_probs, f.ref.at("log_probs"),
               Tolerance::fp32(test::log_prob_terms(f.cfg, seq), scale), "log_probs",
               f.ref.at("response_mask"));
}

TEST_P(ModelFamily, GreedyGenerationEqualsHfGenerate) {
  const Fixture f = fixture(GetParam());
  auto model = load(f.cfg, f.dir);
  const at::Tensor& one = f.ref.at("gen_output");     // [1, 6 + 14]
  const at::Tensor& two = f.ref.at("gen_output_b2");  // [2, 6 + 14]
  const int64_t prompt_len = f.ref.at("gen_prompt").size(1);
  const int64_t new_tokens = one.size(1) - prompt_len;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = new_tokens;
  greedy.ignore_eos = true;
  auto prompt_of = [&](const at::Tensor& t, int64_t r) {
    std::vector<int64_t> ids = row(t, r);
    return std::vector<int64_t>(ids.begin(), ids.begin() + prompt_len);
  };
  auto response_of = [&](const at::Tensor& t, int64_t r) {
    std::vector<int64_t> ids = row(t, r);
    return std::vector<int64_t>(ids.begin() + prompt_len, ids.end());
  };
  // Packed CPU steps (the paged kernels) and padded LibTorch steps.
  for (bool packed : {true, false}) {
    GenerationOptions options = GenerationOptions().set_cache_bytes(1 << 20);
    options.packed_cpu_steps = packed;
    GenerationEngine engine(model, options);
    const std::string how = packed ? "packed steps" : "padded steps";
    auto alone = engine.generate({prompt_of(one, 0)}, greedy);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0].response, response_of(one, 0)) << how;
    auto together = engine.generate({prompt_of(two, 0), prompt_of(two, 1)}, greedy);
    ASSERT_EQ(together.size(), 2u);
    for (int64_t r = 0; r < 2; ++r)
      EXPECT_EQ(together[r].response, response_of(two, r)) << how << ", batch row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFamily,
                         ::testing::Values("tiny-qwen3", "tiny-llama3-rope", "tiny-llama-yarn",
                                           "tiny-llama-linear", "tiny-llama-dynamic",
                                           "tiny-mistral", "tiny-qwen3-moe"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(5);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The tests above can fail: the same weights with the default RoPE (what a
// reader that ignored the scaling would compute) miss HF's logits past the
// original context by far more than the tolerance they allow.
TEST(ScaledRope, IgnoringTheScalingMissesHfByFarMoreThanTheTolerance) {
  for (const char* name :
       {"tiny-llama3-rope", "tiny-llama-yarn", "tiny-llama-linear", "tiny-llama-dynamic"}) {
    Fixture f = fixture(name);
    ASSERT_NE(f.cfg.rope_scaling.type, RopeType::kDefault) << name;
    ModelConfig plain = f.cfg;
    plain.rope_scaling = RopeScaling{};
    auto model = load(plain, f.dir);
    const at::Tensor& mask = f.ref.at("attention_mask");
    const at::Tensor logits = logits_of(*model, f.ref);
    const double scale = max_abs(f.ref.at("logits"), mask);
    const Tolerance tol = Tolerance::fp32(test::logit_terms(f.cfg, logits.size(1)), scale);
    const double miss = max_abs(logits - f.ref.at("logits"), mask);
    EXPECT_GT(miss, 100 * (tol.atol + tol.rtol * scale)) << name << ": max |diff| " << miss;
  }
}

// Qwen3's q/k norm weights get HF's gradients (the loss: the mean log-prob of
// row 0), as do the projections and the tied embedding around them.
TEST(Qwen3, GradientsOfTheHeadNormsMatchHf) {
  const Fixture f = fixture("tiny-qwen3");
  auto model = load(f.cfg, f.dir);
  const at::Tensor ids = f.ref.at("input_ids").narrow(0, 0, 1);
  const at::Tensor logits = model->forward(ids, f.ref.at("position_ids").narrow(0, 0, 1),
                                           f.ref.at("attention_mask").narrow(0, 0, 1));
  const at::Tensor loss = next_token_log_probs(logits, ids, model->parallel().tp()).mean();
  loss.backward();
  const int64_t seq = ids.size(1);
  expect_close(loss.detach().reshape({1}), f.ref.at("loss"),
               Tolerance::fp32(test::log_prob_terms(f.cfg, seq), max_abs(f.ref.at("logits"))),
               "loss");
  TensorMap grads;
  for (const auto& [name, p] : model->named_params()) grads[name] = p.grad();
  const TensorMap hf = shards_to_hf({{grads}}, f.cfg, {f.cfg.num_layers}, false);
  int checked = 0;
  for (const auto& [key, expected] : f.ref) {
    if (!key.starts_with("grad.")) continue;
    const std::string name = key.substr(5);
    ASSERT_TRUE(hf.count(name)) << name;
    expect_close(hf.at(name), expected,
                 Tolerance::fp32(test::gradient_terms(f.cfg, seq, seq - 1), max_abs(expected)),
                 name);
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// Qwen3-MoE's load-balancing loss over the masked tokens is HF's
// (output_router_logits with the attention mask).
TEST(Qwen3Moe, RouterLogitsAndLoadBalancingLossMatchHf) {
  const Fixture f = fixture("tiny-qwen3-moe");
  auto model = load(f.cfg, f.dir);
  ASSERT_EQ(f.cfg.moe.num_experts, 4);
  ASSERT_FALSE(f.cfg.sparse_layer(0));  // mlp_only_layers [0]
  const at::Tensor& mask = f.ref.at("attention_mask");
  const at::Tensor logits =
      model->forward(f.ref.at("input_ids"), f.ref.at("position_ids"), mask);  // with gradients
  const int64_t seq = logits.size(1);
  const double scale = max_abs(f.ref.at("logits"), mask);
  int sparse = 0;
  for (int64_t l = 0; l < f.cfg.num_layers; ++l) sparse += f.cfg.sparse_layer(l) ? 1 : 0;
  EXPECT_EQ(sparse, 3);
  // The loss sums top-k picks, which a rounding cannot flip here (HF's and
  // baton's logits agree to the tolerance of LogitsAndLogProbsMatchHf), and
  // router probabilities, each as exact as a logit.
  const double aux = model->router_aux_loss(mask).item<double>();
  test::expect_near(aux, f.ref.at("aux_loss").item<double>(),
                    Tolerance::fp32(test::logit_terms(f.cfg, seq), scale), "aux_loss (masked)");
  // (HF's loss without the mask counts the padded tokens too, whose hidden
  // states are arbitrary: their attention sees no key. Not comparable.)
  EXPECT_EQ(model->last_router_aux_loss(), aux);
}

// set_router_aux_loss_scale(s) puts s × the load-balancing loss into every
// later backward: the same gradients as adding it to the loss by hand.
TEST(Qwen3Moe, TheScaledLoadBalancingLossEntersTheBackward) {
  const Fixture f = fixture("tiny-qwen3-moe");
  const at::Tensor& ids = f.ref.at("input_ids");
  const at::Tensor& mask = f.ref.at("attention_mask");
  const double s = 0.25;
  auto grads_of = [&](bool injected) {
    auto model = load(f.cfg, f.dir);
    model->set_router_aux_loss_scale(injected ? s : 0.0);
    const at::Tensor logits = model->forward(ids, f.ref.at("position_ids"), mask);
    at::Tensor loss = next_token_log_probs(logits, ids, model->parallel().tp()).mean();
    if (!injected) loss = loss + s * model->router_aux_loss(mask);
    loss.backward();
    TensorMap g;
    for (const auto& [name, p] : model->named_params()) g[name] = p.grad().clone();
    return g;
  };
  const TensorMap injected = grads_of(true), by_hand = grads_of(false);
  const int64_t seq = ids.size(1);
  for (const auto& [name, g] : by_hand) {
    ASSERT_TRUE(injected.at(name).defined()) << name;
    expect_close(injected.at(name), g,
                 Tolerance::fp32(test::gradient_terms(f.cfg, seq, 2 * seq), max_abs(g)), name);
  }
  EXPECT_GT(max_abs(by_hand.at("decoder.layers.1.mlp.router.weight")), 0);
  // Recompute drops the router's graph: the two cannot be combined.
  auto model = std::make_shared<Transformer>(f.cfg, ParallelState::single(),
                                             TransformerOptions().set_recompute_activations(true));
  expect_error([&] { model->set_router_aux_loss_scale(s); }, {"recompute"});
}

// Mistral's window: the fixture's 4096 is longer than any test row (computed
// exactly above); a window shorter than a sequence is refused where the
// sequence reaches the model, naming the key.
TEST(Mistral, ASequenceLongerThanTheSlidingWindowIsRefusedNamingIt) {
  Fixture f = fixture("tiny-mistral");
  ASSERT_EQ(f.cfg.sliding_window, 4096);
  f.cfg.sliding_window = 8;
  auto model = load(f.cfg, f.dir);
  expect_error([&] { logits_of(*model, f.ref); },
               {"Transformer::forward", "16 tokens", "\"sliding_window\" 8"});
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 6;
  greedy.ignore_eos = true;
  for (bool packed : {true, false}) {
    GenerationOptions options = GenerationOptions().set_cache_bytes(1 << 20);
    options.packed_cpu_steps = packed;
    GenerationEngine engine(model, options);
    // 4 + 4 tokens fit; 6 + 6 do not.
    EXPECT_EQ(engine
                  .generate({{5, 6, 7, 8}},
                            [&] {
                              SamplingParams p = greedy;
                              p.max_new_tokens = 4;
                              return p;
                            }())
                  .at(0)
                  .response.size(),
              4u);
    expect_error([&] { engine.generate({{5, 6, 7, 8, 9, 10}}, greedy); }, {"\"sliding_window\" 8"});
  }
}

}  // namespace
}  // namespace baton::engine
