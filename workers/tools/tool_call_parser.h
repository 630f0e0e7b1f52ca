// The tool calls in an assistant turn's text, in the format the model writes them (verl's
// ToolParser, vLLM's tool call parsers of the same names). The text is the decoded response
// with its special tokens.
//
// Formats:
//   hermes       (Qwen2.5, Qwen3) every block
//                  <tool_call>
//                  {"name": "calculator", "arguments": {"expression": "2+2"}}
//                  </tool_call>
//                is a call; "arguments" may also be a JSON string holding an object (some models
//                write that), and may be missing or null for a call without arguments ({}).
//                The content is the text with the blocks removed, as it is otherwise (verl's).
//                A block that does not parse is dropped and reported in `errors`; a <tool_call>
//                without </tool_call> is reported and left in the content.
//   llama3_json  (Llama 3.1 and later, JSON tool calling) the whole message, after optional
//                whitespace and <|python_tag|>, is one call {"name": ..., "parameters": {...}}
//                ("arguments" is accepted too), or several separated by ';', and may end with
//                <|eom_id|> or <|eot_id|>. A message that does not start with '{' there is
//                content without calls (Llama's built-in tools, `<|python_tag|>brave_search.
//                call(...)`, included). In a message that does, every part is a call or an
//                error; text after the last call that is not another call is reported and kept
//                as the content.
//
// Errors never throw: each malformed call gives one entry in `errors`, naming the call's number
// (1-based), its byte offset in the text and what is wrong, and the well-formed calls are kept.
//
// Example:
//   ToolCallParse p = parse_tool_calls(
//       "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": "
//       "{\"expression\": \"2+2\"}}\n</tool_call>", ToolCallFormat::kHermes);
//   // p.content "Let me compute.\n", p.calls[0].name "calculator",
//   // p.calls[0].arguments {"expression": "2+2"}, p.errors empty
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace baton::tools {

enum class ToolCallFormat { kHermes, kLlama3Json };

struct ParsedToolCall {
  std::string name;
  nlohmann::json arguments;  // always an object
};

struct ToolCallParse {
  std::string content;                // the text outside the calls
  std::vector<ParsedToolCall> calls;  // in the order written
  std::vector<std::string> errors;    // one per malformed call: what and where
};

ToolCallParse parse_tool_calls(std::string_view text, ToolCallFormat format);

// "hermes" or "llama3_json" (verl's and vLLM's names). Throws baton::InvalidArgument naming
// `name` and the choices.
ToolCallFormat parse_tool_call_format(std::string_view name);

// The name parse_tool_call_format takes for `format`.
std::string_view tool_call_format_name(ToolCallFormat format);

}  // namespace baton::tools
