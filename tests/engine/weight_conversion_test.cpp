#include "engine/io/weight_conversion.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "engine/io/sharded_model.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Grid = std::vector<std::vector<TensorMap>>;

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

void expect_same(const TensorMap& got, const TensorMap& want) {
  std::vector<std::string> got_names, want_names;
  for (const auto& e : got) got_names.push_back(e.first);
  for (const auto& e : want) want_names.push_back(e.first);
  ASSERT_EQ(got_names, want_names);
  for (const auto& [name, t] : want) {
    EXPECT_TRUE(bit_equal(got.at(name), t)) << name;
    EXPECT_TRUE(at::equal(got.at(name), t)) << name;
  }
}

using testing::expect_error;

// Tiny configs: V=256, H=16, F=24, nq=4, nkv=2, d=4 (q 16, kv 8), 4 layers. V
// is a multiple of make_vocab_size_divisible_by (128) × tp for tp 1 and 2, so
// these layouts hold no vocabulary padding (vocab_padding_test.cpp pads).
ModelConfig tiny_config(ModelFamily family, bool tied) {
  nlohmann::json j = {
      {"architectures", {family == ModelFamily::kLlama ? "LlamaForCausalLM" : "Qwen2ForCausalLM"}},
      {"model_type", family == ModelFamily::kLlama ? "llama" : "qwen2"},
      {"vocab_size", 256},
      {"hidden_size", 16},
      {"intermediate_size", 24},
      {"num_hidden_layers", 4},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"tie_word_embeddings", tied}};
  return ModelConfig::from_hf_json(j, "tiny");
}

// An HF state dict written out by hand (independently of the rule tables), as
// HF's Llama/Qwen2 models name their parameters.
TensorMap random_hf(const ModelConfig& c, bool with_lm_head, bool with_score = false) {
  at::manual_seed(11);
  const int64_t V = c.vocab_size, H = c.hidden_size, F = c.intermediate_size, Q = c.q_size(),
                KV = c.kv_size();
  TensorMap t;
  t["model.embed_tokens.weight"] = at::randn({V, H});
  t["model.norm.weight"] = at::randn({H});
  if (with_lm_head) t["lm_head.weight"] = at::randn({V, H});
  if (with_score) {
    t["score.weight"] = at::randn({1, H});
    t["score.bias"] = at::randn({1});
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = at::randn({H});
    t[p + "post_attention_layernorm.weight"] = at::randn({H});
    t[p + "self_attn.q_proj.weight"] = at::randn({Q, H});
    t[p + "self_attn.k_proj.weight"] = at::randn({KV, H});
    t[p + "self_attn.v_proj.weight"] = at::randn({KV, H});
    t[p + "self_attn.o_proj.weight"] = at::randn({H, Q});
    if (c.qkv_bias) {
      t[p + "self_attn.q_proj.bias"] = at::randn({Q});
      t[p + "self_attn.k_proj.bias"] = at::randn({KV});
      t[p + "self_attn.v_proj.bias"] = at::randn({KV});
    }
    t[p + "mlp.gate_proj.weight"] = at::randn({F, H});
    t[p + "mlp.up_proj.weight"] = at::randn({F, H});
    t[p + "mlp.down_proj.weight"] = at::randn({H, F});
  }
  return t;
}

Grid to_grid(const TensorMap& hf, const ModelConfig& cfg, int64_t tp,
             const std::vector<int64_t>& split, bool value_model = false) {
  Grid g(split.size());
  for (size_t p = 0; p < split.size(); ++p)
    for (int64_t k = 0; k < tp; ++k)
      g[p].push_back(hf_to_shard(
          hf, cfg, ShardSpec::for_rank(cfg, k, tp, static_cast<int64_t>(p), split, value_model)));
  return g;
}

struct Layout {
  int64_t tp;
  std::vector<int64_t> split;
};

const std::vector<Layout> kLayouts = {
    {1, {4}}, {2, {4}}, {1, {2, 2}}, {2, {3, 1}}, {2, {1, 1, 1, 1}}};

