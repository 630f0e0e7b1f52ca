#include "engine/io/model_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "tests/engine/expect_error.h"

namespace baton::engine {
namespace {

using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

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

// A size field that holds a float is refused naming it, not converted (a
// float past int64 was undefined behaviour: found by fuzz_checkpoint_meta).
TEST(ModelConfig, SizesThatAreNotIntegersAreRefusedNamingTheKey) {
  for (const nlohmann::json& bad : {nlohmann::json(9.2e20), nlohmann::json(2048.0),
                                    nlohmann::json("2048"), nlohmann::json(0)}) {
    auto j = qwen2_json();
    j["max_position_embeddings"] = bad;
    try {
      ModelConfig::from_hf_json(j, "t/config.json");
      ADD_FAILURE() << "accepted max_position_embeddings " << bad.dump();
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("t/config.json: \"max_position_embeddings\""),
                std::string::npos)
          << e.what();
    }
  }
  auto j = qwen2_json();
  j["max_position_embeddings"] = 4096;
  EXPECT_EQ(ModelConfig::from_hf_json(j, "t").max_position_embeddings, 4096);
  j["max_position_embeddings"] = nullptr;
  EXPECT_EQ(ModelConfig::from_hf_json(j, "t").max_position_embeddings, 2048);
}

TEST(ModelConfig, SaveThenLoadRoundTrips) {
  auto c = ModelConfig::from_hf_json(qwen2_json(), "test");
  auto dir = std::filesystem::temp_directory_path() / ("baton_cfg_" + std::to_string(::getpid()));
  c.save(dir);
  auto d = ModelConfig::load(dir);
  EXPECT_EQ(d.to_hf_json(), c.to_hf_json());
  baton::remove_tree(dir);
}

// generation_config.json's eos_token_id (a list in instruct checkpoints) is
// the stop set, as in HF generate; config.json's stays what it was.
TEST(ModelConfig, GenerationConfigEosIdsReplaceConfigsAsTheStopSet) {
  auto dir = std::filesystem::temp_directory_path() / ("baton_gen_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto json = qwen2_json();
  json["eos_token_id"] = 7;
  { std::ofstream(dir / "config.json") << json.dump(); }
  auto c = ModelConfig::load(dir);
  EXPECT_EQ(c.stop_token_ids(), std::vector<int64_t>{7});
  EXPECT_TRUE(c.generation_eos_token_ids.empty());

  { std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 9], "top_p": 0.8})"; }
  c = ModelConfig::load(dir);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{7});
  EXPECT_EQ(c.stop_token_ids(), (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(c.to_hf_json()["eos_token_id"], 7);  // config.json is not rewritten with the list

  { std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 3})"; }
  EXPECT_EQ(ModelConfig::load(dir).stop_token_ids(), std::vector<int64_t>{3});

  { std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [7, 128]})"; }
  expect_error([&] { ModelConfig::load(dir); },
               {(dir / "generation_config.json").string(), "eos_token_id 128", "vocab_size 128"});
  { std::ofstream(dir / "generation_config.json") << "{ not json"; }
  expect_error([&] { ModelConfig::load(dir); },
               {(dir / "generation_config.json").string(), "malformed JSON"});
  baton::remove_tree(dir);
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

// --- Configs as transformers 4 and 5 write them -------------------------
// transformers 5 writes "rope_parameters": {"rope_type", "rope_theta"} and
// "dtype" where 4.x wrote "rope_theta" and "torch_dtype" at the top level.

nlohmann::json llama_json() {
  auto j = qwen2_json();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  return j;
}

// Transformers 5's form of a Llama 3 style config (no top-level rope_theta).
nlohmann::json llama_tf5_json() {
  auto j = llama_json();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  j["dtype"] = "bfloat16";
  return j;
}

