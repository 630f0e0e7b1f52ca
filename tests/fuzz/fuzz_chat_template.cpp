// Fuzzes the Jinja chat-template interpreter (text/jinja/template.h, text/chat_template.h):
// the input is a tokenizer's chat_template, parsed and rendered with a small
// fixed conversation, as apply_chat_template would. A template outside the
// supported subset, or one that fails while rendering, must throw JinjaError.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace {

const std::vector<baton::data::ChatMessage>& messages() {
  static const std::vector<baton::data::ChatMessage> kMessages = {
      {"system", "You are a helpful assistant."},
      {"user", "What is 2+2?"},
      {"assistant", "4"},
      {"user", "And 3+3?"},
  };
  return kMessages;
}

// The JSON form with what richer templates read: content parts, tool calls,
// reasoning, tools and a fixed date.
const nlohmann::ordered_json& json_messages() {
  static const nlohmann::ordered_json kJson = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
     "tool_calls": [{"type": "function", "function": {"name": "weather",
                     "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "18C"}
  ])");
  return kJson;
}

const nlohmann::ordered_json& extra_variables() {
  static const nlohmann::ordered_json kJson = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "enable_thinking": false
  })");
  return kJson;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto chat = baton::data::ChatTemplate::from_template(text, "fuzz");
    chat.render(messages(), /*add_generation_prompt=*/true);
    // Without a template the contents are joined, and must be strings (these are not).
    if (!chat.has_template()) return 0;
    baton::data::JinjaRenderOptions options;
    options.now = std::chrono::system_clock::time_point(std::chrono::seconds(1721952000));
    chat.render(json_messages(), /*add_generation_prompt=*/false, extra_variables(), options);
  } catch (const baton::data::JinjaError&) {
  }
  return 0;
}