TEST(WeightConversion, LlamaUntiedRoundTripsBitExactlyThroughEveryLayout) {
  auto cfg = tiny_config(ModelFamily::kLlama, /*tied=*/false);
  auto hf = random_hf(cfg, /*with_lm_head=*/true);
  for (const auto& l : kLayouts) {
    SCOPED_TRACE(::testing::Message() << "tp " << l.tp << " stages " << l.split.size());
    expect_same(shards_to_hf(to_grid(hf, cfg, l.tp, l.split), cfg, l.split, false), hf);
  }
}

TEST(WeightConversion, Qwen2TiedWithBiasRoundTripsBitExactlyThroughEveryLayout) {
  auto cfg = tiny_config(ModelFamily::kQwen2, /*tied=*/true);
  ASSERT_TRUE(cfg.qkv_bias);
  auto hf = random_hf(cfg, /*with_lm_head=*/false);
  for (const auto& l : kLayouts) {
    SCOPED_TRACE(::testing::Message() << "tp " << l.tp << " stages " << l.split.size());
    expect_same(shards_to_hf(to_grid(hf, cfg, l.tp, l.split), cfg, l.split, false), hf);
  }
}

TEST(WeightConversion, ShardNamesAndShapesFollowTheLayoutContract) {
  auto cfg = tiny_config(ModelFamily::kQwen2, /*tied=*/false);
  auto hf = random_hf(cfg, true);
  auto g = to_grid(hf, cfg, 2, {3, 1});
  // Stage 0: the embedding and layers 0..2; stage 1: layer 3 and the head.
  const auto& first = g[0][1];
  EXPECT_EQ(first.at("embedding.word_embeddings.weight").sizes(), (at::IntArrayRef{128, 16}));
  EXPECT_EQ(first.at("decoder.layers.2.self_attention.linear_qkv.weight").sizes(),
            (at::IntArrayRef{16, 16}));  // (nq + 2 nkv) d / t = 32 / 2
  EXPECT_EQ(first.at("decoder.layers.2.self_attention.linear_qkv.bias").sizes(),
            (at::IntArrayRef{16}));
  EXPECT_EQ(first.at("decoder.layers.0.self_attention.linear_proj.weight").sizes(),
            (at::IntArrayRef{16, 8}));
  EXPECT_EQ(first.at("decoder.layers.0.mlp.linear_fc1.weight").sizes(),
            (at::IntArrayRef{24, 16}));  // 2F / t
  EXPECT_EQ(first.at("decoder.layers.0.mlp.linear_fc2.weight").sizes(), (at::IntArrayRef{16, 12}));
  EXPECT_EQ(first.at("decoder.layers.1.mlp.linear_fc1.layer_norm_weight").sizes(),
            (at::IntArrayRef{16}));
  EXPECT_FALSE(first.count("decoder.layers.3.mlp.linear_fc2.weight"));
  EXPECT_FALSE(first.count("decoder.final_layernorm.weight"));
  EXPECT_EQ(first.size(), 1 + 3 * 7u);
  const auto& last = g[1][0];
  EXPECT_EQ(last.size(), 7 + 2u);
  EXPECT_FALSE(last.count("embedding.word_embeddings.weight"));
  EXPECT_TRUE(last.count("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"));
  EXPECT_TRUE(at::equal(last.at("output_layer.weight"), hf.at("lm_head.weight").narrow(0, 0, 128)));
  EXPECT_TRUE(
      at::equal(g[1][1].at("output_layer.weight"), hf.at("lm_head.weight").narrow(0, 128, 128)));
  EXPECT_TRUE(at::equal(last.at("decoder.final_layernorm.weight"), hf.at("model.norm.weight")));
  // Vocab split of the embedding.
  EXPECT_TRUE(at::equal(first.at("embedding.word_embeddings.weight"),
                        hf.at("model.embed_tokens.weight").narrow(0, 128, 128)));
  // Row-parallel split of o_proj and down_proj (dim 1).
  EXPECT_TRUE(at::equal(first.at("decoder.layers.1.self_attention.linear_proj.weight"),
                        hf.at("model.layers.1.self_attn.o_proj.weight").narrow(1, 8, 8)));
  EXPECT_TRUE(at::equal(first.at("decoder.layers.1.mlp.linear_fc2.weight"),
                        hf.at("model.layers.1.mlp.down_proj.weight").narrow(1, 12, 12)));
}

