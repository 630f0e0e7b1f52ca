// Rendering chat messages into prompt text with the tokenizer's Jinja chat template, byte for
// byte as transformers' apply_chat_template(messages, tokenize=False) renders it (see
// jinja.h for the Jinja subset and how a template outside it fails). A tokenizer without a
// chat_template joins the messages' contents with newlines.
//
// Like transformers, render() gives the template `messages`, `add_generation_prompt`,
// `tools` and `documents` (None unless given), the tokenizer's named special tokens
// (`bos_token`, `eos_token`, ...) and any extra variables (which win over the special tokens);
// keys of a message whose value is null are dropped, and a message's reasoning given as
// `reasoning_content`, `thinking` or `reasoning` is also passed under `reasoning_content` and
// `thinking`, as transformers does.
//
// Example:
//   auto chat = baton::data::ChatTemplate::from_tokenizer(tokenizer, "models/m");
//   std::string text = chat.render({{"user", "What is 2+2?"}}, /*add_generation_prompt=*/true);
//   nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([{"role": "user",
//       "content": "Hi"}])");
//   std::string thinking_off = chat.render(messages, true, {{"enable_thinking", false}});
//
// Thread safety: a ChatTemplate is immutable; render may run concurrently.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/jinja/template.h"

namespace baton::data {

class Tokenizer;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Parses `jinja_template` (the tokenizer's chat_template, "" for none). Throws JinjaError naming `source`, the line and the construct for a template outside the
  // supported subset. The template sees no special tokens (see from_tokenizer).
  static ChatTemplate from_template(const std::string& jinja_template, const std::string& source);
  // The tokenizer's chat_template, with its named special tokens (bos_token, eos_token, ...)
  // as variables.
  static ChatTemplate from_tokenizer(const Tokenizer& tokenizer, const std::string& source);

  // The text transformers' apply_chat_template(messages, add_generation_prompt, tokenize=False)
  // gives for this template.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The same for messages as JSON (a list of objects: content may be a list of parts,
  // tool_calls, reasoning_content, ...) and `extra_variables` (a JSON object, e.g. {"tools":
  // [...], "enable_thinking": false, "date_string": "26 Jul 2024"}; null for none).
  // `options.now` fixes the date strftime_now() gives.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_variables,
                     const JinjaRenderOptions& options = {}) const;

  // False for a tokenizer without a chat template (the contents are joined with "\n").
  bool has_template() const { return jinja_.has_value(); }
  // The variables every render gets besides the messages (the special tokens).
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const {
    return special_tokens_;
  }

 private:
  std::optional<JinjaTemplate> jinja_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace baton::data
