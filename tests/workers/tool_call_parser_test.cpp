// Tool calls parsed out of assistant turns as Qwen (hermes) and Llama 3 (llama3_json) write
// them (workers/tools/tool_call_parser.h).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "workers/tools/tool_call_parser.h"

namespace baton::tools {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

ToolCallParse hermes(const std::string& text) {
  return parse_tool_calls(text, ToolCallFormat::kHermes);
}

ToolCallParse llama(const std::string& text) {
  return parse_tool_calls(text, ToolCallFormat::kLlama3Json);
}

// A block as Qwen2.5's chat template writes one.
std::string block(const std::string& json) { return "<tool_call>\n" + json + "\n</tool_call>"; }

const char* const kAddCall = R"({"name": "calculator", "arguments": {"expression": "2+2"}})";
const char* const kEchoCall = R"({"name": "echo", "arguments": {"text": "hi", "n": 2}})";

// ---- hermes ----------------------------------------------------------------------------------

TEST(HermesToolCalls, OneCall) {
  const ToolCallParse p = hermes(block(kAddCall));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[0].arguments, nlohmann::json({{"expression", "2+2"}}));
  EXPECT_EQ(p.content, "");
  EXPECT_TRUE(p.errors.empty());
}

TEST(HermesToolCalls, SeveralCallsInOneTurnKeepTheirOrderAndTheContent) {
  const std::string text = "<think>\nTwo things to do.\n</think>\n\nLet me call both.\n" +
                           block(kAddCall) + "\n" + block(kEchoCall) + "\nDone.";
  const ToolCallParse p = hermes(text);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[1].name, "echo");
  EXPECT_EQ(p.calls[1].arguments, nlohmann::json({{"text", "hi"}, {"n", 2}}));
  EXPECT_EQ(p.content, "<think>\nTwo things to do.\n</think>\n\nLet me call both.\n\n\nDone.");
  EXPECT_TRUE(p.errors.empty());
}

TEST(HermesToolCalls, ArgumentsAsAStringHoldingAnObject) {
  const ToolCallParse p =
      hermes(block(R"({"name": "calculator", "arguments": "{\"expression\": \"1+1\"}"})"));
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, nlohmann::json({{"expression", "1+1"}}));
  EXPECT_TRUE(p.errors.empty());
}

TEST(HermesToolCalls, MissingOrNullArgumentsAreEmpty) {
  const ToolCallParse p =
      hermes(block(R"({"name": "now"})") + block(R"({"name": "now", "arguments": null})"));
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].arguments, nlohmann::json::object());
  EXPECT_EQ(p.calls[1].arguments, nlohmann::json::object());
}

TEST(HermesToolCalls, MalformedJsonIsAnErrorAndTheOtherCallsAreKept) {
  const std::string bad = block(R"({"name": "calculator", "arguments": {"expression": }})");
  const std::string text = "ok " + bad + block(kEchoCall);
  const ToolCallParse p = hermes(text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "echo");
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "tool call 1 at offset 3");
  EXPECT_CONTAINS(p.errors[0], "invalid JSON");
  EXPECT_EQ(p.content, "ok ");  // the malformed block is dropped, as verl does
}

TEST(HermesToolCalls, UnterminatedTagIsAnErrorAndStaysContent) {
  const std::string open = "<tool_call>\n{\"name\": \"echo\", \"argu";
  ToolCallParse p = hermes("Calling. " + open);
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "tool call 1 at offset 9: <tool_call> without </tool_call>");
  EXPECT_EQ(p.content, "Calling. " + open);

  // After a well-formed call.
  p = hermes(block(kAddCall) + open);
  ASSERT_EQ(p.calls.size(), 1u);
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "tool call 2");
  EXPECT_EQ(p.content, open);
}

TEST(HermesToolCalls, MissingNameAndNonObjectArgumentsAreErrors) {
  const ToolCallParse p =
      hermes(block(R"({"arguments": {"x": 1}})") + block(R"({"name": "", "arguments": {}})") +
             block(R"({"name": "f", "arguments": [1, 2]})") +
             block(R"({"name": "f", "arguments": "1+1"})") +
             block(R"({"name": "f", "arguments": "[1]"})") + block(R"(["f", {}])"));
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 6u);
  EXPECT_CONTAINS(p.errors[0], "tool call 1");
  EXPECT_CONTAINS(p.errors[0], R"(missing "name")");
  EXPECT_CONTAINS(p.errors[1], R"("name" must be a non-empty string)");
  EXPECT_CONTAINS(p.errors[2], R"("arguments" must be a JSON object, not a JSON array)");
  EXPECT_CONTAINS(p.errors[3], R"("arguments" is a string that is not JSON)");
  EXPECT_CONTAINS(p.errors[4], R"("arguments" is a string that holds a JSON array)");
  EXPECT_CONTAINS(p.errors[5], "expected a JSON object");
  EXPECT_CONTAINS(p.errors[5], "tool call 6");
}

