// The reward manager on batches tokenized with the byte-level BPE fixture of
// tests/text (a Qwen2-style tokenizer: <|endoftext|> pads, <|im_end|> ends).
// Expected scores are those of the rule-based functions for the decoded text
// (reward_test.cpp checks the functions themselves); positions are each row's
// last valid response token. Everything is exact: scores are small binary
// fractions and nothing is summed.
#include "workers/rewards/reward_manager.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace baton::rewards {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

const data::Tokenizer& tok() {
  static const data::Tokenizer t = data::Tokenizer::load(std::string(BATON_FIXTURES_DIR) + "/bpe");
  return t;
}

std::vector<int32_t> ids(const std::string& text) { return tok().encode(text, false); }

int32_t single_id(const std::string& text) {
  const auto v = ids(text);
  EXPECT_EQ(v.size(), 1u) << text;
  return v.at(0);
}

// A token that decodes to a digit: padding that would change an answer if it
// were decoded.
int32_t digit_pad() { return single_id("7"); }

// Rewards for the tests, registered once per process.
void register_test_functions() {
  static const bool done = [] {
    register_reward_function("rm_test_half_if_empty", [](const RewardInput& in) {
      return in.response.empty() ? 0.5 : 0.25;
    });
    register_reward_function("rm_test_one", [](const RewardInput&) { return 1.0; });
    register_reward_function("rm_test_throws_on_no", [](const RewardInput& in) -> double {
      if (in.response == "no") throw std::runtime_error("cannot parse 'no'");
      return 1.0;
    });
    register_reward_data_source("rm_test_source", "rm_test_throws_on_no");
    register_reward_function("rm_test_extra_info_length", [](const RewardInput& in) {
      return static_cast<double>(in.extra_info.size());
    });
    // What a multi-turn rollout scored: the sum of its tool rewards and turn
    // scores, plus 100 per assistant turn.
    register_reward_function("rm_test_rollout_scores", [](const RewardInput& in) {
      const nlohmann::json extra = nlohmann::json::parse(in.extra_info);
      double sum = 100.0 * extra.at("num_turns").get<double>();
      for (const char* key : {"tool_rewards", "turn_scores"})
        for (double v : extra.at("rollout_reward_scores").at(key)) sum += v;
      return sum + (extra.contains("index") ? 1000.0 : 0.0);
    });
    // What extra_info carries beyond the row's own: 1 for rollout_reward_scores,
    // 10 for num_turns.
    register_reward_function("rm_test_rollout_keys", [](const RewardInput& in) {
      const nlohmann::json extra = nlohmann::json::parse(in.extra_info);
      return (extra.contains("rollout_reward_scores") ? 1.0 : 0.0) +
             (extra.contains("num_turns") ? 10.0 : 0.0);
    });
    return true;
  }();
  (void)done;
}

struct Row {
  std::string prompt;
  std::vector<int32_t> response;  // valid tokens
  std::string data_source;
  Value ground_truth;
};

struct BatchOptions {
  int32_t pad = digit_pad();
  int64_t extra_response_pad = 2;  // R = the longest response + this
  bool attention_mask = true;
  bool response_mask = false;
};

