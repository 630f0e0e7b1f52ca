#include "engine/model_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/errors.h"

namespace baton::engine {
namespace {

nlohmann::json qwen2_json() {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"model_type", "qwen2"},
          {"vocab_size", 128},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"rope_theta", 1000000.0},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", true}};
}

TEST(ModelConfig, ParsesQwen2AndDerivesHeadDimAndBias) {
  auto c = ModelConfig::from_hf_json(qwen2_json(), "test");
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.q_size(), 64);
  EXPECT_EQ(c.kv_size(), 32);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
}

TEST(ModelConfig, LlamaDefaultsKvHeadsToHeadsAndNoBias) {
  auto j = qwen2_json();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j.erase("num_key_value_heads");
  auto c = ModelConfig::from_hf_json(j, "test");
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ModelConfig, RejectsUnsupportedArchitectureNamingIt) {
  auto j = qwen2_json();
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  try {
    ModelConfig::from_hf_json(j, "cfg.json");
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("GPT2LMHeadModel"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, RejectsMissingSizeAndIndivisibleHeads) {
  auto j = qwen2_json();
  j.erase("hidden_size");
  EXPECT_THROW(ModelConfig::from_hf_json(j, "t"), EngineError);
  j = qwen2_json();
  j["num_key_value_heads"] = 3;
  try {
    ModelConfig::from_hf_json(j, "t");
    FAIL();
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads 3"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, SaveThenLoadRoundTrips) {
  auto c = ModelConfig::from_hf_json(qwen2_json(), "test");
  auto dir = std::filesystem::temp_directory_path() / ("baton_cfg_" + std::to_string(::getpid()));
  c.save(dir);
  auto d = ModelConfig::load(dir);
  EXPECT_EQ(d.to_hf_json(), c.to_hf_json());
  std::filesystem::remove_all(dir);
}

TEST(ModelConfig, MalformedFileNamesThePath) {
  auto file = std::filesystem::temp_directory_path() /
              ("baton_bad_" + std::to_string(::getpid()) + ".json");
  { std::ofstream(file) << "{ not json"; }
  try {
    ModelConfig::load(file);
    FAIL();
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace baton::engine
