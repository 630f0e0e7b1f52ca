#include "engine/io/sharded_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "engine/io/weight_conversion.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

using testing::expect_error;

ModelConfig tiny() {
  return ModelConfig::from_hf_json({{"architectures", {"Qwen2ForCausalLM"}},
                                    {"model_type", "qwen2"},
                                    {"vocab_size", 8},
                                    {"hidden_size", 4},
                                    {"intermediate_size", 4},
                                    {"num_hidden_layers", 3},
                                    {"num_attention_heads", 2},
                                    {"num_key_value_heads", 2},
                                    {"tie_word_embeddings", true}},
                                   "tiny");
}

// Fake per-rank contents: the format does not look inside them.
std::vector<std::vector<TensorMap>> fake_shards(int64_t tp, int64_t pp) {
  std::vector<std::vector<TensorMap>> s(pp);
  for (int64_t p = 0; p < pp; ++p)
    for (int64_t k = 0; k < tp; ++k) s[p].push_back({{"w", at::full({2}, double(10 * p + k))}});
  return s;
}

TEST(ShardedModel, WritesLayoutConfigAndOneFilePerRank) {
  TempDir dir;
  auto cfg = tiny();
  nlohmann::json base = {{"bos_token_id", 1}, {"architectures", {"Qwen2ForCausalLM"}}};
  save_sharded(dir.path(), cfg, {2, 2, {2, 1}, true}, fake_shards(2, 2), &base);
  auto layout = nlohmann::json::parse(std::ifstream(dir / "layout.json"));
  EXPECT_EQ(layout, (nlohmann::json{{"format", "baton-sharded-v1"},
                                    {"tp", 2},
                                    {"pp", 2},
                                    {"layer_split", {2, 1}},
                                    {"value_model", true},
                                    {"make_vocab_size_divisible_by", 128},
                                    {"padded_vocab_size", 256}}));
  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(config["architectures"][0], "Qwen2ForTokenClassification");
  EXPECT_EQ(config["id2label"], (nlohmann::json{{"0", "LABEL_0"}}));
  EXPECT_EQ(config["bos_token_id"], 1);  // the source config's other keys survive
  EXPECT_TRUE(is_value_architecture(ModelConfig::load(dir.path()).architecture));
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t k = 0; k < 2; ++k)
      EXPECT_TRUE(at::equal(load_sharded_rank(dir.path(), k, p).at("w"),
                            at::full({2}, double(10 * p + k))));
  auto all = load_sharded_all(dir.path());
  ASSERT_EQ(all.size(), 2u);
  ASSERT_EQ(all[1].size(), 2u);
  EXPECT_TRUE(at::equal(all[1][0].at("w"), at::full({2}, 10.0)));
}

TEST(ShardedModel, EmptySplitMeansEvenAndStaleRankFilesGo) {
  TempDir dir;
  auto cfg = tiny();
  save_sharded(dir.path(), cfg, {2, 2, {}, false}, fake_shards(2, 2));
  EXPECT_EQ(load_sharded_layout(dir.path()).layer_split, (std::vector<int64_t>{2, 1}));
  save_sharded(dir.path(), cfg, {1, 1, {}, false}, fake_shards(1, 1));
  EXPECT_TRUE(fs::exists(dir / "model-tp0-pp0.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model-tp1-pp0.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model-tp0-pp1.safetensors"));
}

TEST(ShardedModel, RejectsLayoutsThatDoNotFit) {
  TempDir dir;
  auto cfg = tiny();
  expect_error(
      [&] {
        save_sharded(dir.path(), cfg, {1, 2, {2, 2}, false}, fake_shards(1, 2));
      },
      {"sums to 4"});
  expect_error(
      [&] {
        save_sharded(dir.path(), cfg, {3, 1, {}, false}, fake_shards(3, 1));
      },
      {"tensor parallel size 3", "num_key_value_heads 2"});
  expect_error(
      [&] {
        save_sharded(dir.path(), cfg, {1, 2, {}, false}, fake_shards(1, 1));
      },
      {"1 stages of shards for pp 2"});
}