// prompts left-padded, responses right-padded, both with `pad`.
DataProto make_batch(const std::vector<Row>& rows, const BatchOptions& o = {}) {
  const int64_t n = static_cast<int64_t>(rows.size());
  int64_t p = 1, r = 0;
  for (const Row& row : rows) {
    p = std::max<int64_t>(p, static_cast<int64_t>(ids(row.prompt).size()) + 1);
    r = std::max<int64_t>(r, static_cast<int64_t>(row.response.size()));
  }
  r += o.extra_response_pad;
  at::Tensor prompts = at::full({n, p}, o.pad, at::kLong);
  at::Tensor responses = at::full({n, r}, o.pad, at::kLong);
  at::Tensor mask = at::zeros({n, p + r}, at::kLong);
  List sources, truths;
  for (int64_t i = 0; i < n; ++i) {
    const Row& row = rows[static_cast<size_t>(i)];
    const auto prompt = ids(row.prompt);
    const int64_t pl = static_cast<int64_t>(prompt.size());
    for (int64_t j = 0; j < pl; ++j) {
      prompts[i][p - pl + j] = prompt[static_cast<size_t>(j)];
      mask[i][p - pl + j] = 1;
    }
    for (int64_t j = 0; j < static_cast<int64_t>(row.response.size()); ++j) {
      responses[i][j] = row.response[static_cast<size_t>(j)];
      mask[i][p + j] = 1;
    }
    sources.emplace_back(row.data_source);
    truths.push_back(row.ground_truth);
  }
  DataProto::Tensors tensors{{"prompts", prompts}, {"responses", responses}};
  if (o.attention_mask) tensors["attention_mask"] = mask;
  if (o.response_mask) tensors["response_mask"] = mask.narrow(1, p, r).contiguous();
  return DataProto(tensors, {{"data_source", sources}, {"ground_truth", truths}});
}

// [N, R] zeros with `score` at (row, position) for each entry.
at::Tensor expected_scores(int64_t n, int64_t r,
                           const std::vector<std::tuple<int64_t, int64_t, float>>& at_positions) {
  at::Tensor t = at::zeros({n, r}, at::kFloat);
  for (const auto& [i, j, s] : at_positions) t[i][j] = s;
  return t;
}

int64_t last_of(const std::string& text) { return static_cast<int64_t>(ids(text).size()) - 1; }

TEST(RewardManager, Gsm8kRowsScoreAtTheirLastValidToken) {
  const RewardManager rm(tok());
  const std::vector<std::string> responses = {"So 8 * 9 = 72.\n#### 72", "8 * 9 = 71\n#### 71",
                                              "The answer is 72"};
  std::vector<Row> rows;
  for (const auto& r : responses) rows.push_back({"What is 8 * 9?", ids(r), "openai/gsm8k", "72"});
  const DataProto batch = make_batch(rows);
  const RewardResult result = rm.compute(batch);

  EXPECT_EQ(result.scores, (std::vector<double>{1.0, 0.0, 0.0}));
  EXPECT_EQ(result.extra.at("acc"), result.scores);
  EXPECT_EQ(result.empty_responses, 0);
  const int64_t r = batch.tensor("responses").size(1);
  ASSERT_EQ(result.token_level_scores.scalar_type(), at::kFloat);
  // The correct row's 1 at its last token; the two others score 0 everywhere.
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(3, r, {{0, last_of(responses[0]), 1.0f}})))
      << result.token_level_scores;
}

TEST(RewardManager, PaddingIsNeverDecoded) {
  const RewardManager rm(tok());
  // Padding with the token "7": decoded, "#### 4" would read "#### 477" (wrong)
  // and "#### 7" would read "#### 777" (right for 777).
  const DataProto batch = make_batch({{"Q", ids("#### 4"), "openai/gsm8k", "4"},
                                      {"Q", ids("#### 7"), "openai/gsm8k", "777"}},
                                     {.pad = digit_pad(), .extra_response_pad = 2});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{1.0, 0.0}));
  const int64_t r = batch.tensor("responses").size(1);
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(2, r, {{0, last_of("#### 4"), 1.0f}})));
}

TEST(RewardManager, ResponseMaskAloneSelectsTheSameTokens) {
  const RewardManager rm(tok());
  const std::vector<Row> rows = {{"Q", ids("#### 4"), "openai/gsm8k", "4"},
                                 {"Q", ids("x\n#### 12"), "openai/gsm8k", "12"}};
  const RewardResult with_attention = rm.compute(make_batch(rows));
  const RewardResult with_response_mask =
      rm.compute(make_batch(rows, {.attention_mask = false, .response_mask = true}));
  EXPECT_EQ(with_response_mask.scores, (std::vector<double>{1.0, 1.0}));
  EXPECT_TRUE(at::equal(with_attention.token_level_scores, with_response_mask.token_level_scores));
  EXPECT_EQ(with_response_mask.token_level_scores[1][last_of("x\n#### 12")].item<float>(), 1.0f);
}