TEST(WeightConversion, TiedEmbeddingsHaveNoHeadOnOneStageAndACopyOnTheLastStage) {
  auto cfg = tiny_config(ModelFamily::kQwen2, /*tied=*/true);
  auto hf = random_hf(cfg, false);
  auto one = hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 2, 0, {4}));
  EXPECT_FALSE(one.count("output_layer.weight"));
  auto g = to_grid(hf, cfg, 2, {2, 2});
  EXPECT_FALSE(g[0][0].count("output_layer.weight"));
  EXPECT_TRUE(at::equal(g[1][1].at("output_layer.weight"),
                        hf.at("model.embed_tokens.weight").narrow(0, 128, 128)));
  // Export takes the first stage's embedding, whatever the last stage's copy holds.
  g[1][1]["output_layer.weight"] = at::zeros({128, 16});
  expect_same(shards_to_hf(g, cfg, {2, 2}, false), hf);
  // A tied checkpoint that still carries lm_head.weight loads (HF ignores it too).
  auto with_head = hf;
  with_head["lm_head.weight"] = hf.at("model.embed_tokens.weight").clone();
  EXPECT_NO_THROW(hf_to_shard(with_head, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {4})));
}

TEST(WeightConversion, QkvLayoutGroupsQueriesWithTheirKvHead) {
  // nq = 4, nkv = 2 (two queries per kv head), d = 1, H = 1.
  ModelConfig cfg;
  cfg.family = ModelFamily::kQwen2;
  cfg.vocab_size = 2;
  cfg.hidden_size = 1;
  cfg.intermediate_size = 2;
  cfg.num_layers = 1;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 1;
  cfg.qkv_bias = true;
  cfg.tie_word_embeddings = true;
  TensorMap hf = {
      {"model.embed_tokens.weight", at::zeros({2, 1})},
      {"model.norm.weight", at::ones({1})},
      {"model.layers.0.input_layernorm.weight", at::ones({1})},
      {"model.layers.0.post_attention_layernorm.weight", at::ones({1})},
      {"model.layers.0.self_attn.q_proj.weight", at::tensor({0.f, 1.f, 2.f, 3.f}).view({4, 1})},
      {"model.layers.0.self_attn.k_proj.weight", at::tensor({10.f, 11.f}).view({2, 1})},
      {"model.layers.0.self_attn.v_proj.weight", at::tensor({20.f, 21.f}).view({2, 1})},
      {"model.layers.0.self_attn.q_proj.bias", at::tensor({100.f, 101.f, 102.f, 103.f})},
      {"model.layers.0.self_attn.k_proj.bias", at::tensor({110.f, 111.f})},
      {"model.layers.0.self_attn.v_proj.bias", at::tensor({120.f, 121.f})},
      {"model.layers.0.self_attn.o_proj.weight", at::zeros({1, 4})},
      {"model.layers.0.mlp.gate_proj.weight", at::tensor({0.f, 1.f}).view({2, 1})},
      {"model.layers.0.mlp.up_proj.weight", at::tensor({10.f, 11.f}).view({2, 1})},
      {"model.layers.0.mlp.down_proj.weight", at::zeros({1, 2})},
  };
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.";
  auto whole = hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {1}));
  EXPECT_TRUE(at::equal(whole.at(qkv + "weight").flatten(),
                        at::tensor({0.f, 1.f, 10.f, 20.f, 2.f, 3.f, 11.f, 21.f})));
  EXPECT_TRUE(at::equal(whole.at(qkv + "bias"),
                        at::tensor({100.f, 101.f, 110.f, 120.f, 102.f, 103.f, 111.f, 121.f})));
  auto r0 = hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 2, 0, {1}));
  auto r1 = hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 1, 2, 0, {1}));
  EXPECT_TRUE(at::equal(r0.at(qkv + "weight").flatten(), at::tensor({0.f, 1.f, 10.f, 20.f})));
  EXPECT_TRUE(at::equal(r1.at(qkv + "weight").flatten(), at::tensor({2.f, 3.f, 11.f, 21.f})));
  EXPECT_TRUE(at::equal(r1.at(qkv + "bias"), at::tensor({102.f, 103.f, 111.f, 121.f})));
  // gate/up: rank k holds [its gate rows; its up rows].
  const std::string fc1 = "decoder.layers.0.mlp.linear_fc1.weight";
  EXPECT_TRUE(at::equal(whole.at(fc1).flatten(), at::tensor({0.f, 1.f, 10.f, 11.f})));
  EXPECT_TRUE(at::equal(r0.at(fc1).flatten(), at::tensor({0.f, 10.f})));
  EXPECT_TRUE(at::equal(r1.at(fc1).flatten(), at::tensor({1.f, 11.f})));
  expect_same(shards_to_hf({{r0, r1}}, cfg, {1}, false), hf);
}

