// The tool agent loop (workers/roles/agent_loop.h) on a character-level
// tokenizer with ChatML's special tokens and template (tests/workers/
// chatml_tokenizer.h): the tokens
// a tool turn appends, their continuity with the whole conversation rendered
// and tokenised at once (verl's tokenization sanity check), the calls run on
// the registered tools, every failure shown to the model and counted, the
// turn limit, and verl's truncation of tool responses; interactions (their
// config file, the built-in answer_check, the user turns they append, their
// turn limit and scores, and their failures).
#include "workers/roles/agent_loop.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include "base/errors.h"
#include "tests/workers/chatml_tokenizer.h"
#include "workers/roles/interaction.h"
#include "workers/tools/tool_registry.h"

namespace baton::workers {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

struct Fixture {
  data::Tokenizer tokenizer = test::chatml_tokenizer();
  data::ChatTemplate chat = data::ChatTemplate::from_tokenizer(tokenizer, "chatml_tokenizer.h");
  int64_t im_end = *tokenizer.token_to_id("<|im_end|>");

  std::vector<int64_t> encode(const std::string& text) const {
    const auto ids = tokenizer.encode(text, false);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int64_t>& ids) const {
    return tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.end()), false);
  }
};

tools::ConfiguredTool calculator() {
  tools::ConfiguredTool t;
  t.name = "calculator";
  t.schema = tools::find_tool("calculator").schema;
  t.config = json::object();
  return t;
}

// A sequence as the engine passes it: `turns` generated tokens, with earlier
// turns' appended tokens marked 0.
engine::GeneratedSequence sequence(const Fixture& f, const std::string& generated,
                                   int64_t turns = 1) {
  engine::GeneratedSequence s;
  s.response = f.encode(generated);
  s.response.push_back(f.im_end);
  s.generated_mask.assign(s.response.size(), 1);
  s.turns = turns;
  return s;
}

std::string run(const std::optional<std::shared_future<std::vector<int64_t>>>& next,
                const Fixture& f) {
  EXPECT_TRUE(next.has_value());
  return next ? f.decode(next->get()) : "";
}

TEST(ToolAgentLoop, ATurnAppendsTheTemplatesToolTurnAndTheNextAssistantPrefix) {
  Fixture f;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, {});
  const std::vector<int64_t> tokens =
      loop.turn_tokens(ordered_json::array({{{"role", "tool"}, {"content", "4"}}}), f.im_end);
  EXPECT_EQ(f.decode(tokens),
            "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

// The prompt, the generated turn and the appended tokens are exactly the
// tokens of the whole conversation rendered and tokenised at once.
TEST(ToolAgentLoop, TheTrajectoryEqualsTheWholeConversationTokenised) {
  Fixture f;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, {});
  const std::string call =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n"
      "</tool_call>";
  const ordered_json user = {{"role", "user"}, {"content", "What is 6*7?"}};
  std::vector<int64_t> trajectory =
      f.encode(f.chat.render(ordered_json::array({user}), true, nullptr));
  const engine::GeneratedSequence s = sequence(f, call);
  trajectory.insert(trajectory.end(), s.response.begin(), s.response.end());
  const std::vector<int64_t> appended = loop.on_stop(s)->get();
  trajectory.insert(trajectory.end(), appended.begin(), appended.end());
  const ordered_json whole = ordered_json::array(
      {user, {{"role", "assistant"}, {"content", call}}, {{"role", "tool"}, {"content", "42"}}});
  EXPECT_EQ(trajectory, f.encode(f.chat.render(whole, true, nullptr)));
  const TurnMetrics m = loop.metrics(0, 0);
  EXPECT_EQ(m.tool_calls, 1);
  EXPECT_EQ(m.tool_errors, 0);
  EXPECT_GE(m.tool_time_s, 0);
}

