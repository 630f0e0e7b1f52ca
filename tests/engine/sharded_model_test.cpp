#include "engine/io/sharded_model.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/checksum_manifest.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "engine/io/weight_conversion.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"
#include "tests/file_faults.h"

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
  // Hand-written layouts below: a directory without checksums.
  remove_checksum_manifest(dir.path());
  std::ofstream(dir / "layout.json") << R"({"format": "other", "tp": 2})";
  expect_error([&] { load_sharded_layout(dir.path()); }, {"layout.json", "format"});
  std::ofstream(dir / "layout.json")
      << R"({"format": "baton-sharded-v1", "tp": 2, "pp": 1, "layer_split": [2], "value_model": false})";
  expect_error([&] { load_sharded_layout(dir.path()); }, {"layout.json", "sums to 2"});
}

// An HF export (save_hf_model: config.json, the index, the shards, and their
// checksum manifest): a flipped byte in any of its files, in a safetensors
// header or in a tensor's bytes past the first block, is refused on load
// naming the file and the byte range.
TEST(HfExport, AFlippedByteAnywhereIsRefusedNamingTheFileAndTheByteRange) {
  TempDir dir;
  const fs::path fixture = fs::path(BATON_FIXTURES_DIR) / "tiny-llama";
  HfModel m = load_hf_model(fixture);
  m.weights.emplace("zz.extra", at::arange(700000, at::kFloat));  // 2.8 MB: three blocks
  save_hf_model(dir.path(), m.config, m.weights, false, /*max_shard_bytes=*/1 << 20);
  const std::optional<ChecksumManifest> manifest = ChecksumManifest::read(dir.path());
  ASSERT_TRUE(manifest.has_value());
  std::vector<std::string> shards;
  for (const auto& [name, sum] : manifest->files())
    if (name.find("-of-") != std::string::npos) shards.push_back(name);
  ASSERT_GE(shards.size(), 2u);
  EXPECT_NE(manifest->find("config.json"), nullptr);
  EXPECT_NE(manifest->find("model.safetensors.index.json"), nullptr);
  const std::string big = shards.back();  // the extra tensor, in a shard of its own
  const uint64_t big_size = fs::file_size(dir / big);
  ASSERT_GT(big_size, 2 * kChecksumBlockBytes);

  struct Damage {
    std::string file;
    uint64_t offset;
  };
  for (const Damage& d :
       std::vector<Damage>{{"config.json", 10},
                           {"model.safetensors.index.json", 30},
                           {shards.front(), 4},   // the header length
                           {shards.front(), 60},  // the JSON header
                           {shards.front(), fs::file_size(dir / shards.front()) - 1},
                           {big, kChecksumBlockBytes + 4321},
                           {big, big_size - 2}}) {
    SCOPED_TRACE(d.file + " at " + std::to_string(d.offset));
    const fs::path file = dir / d.file;
    baton::testing::flip_byte(file, d.offset);
    expect_error([&] { load_hf_model(dir.path()); },
                 {file.string(),
                  baton::testing::block_range(d.offset, fs::file_size(file), kChecksumBlockBytes),
                  "do not match", (dir / kChecksumManifestFile).string()});
    baton::testing::flip_byte(file, d.offset);
  }
  const HfModel back = load_hf_model(dir.path());
  ASSERT_EQ(back.weights.size(), m.weights.size());
  for (const auto& [name, t] : m.weights) EXPECT_TRUE(at::equal(back.weights.at(name), t)) << name;
  // A fresh export replaces the manifest along with the files.
  save_hf_model(dir.path(), m.config, m.weights, false);
  EXPECT_NE(ChecksumManifest::read(dir.path())->find("model.safetensors"), nullptr);
  EXPECT_EQ(ChecksumManifest::read(dir.path())->find(shards.front()), nullptr);
  EXPECT_EQ(load_hf_model(dir.path()).weights.size(), m.weights.size());
}

// A sharded model directory (save_sharded) is checked the same way.
TEST(ShardedModel, AFlippedByteIsRefusedNamingTheFileAndTheByteRange) {
  TempDir dir;
  save_sharded(dir.path(), tiny(), {2, 1, {}, false}, fake_shards(2, 1));
  const fs::path file = dir / "model-tp1-pp0.safetensors";
  baton::testing::flip_byte(file, fs::file_size(file) - 3);
  expect_error([&] { load_sharded_rank(dir.path(), 1, 0); },
               {file.string(), "bytes [0, " + std::to_string(fs::file_size(file)) + ")"});
  load_sharded_rank(dir.path(), 0, 0);  // the other rank's file is intact
  baton::testing::flip_byte(file, fs::file_size(file) - 3);
  baton::testing::flip_byte(dir / "layout.json", 7);
  expect_error([&] { load_sharded_layout(dir.path()); }, {(dir / "layout.json").string()});
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