TEST(WeightConversion, MissingUnexpectedAndMisshapedTensorsAreNamed) {
  auto cfg = tiny_config(ModelFamily::kLlama, false);
  auto spec = ShardSpec::for_rank(cfg, 0, 2, 0, {4});
  auto hf = random_hf(cfg, true);
  hf.erase("model.layers.3.mlp.up_proj.weight");
  expect_error([&] { hf_to_shard(hf, cfg, spec); },
               {"missing tensors", "model.layers.3.mlp.up_proj.weight"});

  hf = random_hf(cfg, true);
  hf["model.layers.0.self_attn.q_norm.weight"] = at::ones({4});
  expect_error([&] { hf_to_shard(hf, cfg, spec); },
               {"unexpected tensors", "model.layers.0.self_attn.q_norm.weight"});

  hf = random_hf(cfg, true);
  hf["model.layers.1.self_attn.k_proj.weight"] = at::ones({16, 16});
  expect_error([&] { hf_to_shard(hf, cfg, spec); },
               {"model.layers.1.self_attn.k_proj.weight", "expected [8, 16]", "got [16, 16]"});

  // Rotary caches some old checkpoints carry are ignored.
  hf = random_hf(cfg, true);
  hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({2});
  EXPECT_NO_THROW(hf_to_shard(hf, cfg, spec));
}

TEST(WeightConversion, TensorParallelSizeMustDivideKvHeadsAndIntermediate) {
  auto cfg = tiny_config(ModelFamily::kLlama, false);
  auto hf = random_hf(cfg, true);
  expect_error([&] { hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 3, 0, {4})); },
               {"tensor parallel size 3", "num_key_value_heads 2"});
  expect_error([&] { hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 4, 0, {4})); },
               {"tensor parallel size 4", "num_key_value_heads 2"});
  cfg.intermediate_size = 25;
  expect_error([&] { validate_tensor_parallel(cfg, 2); }, {"intermediate_size 25"});
  // Any vocabulary: it is padded (vocab_padding.h).
  cfg.intermediate_size = 24;
  cfg.vocab_size = 97;
  EXPECT_NO_THROW(validate_tensor_parallel(cfg, 2));
}