TEST(ToolAgentLoop, AnAnswerWithoutCallsOrPastTheTurnLimitEndsTheTrajectory) {
  Fixture f;
  MultiTurnOptions two;
  two.max_assistant_turns = 2;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, two);
  EXPECT_FALSE(loop.on_stop(sequence(f, "The answer is 42.")).has_value());
  const std::string call =
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}</tool_call>";
  EXPECT_TRUE(loop.on_stop(sequence(f, call, 1)).has_value());
  EXPECT_FALSE(loop.on_stop(sequence(f, call, 2)).has_value()) << "the second turn is the last";
}

// Only this turn's text is parsed: a call in an earlier turn (before the
// appended tokens) is not run again.
TEST(ToolAgentLoop, OnlyTheLastTurnsTextIsParsed) {
  Fixture f;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, {});
  engine::GeneratedSequence s = sequence(
      f, "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}</tool_call>");
  const std::vector<int64_t> tool = f.encode("\n<|im_start|>user\n2<|im_end|>\n<|im_start|>assistant\n");
  s.response.insert(s.response.end(), tool.begin(), tool.end());
  s.generated_mask.resize(s.response.size(), 0);
  const std::vector<int64_t> answer = f.encode("It is 2.");
  s.response.insert(s.response.end(), answer.begin(), answer.end());
  s.response.push_back(f.im_end);
  s.generated_mask.resize(s.response.size(), 1);
  s.turns = 2;
  EXPECT_FALSE(loop.on_stop(s).has_value());
}

TEST(ToolAgentLoop, FailuresAreShownToTheModelAndCounted) {
  Fixture f;
  MultiTurnOptions one_call;
  one_call.max_parallel_calls = 1;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, one_call);
  // A malformed call, a call to an unknown tool, a bad expression, and one
  // call too many.
  engine::GeneratedSequence malformed = sequence(f, "<tool_call>{not json</tool_call>");
  malformed.request = 0;
  EXPECT_NE(run(loop.on_stop(malformed), f).find("Error: a malformed tool call"),
            std::string::npos);
  engine::GeneratedSequence unknown = sequence(
      f, "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}</tool_call>");
  unknown.request = 1;
  EXPECT_NE(run(loop.on_stop(unknown), f)
                .find("Error: no tool named 'search'; the tools are: calculator"),
            std::string::npos);
  engine::GeneratedSequence bad = sequence(
      f, "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1/0\"}}"
         "</tool_call><tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": "
         "\"2+2\"}}</tool_call>");
  bad.request = 2;
  const std::string shown = run(loop.on_stop(bad), f);
  EXPECT_NE(shown.find("division by zero"), std::string::npos) << shown;
  EXPECT_NE(shown.find("at most 1 tool call(s) per turn; 'calculator' was not run"),
            std::string::npos)
      << shown;
  EXPECT_EQ(loop.metrics(0, 0).tool_errors, 1);
  EXPECT_EQ(loop.metrics(0, 0).tool_calls, 0);
  EXPECT_EQ(loop.metrics(1, 0).tool_errors, 1);
  EXPECT_EQ(loop.metrics(2, 0).tool_calls, 2);
  EXPECT_EQ(loop.metrics(2, 0).tool_errors, 2);
}

// The row's tools_kwargs reach its tool, over the tool config's.
TEST(ToolAgentLoop, TheRowsToolsKwargsOverrideTheToolsConfig) {
  Fixture f;
  tools::ConfiguredTool echo;
  echo.name = "agent_loop_test_echo";
  echo.config = {{"prefix", "config"}, {"suffix", "!"}};
  tools::register_tool(
      echo.name,
      ordered_json::parse(R"({"type": "function", "function": {"name": "agent_loop_test_echo",
          "parameters": {"type": "object", "properties": {}}}})"),
      [](const json&, const json& kwargs) {
        tools::ToolResult r;
        r.text = kwargs.value("prefix", std::string("?")) + kwargs.value("suffix", std::string("?"));
        return r;
      });
  echo.schema = tools::find_tool(echo.name).schema;
  ToolAgentLoop loop(f.tokenizer, f.chat, {echo}, {},
                     {json::object(), {{"agent_loop_test_echo", {{"prefix", "row"}}}}});
  const std::string call = "<tool_call>{\"name\": \"agent_loop_test_echo\"}</tool_call>";
  engine::GeneratedSequence first = sequence(f, call), second = sequence(f, call);
  second.request = 1;
  EXPECT_NE(run(loop.on_stop(first), f).find("\nconfig!\n"), std::string::npos);
  EXPECT_NE(run(loop.on_stop(second), f).find("\nrow!\n"), std::string::npos);
}

