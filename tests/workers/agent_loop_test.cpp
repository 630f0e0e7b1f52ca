// The tool agent loop (workers/roles/agent_loop.h) on a character-level
// tokenizer with ChatML's special tokens and template (tests/workers/
// chatml_tokenizer.h): the tokens
// a tool turn appends, their continuity with the whole conversation rendered
// and tokenised at once (verl's tokenization sanity check), the calls run on
// the registered tools, every failure shown to the model and counted, the
// turn limit, and verl's truncation of tool responses.
#include "workers/roles/agent_loop.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "base/errors.h"
#include "tests/workers/chatml_tokenizer.h"
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
      loop.tool_turn_tokens(ordered_json::array({{{"role", "tool"}, {"content", "4"}}}), f.im_end);
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

}  // namespace
}  // namespace baton::workers
