#include "workers/tools/tool_registry.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "base/registry.h"
#include "workers/tools/calculator_tool.h"
#include "workers/tools/code_runner_tool.h"

namespace baton::tools {
namespace {

using detail::cat;

// Throws InvalidArgument unless `schema` is {"function": {"name": name, ...}, ...}.
void check_schema(const std::string& name, const nlohmann::ordered_json& schema) {
  const auto fail = [&](const std::string& what) {
    throw InvalidArgument(cat("register_tool: the schema of tool '", name, "' ", what,
                              R"( (an OpenAI function schema: {"type": "function", "function": )",
                              R"({"name": ..., "description": ..., "parameters": {...}}}))"));
  };
  if (!schema.is_object()) fail("is not a JSON object");
  const auto function = schema.find("function");
  if (function == schema.end() || !function->is_object()) fail("has no \"function\" object");
  const auto function_name = function->find("name");
  if (function_name == function->end() || !function_name->is_string())
    fail("has no string \"function.name\"");
  if (function_name->get_ref<const std::string&>() != name)
    fail(cat("names the function '", function_name->get_ref<const std::string&>(),
             "', not the tool's name"));
}

Registry<ToolSpec>& tools() {
  static Registry<ToolSpec>* registry = [] {
    // Built-ins are added here rather than with BATON_TOOL: a static registration in a static
    // library is dropped by the linker when nothing else in its object file is used.
    auto* r = new Registry<ToolSpec>(
        "tool", "register your own with BATON_TOOL or baton::tools::register_tool");
    r->add("calculator", {"calculator", calculator_tool_schema(), calculator_tool});
    r->add("code_interpreter",
           {"code_interpreter", code_interpreter_tool_schema(), code_interpreter_tool});
    return r;
  }();
  return *registry;
}

// The schema's required argument names that `arguments` lacks.
std::vector<std::string> missing_arguments(const nlohmann::ordered_json& schema,
                                           const nlohmann::json& arguments) {
  std::vector<std::string> missing;
  const auto function = schema.find("function");
  if (function == schema.end() || !function->is_object()) return missing;
  const auto parameters = function->find("parameters");
  if (parameters == function->end() || !parameters->is_object()) return missing;
  const auto required = parameters->find("required");
  if (required == parameters->end() || !required->is_array()) return missing;
  for (const auto& key : *required) {
    if (key.is_string() && !arguments.contains(key.get_ref<const std::string&>()))
      missing.push_back(key.get<std::string>());
  }
  return missing;
}

ToolResult error_result(std::string text) {
  ToolResult r;
  r.text = std::move(text);
  r.error = true;
  return r;
}

// `value` as JSON text, cut after 200 characters: an error shown to the model quotes it.
std::string quote(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  size_t cut = 200;
  if (text.size() <= cut) return text;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
  text = text.substr(0, cut) + "...";
  return text;
}

}  // namespace

void register_tool(std::string name, nlohmann::ordered_json schema, ToolFunction fn) {
  if (!fn) throw InvalidArgument("register_tool: empty function for tool '" + name + "'");
  if (name.empty()) throw InvalidArgument("register_tool: the tool's name is empty");
  check_schema(name, schema);
  std::string key = name;
  tools().add(std::move(key), {std::move(name), std::move(schema), std::move(fn)});
}

const ToolSpec& find_tool(std::string_view name) { return tools().get(name); }

std::vector<std::string> tool_names() { return tools().names(); }

ToolResult call_tool(std::string_view name, const nlohmann::json& arguments,
                     const nlohmann::json& tools_kwargs) {
  const ToolSpec* tool = tools().find(name);
  if (!tool) return error_result("Error: " + tools().not_registered_message(name));
  if (!arguments.is_object())
    return error_result(cat("Error: the arguments of tool '", name, "' must be a JSON object, got ",
                            quote(arguments)));
  const std::vector<std::string> missing = missing_arguments(tool->schema, arguments);
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "\"" : ", \"") + m + "\"";
    return error_result(cat("Error: tool '", name, "' is missing the required argument",
                            missing.size() > 1 ? "s " : " ", list));
  }
  try {
    return tool->fn(arguments, tools_kwargs);
  } catch (const std::exception& e) {
    return error_result(cat("Error: tool '", name, "' failed: ", e.what()));
  } catch (...) {
    return error_result(cat("Error: tool '", name, "' failed with an unknown exception"));
  }
}

}  // namespace baton::tools
