// Tools a multi-turn rollout's model may call (verl's agent loop), by name: each tool is its
// OpenAI function schema (what the chat template's `tools` shows the model) and the function
// that runs a call.
//
// Built-in tools:
//   calculator         exact integer and rational arithmetic (workers/tools/calculator_tool.h)
//   code_interpreter   code run in a sandbox: no network, rlimits, a timeout
//                      (workers/tools/code_runner_tool.h)
//
// Example:
//   register_tool("echo", nlohmann::ordered_json::parse(R"({"type": "function", "function": {
//                     "name": "echo", "description": "Repeats the text.",
//                     "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
//                                    "required": ["text"]}}})"),
//                 [](const nlohmann::json& arguments, const nlohmann::json& tools_kwargs) {
//                   return ToolResult{.text = arguments["text"].get<std::string>()};
//                 });
//   ToolResult r = call_tool("calculator", {{"expression", "1/3 + 1/6"}}, {});  // r.text "1/2"
//   ToolResult e = call_tool("calculator", {}, {});  // e.error: "expression" is missing
//
// In a driver, register at namespace scope with BATON_TOOL(name, schema_json, fn) (below): it
// runs before main() in the driver and in every worker process of the executable, so the
// process that runs the agent loop knows the name too.
//
// Schemas are nlohmann::ordered_json: the template prints them with `tojson`, which keeps the
// keys in the order they were written (as Python's json.dumps does), so a prompt matches verl's
// byte for byte. A nlohmann::json converts to one implicitly.
//
// Thread safety: registration, lookup and call_tool may happen from any thread; the tool
// functions themselves are called without a lock (a tool with state guards it itself).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "base/static_registration.h"

namespace baton::tools {

// What a call gives back to the model, and what the rollout records of it.
struct ToolResult {
  std::string text;              // the tool message's content
  bool error = false;            // the call failed; `text` says why
  std::optional<double> reward;  // a tool that scores (verl's calc_gsm8k_reward), added to the
                                 // turn's reward by the agent loop
  std::map<std::string, double> metrics;  // logged per call (verl's tool metrics)
};

// A tool: the call's parsed JSON arguments (an object holding every required argument) and the
// row's tools_kwargs for this tool (JSON, {} if none) -> its result. May throw: call_tool turns
// an exception into an error result whose text names the tool and the message.
using ToolFunction =
    std::function<ToolResult(const nlohmann::json& arguments, const nlohmann::json& tools_kwargs)>;

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json schema;  // OpenAI function schema: {"type": "function", "function": {...}}
  ToolFunction fn;
};

// Registers a tool. Throws baton::InvalidArgument for an empty name or function, a name already
// registered (built-ins included), or a schema that is not an object whose "function" is an
// object with "name" equal to `name`.
void register_tool(std::string name, nlohmann::ordered_json schema, ToolFunction fn);

// The tool registered as `name`; the reference stays valid for the program's lifetime. Throws
// baton::InvalidArgument naming it and every registered tool.
const ToolSpec& find_tool(std::string_view name);

// Registered tool names, sorted.
std::vector<std::string> tool_names();

// Runs a call and never throws: an unknown tool, arguments that are not an object, a missing
// required argument (the schema's function.parameters.required) or a tool that throws give an
// error result (error = true) whose text says what was wrong, to be shown to the model.
ToolResult call_tool(std::string_view name, const nlohmann::json& arguments,
                     const nlohmann::json& tools_kwargs);

}  // namespace baton::tools

// Registers a tool in every process of the executable, before main(). At namespace scope of a
// .cpp file; `schema_json` is a string literal holding the JSON schema, the function may be a
// lambda (commas and all) or a function's name. A bad schema aborts at start-up, naming the tool.
#define BATON_TOOL(name, schema_json, ...)                                                \
  static const bool BATON_REGISTRATION_NAME(baton_tool_registered_) =                     \
      ::baton::detail::register_at_startup("BATON_TOOL", name, [] {                       \
        ::baton::tools::register_tool(name, ::nlohmann::ordered_json::parse(schema_json), \
                                      __VA_ARGS__);                                       \
      })
