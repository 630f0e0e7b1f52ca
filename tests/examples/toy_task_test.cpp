// examples/toy_task, run as a program: its dataset, tokenizer and model load with
// baton's own readers, every dataset string round-trips through the tokenizer,
// the SFT answers score 1 under the registry's GSM8K reward (but for the carries the
// noise drops, and only those), and a seed fixes every byte. The tool task
// (--op mul --tool-share): chat prompts, and SFT trajectories that are
// exactly what a multi-turn rollout with the calculator makes of them.
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/prompt_dataset.h"
#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"
#include "tests/engine/temp_dir.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"
#include "workers/rewards/reward_registry.h"
#include "workers/tools/tool_call_parser.h"
#include "workers/tools/tool_registry.h"

namespace {

namespace fs = std::filesystem;
using baton::engine::testing::TempDir;

// Runs toy_task with `args`; returns its exit status.
int run_toy_task(const std::string& args) {
  const std::string cmd = std::string("'") + TOY_TASK_EXE + "' " + args + " >/dev/null 2>&1";
  const int raw = std::system(cmd.c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<nlohmann::json> read_jsonl(const fs::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// One generated task shared by a suite's tests, made with `Args::kFlags`.
template <typename Args>
class GeneratedTask : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_EQ(run_toy_task("--out '" + (*dir_ / "task").string() + "' " + Args::kFlags), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path task() { return *dir_ / "task"; }
  static inline TempDir* dir_ = nullptr;
};

// Small: operands below 20, 40 val rows.
struct AdditionFlags {
  static constexpr const char* kFlags = "--seed 3 --max-operand 20 --val-size 40";
};
using ToyTask = GeneratedTask<AdditionFlags>;

TEST_F(ToyTask, SplitsEveryProblemOnceIntoTrainAndVal) {
  const auto train = read_jsonl(task() / "data" / "train.jsonl");
  const auto val = read_jsonl(task() / "data" / "val.jsonl");
  EXPECT_EQ(val.size(), 40u);
  EXPECT_EQ(train.size(), 20u * 20u - 40u);
  std::set<std::string> prompts;
  for (const auto* rows : {&train, &val}) {
    for (const auto& row : *rows) {
      const int64_t a = row["extra_info"]["a"], b = row["extra_info"]["b"];
      EXPECT_EQ(row["prompt"], std::to_string(a) + "+" + std::to_string(b) + "=");
      EXPECT_EQ(row["reward_model"]["ground_truth"], std::to_string(a + b));
      EXPECT_EQ(row["data_source"], "openai/gsm8k");
      prompts.insert(row["prompt"]);
    }
  }
  EXPECT_EQ(prompts.size(), 400u);  // no problem twice
}

TEST_F(ToyTask, TokenizerRoundTripsEveryDatasetStringOneTokenPerCharacter) {
  const auto tok = baton::data::Tokenizer::load(task() / "model");
  ASSERT_TRUE(tok.eos_id().has_value());
  ASSERT_TRUE(tok.pad_id().has_value());
  EXPECT_EQ(*tok.pad_id(), 0);
  EXPECT_EQ(*tok.eos_id(), 1);
  const auto sft = read_jsonl(task() / "data" / "sft.jsonl");
  ASSERT_EQ(sft.size(), 360u);
  for (const auto& row : sft) {
    for (const std::string text : {row["prompt"], row["response"]}) {
      const auto ids = tok.encode(text, /*add_special_tokens=*/true);
      EXPECT_EQ(ids.size(), text.size()) << text;
      EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), text);
    }
    // The response as the model would emit it, eos included.
    auto ids = tok.encode(row["response"].get<std::string>(), false);
    ids.push_back(*tok.eos_id());
    EXPECT_EQ(tok.decode(ids, true), row["response"]);
  }
}

double sft_score(const nlohmann::json& sft_row, const nlohmann::json& train_row) {
  const std::string response = sft_row["response"];
  const std::string truth = train_row["reward_model"]["ground_truth"];
  return baton::rewards::compute_score(
      {.data_source = "openai/gsm8k", .response = response, .ground_truth = truth});
}

TEST_F(ToyTask, SftResponsesScoreOneUnderTheGsm8kRewardWithoutNoise) {
  TempDir clean;
  ASSERT_EQ(run_toy_task("--out '" + clean.path().string() +
                         "' --seed 3 --max-operand 20 --val-size 40 --carry-noise 0"),
            0);
  const auto sft = read_jsonl(clean / "data/sft.jsonl");
  const auto train = read_jsonl(clean / "data/train.jsonl");
  ASSERT_EQ(sft.size(), train.size());
  for (std::size_t i = 0; i < sft.size(); ++i) {
    ASSERT_EQ(sft[i]["prompt"], train[i]["prompt"]);
    EXPECT_EQ(sft_score(sft[i], train[i]), 1.0) << sft[i]["response"];
  }
}

TEST_F(ToyTask, CarryNoiseDropsTheCarryOfAboutThatShareOfCarryingAnswersOnly) {
  // The shared task has the default noise, 0.5.
  const auto sft = read_jsonl(task() / "data" / "sft.jsonl");
  const auto train = read_jsonl(task() / "data" / "train.jsonl");
  ASSERT_EQ(sft.size(), train.size());
  int carrying = 0, dropped = 0;
  for (std::size_t i = 0; i < sft.size(); ++i) {
    const int64_t a = train[i]["extra_info"]["a"], b = train[i]["extra_info"]["b"];
    const std::string response = sft[i]["response"];
    if (a % 10 + b % 10 < 10) {
      EXPECT_EQ(sft_score(sft[i], train[i]), 1.0) << response;
      continue;
    }
    ++carrying;
    if (sft_score(sft[i], train[i]) == 1.0) continue;
    ++dropped;
    EXPECT_EQ(response, "#### " + std::to_string(a + b - 10));
  }
  // 0..19 + 0..19: 45 % of the pairs carry, ~160 of the 360 train rows. The
  // draws are fixed by the seed; a binomial(160, 0.5) lands within ±5
  // standard deviations (±32) of 80 but for a broken rule.
  EXPECT_GT(carrying, 100);
  EXPECT_NEAR(dropped, carrying / 2, 32);
}

TEST_F(ToyTask, PromptDatasetLoadsTrainAndVal) {
  const auto tok = baton::data::Tokenizer::load(task() / "model");
  const auto ds = baton::data::PromptDataset::load(
      {(task() / "data" / "train.jsonl").string(), (task() / "data" / "val.jsonl").string()}, tok,
      baton::data::PromptDatasetOptions().set_max_prompt_length(6));  // "19+19=" is the longest
  ASSERT_EQ(ds.size(), 400u);
  EXPECT_EQ(ds.pad_id(), 0);
  const auto& row = ds.row(0);
  EXPECT_EQ(row.prompt_ids.size(), row.prompt_text.size());
  EXPECT_EQ(tok.decode(row.prompt_ids, true), row.prompt_text);
  const auto batch = ds.batch({0, 1});
  EXPECT_EQ(batch.seq_len, 6);
}

TEST_F(ToyTask, ModelLoadsIntoTheEngineWithTheTokenizersVocabulary) {
  const auto cfg = baton::engine::ModelConfig::load(task() / "model");
  const auto tok = baton::data::Tokenizer::load(task() / "model");
  EXPECT_EQ(cfg.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(cfg.vocab_size, tok.vocab_size());
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int64_t>{*tok.eos_id()}));
  auto model = std::make_shared<baton::engine::Transformer>(
      cfg, baton::engine::ParallelState::single());
  model->load_state_dict(baton::engine::hf_to_shard(
      baton::engine::read_hf_weights(task() / "model"), cfg, model->shard_spec()));
  const auto ids = at::tensor(std::vector<int64_t>{4, 5, 13, 6}).view({1, 4});
  const auto pos = at::arange(4, at::kLong).view({1, 4});
  const auto logits = model->forward(ids, pos, at::ones({1, 4}, at::kLong));
  // The columns past the vocabulary are the engine's padding (-inf by design).
  EXPECT_TRUE(logits.slice(-1, 0, cfg.vocab_size).isfinite().all().item<bool>());
}

TEST_F(ToyTask, SameSeedWritesTheSameBytesAndAnotherSeedOtherWeights) {
  TempDir again;
  const std::string common = " --max-operand 20 --val-size 40";
  ASSERT_EQ(run_toy_task("--out '" + (again / "same").string() + "' --seed 3" + common), 0);
  ASSERT_EQ(run_toy_task("--out '" + (again / "other").string() + "' --seed 4" + common), 0);
  for (const char* file : {"data/train.jsonl", "data/val.jsonl", "data/sft.jsonl",
                           "model/config.json", "model/model.safetensors", "model/tokenizer.json",
                           "model/tokenizer_config.json"}) {
    EXPECT_EQ(read_file(task() / file), read_file(again / "same" / file)) << file;
  }
  EXPECT_NE(read_file(task() / "model/model.safetensors"),
            read_file(again / "other" / "model/model.safetensors"));
  EXPECT_NE(read_file(task() / "data/val.jsonl"), read_file(again / "other" / "data/val.jsonl"));
}

TEST(ToyTaskUsage, RefusesMissingOutAndUnknownOptions) {
  EXPECT_EQ(run_toy_task("--seed 1"), 2);
  TempDir dir;
  EXPECT_EQ(run_toy_task("--out '" + dir.path().string() + "' --bogus 1"), 2);
  EXPECT_EQ(run_toy_task("--out '" + dir.path().string() + "' --max-operand 2 --val-size 4"), 2);
  EXPECT_EQ(run_toy_task("--out '" + dir.path().string() + "' --carry-noise 1.5"), 2);
  EXPECT_EQ(run_toy_task("--out '" + dir.path().string() + "' --op div"), 2);
  EXPECT_EQ(run_toy_task("--out '" + dir.path().string() + "' --tool-share -1"), 2);
}

// The tool task: multiplication in chat form, half the SFT answers through
// the calculator.
struct ToolFlags {
  static constexpr const char* kFlags =
      "--seed 5 --op mul --max-operand 1000 --train-size 400 --val-size 40 --tool-share 0.5";
};
using ToyToolTask = GeneratedTask<ToolFlags>;

// Each SFT row is the conversation a multi-turn rollout makes: the prompt as
// the template renders the row's messages, then either "#### c" or the
// calculator's call (Hermes form), the tool turn as the template renders its
// result, and "#### c". Every answer is right, and the tokens fit the
// configs (sft_tool_toy.yaml's max_length 96, grpo_tool_toy.yaml's
// max_prompt_length 24 and max_response_length 80).
TEST_F(ToyToolTask, SftRowsAreTheRolloutsConversationWithTheCalculator) {
  const auto tok = baton::data::Tokenizer::load(task() / "model");
  const auto chat = baton::data::ChatTemplate::from_tokenizer(
      tok, (task() / "model" / "tokenizer_config.json").string());
  ASSERT_TRUE(chat.has_template());
  EXPECT_EQ(tok.decode({*tok.eos_id()}, false), "<|im_end|>");
  const auto sft = read_jsonl(task() / "data" / "sft.jsonl");
  const auto train = read_jsonl(task() / "data" / "train.jsonl");
  ASSERT_EQ(sft.size(), 400u);
  ASSERT_EQ(train.size(), 400u);
  int64_t with_tool = 0;
  for (std::size_t i = 0; i < sft.size(); ++i) {
    const int64_t a = train[i]["extra_info"]["a"], b = train[i]["extra_info"]["b"];
    const std::string product = std::to_string(a * b);
    const std::string expression = std::to_string(a) + "*" + std::to_string(b);
    ASSERT_EQ(train[i]["reward_model"]["ground_truth"], product);
    const nlohmann::ordered_json user = {{"role", "user"}, {"content", expression}};
    ASSERT_EQ(train[i]["prompt"], nlohmann::json::array({user}));
    const std::string prompt = sft[i]["prompt"], response = sft[i]["response"];
    EXPECT_EQ(prompt, chat.render(nlohmann::ordered_json::array({user}), true, nullptr));
    EXPECT_EQ(sft_score(sft[i], train[i]), 1.0) << response;
    EXPECT_LE(tok.encode(prompt, false).size(), 24u);
    EXPECT_LE(tok.encode(response, false).size() + 1, 80u) << response;
    if (response == "#### " + product) continue;
    ++with_tool;
    // The call: what the model generates up to its end of turn.
    const size_t end = response.find("<|im_end|>");
    ASSERT_NE(end, std::string::npos) << response;
    const std::string call_text = response.substr(0, end);
    const auto parsed = baton::tools::parse_tool_calls(call_text, baton::tools::ToolCallFormat::kHermes);
    ASSERT_EQ(parsed.calls.size(), 1u) << call_text;
    EXPECT_TRUE(parsed.errors.empty());
    EXPECT_EQ(parsed.calls[0].name, "calculator");
    const auto result = baton::tools::call_tool("calculator", parsed.calls[0].arguments, {});
    EXPECT_FALSE(result.error) << result.text;
    EXPECT_EQ(result.text, product);
    // The whole conversation, rendered at once, then the answer.
    const nlohmann::ordered_json whole = nlohmann::ordered_json::array(
        {user, {{"role", "assistant"}, {"content", call_text}}, {{"role", "tool"}, {"content", result.text}}});
    EXPECT_EQ(prompt + response, chat.render(whole, true, nullptr) + "#### " + product);
  }
  // binomial(400, 0.5): 200 ± 5 standard deviations (±50) but for a broken rule.
  EXPECT_NEAR(with_tool, 200, 50);
}

TEST_F(ToyToolTask, TheModelEndsTurnsAtImEndAndHoldsTheTrajectory) {
  const auto cfg = baton::engine::ModelConfig::load(task() / "model");
  const auto tok = baton::data::Tokenizer::load(task() / "model");
  EXPECT_EQ(cfg.vocab_size, tok.vocab_size());
  EXPECT_EQ(cfg.eos_token_ids, (std::vector<int64_t>{*tok.token_to_id("<|im_end|>")}));
  EXPECT_EQ(cfg.max_position_embeddings, 128);
  // The call's fixed parts are single tokens, as a BPE would merge them.
  EXPECT_EQ(tok.encode("<tool_call>\"calculator\"", false).size(), 2u);
}

}  // namespace