TEST(RewardManager, SpecialTokensInTheValidResponseAreSkippedButHoldTheScore) {
  const RewardManager rm(tok());
  auto response = ids("#### 4");
  const int32_t eos = *tok().eos_id();
  response.push_back(eos);  // "<|im_end|>" is valid (generated) but special
  const DataProto batch = make_batch({{"Q", response, "openai/gsm8k", "4"}},
                                     {.pad = *tok().pad_id(), .extra_response_pad = 3});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{1.0}));
  const int64_t r = batch.tensor("responses").size(1);
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(1, r, {{0, static_cast<int64_t>(response.size()) - 1,
                                                1.0f}})));
}

TEST(RewardManager, MixedDataSourcesUseTheirOwnFunctions) {
  const RewardManager rm(tok());
  const std::vector<std::string> responses = {
      "#### 5",                                     // gsm8k: right
      "so it is $\\boxed{\\dfrac{1}{2}}$",          // math: \frac{1}{2} == 0.5 normalised
      "so it is $\\boxed{3}$",                      // math: wrong
      "<answer>The Eiffel Tower</answer>",          // exact match: right
      "#### 0.5",                                   // gsm8k: "0.5" != "1/2" as strings
  };
  const DataProto batch = make_batch({{"a", ids(responses[0]), "openai/gsm8k", "5"},
                                      {"b", ids(responses[1]), "lighteval/MATH", "0.5"},
                                      {"c", ids(responses[2]), "HuggingFaceH4/MATH-500", "4"},
                                      {"d", ids(responses[3]), "searchR1_nq", "eiffel tower"},
                                      {"e", ids(responses[4]), "openai/gsm8k", "1/2"}});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{1.0, 1.0, 0.0, 1.0, 0.0}));
  const int64_t r = batch.tensor("responses").size(1);
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(5, r,
                                        {{0, last_of(responses[0]), 1.0f},
                                         {1, last_of(responses[1]), 1.0f},
                                         {3, last_of(responses[3]), 1.0f}})));
}

TEST(RewardManager, IntegerGroundTruthIsItsDecimalText) {
  const RewardManager rm(tok());
  const RewardResult result =
      rm.compute(make_batch({{"Q", ids("#### 42"), "openai/gsm8k", Value(int64_t{42})}}));
  EXPECT_EQ(result.scores, (std::vector<double>{1.0}));
}

TEST(RewardManager, EmptyResponseIsScoredButPlacedNowhere) {
  register_test_functions();
  const RewardManager rm(tok(), RewardManagerOptions().set_reward_fn_name("rm_test_half_if_empty"));
  const DataProto batch = make_batch({{"Q", ids("#### 1"), "openai/gsm8k", "1"},
                                      {"Q", {}, "openai/gsm8k", "1"}});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(result.empty_responses, 1);
  const int64_t r = batch.tensor("responses").size(1);
  // Row 1 is all zeros: in particular not 0.5 in the last column (verl's index -1).
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(2, r, {{0, last_of("#### 1"), 0.25f}})));
}

TEST(RewardManager, NamedFunctionScoresEveryRowWhateverItsDataSource) {
  register_test_functions();
  const RewardManager rm(tok(), RewardManagerOptions().set_reward_fn_name("rm_test_one"));
  DataProto batch = make_batch({{"Q", ids("no"), "no_such_source", "x"},
                                {"Q", ids("answer"), "openai/gsm8k", "y"}});
  EXPECT_EQ(rm.compute(batch).scores, (std::vector<double>{1.0, 1.0}));
  batch.pop({}, {"data_source"});  // not needed with a named function
  EXPECT_EQ(rm.compute(batch).scores, (std::vector<double>{1.0, 1.0}));
}