TEST(ModelConfig, ReadsRopeThetaAndDtypeFromTransformers5Form) {
  auto c = ModelConfig::from_hf_json(llama_tf5_json(), "test");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, AcceptsBothFormsWhenTheyAgree) {
  auto j = llama_tf5_json();
  j["rope_theta"] = 500000;  // an integer in one place, a float in the other
  j["torch_dtype"] = "bfloat16";
  auto c = ModelConfig::from_hf_json(j, "test");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, DefaultsToThetaTenThousandAndFloat32WhenNeitherFormIsThere) {
  auto j = llama_json();
  j.erase("rope_theta");
  auto c = ModelConfig::from_hf_json(j, "test");
  EXPECT_EQ(c.rope_theta, 10000.0);  // HF's default in both versions
  EXPECT_EQ(c.torch_dtype, "float32");
}

TEST(ModelConfig, RejectsRopeThetaThatDisagreesWithRopeParameters) {
  auto j = llama_tf5_json();
  j["rope_theta"] = 10000.0;
  expect_error([&] { ModelConfig::from_hf_json(j, "dir/config.json"); },
               {"dir/config.json", "\"rope_theta\" is 10000.0",
                "\"rope_parameters.rope_theta\" is 500000.0"});
  // The same through a 4.x "rope_scaling" that carries a theta of its own.
  j = llama_json();  // rope_theta 1e6
  j["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_theta\" is 1000000.0", "\"rope_scaling.rope_theta\" is 10000.0"});
}

TEST(ModelConfig, RejectsTorchDtypeThatDisagreesWithDtype) {
  auto j = llama_tf5_json();
  j["torch_dtype"] = "float32";
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"torch_dtype\" is \"float32\"", "\"dtype\" is \"bfloat16\""});
}

TEST(ModelConfig, ReadsEveryScaledRopeTypeWithItsParameters) {
  auto j = llama_tf5_json();
  j["max_position_embeddings"] = 4096;
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  RopeScaling r = ModelConfig::from_hf_json(j, "cfg").rope_scaling;
  EXPECT_EQ(r.type, RopeType::kLlama3);
  EXPECT_EQ(r.factor, 8.0);
  EXPECT_EQ(r.high_freq_factor, 4.0);
  EXPECT_EQ(r.original_max_position_embeddings, 8192);

  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 1e6},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 1024}};
  r = ModelConfig::from_hf_json(j, "cfg").rope_scaling;
  EXPECT_EQ(r.type, RopeType::kYarn);
  EXPECT_EQ(r.beta_fast, 32.0);  // HF's defaults
  EXPECT_EQ(r.beta_slow, 1.0);
  EXPECT_TRUE(r.truncate);
  EXPECT_FALSE(r.attention_factor.has_value());
  // Without a factor, YaRN's is max_position_embeddings / the original.
  j["rope_parameters"].erase("factor");
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").rope_scaling.factor, 4.0);
  // Without an original context: max_position_embeddings (HF's default).
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").rope_scaling.original_max_position_embeddings,
            4096);

  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  r = ModelConfig::from_hf_json(j, "cfg").rope_scaling;
  EXPECT_EQ(r.type, RopeType::kLinear);
  EXPECT_EQ(r.factor, 2.0);
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").rope_scaling.type, RopeType::kDynamic);
}

TEST(ModelConfig, RefusesARopeTypeOrParameterItDoesNotImplementNamingIt) {
  auto j = llama_tf5_json();
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 8.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.rope_type\" is \"longrope\"",
                "supported RoPE types: default, linear, dynamic, yarn, llama3"});
  // A parameter its type does not take.
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.low_freq_factor\" is 1.0",
                "not understood with rope_type \"linear\""});
  // A parameter its type needs.
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "rope_type \"llama3\" needs \"high_freq_factor\""});
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.factor\" is -2.0", "not positive"});
}

TEST(ModelConfig, ReadsRopeScalingOfTransformers4) {
  auto j = llama_json();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  ModelConfig c = ModelConfig::from_hf_json(j, "cfg");
  EXPECT_EQ(c.rope_scaling.type, RopeType::kLlama3);
  EXPECT_EQ(c.rope_theta, 1e6);  // the top-level one
  // The pre-4.45 spelling "type".
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").rope_scaling.type, RopeType::kLinear);
  // A "default" type with a scaling parameter it would not use: not understood.
  j["rope_scaling"] = {{"rope_type", "default"}, {"factor", 2.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_scaling.factor\" is 2.0"});
  // Not an object at all.
  j["rope_scaling"] = "linear";
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_scaling\" is \"linear\""});
  // Both places, disagreeing: two different models to transformers 4 and 5.
  j = llama_tf5_json();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.factor\" is 2.0", "\"rope_scaling.factor\" is 4.0"});
}