// verl's datasets carry a row's tool settings in extra_info.tools_kwargs.
TEST(ToolAgentLoop, EachRowsToolsKwargsComeFromItsExtraInfo) {
  DataProto prompts;
  prompts.set_tensor("input_ids", at::zeros({3, 2}, at::kLong));
  prompts.set_column("extra_info",
                     {Value(std::string(R"({"tools_kwargs": {"calculator": {"x": 1}}})")),
                      Value(std::string(R"({"index": 4})")), Value(std::string("{}"))});
  const std::vector<json> kwargs = tools_kwargs_of(prompts);
  ASSERT_EQ(kwargs.size(), 3u);
  EXPECT_EQ(kwargs[0], json({{"calculator", {{"x", 1}}}}));
  EXPECT_EQ(kwargs[1], json::object());
  EXPECT_EQ(tools_kwargs_of(DataProto(prompts.tensors())).size(), 3u) << "no column: {} each";
  prompts.set_column("extra_info", {Value(std::string("{}")), Value(std::string("{oops")),
                                    Value(std::string("{}"))});
  try {
    tools_kwargs_of(prompts);
    ADD_FAILURE() << "extra_info that is not JSON was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("extra_info of prompt row 1 is not JSON"),
              std::string::npos)
        << e.what();
  }
}

TEST(ToolAgentLoop, ToolResponsesAreTruncatedAsVerlDoes) {
  EXPECT_EQ(truncate_tool_response("abcdef", 10, "left"), "abcdef");
  EXPECT_EQ(truncate_tool_response("abcdef", 3, "left"), "abc...(truncated)");
  EXPECT_EQ(truncate_tool_response("abcdef", 3, "right"), "(truncated)...def");
  EXPECT_EQ(truncate_tool_response("abcdef", 4, "middle"), "ab\n...(truncated)...\nef");
  // Characters, not bytes: "é" is two bytes and stays whole.
  EXPECT_EQ(truncate_tool_response("ééééé", 2, "left"), "éé...(truncated)");
  EXPECT_THROW(truncate_tool_response("x", 1, "top"), InvalidArgument);
  Fixture f;
  MultiTurnOptions bad;
  bad.tool_response_truncate_side = "top";
  EXPECT_THROW(ToolAgentLoop(f.tokenizer, f.chat, {}, bad), InvalidArgument);
}

// ---- Interactions (workers/roles/interaction.h) ----

constexpr const char* kIncorrect =
    "Your response is incorrect! You need to reflect on your answer and try again.";

ConfiguredInteraction answer_check(nlohmann::json config = nlohmann::json::object()) {
  return {"arithmetic", "answer_check", std::move(config)};
}

// A sequence whose earlier turns were appended: `turns` generated texts with
// an appended filler between each.
engine::GeneratedSequence later_turn(const Fixture& f, const std::string& text, int64_t turns) {
  engine::GeneratedSequence s;
  for (int64_t t = 0; t < turns; ++t) {
    if (t > 0) {
      const std::vector<int64_t> glue = f.encode("\n<|im_start|>user\n?<|im_end|>\n");
      s.response.insert(s.response.end(), glue.begin(), glue.end());
      s.generated_mask.resize(s.response.size(), 0);
    }
    const std::vector<int64_t> ids = f.encode(t + 1 == turns ? text : "#### 0");
    s.response.insert(s.response.end(), ids.begin(), ids.end());
    s.response.push_back(f.im_end);
    s.generated_mask.resize(s.response.size(), 1);
  }
  s.turns = turns;
  return s;
}