TEST(RewardManager, ExtraInfoColumnReachesTheFunction) {
  register_test_functions();
  const RewardManager rm(tok(), RewardManagerOptions().set_reward_fn_name("rm_test_extra_info_length"));
  DataProto batch = make_batch({{"Q", ids("a"), "s", "x"}, {"Q", ids("b"), "s", "x"}});
  // 12 characters; none is "".
  batch.set_column("extra_info", List{Value("{\"index\": 7}"), Value()});
  EXPECT_EQ(rm.compute(batch).scores, (std::vector<double>{12.0, 0.0}));
}

// A multi-turn rollout's rollout_reward_scores and turns reach the function
// in extra_info (verl's rollout_reward_scores and num_turns), beside the
// row's own extra_info.
TEST(RewardManager, AMultiTurnRolloutsScoresAndTurnsReachTheFunction) {
  register_test_functions();
  const RewardManager rm(tok(), RewardManagerOptions().set_reward_fn_name("rm_test_rollout_scores"));
  DataProto batch = make_batch({{"Q", ids("a"), "s", "x"}, {"Q", ids("b"), "s", "x"}});
  batch.set_column("extra_info", List{Value("{\"index\": 7}"), Value()});
  batch.set_column("rollout_reward_scores",
                   List{Value(R"({"tool_rewards": [0.5], "turn_scores": [0.0, 1.0]})"),
                        Value(R"({"tool_rewards": [], "turn_scores": [0.25]})")});
  batch.set_tensor("multi_turn_turns", at::tensor({3.0f, 2.0f}));
  EXPECT_EQ(rm.compute(batch).scores, (std::vector<double>{1301.5, 200.25}));
}

// verl's dapo manager passes a multi-turn rollout's rollout_reward_scores but
// not its num_turns; the naive manager passes both.
TEST(RewardManager, TheDapoManagerPassesRolloutScoresButNotTurns) {
  register_test_functions();
  DataProto batch = make_batch({{"Q", ids("a"), "s", "x"}});
  batch.set_column("rollout_reward_scores",
                   List{Value(R"({"tool_rewards": [0.5], "turn_scores": []})")});
  batch.set_tensor("multi_turn_turns", at::tensor({2.0f}));
  const auto options = RewardManagerOptions().set_reward_fn_name("rm_test_rollout_keys");
  EXPECT_EQ(RewardManager(tok(), options).compute(batch).scores, (std::vector<double>{11.0}));
  const RewardManager dapo(tok(), RewardManagerOptions(options).set_kind(RewardManagerKind::kDapo));
  EXPECT_EQ(dapo.compute(batch).scores, (std::vector<double>{1.0}));
}

TEST(RewardManager, KindsAreNaiveAndDapo) {
  EXPECT_EQ(parse_reward_manager_kind("naive"), RewardManagerKind::kNaive);
  EXPECT_EQ(parse_reward_manager_kind("dapo"), RewardManagerKind::kDapo);
  try {
    parse_reward_manager_kind("prime");
    ADD_FAILURE() << "prime was accepted";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "'prime' is not one of: naive, dapo");
  }
}

TEST(RewardManager, OverlongBufferPenalisesLinearlyPastTheExpectedLength) {
  register_test_functions();
  // max_resp_len 8, buffer 4: no penalty up to 4 tokens, -0.25 per token after.
  const RewardManager rm(
      tok(),
      RewardManagerOptions()
          .set_kind(RewardManagerKind::kDapo)
          .set_reward_fn_name("rm_test_one")
          .set_overlong_buffer(
              {.enable = true, .len = 4, .penalty_factor = 1.0, .max_resp_len = 8, .log = true}));
  const int32_t a = single_id("a");
  const DataProto batch = make_batch({{"Q", std::vector<int32_t>(3, a), "s", "x"},
                                      {"Q", std::vector<int32_t>(4, a), "s", "x"},
                                      {"Q", std::vector<int32_t>(6, a), "s", "x"},
                                      {"Q", std::vector<int32_t>(8, a), "s", "x"}},
                                     {.extra_response_pad = 0});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{1.0, 1.0, 0.5, 0.0}));
  EXPECT_EQ(result.extra.at("acc"), (std::vector<double>{1.0, 1.0, 1.0, 1.0}));
  EXPECT_EQ(result.extra.at("overlong_reward"), (std::vector<double>{0.0, 0.0, -0.5, -1.0}));
  EXPECT_EQ(result.extra.at("overlong"), (std::vector<double>{0.0, 0.0, 1.0, 1.0}));
  EXPECT_TRUE(at::equal(result.token_level_scores,
                        expected_scores(4, 8, {{0, 2, 1.0f}, {1, 3, 1.0f}, {2, 5, 0.5f}})));
}

