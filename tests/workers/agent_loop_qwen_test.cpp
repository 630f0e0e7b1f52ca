// The tool agent loop on a real model family's files: Qwen's 151,643-token
// BPE and Qwen2.5-Instruct's chat template (both CTest fixtures of
// tests/text, written from PyPI packages into the build tree). A trajectory
// made of the prompt, the model's tokens and the tool turns the loop appends
// is exactly the tokenisation of the whole conversation rendered at once, so
// no re-tokenisation drift (verl's tokenization_sanity_check_mode) can occur.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "workers/roles/agent_loop.h"
#include "workers/tools/tool_registry.h"

namespace baton::workers {
namespace {

using nlohmann::ordered_json;

const std::string kQwenDir = std::string(BATON_QWEN_DIR) + "/qwen";
const std::string kTemplate =
    std::string(BATON_CHAT_TEMPLATES_DIR) + "/templates/Qwen-Qwen2.5-7B-Instruct.jinja";

std::string read(const std::string& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << path << " is missing: run the CTest fixtures (ctest -R Fixture)";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int64_t> encode(const data::Tokenizer& t, const std::string& text) {
  const auto ids = t.encode(text, false);
  return {ids.begin(), ids.end()};
}

TEST(ToolAgentLoopQwen, TwoCallsInATurnGiveTheTokensOfTheWholeConversation) {
  const data::Tokenizer tokenizer = data::Tokenizer::load(kQwenDir);
  const data::ChatTemplate chat = data::ChatTemplate::from_template(read(kTemplate), kTemplate);
  tools::ConfiguredTool calculator;
  calculator.name = "calculator";
  calculator.schema = tools::find_tool("calculator").schema;
  MultiTurnOptions options;
  options.max_parallel_calls = 2;
  ToolAgentLoop loop(tokenizer, chat, {calculator}, options);
  const int64_t im_end = *tokenizer.token_to_id("<|im_end|>");

  const ordered_json tools = ordered_json::array({calculator.schema});
  const ordered_json user = {{"role", "user"}, {"content", "What are 123*456 and 7/8 + 1/8?"}};
  std::vector<int64_t> trajectory =
      encode(tokenizer, chat.render(ordered_json::array({user}), true, {{"tools", tools}}));
  // The model's turn: some thought, two calls (Qwen2.5 writes each on its
  // own lines), its end-of-turn token.
  const std::string turn =
      "Let me compute both.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
      "{\"expression\": \"123*456\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculator\", "
      "\"arguments\": {\"expression\": \"7/8 + 1/8\"}}\n</tool_call>";
  engine::GeneratedSequence seq;
  seq.response = encode(tokenizer, turn);
  seq.response.push_back(im_end);
  seq.generated_mask.assign(seq.response.size(), 1);
  trajectory.insert(trajectory.end(), seq.response.begin(), seq.response.end());
  const std::vector<int64_t> appended = loop.on_stop(seq)->get();
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>(appended.begin(), appended.end()), false),
            "\n<|im_start|>user\n<tool_response>\n56088\n</tool_response>\n<tool_response>\n1\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  trajectory.insert(trajectory.end(), appended.begin(), appended.end());
  const ordered_json whole =
      ordered_json::array({user,
                           {{"role", "assistant"}, {"content", turn}},
                           {{"role", "tool"}, {"content", "56088"}},
                           {{"role", "tool"}, {"content", "1"}}});
  EXPECT_EQ(trajectory, encode(tokenizer, chat.render(whole, true, {{"tools", tools}})));
  EXPECT_EQ(loop.metrics(0, 0).tool_calls, 2);
  EXPECT_EQ(loop.metrics(0, 0).tool_errors, 0);
}

}  // namespace
}  // namespace baton::workers