TEST(ModelConfig, WritesAScaledRopeThatReadsBackTheSame) {
  auto j = llama_tf5_json();
  j["rope_parameters"] = {{"rope_type", "yarn"},     {"rope_theta", 1e6},
                          {"factor", 4.0},           {"original_max_position_embeddings", 64},
                          {"attention_factor", 1.5}, {"beta_fast", 16.0}};
  const ModelConfig c = ModelConfig::from_hf_json(j, "cfg");
  const nlohmann::json out = c.to_hf_json();
  EXPECT_EQ(out.at("rope_parameters").at("rope_type"), "yarn");
  EXPECT_EQ(out.at("rope_scaling"), out.at("rope_parameters"));  // for transformers 4
  const ModelConfig back = ModelConfig::from_hf_json(out, "saved");
  EXPECT_TRUE(back.rope_scaling == c.rope_scaling);
  EXPECT_EQ(back.rope_theta, 1e6);
}

TEST(ModelConfig, ReadsQwen3WithItsHeadNormsAndHeadDim) {
  auto j = qwen2_json();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["head_dim"] = 32;  // not hidden / heads
  ModelConfig c = ModelConfig::from_hf_json(j, "cfg");
  EXPECT_EQ(c.family, ModelFamily::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);  // attention_bias defaults to false
  EXPECT_EQ(c.q_size(), 128);
  // Qwen3Config's head_dim default is 128, not hidden / heads.
  j.erase("head_dim");
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").head_dim, 128);
  const nlohmann::json out = c.to_hf_json();
  EXPECT_EQ(out.at("model_type"), "qwen3");
  EXPECT_EQ(out.at("head_dim"), 32);
  // A window in use is refused as for Qwen2.
  j["use_sliding_window"] = true;
  j["sliding_window"] = 64;
  j["max_window_layers"] = 1;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"use_sliding_window\" is true"});
}

TEST(ModelConfig, ReadsMistralsSlidingWindowAsHfDefaultsIt) {
  auto j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["attention_bias"] = true;  // not a Mistral key: no biases
  ModelConfig c = ModelConfig::from_hf_json(j, "cfg");
  EXPECT_EQ(c.family, ModelFamily::kMistral);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 4096);  // MistralConfig's default when absent
  j["sliding_window"] = nullptr;
  EXPECT_FALSE(ModelConfig::from_hf_json(j, "cfg").sliding_window.has_value());
  j["sliding_window"] = 32;
  c = ModelConfig::from_hf_json(j, "cfg");
  EXPECT_EQ(c.sliding_window, 32);
  EXPECT_EQ(c.to_hf_json().at("sliding_window"), 32);
  EXPECT_EQ(c.to_hf_json().at("model_type"), "mistral");
}

TEST(ModelConfig, AcceptsRopeScalingThatSaysDefault) {
  // Both versions compute the plain RoPE for it (5.x reads it as rope_parameters).
  auto j = llama_json();
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg").rope_theta, 1e6);
}

TEST(ModelConfig, RejectsPartialRotaryFactorBelowOne) {
  auto j = llama_tf5_json();
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.partial_rotary_factor\" is 0.5"});
  j = llama_json();
  j["partial_rotary_factor"] = 0.25;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"partial_rotary_factor\" is 0.25"});
  j["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
}

TEST(ModelConfig, RejectsRopeValuesOfTheWrongTypeAsEngineErrors) {
  auto j = llama_json();
  j["rope_theta"] = "1e6";
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); }, {"cfg", "\"rope_theta\" is \"1e6\""});
  j = llama_tf5_json();
  j["rope_parameters"]["rope_theta"] = -1.0;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"rope_parameters.rope_theta\" is -1.0", "not positive"});
  j = llama_tf5_json();
  j["dtype"] = 16;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); }, {"cfg", "\"dtype\" is 16"});
}

