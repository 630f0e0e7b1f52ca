// Chat rendering: Qwen2's template against transformers' apply_chat_template (jinja2), as the
// tokenizer fixture script rendered it, special tokens, JSON messages and extra variables.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer.h"

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

TEST(ChatTemplate, Qwen2TemplateRendersAsTransformersAndTokenizesAsHf) {
  std::ifstream in(kFixtures + "/tokenizer_expected.json");
  const auto expected = nlohmann::json::parse(in).at("chat");
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const ChatTemplate chat = ChatTemplate::from_tokenizer(tok, "bpe");
  ASSERT_TRUE(chat.has_template());
  ASSERT_EQ(expected.size(), 6u);
  for (const auto& c : expected) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    const std::string text = chat.render(messages, c.at("add_generation_prompt").get<bool>());
    EXPECT_EQ(text, c.at("text").get<std::string>());
    EXPECT_EQ(tok.encode(text, false), c.at("ids").get<std::vector<int32_t>>());
  }
}

TEST(ChatTemplate, NoTemplateJoinsContentsWithNewlines) {
  const ChatTemplate chat = ChatTemplate::from_template("", "m");
  EXPECT_FALSE(chat.has_template());
  EXPECT_EQ(chat.render({{"system", "Be brief."}, {"user", "2+2?"}}, true), "Be brief.\n2+2?");
}

TEST(ChatTemplate, SpecialTokensComeFromTheTokenizer) {
  std::ifstream in(kFixtures + "/bpe/tokenizer.json");
  const std::string tokenizer_json((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  const std::string llama3 =
      "{{- bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
      "'<|end_header_id|>\\n\\n' + message['content'] | trim + eos_token }}{% endfor %}";
  const Tokenizer tok = Tokenizer::from_json(
      tokenizer_json,
      nlohmann::json(
          {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|im_end|>"}, {"chat_template", llama3}})
          .dump(),
      "models/m");
  const ChatTemplate chat = ChatTemplate::from_tokenizer(tok, "models/m");
  EXPECT_EQ(chat.render({{"user", " hi "}}, false),
            "<|endoftext|><|start_header_id|>user<|end_header_id|>\n\nhi<|im_end|>");
  // Extra variables win over the tokenizer's special tokens, as in transformers.
  EXPECT_EQ(chat.render(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x"}])"),
                        false, {{"bos_token", ""}}),
            "<|start_header_id|>user<|end_header_id|>\n\nx<|im_end|>");
}

TEST(ChatTemplate, JsonMessagesAndExtraVariablesReachTheTemplate) {
  const std::string text =
      "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}"
      "{% else %}{{ m.content | map(attribute='text') | join('+') }}{% endif %}"
      "{% if m.tool_calls %} calls {{ m.tool_calls[0].function.arguments | tojson }}{% endif %}"
      "{% if m.reasoning_content is defined %} thought {{ m.thinking }}{% endif %}"
      "{% if m.name is defined %} named{% endif %}\n{% endfor %}"
      "{{ tools | length if tools else 'no tools' }} {{ enable_thinking }}"
      "{{ documents is none }}";
  const ChatTemplate chat = ChatTemplate::from_template(text, "m");
  const auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": "", "name": null, "reasoning": "hmm",
     "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": [true, null, 0.5]}}}]}
  ])");
  const auto extra =
      nlohmann::ordered_json::parse(R"({"tools": [{"a": 1}, {"b": 2}], "enable_thinking": false})");
  // trim_blocks removes the newline after {% endif %}.
  EXPECT_EQ(chat.render(messages, false, extra),
            "user:a+bassistant: calls {\"z\": 1, \"a\": [true, null, 0.5]} thought hmm"
            "2 FalseTrue");
  EXPECT_NE(chat.render(messages, false, nullptr).find("no tools"), std::string::npos);
}

TEST(ChatTemplate, TemplatesOutsideTheSubsetFailNamingTheSource) {
  try {
    ChatTemplate::from_template("{% for m in messages %}\n{% include 'other' %}{% endfor %}",
                                "models/llama/tokenizer_config.json");
    FAIL() << "no error";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("models/llama/tokenizer_config.json:2"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("include"), std::string::npos);
  }
}

}  // namespace
}  // namespace baton::data