TEST(Interaction, AnswerCheckEndsACorrectAnswerAndAsksAgainOtherwise) {
  const InteractionFunction& check = find_interaction("answer_check");
  const json kwargs = {{"ground_truth", "42"}};
  const ordered_json messages = ordered_json::array();
  const InteractionReply wrong = check({kwargs, "So #### 41", messages, 0});
  EXPECT_FALSE(wrong.terminate);
  EXPECT_EQ(wrong.text, kIncorrect);
  EXPECT_EQ(wrong.reward, 0.0);
  const InteractionReply right = check({kwargs, "So #### 42", messages, 1});
  EXPECT_TRUE(right.terminate);
  EXPECT_EQ(right.reward, 1.0);
  // Its settings: another reward function, pass score and feedback.
  const json exact = {{"ground_truth", "42"}, {"reward_function", "exact_match"},
                      {"feedback", "no"}, {"pass_score", 2.0}};
  const InteractionReply strict = check({exact, "42", messages, 0});
  EXPECT_FALSE(strict.terminate) << "score 1 is below pass_score 2";
  EXPECT_EQ(strict.text, "no");
  EXPECT_THROW(check({json::object(), "42", messages, 0}), InvalidArgument) << "no ground_truth";
  EXPECT_THROW(find_interaction("answer_chek"), InvalidArgument);
}

TEST(Interaction, TheConfigFileIsVerlsFormat) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("baton_interaction_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  };
  const std::vector<ConfiguredInteraction> loaded = load_interaction_config(write("ok.yaml", R"(
interaction:
  - name: gsm8k
    class_name: verl.interactions.gsm8k_interaction.answer_check
    config: {feedback: "Try again.", pass_score: 1}
  - name: plain
    class_name: answer_check
)"));
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].name, "gsm8k");
  EXPECT_EQ(loaded[0].class_name, "answer_check") << "the last part of a Python class path";
  EXPECT_EQ(loaded[0].config, json({{"feedback", "Try again."}, {"pass_score", 1}}));
  EXPECT_EQ(loaded[1].config, json::object());
  const auto refused = [&](const std::string& text, const std::string& part) {
    try {
      load_interaction_config(write("bad.yaml", text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    }
  };
  refused("tools: []\n", "missing 'interaction'");
  refused("interaction:\n  - class_name: answer_check\n", "interaction[0]: missing 'name'");
  refused("interaction:\n  - name: a\n", "interaction[0]: missing 'class_name'");
  refused("interaction:\n  - {name: a, class_name: my.Simulator}\n",
          "interaction[0]: 'class_name': interaction 'Simulator' is not registered");
  refused("interaction:\n  - {name: a, class_name: answer_check, config: [1]}\n",
          "'config' must be a mapping");
  refused("interaction:\n  - {name: a, class_name: answer_check}\n"
          "  - {name: a, class_name: answer_check}\n",
          "interaction[1]: 'name': interaction 'a' is listed twice (also interaction[0])");
  refused("interaction: [\n", "not valid YAML");
  EXPECT_THROW(load_interaction_config(dir / "missing.yaml"), FileError);
  std::filesystem::remove_all(dir);
}

// A row with interaction_kwargs: a turn without a tool call is answered by
// the interaction as a user turn (rendered by the template, tokens
// continuous with the whole conversation), until it ends the trajectory; a
// row without ends at such a turn.
TEST(Interaction, ATurnWithoutACallIsAnsweredByTheRowsInteraction) {
  Fixture f;
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, {}, {}, {answer_check()},
                     {json{{"ground_truth", "42"}}, nullptr});
  const ordered_json user = {{"role", "user"}, {"content", "What is 6*7?"}};
  std::vector<int64_t> trajectory =
      f.encode(f.chat.render(ordered_json::array({user}), true, nullptr));
  const engine::GeneratedSequence first = sequence(f, "#### 41");
  trajectory.insert(trajectory.end(), first.response.begin(), first.response.end());
  const auto next = loop.on_stop(first);
  ASSERT_TRUE(next.has_value());
  const std::vector<int64_t> appended = next->get();
  trajectory.insert(trajectory.end(), appended.begin(), appended.end());
  const ordered_json whole = ordered_json::array(
      {user, {{"role", "assistant"}, {"content", "#### 41"}}, {{"role", "user"}, {"content", kIncorrect}}});
  EXPECT_EQ(trajectory, f.encode(f.chat.render(whole, true, nullptr)));
  EXPECT_EQ(loop.metrics(0, 0).user_turns, 1);
  EXPECT_EQ(loop.metrics(0, 0).turn_scores, (std::vector<double>{0.0}));

  // The right answer ends it: no tokens, and the turn's score is kept.
  const auto last = loop.on_stop(later_turn(f, "#### 42", 2));
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(last->get().empty());
  EXPECT_EQ(loop.metrics(0, 0).user_turns, 1);
  EXPECT_EQ(loop.metrics(0, 0).turn_scores, (std::vector<double>{0.0, 1.0}));

  engine::GeneratedSequence other = sequence(f, "#### 41");
  other.request = 1;
  EXPECT_FALSE(loop.on_stop(other).has_value()) << "no interaction_kwargs: the answer ends it";
}

