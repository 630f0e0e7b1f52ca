#include "data/chat_template.h"

#include "data/tokenizer_error.h"

namespace baton::data {
namespace {

// Jinja string literals in the template write a newline as the two characters \n.
std::string unescape_jinja(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::from_template(const std::string& jinja_template,
                                         const std::string& source) {
  ChatTemplate t;
  if (jinja_template.empty()) return t;
  const bool chatml = jinja_template.find("<|im_start|>") != std::string::npos &&
                      jinja_template.find("<|im_end|>") != std::string::npos &&
                      jinja_template.find("message['role']") != std::string::npos &&
                      jinja_template.find("message['content']") != std::string::npos;
  // Templates with tools, reasoning content or images render differently from plain ChatML.
  const bool extended = jinja_template.find("tools") != std::string::npos ||
                        jinja_template.find("reasoning_content") != std::string::npos ||
                        jinja_template.find("image") != std::string::npos;
  if (!chatml || extended) {
    throw TokenizerError(source +
                         ": the chat_template is not one baton can render (it renders "
                         "Qwen2's ChatML template, or concatenates the messages when the "
                         "tokenizer has no chat_template); give string prompts instead, or "
                         "remove chat_template from tokenizer_config.json");
  }
  t.kind_ = Kind::kChatMl;
  // Qwen2's template inserts '<|im_start|>system\n...<|im_end|>\n' when messages[0] is not a
  // system message.
  const std::string open = "'<|im_start|>system\\n";
  if (const std::size_t begin = jinja_template.find(open);
      begin != std::string::npos && jinja_template.find("!= 'system'") != std::string::npos) {
    const std::size_t text = begin + open.size();
    const std::size_t end = jinja_template.find("<|im_end|>", text);
    const std::string inner = jinja_template.substr(text, end - text);
    if (end != std::string::npos && inner.find('\'') == std::string::npos) {
      t.default_system_ = unescape_jinja(inner);
    }
  }
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (kind_ == Kind::kConcatenate) {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (i > 0) out += '\n';
      out += messages[i].content;
    }
    return out;
  }
  if (!messages.empty() && messages.front().role != "system" && !default_system_.empty()) {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace baton::data