TEST(RewardManager, ExaminesTheFirstRowsOfEachDataSourceWithoutPadding) {
  const RewardManager rm(tok(), RewardManagerOptions().set_num_examine(1));
  const DataProto batch = make_batch({{"What is 2+2?", ids("#### 4"), "openai/gsm8k", "4"},
                                      {"Q2", ids("#### 5"), "openai/gsm8k", "5"},
                                      {"Half?", ids("\\boxed{3}"), "lighteval/MATH", "0.5"}},
                                     {.pad = digit_pad()});
  testing::internal::CaptureStderr();
  rm.compute(batch);
  const std::string printed = testing::internal::GetCapturedStderr();
  // The prompts' left padding ("7" tokens) and the responses' right padding
  // are not printed; the second gsm8k row is not examined.
  EXPECT_EQ(printed,
            "[prompt] What is 2+2?\n[response] #### 4\n[ground_truth] 4\n[score] 1\n"
            "[prompt] Half?\n[response] \\boxed{3}\n[ground_truth] 0.5\n[score] 0\n");
}

TEST(RewardManager, WithTokenLevelScoresAddsTheTensorAndExtraColumns) {
  const RewardManager rm(tok());
  const DataProto batch = make_batch({{"Q", ids("#### 4"), "openai/gsm8k", "4"},
                                      {"Q", ids("#### 3"), "openai/gsm8k", "4"}});
  const DataProto scored = rm.with_token_level_scores(batch);
  EXPECT_FALSE(batch.has_tensor("token_level_scores"));
  EXPECT_TRUE(at::equal(scored.tensor("token_level_scores"), rm.compute(batch).token_level_scores));
  EXPECT_EQ(scored.column("acc"), (List{Value(1.0), Value(0.0)}));
  EXPECT_TRUE(scored.tensor("responses").is_same(batch.tensor("responses")));
}