TEST(Interaction, MaxUserTurnsEndsTheTrajectory) {
  Fixture f;
  MultiTurnOptions one;
  one.max_user_turns = 1;
  ToolAgentLoop loop(f.tokenizer, f.chat, {}, one, {}, {answer_check()},
                     {json{{"ground_truth", "42"}}});
  EXPECT_FALSE(loop.on_stop(sequence(f, "#### 1"))->get().empty());
  EXPECT_FALSE(loop.on_stop(later_turn(f, "#### 2", 2)).has_value());
  EXPECT_EQ(loop.metrics(0, 0).user_turns, 1);
  EXPECT_EQ(loop.metrics(0, 0).turn_scores.size(), 1u);
}

// The interaction sees the trajectory so far: assistant texts (special tokens
// skipped), tool results and its own earlier user turns; its settings are
// the config's overridden by the row's kwargs.
TEST(Interaction, SeesTheTrajectoryAndTheRowsKwargs) {
  static const bool registered = [] {
    register_interaction("agent_loop_test_recorder", [](const InteractionInput& in) {
      InteractionReply r;
      r.terminate = in.user_turns >= 1;
      r.text = in.kwargs.dump() + "|" + in.messages.dump() + "|" + std::string(in.response);
      r.reward = 0.5;
      return r;
    });
    register_interaction("agent_loop_test_throws", [](const InteractionInput&) -> InteractionReply {
      throw std::runtime_error("the environment fell over");
    });
    return true;
  }();
  (void)registered;
  Fixture f;
  const std::vector<ConfiguredInteraction> configured = {
      {"rec", "agent_loop_test_recorder", {{"a", 1}, {"b", 2}}},
      {"bad", "agent_loop_test_throws", json::object()}};
  ToolAgentLoop loop(f.tokenizer, f.chat, {calculator()}, {}, {}, configured,
                     {json{{"name", "rec"}, {"b", 3}}, json{{"name", "bad"}}});
  const std::string call =
      "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}</tool_call>";
  loop.on_stop(sequence(f, call))->get();  // a tool turn first
  const std::string shown = f.decode(loop.on_stop(later_turn(f, "It is 42.", 2))->get());
  const std::string expected =
      json({{"a", 1}, {"b", 3}}).dump() + "|" +
      ordered_json::array({{{"role", "assistant"}, {"content", call}},
                           {{"role", "tool"}, {"content", "42"}},
                           {{"role", "assistant"}, {"content", "It is 42."}}})
          .dump() +
      "|It is 42.";
  EXPECT_NE(shown.find(expected), std::string::npos) << shown;
  EXPECT_TRUE(loop.on_stop(later_turn(f, "Done.", 3))->get().empty()) << "user_turns 1: it ends";
  EXPECT_EQ(loop.metrics(0, 0).turn_scores, (std::vector<double>{0.5, 0.5}));

  engine::GeneratedSequence failing = sequence(f, "x");
  failing.request = 1;
  try {
    loop.on_stop(failing)->get();
    ADD_FAILURE() << "a throwing interaction was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interaction 'bad' failed: the environment fell over"),
              std::string::npos)
        << e.what();
  }
}

