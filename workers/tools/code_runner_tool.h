// The built-in "code_interpreter" tool (verl's sandbox fusion tool's name and schema): runs the
// model's code in the sandbox of workers/tools/sandbox.h. What it returns and the tools_kwargs
// it reads: workers/tools/code_runner_tool.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include "workers/tools/tool_registry.h"

namespace baton::tools {

// {"type": "function", "function": {"name": "code_interpreter", ...}}: one required string
// argument "code".
nlohmann::ordered_json code_interpreter_tool_schema();

// Runs arguments["code"] with the interpreter of tools_kwargs (python3 by default). Throws
// baton::InvalidArgument when "code" is not a string, SandboxError when no sandbox can be made
// (call_tool turns both into error results).
ToolResult code_interpreter_tool(const nlohmann::json& arguments,
                                 const nlohmann::json& tools_kwargs);

}  // namespace baton::tools