TEST(HermesToolCalls, OtherFormatsAreContent) {
  for (const std::string& text :
       {std::string(R"({"name": "calculator", "parameters": {"expression": "2+2"}})"),
        std::string(R"(<|python_tag|>{"name": "calculator", "parameters": {}})"),
        std::string("No tools needed: 4."), std::string("A stray </tool_call> tag."),
        std::string("")}) {
    const ToolCallParse p = hermes(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_TRUE(p.errors.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

// ---- llama3_json -----------------------------------------------------------------------------

TEST(Llama3JsonToolCalls, TheWholeMessageIsACall) {
  // As Llama 3.1's chat template writes an assistant's tool call.
  const ToolCallParse p = llama(R"({"name": "calculator", "parameters": {"expression": "2+2"}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "calculator");
  EXPECT_EQ(p.calls[0].arguments, nlohmann::json({{"expression", "2+2"}}));
  EXPECT_EQ(p.content, "");
  EXPECT_TRUE(p.errors.empty());
}

TEST(Llama3JsonToolCalls, AfterPythonTagAndBeforeTheEndToken) {
  for (const char* text :
       {R"(<|python_tag|>{"name": "calculator", "parameters": {"expression": "1"}}<|eom_id|>)",
        "\n <|python_tag|> {\"name\": \"calculator\", \"parameters\": {\"expression\": \"1\"}}\n"
        "<|eot_id|>\n"}) {
    const ToolCallParse p = llama(text);
    ASSERT_EQ(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.calls[0].arguments, nlohmann::json({{"expression", "1"}}));
    EXPECT_TRUE(p.errors.empty()) << text;
    EXPECT_EQ(p.content, "");
  }
}

TEST(Llama3JsonToolCalls, SeveralCallsSeparatedBySemicolons) {
  const ToolCallParse p =
      llama(R"(<|python_tag|>{"name": "calculator", "parameters": {"expression": "f(x); {y}"}}; )"
            R"({"name": "echo", "arguments": {"text": "a;b"}};{"name": "now", "parameters": {}};)");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].arguments, nlohmann::json({{"expression", "f(x); {y}"}}));
  EXPECT_EQ(p.calls[1].name, "echo");  // "arguments" is accepted for "parameters"
  EXPECT_EQ(p.calls[1].arguments, nlohmann::json({{"text", "a;b"}}));
  EXPECT_EQ(p.calls[2].name, "now");
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.content, "");
}

TEST(Llama3JsonToolCalls, TextThatDoesNotStartWithABraceIsContent) {
  for (const std::string& text :
       {std::string("The answer is 4."),
        std::string(R"(<|python_tag|>brave_search.call(query="weather"))"),
        "<tool_call>\n" + std::string(kAddCall) + "\n</tool_call>",
        std::string(R"(Sure: {"name": "calculator", "parameters": {}})"), std::string("")}) {
    const ToolCallParse p = llama(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_TRUE(p.errors.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(Llama3JsonToolCalls, MalformedCallsAreErrors) {
  ToolCallParse p =
      llama(R"({"name": "a", "parameters": {"x": }}; {"name": "b", "parameters": {}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "b");
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "tool call 1 at offset 0: invalid JSON");

  p = llama(R"({"name": "a", "parameters": {"x": 1})");
  EXPECT_TRUE(p.calls.empty());
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "not closed");

  p = llama(R"({"parameters": {}})");
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], R"(missing "name")");

  p = llama(R"({"name": "a", "parameters": 3})");
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], R"("parameters" must be a JSON object)");
}

TEST(Llama3JsonToolCalls, TextAfterTheCallsIsAnErrorAndContent) {
  const ToolCallParse p = llama(R"({"name": "a", "parameters": {}} and then I wait.)");
  ASSERT_EQ(p.calls.size(), 1u);
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_CONTAINS(p.errors[0], "not another call at offset 32");
  EXPECT_EQ(p.content, "and then I wait.");
}

// ---- Formats by name -------------------------------------------------------------------------

TEST(ToolCallFormat, ByName) {
  EXPECT_EQ(parse_tool_call_format("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(parse_tool_call_format("llama3_json"), ToolCallFormat::kLlama3Json);
  for (const ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json})
    EXPECT_EQ(parse_tool_call_format(tool_call_format_name(f)), f);
  try {
    parse_tool_call_format("qwen");
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "'qwen'");
    EXPECT_CONTAINS(e.what(), "hermes or llama3_json");
  }
}

}  // namespace
}  // namespace baton::tools
