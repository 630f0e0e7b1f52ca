// baton-generate, run as a program: its greedy output equals the in-process
// engine's, TP=2 (two local processes) gives the same sequences as TP=1
// (greedy and seeded sampling), and bad arguments exit non-zero naming what
// was wrong.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/rollout/generation.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/run_program.h"

namespace baton::engine {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

test::ProgramRun generate(const std::string& args) {
  return test::run_program(std::string("'") + BATON_GENERATE_EXE + "' " + args);
}

nlohmann::json generate_json(const std::string& args) {
  auto r = generate(args);
  EXPECT_EQ(r.status, 0) << r.out;
  auto last = r.out.substr(r.out.rfind('{', r.out.rfind("\"model\"")));
  return nlohmann::json::parse(last);
}

std::string model_arg(const std::string& fixture) {
  return "--model '" + kFixtures + "/" + fixture + "'";
}

// Log-probs of the same tokens at TP 1 and TP 2 differ by the TP split's
// summation order: the chain of a log-prob over the longest sequence, at the
// scale of the fixture's logits over those sequences.
test::Tolerance log_prob_tolerance(const std::string& fixture, const nlohmann::json& sequences) {
  auto dir = kFixtures + "/" + fixture;
  auto cfg = ModelConfig::load(dir);
  Transformer model(cfg, ParallelState::single());
  model.load_state_dict(
      hf_to_shard(read_hf_weights(dir), cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
  std::vector<std::vector<int64_t>> all;
  size_t longest = 0;
  for (const auto& s : sequences) {
    all.push_back(s["prompt"].get<std::vector<int64_t>>());
    auto response = s["response"].get<std::vector<int64_t>>();
    all.back().insert(all.back().end(), response.begin(), response.end());
    longest = std::max(longest, all.back().size());
  }
  return test::Tolerance::fp32(test::log_prob_terms(cfg, static_cast<int64_t>(longest)),
                               test::max_abs_logit(model, all));
}

TEST(BatonGenerate, GreedyMatchesTheInProcessEngine) {
  auto j = generate_json(model_arg("tiny-llama") +
                         " --prompt-tokens '5,17,33;9,4' --max-new-tokens 6 --temperature 0 "
                         "--ignore-eos");
  auto dir = kFixtures + "/tiny-llama";
  auto cfg = ModelConfig::load(dir);
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  model->load_state_dict(
      hf_to_shard(read_hf_weights(dir), cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
  GenerationEngine engine(model);
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 6;
  p.ignore_eos = true;
  auto expected = engine.generate({{5, 17, 33}, {9, 4}}, p);
  ASSERT_EQ(j["sequences"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& s = j["sequences"][i];
    EXPECT_EQ(s["request"].get<int64_t>(), static_cast<int64_t>(i));
    EXPECT_EQ(s["prompt"].get<std::vector<int64_t>>(), expected[i].prompt);
    EXPECT_EQ(s["response"].get<std::vector<int64_t>>(), expected[i].response);
    EXPECT_EQ(s["log_probs"].size(), 6u);
    EXPECT_EQ(s["finish_reason"], "length");
  }
}

TEST(BatonGenerate, TensorParallelEqualsSingleProcess) {
  for (const std::string& fixture : {std::string("tiny-llama"), std::string("tiny-qwen2")}) {
    for (const std::string& sampling :
         {std::string("--temperature 0"), std::string("--temperature 0.9 --top-k 40 --top-p 0.95 "
                                                      "--n 2 --seed 17")}) {
      SCOPED_TRACE(fixture + " " + sampling);
      std::string args = model_arg(fixture) + " --prompt-tokens '5,17,33;9,4;60' " +
                         "--max-new-tokens 8 --ignore-eos " + sampling;
      auto one = generate_json(args + " --tp 1");
      auto two = generate_json(args + " --tp 2");
      EXPECT_EQ(two["tp"], 2);
      ASSERT_EQ(one["sequences"].size(), two["sequences"].size());
      const auto tol = log_prob_tolerance(fixture, one["sequences"]);
      for (size_t i = 0; i < one["sequences"].size(); ++i) {
        EXPECT_EQ(one["sequences"][i]["response"], two["sequences"][i]["response"]) << i;
        test::expect_close(two["sequences"][i]["log_probs"].get<std::vector<double>>(),
                           one["sequences"][i]["log_probs"].get<std::vector<double>>(), tol,
                           "sequence " + std::to_string(i));
      }
    }
  }
}

// Every family and scaled RoPE, through the tool: HF's greedy generate.
TEST(BatonGenerate, GreedyEqualsHfGenerateForEachFamily) {
  for (const std::string fixture : {"tiny-qwen3", "tiny-qwen3-moe", "tiny-llama3-rope",
                                    "tiny-llama-yarn", "tiny-llama-dynamic", "tiny-mistral"}) {
    SCOPED_TRACE(fixture);
    const TensorMap ref = read_safetensors(kFixtures + "/" + fixture + "/reference.safetensors");
    const at::Tensor out = ref.at("gen_output")[0];
    const int64_t prompt_len = ref.at("gen_prompt").size(1);
    std::string prompt;
    for (int64_t i = 0; i < prompt_len; ++i)
      prompt += (i ? "," : "") + std::to_string(out[i].item<int64_t>());
    auto j =
        generate_json(model_arg(fixture) + " --prompt-tokens '" + prompt + "' --max-new-tokens " +
                      std::to_string(out.size(0) - prompt_len) + " --temperature 0 --ignore-eos");
    ASSERT_EQ(j["sequences"].size(), 1u);
    std::vector<int64_t> want;
    for (int64_t i = prompt_len; i < out.size(0); ++i) want.push_back(out[i].item<int64_t>());
    EXPECT_EQ(j["sequences"][0]["response"].get<std::vector<int64_t>>(), want);
  }
}

TEST(BatonGenerate, BadArgumentsExitNonZeroNamingTheProblem) {
  struct Bad {
    std::string args, needle;
  };
  std::string m = model_arg("tiny-llama");
  for (const auto& c : std::vector<Bad>{
           {m + " --prompt-tokens 1,2", "--max-new-tokens is required"},
           {m + " --prompt-tokens '1,x' --max-new-tokens 2", "bad prompt token: \"x\""},
           {m + " --prompt-tokens '1;' --max-new-tokens 2", "bad prompt token: \"\""},
           {m + " --prompt-tokens 1 --max-new-tokens 2 --tp 3", "does not divide"},
           {m + " --prompt-tokens 1 --max-new-tokens 2 --temperature -1", "temperature"},
           {m + " --prompt-tokens 1,500 --max-new-tokens 2", "500"},
           {m + " --prompt-tokens 1 --max-new-tokens 2 --bogus 1", "unknown option --bogus"},
           {"--model /nonexistent --prompt-tokens 1 --max-new-tokens 2", "/nonexistent"},
       }) {
    auto r = generate(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace baton::engine