TEST(WeightConversion, LayerSplits) {
  EXPECT_EQ(even_layer_split(4, 3), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(even_layer_split(4, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(even_layer_split(7, 1), (std::vector<int64_t>{7}));
  expect_error([] { even_layer_split(2, 3); }, {"2 layers", "3 pipeline stages"});
  expect_error([] { even_layer_split(2, 0); }, {"pipeline size"});
  expect_error([] { validate_layer_split({3, 2}, 4); }, {"[3, 2]", "sums to 5", "4 layers"});
  expect_error([] { validate_layer_split({4, 0}, 4); }, {"[4, 0]", "positive"});
  expect_error([] { validate_layer_split({}, 4); }, {"empty"});
  auto cfg = tiny_config(ModelFamily::kLlama, false);
  auto s = ShardSpec::for_rank(cfg, 1, 2, 1, {3, 1});
  EXPECT_EQ(s.layer_begin, 3);
  EXPECT_EQ(s.layer_end, 4);
  EXPECT_FALSE(s.first_stage);
  EXPECT_TRUE(s.last_stage);
  expect_error([&] { ShardSpec::for_rank(cfg, 2, 2, 0, {4}); }, {"tp rank 2"});
  expect_error([&] { ShardSpec::for_rank(cfg, 0, 2, 2, {2, 2}); }, {"pp rank 2"});
}

TEST(WeightConversion, ValueModelTakesScoreAndIgnoresTheLmHead) {
  auto cfg = tiny_config(ModelFamily::kQwen2, true);
  auto hf = random_hf(cfg, false, /*with_score=*/true);
  auto g = to_grid(hf, cfg, 2, {3, 1}, /*value_model=*/true);
  for (const auto& shard : g[1]) {
    EXPECT_TRUE(at::equal(shard.at("value_head.weight"), hf.at("score.weight")));
    EXPECT_TRUE(at::equal(shard.at("value_head.bias"), hf.at("score.bias")));
    EXPECT_FALSE(shard.count("output_layer.weight"));
  }
  EXPECT_FALSE(g[0][0].count("value_head.weight"));
  expect_same(shards_to_hf(g, cfg, {3, 1}, true), hf);

  // An LM checkpoint (untied, with lm_head) as a critic: no head, lm_head ignored.
  auto lm_cfg = tiny_config(ModelFamily::kLlama, false);
  auto lm = random_hf(lm_cfg, true);
  auto shard = hf_to_shard(lm, lm_cfg, ShardSpec::for_rank(lm_cfg, 0, 1, 0, {4}, true));
  EXPECT_FALSE(shard.count("value_head.weight"));
  EXPECT_FALSE(shard.count("output_layer.weight"));
  // The trainer initialises the head; export then adds HF's zero bias.
  shard["value_head.weight"] = at::full({1, 16}, 0.5);
  auto back = shards_to_hf({{shard}}, lm_cfg, {4}, true);
  EXPECT_TRUE(at::equal(back.at("score.weight"), at::full({1, 16}, 0.5)));
  EXPECT_TRUE(at::equal(back.at("score.bias"), at::zeros({1})));
  EXPECT_FALSE(back.count("lm_head.weight"));
  // score.* in a causal LM's checkpoint is unexpected.
  expect_error([&] { hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {4})); },
               {"unexpected tensors", "score.weight"});
}

TEST(WeightConversion, ShardsToHfNamesBadShards) {
  auto cfg = tiny_config(ModelFamily::kLlama, false);
  auto hf = random_hf(cfg, true);
  auto g = to_grid(hf, cfg, 2, {2, 2});
  auto bad = g;
  bad[1][1].erase("decoder.layers.3.mlp.linear_fc2.weight");
  expect_error(
      [&] {
        shards_to_hf(bad, cfg, {2, 2}, false);
      },
      {"tp rank 1, pp stage 1", "missing", "decoder.layers.3.mlp.linear_fc2.weight"});
  bad = g;
  bad[0][0]["decoder.layers.3.mlp.linear_fc2.weight"] = at::zeros({16, 12});  // wrong stage
  expect_error(
      [&] {
        shards_to_hf(bad, cfg, {2, 2}, false);
      },
      {"tp rank 0, pp stage 0", "unexpected", "decoder.layers.3.mlp.linear_fc2.weight"});
  bad = g;
  bad[0][1]["embedding.word_embeddings.weight"] = at::zeros({256, 16});
  expect_error(
      [&] {
        shards_to_hf(bad, cfg, {2, 2}, false);
      },
      {"embedding.word_embeddings.weight", "expected [128, 16]", "got [256, 16]"});
  expect_error([&] { shards_to_hf(g, cfg, {3, 1}, false); }, {"tp rank"});
  expect_error([&] { shards_to_hf(g, cfg, {4}, false); }, {"2 pipeline stages"});
}

TEST(WeightConversion, FindRuleMatchesEngineNamesWithTheirLayer) {
  int64_t layer = -5;
  auto* r = find_rule(ModelFamily::kQwen2, "decoder.layers.17.mlp.linear_fc1.weight", &layer);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->transform, Transform::kGateUp);
  EXPECT_EQ(layer, 17);
  r = find_rule(ModelFamily::kLlama, "embedding.word_embeddings.weight", &layer);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->transform, Transform::kSplitRows);
  EXPECT_EQ(layer, -1);
  EXPECT_EQ(find_rule(ModelFamily::kLlama, "decoder.layers.x.mlp.linear_fc1.weight"), nullptr);
  EXPECT_EQ(find_rule(ModelFamily::kQwen2, "decoder.layers.0.self_attention.linear_proj.bias"),
            nullptr);  // Qwen2's o_proj has no bias
  EXPECT_NE(find_rule(ModelFamily::kLlama, "decoder.layers.0.self_attention.linear_proj.bias"),
            nullptr);
}

