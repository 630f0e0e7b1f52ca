#include "text/chat_template.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer.h"

namespace baton::data {
namespace {

using Json = nlohmann::ordered_json;

// What transformers does to each message before rendering: keys with a null value go, and
// reasoning given under any of its names is passed as `thinking` and `reasoning_content` too.
Json prepare_message(const Json& message) {
  if (!message.is_object()) return message;
  Json m = Json::object();
  for (const auto& [k, v] : message.items()) {
    if (!v.is_null()) m[k] = v;
  }
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    if (!m.contains(key)) continue;
    const Json reasoning = m[key];
    Json aliased = Json::object();
    aliased["thinking"] = reasoning;
    for (const auto& [k, v] : m.items()) aliased[k] = v;
    aliased["reasoning_content"] = reasoning;
    return aliased;
  }
  return m;
}

}  // namespace

ChatTemplate ChatTemplate::from_template(const std::string& jinja_template,
                                         const std::string& source) {
  ChatTemplate t;
  if (!jinja_template.empty()) t.jinja_ = JinjaTemplate::parse(jinja_template, source);
  return t;
}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tokenizer, const std::string& source) {
  ChatTemplate t = from_template(tokenizer.chat_template(), source);
  t.special_tokens_ = tokenizer.special_tokens();
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  Json list = Json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render(list, add_generation_prompt, Json());
}

std::string ChatTemplate::render(const Json& messages, bool add_generation_prompt,
                                 const Json& extra_variables,
                                 const JinjaRenderOptions& options) const {
  if (!messages.is_array()) {
    throw TokenizerError("chat messages: expected a list of message objects, got " +
                         std::string(messages.type_name()));
  }
  if (!jinja_) {
    std::string out;
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const Json& content = messages[i].is_object() ? messages[i].value("content", Json()) : Json();
      if (!content.is_string()) {
        throw TokenizerError("chat messages[" + std::to_string(i) +
                             "].content: without a chat_template the contents must be strings");
      }
      if (i > 0) out += '\n';
      out += content.get<std::string>();
    }
    return out;
  }
  if (!extra_variables.is_null() && !extra_variables.is_object()) {
    throw TokenizerError(jinja_->source() + ": chat template variables: expected a JSON object");
  }
  Json variables = Json::object();
  for (const auto& [name, token] : special_tokens_) variables[name] = token;
  if (extra_variables.is_object()) {
    for (const auto& [k, v] : extra_variables.items()) variables[k] = v;
  }
  Json prepared = Json::array();
  for (const Json& m : messages) prepared.push_back(prepare_message(m));
  variables["messages"] = std::move(prepared);
  variables["add_generation_prompt"] = add_generation_prompt;
  if (!variables.contains("tools")) variables["tools"] = nullptr;
  if (!variables.contains("documents")) variables["documents"] = nullptr;
  return jinja_->render(variables, options);
}

}  // namespace baton::data