TEST(Interaction, RowsNamingNoConfiguredInteractionAreRefused) {
  Fixture f;
  const auto refused = [&](const std::vector<ConfiguredInteraction>& configured, const json& row,
                           const std::string& part) {
    try {
      ToolAgentLoop loop(f.tokenizer, f.chat, {}, {}, {}, configured, {nullptr, row});
      ADD_FAILURE() << "accepted " << row.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("interaction_kwargs of prompt row 1"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused({}, json{{"ground_truth", "1"}}, "no interaction is configured");
  refused({answer_check()}, json{{"name", "chess"}},
          "no interaction named 'chess'; the configured ones are: arithmetic");
  refused({answer_check(), {"other", "answer_check", json::object()}}, json::object(),
          "no 'name' to choose an interaction");
  refused({answer_check()}, json::array(), "must be an object");
}

TEST(Interaction, EachRowsKwargsComeFromItsExtraInfo) {
  DataProto prompts;
  prompts.set_tensor("input_ids", at::zeros({3, 2}, at::kLong));
  prompts.set_column("extra_info",
                     {Value(std::string(R"({"interaction_kwargs": {"name": "a", "x": 1}})")),
                      Value(std::string(R"({"index": 4})")), Value()});
  const std::vector<json> kwargs = interaction_kwargs_of(prompts);
  ASSERT_EQ(kwargs.size(), 3u);
  EXPECT_EQ(kwargs[0], json({{"name", "a"}, {"x", 1}}));
  EXPECT_TRUE(kwargs[1].is_null());
  EXPECT_TRUE(kwargs[2].is_null());
  prompts.set_column("extra_info", {Value(std::string(R"({"interaction_kwargs": 3})")), Value(),
                                    Value()});
  EXPECT_THROW(interaction_kwargs_of(prompts), Error);
}

// The rollout's columns: user turns, and what the tools and interaction
// scored as the JSON the reward manager hands on.
TEST(Interaction, TheRolloutsColumnsHoldTheUserTurnsAndScores) {
  Fixture f;
  ToolAgentLoop loop(f.tokenizer, f.chat, {}, {}, {}, {answer_check()},
                     {json{{"ground_truth", "42"}}});
  engine::GeneratedSequence s = sequence(f, "#### 1");
  loop.on_stop(s)->get();
  s.turns = 2;
  engine::GeneratedSequence plain = sequence(f, "x");
  plain.sample = 1;
  DataProto out;
  add_multi_turn_columns(out, {s, plain}, loop);
  EXPECT_TRUE(at::equal(out.tensor("multi_turn_user_turns"), at::tensor({1.0f, 0.0f})));
  EXPECT_TRUE(at::equal(out.tensor("multi_turn_turns"), at::tensor({2.0f, 1.0f})));
  const List& scores = out.column("rollout_reward_scores");
  ASSERT_EQ(scores.size(), 2u);
  EXPECT_EQ(json::parse(scores[0].as_string()),
            json({{"tool_rewards", json::array()}, {"turn_scores", {0.0}}}));
  EXPECT_EQ(json::parse(scores[1].as_string()),
            json({{"tool_rewards", json::array()}, {"turn_scores", json::array()}}));
}

}  // namespace
}  // namespace baton::workers
