// Chat rendering against transformers' apply_chat_template (jinja2), as the fixture script
// rendered Qwen2's template.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

TEST(ChatTemplate, Qwen2TemplateRendersAsTransformersAndTokenizesAsHf) {
  std::ifstream in(kFixtures + "/tokenizer_expected.json");
  const auto expected = nlohmann::json::parse(in).at("chat");
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const ChatTemplate chat = ChatTemplate::from_template(tok.chat_template(), "bpe");
  ASSERT_EQ(chat.kind(), ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(chat.default_system(), "You are a helpful assistant.");
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
  EXPECT_EQ(chat.kind(), ChatTemplate::Kind::kConcatenate);
  EXPECT_EQ(chat.render({{"system", "Be brief."}, {"user", "2+2?"}}, true), "Be brief.\n2+2?");
}

TEST(ChatTemplate, ChatMlWithoutDefaultSystemAddsNone) {
  const std::string qwen3_like =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const ChatTemplate chat = ChatTemplate::from_template(qwen3_like, "m");
  EXPECT_EQ(chat.render({{"user", "hi"}}, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, OtherTemplatesFailNamingTheSource) {
  const std::string llama3 =
      "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
      "'<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}";
  try {
    ChatTemplate::from_template(llama3, "models/llama/tokenizer_config.json");
    FAIL() << "no error";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("models/llama/tokenizer_config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos);
  }
}

}  // namespace
}  // namespace baton::data