TEST(RewardManager, EmptyBatchGivesAnEmptyResult) {
  const RewardManager rm(tok());
  const DataProto batch({{"prompts", at::zeros({0, 3}, at::kLong)},
                         {"responses", at::zeros({0, 4}, at::kLong)},
                         {"attention_mask", at::zeros({0, 7}, at::kLong)}},
                        {{"data_source", List{}}, {"ground_truth", List{}}});
  const RewardResult result = rm.compute(batch);
  EXPECT_EQ(result.token_level_scores.sizes().vec(), (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(result.scores.empty());
}

// ---- errors --------------------------------------------------------------------

std::string error_of(const RewardManager& rm, const DataProto& batch) {
  try {
    rm.compute(batch);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "compute did not throw baton::Error";
  return "";
}

TEST(RewardManager, UnknownDataSourceNamesTheRow) {
  const RewardManager rm(tok());
  const std::string message = error_of(rm, make_batch({{"Q", ids("#### 4"), "openai/gsm8k", "4"},
                                                       {"Q", ids("#### 4"), "my_task", "4"}}));
  EXPECT_CONTAINS(message, "row 1");
  EXPECT_CONTAINS(message, "'my_task'");
  EXPECT_CONTAINS(message, "register_reward_data_source");
}

TEST(RewardManager, AThrowingFunctionNamesTheRowItsSourceAndTheFunctionOrScoresZero) {
  register_test_functions();
  DataProto batch = make_batch({{"Q", ids("answer"), "rm_test_source", "x"},
                                {"Q", ids("no"), "rm_test_source", "x"}});
  const std::string message = error_of(RewardManager(tok()), batch);
  EXPECT_CONTAINS(message, "row 1");
  EXPECT_CONTAINS(message, "data_source 'rm_test_source'");
  EXPECT_CONTAINS(message, "'rm_test_throws_on_no'");
  EXPECT_CONTAINS(message, "cannot parse 'no'");
  const RewardManager lenient(tok(), RewardManagerOptions().set_zero_on_error(true));
  const RewardResult r = lenient.compute(batch);
  EXPECT_EQ(r.scores, (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(r.errors, 1);
  EXPECT_EQ(lenient.with_token_level_scores(batch).meta_value("reward_errors")->as_float(), 1.0);
}

TEST(RewardManager, MissingOrMalformedInputsAreNamed) {
  const RewardManager rm(tok());
  const DataProto good = make_batch({{"Q", ids("#### 4"), "openai/gsm8k", "4"}});

  DataProto no_responses = good;
  no_responses.pop({"responses"});
  EXPECT_CONTAINS(error_of(rm, no_responses), "no tensor 'responses'");

  DataProto no_masks = good;
  no_masks.pop({"attention_mask"});
  EXPECT_CONTAINS(error_of(rm, no_masks), "neither 'attention_mask'");

  DataProto short_mask = good;
  short_mask.set_tensor("attention_mask", good.tensor("attention_mask").narrow(1, 0, 3));
  const std::string shape_error = error_of(rm, short_mask);
  EXPECT_CONTAINS(shape_error, "'attention_mask' must be [N, P + R]");
  EXPECT_CONTAINS(shape_error, "[1, 3]");

  DataProto float_responses = good;
  float_responses.set_tensor("responses", good.tensor("responses").to(at::kFloat));
  EXPECT_CONTAINS(error_of(rm, float_responses), "'responses' must hold integers");

  DataProto flat_prompts = good;
  flat_prompts.set_tensor("prompts", good.tensor("prompts").unsqueeze(2));
  EXPECT_CONTAINS(error_of(rm, flat_prompts), "'prompts' must be 2-D");

  DataProto no_truth = good;
  no_truth.pop({}, {"ground_truth"});
  EXPECT_CONTAINS(error_of(rm, no_truth), "no column 'ground_truth'");

  DataProto no_source = good;
  no_source.pop({}, {"data_source"});
  EXPECT_CONTAINS(error_of(rm, no_source), "no column 'data_source'");

  DataProto float_truth = good;
  float_truth.set_column("ground_truth", List{Value(4.0)});
  EXPECT_CONTAINS(error_of(rm, float_truth), "column 'ground_truth' row 0: expected a string");
}

TEST(RewardManager, ConstructorRejectsBadOptions) {
  EXPECT_THROW(RewardManager(tok(), RewardManagerOptions().set_reward_fn_name("no_such_fn")),
               baton::InvalidArgument);
  EXPECT_THROW(RewardManager(tok(), RewardManagerOptions().set_num_examine(-1)),
               baton::InvalidArgument);
  const auto dapo = RewardManagerOptions().set_kind(RewardManagerKind::kDapo);
  EXPECT_THROW(
      RewardManager(tok(), RewardManagerOptions(dapo).set_overlong_buffer({.enable = true})),
      baton::InvalidArgument);
  EXPECT_THROW(RewardManager(tok(), RewardManagerOptions(dapo).set_overlong_buffer(
                                        {.enable = true, .len = 9, .max_resp_len = 8})),
               baton::InvalidArgument);
  // The overlong buffer is the dapo manager's: the naive one refuses it.
  const OverlongBufferOptions valid{.enable = true, .len = 4, .max_resp_len = 8};
  EXPECT_NO_THROW(RewardManager(tok(), RewardManagerOptions(dapo).set_overlong_buffer(valid)));
  try {
    RewardManager(tok(), RewardManagerOptions().set_overlong_buffer(valid));
    ADD_FAILURE() << "a naive manager took an overlong buffer";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "reward_model.reward_manager = dapo");
  }
}

}  // namespace
}  // namespace baton::rewards
