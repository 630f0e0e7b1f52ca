// Rendering chat messages into prompt text. Two renderings exist for now: ChatML (Qwen2's
// template: <|im_start|>role\ncontent<|im_end|>\n, with the default system message the template
// inserts when the chat has none) and, for a tokenizer without a chat_template, the contents
// joined with newlines. Any other Jinja template fails with an error naming it.
//
// Example:
//   auto chat = baton::data::ChatTemplate::from_template(tokenizer.chat_template(), "models/m");
//   std::string text = chat.render({{"user", "What is 2+2?"}}, /*add_generation_prompt=*/true);
#pragma once

#include <string>
#include <vector>

namespace baton::data {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind {
    kConcatenate,  // no chat_template: contents joined with "\n"
    kChatMl,       // Qwen2's ChatML
  };

  // Recognises `jinja_template` (the tokenizer's chat_template, "" for none). Throws
  // TokenizerError naming `source` for a template that is neither empty nor ChatML.
  static ChatTemplate from_template(const std::string& jinja_template, const std::string& source);

  // The text transformers' apply_chat_template(messages, add_generation_prompt, tokenize=False)
  // gives for this template.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  Kind kind() const { return kind_; }
  // The system message ChatML inserts when the chat does not start with one ("" for none).
  const std::string& default_system() const { return default_system_; }

 private:
  Kind kind_ = Kind::kConcatenate;
  std::string default_system_;
};

}  // namespace baton::data