TEST(ModelConfig, RejectsQwen2SlidingWindowInUse) {
  // transformers 4: layers >= max_window_layers use the window.
  auto j = qwen2_json();  // 4 layers
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 2;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"use_sliding_window\" is true", "\"sliding_window\" is 4096",
                "\"max_window_layers\" is 2"});
  // max_window_layers absent: HF's default 28 covers these 4 layers, no window.
  j.erase("max_window_layers");
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
  // transformers 5 names each layer's kind.
  j = qwen2_json();
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "sliding_attention"};
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"layer_types[3]\" is \"sliding_attention\""});
}

TEST(ModelConfig, AcceptsQwen2SlidingWindowThatIsSetButOff) {
  // As Qwen2.5 ships (and transformers 5 writes it: window null, all layers full).
  auto j = qwen2_json();
  j["use_sliding_window"] = false;
  j["sliding_window"] = 131072;
  j["max_window_layers"] = 0;
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
  j["sliding_window"] = nullptr;
  j["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
}

TEST(ModelConfig, IgnoresSlidingWindowKeysOnLlamaAsHfDoes) {
  auto j = llama_json();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 16;
  j["max_window_layers"] = 0;
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
}

TEST(ModelConfig, RejectsAttentionDropout) {
  auto j = qwen2_json();
  j["attention_dropout"] = 0.1;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg"); },
               {"cfg", "\"attention_dropout\" is 0.1"});
  j["attention_dropout"] = 0;
  EXPECT_NO_THROW(ModelConfig::from_hf_json(j, "cfg"));
}

// The fixtures' configs, written by HF itself: tiny-llama and tiny-qwen2 by
// transformers 4.49 (make_fixtures.py), tiny-llama-tf5 and tf5-configs/ by
// transformers 5.23 (make_tf5_fixtures.py).
TEST(ModelConfig, LoadsConfigsSavedByTransformers4And5) {
  auto llama4 = ModelConfig::load(kFixtures + "/tiny-llama");
  EXPECT_EQ(llama4.rope_theta, 10000.0);
  auto qwen4 = ModelConfig::load(kFixtures + "/tiny-qwen2");  // window 4096 set, off
  EXPECT_EQ(qwen4.rope_theta, 1e6);
  EXPECT_EQ(qwen4.torch_dtype, "float32");

  auto llama5 = ModelConfig::load(kFixtures + "/tiny-llama-tf5");
  EXPECT_EQ(llama5.rope_theta, 500000.0);
  EXPECT_EQ(llama5.torch_dtype, "float32");
  auto qwen5 = ModelConfig::load(kFixtures + "/tf5-configs/qwen2.json");
  EXPECT_EQ(qwen5.rope_theta, 1e6);
  EXPECT_EQ(qwen5.torch_dtype, "bfloat16");
  EXPECT_TRUE(qwen5.tie_word_embeddings);
}

TEST(ModelConfig, RefusesTransformers5ConfigsItCannotComputeNamingFileKeyAndValue) {
  const std::string dir = kFixtures + "/tf5-configs/";
  // Scaled RoPEs as transformers 5.23 writes them: read.
  EXPECT_EQ(ModelConfig::load(dir + "llama-rope-llama3.json").rope_scaling.type, RopeType::kLlama3);
  EXPECT_EQ(ModelConfig::load(dir + "llama-rope-yarn.json").rope_scaling.type, RopeType::kYarn);
  expect_error([&] { ModelConfig::load(dir + "qwen2-sliding.json"); },
               {dir + "qwen2-sliding.json", "\"sliding_window\" is 8"});
}

TEST(ModelConfig, WritesThetaAndDtypeInTheSpellingsOfBothVersions) {
  auto c = ModelConfig::load(kFixtures + "/tiny-llama-tf5");
  auto j = c.to_hf_json();
  EXPECT_EQ(j.at("rope_theta"), 500000.0);
  EXPECT_EQ(j.at("rope_parameters"),
            (nlohmann::json{{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  EXPECT_EQ(j.at("torch_dtype"), "float32");
  EXPECT_EQ(j.at("dtype"), "float32");
  EXPECT_EQ(ModelConfig::from_hf_json(j, "saved").rope_theta, 500000.0);
}

}  // namespace
}  // namespace baton::engine