TEST(WeightConversion, LlamaBiasesRoundTrip) {
  auto cfg = tiny_config(ModelFamily::kLlama, false);
  cfg.qkv_bias = true;
  cfg.mlp_bias = true;
  auto hf = random_hf(cfg, true);
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    hf[p + "self_attn.o_proj.bias"] = at::randn({16});
    hf[p + "mlp.gate_proj.bias"] = at::randn({24});
    hf[p + "mlp.up_proj.bias"] = at::randn({24});
    hf[p + "mlp.down_proj.bias"] = at::randn({16});
  }
  auto g = to_grid(hf, cfg, 2, {3, 1});
  EXPECT_EQ(g[0][0].at("decoder.layers.0.mlp.linear_fc1.bias").sizes(), (at::IntArrayRef{24}));
  expect_same(shards_to_hf(g, cfg, {3, 1}, false), hf);
}

// The HF fixtures (tests/engine/fixtures, written by HF transformers) through
// TP=2 × PP=2 on disk and back, bit-exactly.
class FixtureRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureRoundTrip, ThroughTp2Pp2OnDiskIsBitExact) {
  const fs::path src = fs::path(BATON_FIXTURES_DIR) / GetParam();
  if (!fs::exists(src / "config.json")) GTEST_SKIP() << "no fixture " << src;
  auto m = load_hf_model(src);
  for (const auto& split : {std::vector<int64_t>{2, 2}, std::vector<int64_t>{3, 1}}) {
    TempDir sharded, out;
    ShardedLayout layout{2, 2, split, m.value_model};
    save_sharded(sharded.path(), m.config, layout, shard_all(m.weights, m.config, layout));
    auto loaded = load_sharded_layout(sharded.path());
    EXPECT_EQ(loaded.layer_split, split);
    EXPECT_EQ(loaded.value_model, m.value_model);
    auto hf = shards_to_hf(load_sharded_all(sharded.path()), ModelConfig::load(sharded.path()),
                           loaded.layer_split, loaded.value_model);
    save_hf_model(out.path(), m.config, hf, loaded.value_model, /*max_shard_bytes=*/200 << 10);
    auto back = load_hf_model(out.path());
    EXPECT_EQ(back.value_model, m.value_model);
    EXPECT_EQ(back.config.to_hf_json(), m.config.to_hf_json());
    expect_same(back.weights, m.weights);
  }
}

INSTANTIATE_TEST_SUITE_P(HfFixtures, FixtureRoundTrip,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen2-value"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// whole_model_tensors lists exactly what one TP1 stage holds, with its shapes.
TEST(WeightConversion, WholeModelTensorsAreTheOneStageModel) {
  for (bool tied : {false, true}) {
    for (auto family : {ModelFamily::kLlama, ModelFamily::kQwen2}) {
      auto cfg = tiny_config(family, tied);
      SCOPED_TRACE(cfg.architecture + (tied ? " tied" : " untied"));
      auto one_stage = hf_to_shard(random_hf(cfg, !tied), cfg,
                                   ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}));
      auto listed = whole_model_tensors(cfg, /*value_model=*/false);
      ASSERT_EQ(listed.size(), one_stage.size());
      for (const auto& t : listed) {
        ASSERT_TRUE(one_stage.count(t.engine_name)) << t.engine_name;
        EXPECT_EQ(one_stage.at(t.engine_name).sizes(), at::IntArrayRef(t.shape)) << t.engine_name;
        EXPECT_EQ(find_rule(cfg.family, t.engine_name), t.rule) << t.engine_name;
      }
      EXPECT_EQ(listed.front().engine_name, "embedding.word_embeddings.weight");
    }
  }
  auto cfg = tiny_config(ModelFamily::kQwen2, false);
  auto critic = whole_model_tensors(cfg, /*value_model=*/true);
  EXPECT_EQ(critic[critic.size() - 2].engine_name, "value_head.weight");
  EXPECT_EQ(critic.back().engine_name, "value_head.bias");
  EXPECT_EQ(critic.back().shape, std::vector<int64_t>{1});
}

}  // namespace
}  // namespace baton::engine