TEST(ShardedModel, LoadNamesMissingAndCorruptFiles) {
  TempDir dir;
  auto cfg = tiny();
  expect_error([&] { load_sharded_layout(dir.path()); }, {"layout.json", "missing"});
  save_sharded(dir.path(), cfg, {2, 1, {}, false}, fake_shards(2, 1));
  expect_error([&] { load_sharded_rank(dir.path(), 2, 0); }, {"outside the layout"});
  fs::remove(dir / "model-tp1-pp0.safetensors");
  expect_error([&] { load_sharded_all(dir.path()); }, {"model-tp1-pp0.safetensors", "missing"});
  std::ofstream(dir / "model-tp1-pp0.safetensors") << "garbage!garbage!";
  expect_error([&] { load_sharded_rank(dir.path(), 1, 0); }, {"model-tp1-pp0.safetensors"});
  std::ofstream(dir / "layout.json") << R"({"format": "other", "tp": 2})";
  expect_error([&] { load_sharded_layout(dir.path()); }, {"layout.json", "format"});
  std::ofstream(dir / "layout.json")
      << R"({"format": "baton-sharded-v1", "tp": 2, "pp": 1, "layer_split": [2], "value_model": false})";
  expect_error([&] { load_sharded_layout(dir.path()); }, {"layout.json", "sums to 2"});
}

// Expert parallelism: one file per (tp, pp, EP rank), ep in layout.json; a
// reader asks for any ep that divides num_experts (the files' experts joined
// and split again), and load_sharded_all gives every expert.
TEST(ShardedModel, ExpertParallelFilesLoadUnderAnyEp) {
  TempDir dir;
  const std::string fixture = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen3-moe";
  const auto cfg = ModelConfig::load(fixture);
  const TensorMap hf = read_hf_weights(fixture);
  ShardedLayout layout{.tp = 2, .pp = 1, .ep = 2};
  const auto shards = shard_all(hf, cfg, layout);
  save_sharded(dir.path(), cfg, layout, shards);
  for (const char* f : {"model-tp0-pp0-ep0.safetensors", "model-tp1-pp0-ep1.safetensors"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  EXPECT_FALSE(fs::exists(dir / "model-tp0-pp0.safetensors"));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir / "layout.json"))["ep"], 2);
  EXPECT_EQ(load_sharded_layout(dir.path()).ep, 2);

  auto expect_same = [](const TensorMap& got, const TensorMap& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(got.at(name), t)) << what << name;
  };
  const auto all = load_sharded_all(dir.path());
  for (int64_t k = 0; k < 2; ++k) {
    expect_same(all[0][k], shards[0][k], "every expert");
    for (int64_t ep : {1, 2, 4})
      for (int64_t e = 0; e < ep; ++e) {
        auto spec = ShardSpec::for_rank(cfg, k, 2, 0, {cfg.num_layers});
        spec.ep_rank = e;
        spec.ep_size = ep;
        expect_same(load_sharded_rank(dir.path(), k, 0, e, ep), hf_to_shard(hf, cfg, spec),
                    detail::cat("tp ", k, " ep ", e, " of ", ep, ": "));
      }
  }
  expect_error([&] { load_sharded_rank(dir.path(), 0, 0, 0, 3); }, {"do not split over ep 3"});

  // Back to ep 1: the EP rank files go.
  save_sharded(dir.path(), cfg, {.tp = 2, .pp = 1}, shards);
  EXPECT_TRUE(fs::exists(dir / "model-tp0-pp0.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model-tp0-pp0-ep1.safetensors"));
  expect_error([&] { save_sharded(dir.path(), cfg, {.tp = 2, .pp = 1, .ep = 3}, shards); },
               {"expert parallel size 3", "num_experts = 4"});
}

}  // namespace
}  // namespace baton::engine
