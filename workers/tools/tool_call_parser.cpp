#include "workers/tools/tool_call_parser.h"

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "base/errors.h"

namespace baton::tools {
namespace {

using detail::cat;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::array<std::string_view, 2> kLlamaEndTokens = {"<|eom_id|>", "<|eot_id|>"};

// The keys a format's call may hold its arguments under, the preferred one first.
constexpr std::array<std::string_view, 1> kHermesArgumentKeys = {"arguments"};
constexpr std::array<std::string_view, 2> kLlamaArgumentKeys = {"parameters", "arguments"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_space(std::string_view text, size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_error_message(const nlohmann::json::exception& e) {
  std::string_view message = e.what();
  if (message.starts_with('[')) {
    const size_t close = message.find("] ");
    if (close != std::string_view::npos) message.remove_prefix(close + 2);
  }
  return std::string(message);
}

// Fills `call` from a parsed call object; returns what is wrong with it ("" if nothing).
template <size_t N>
std::string read_call(const nlohmann::json& object,
                      const std::array<std::string_view, N>& argument_keys, ParsedToolCall& call) {
  if (!object.is_object())
    return cat(R"(expected a JSON object {"name": ..., ")", argument_keys[0],
               R"(": {...}}, not a JSON )", object.type_name());
  const auto name = object.find("name");
  if (name == object.end()) return R"(missing "name")";
  if (!name->is_string() || name->get_ref<const std::string&>().empty())
    return cat(R"("name" must be a non-empty string, got )", name->dump());
  call.name = name->get<std::string>();

  const nlohmann::json* arguments = nullptr;
  std::string_view key = argument_keys[0];
  for (const std::string_view k : argument_keys) {
    if (const auto it = object.find(k); it != object.end()) {
      arguments = &*it;
      key = k;
      break;
    }
  }
  if (!arguments || arguments->is_null()) {
    call.arguments = nlohmann::json::object();
    return "";
  }
  if (arguments->is_string()) {
    // Some models write the arguments as a JSON string holding the object.
    try {
      call.arguments = nlohmann::json::parse(arguments->get_ref<const std::string&>());
    } catch (const nlohmann::json::exception& e) {
      return cat('"', key, "\" is a string that is not JSON: ", json_error_message(e));
    }
    if (!call.arguments.is_object())
      return cat('"', key, "\" is a string that holds a JSON ", call.arguments.type_name(),
                 ", not an object");
    return "";
  }
  if (!arguments->is_object())
    return cat('"', key, "\" must be a JSON object, not a JSON ", arguments->type_name());
  call.arguments = *arguments;
  return "";
}

// Parses call number `index`, written as `json_text` at byte `offset` of the turn, into
// out.calls, or says what is wrong with it in out.errors.
template <size_t N>
void parse_call(std::string_view json_text, size_t offset, int index,
                const std::array<std::string_view, N>& argument_keys, ToolCallParse& out) {
  const std::string where = cat("tool call ", index, " at offset ", offset, ": ");
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    out.errors.push_back(where + "invalid JSON: " + json_error_message(e));
    return;
  }
  ParsedToolCall call;
  if (std::string error = read_call(object, argument_keys, call); !error.empty()) {
    out.errors.push_back(where + error);
    return;
  }
  out.calls.push_back(std::move(call));
}

ToolCallParse parse_hermes(std::string_view text) {
  ToolCallParse out;
  size_t pos = 0;
  for (int index = 1;; ++index) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) {
      out.content.append(text.substr(pos));
      break;
    }
    out.content.append(text.substr(pos, open - pos));
    const size_t body = open + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    if (close == std::string_view::npos) {
      out.errors.push_back(
          cat("tool call ", index, " at offset ", open, ": <tool_call> without </tool_call>"));
      out.content.append(text.substr(open));
      break;
    }
    parse_call(text.substr(body, close - body), open, index, kHermesArgumentKeys, out);
    pos = close + kHermesClose.size();
  }
  return out;
}

// The end of the JSON object (or array) that starts at `pos`, matching brackets outside
// strings; npos when the text ends first. Mismatched kinds of brackets are left to the parser.
size_t json_value_end(std::string_view text, size_t pos) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

ToolCallParse parse_llama3_json(std::string_view text) {
  ToolCallParse out;
  size_t pos = skip_space(text, 0);
  if (text.substr(pos).starts_with(kPythonTag)) pos = skip_space(text, pos + kPythonTag.size());
  if (pos == text.size() || text[pos] != '{') {
    out.content = std::string(text);
    return out;
  }
  // The message without its trailing whitespace and end-of-turn tokens.
  std::string_view body = text;
  for (bool trimmed = true; trimmed;) {
    trimmed = false;
    while (!body.empty() && is_space(body.back())) body.remove_suffix(1);
    for (const std::string_view token : kLlamaEndTokens) {
      if (body.ends_with(token)) {
        body.remove_suffix(token.size());
        trimmed = true;
      }
    }
  }
  for (int index = 1; pos < body.size(); ++index) {
    const size_t start = pos;
    const size_t end = json_value_end(body, start);
    if (end == std::string_view::npos) {
      out.errors.push_back(
          cat("tool call ", index, " at offset ", start, ": the JSON object is not closed"));
      break;
    }
    parse_call(body.substr(start, end - start), start, index, kLlamaArgumentKeys, out);
    pos = skip_space(body, end);
    if (pos == body.size()) break;
    if (body[pos] == ';') {
      pos = skip_space(body, pos + 1);
      if (pos == body.size()) break;  // a trailing ';'
      if (body[pos] == '{') continue;
    }
    out.errors.push_back(cat("tool call ", index, " at offset ", start,
                             ": followed by text that is not another call at offset ", pos,
                             " (calls are separated by ';')"));
    out.content = std::string(body.substr(pos));
    break;
  }
  return out;
}

}  // namespace

ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return parse_hermes(text);
    case ToolCallFormat::kLlama3Json:
      return parse_llama3_json(text);
  }
  throw InternalError(cat("parse_tool_calls: unknown ToolCallFormat ", static_cast<int>(format)));
}

ToolCallFormat parse_tool_call_format(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  throw InvalidArgument(cat("unknown tool call format '", name, "'; choose hermes or llama3_json"));
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
  }
  return "?";
}

}  // namespace baton::tools
