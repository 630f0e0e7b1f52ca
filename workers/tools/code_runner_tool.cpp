// The "code_interpreter" tool, named and described as verl's sandbox fusion tool: runs the
// model's code (its one argument, "code") with python3 in the sandbox of
// workers/tools/sandbox.h, and shows the model what came out.
//
// The tool message: stdout, then stderr (a traceback), then one "Error: ..." line when the run
// failed: timed out, killed by a signal (the limit it means, when one does), a nonzero exit
// status. A run that failed or whose output was truncated is an error result (error = true).
// metrics: {"sandbox_seconds": the run's wall time}.
//
// tools_kwargs (the row's, or the tool config's `config`), every key optional:
//   interpreter              the program that reads the code on stdin: an argv list or one
//                            name (default ["python3", "-I", "-u", "-"]: isolated mode,
//                            unbuffered so that a run killed midway still shows its output)
//   timeout, default_timeout wall seconds (default 10); the CPU limit follows unless set
//   cpu_seconds              CPU seconds per process (default 5)
//   memory_limit_mb          address space per process (default 512)
//   output_bytes             stdout and stderr kept (default 16384)
// A SandboxError (no isolation here, an interpreter that cannot run) propagates: call_tool
// turns it into an error result naming it.
#include <signal.h>
#include <string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "workers/tools/code_runner_tool.h"
#include "workers/tools/sandbox.h"

namespace baton::tools {
namespace {

using detail::cat;

constexpr const char* kSchema = R"({
  "type": "function",
  "function": {
    "name": "code_interpreter",
    "description": "A tool for executing code.",
    "parameters": {
      "type": "object",
      "properties": {
        "code": {
          "type": "string",
          "description": "The code to execute."
        }
      },
      "required": ["code"]
    }
  }
})";

std::optional<double> positive_number(const nlohmann::json& kwargs, const char* key) {
  const auto it = kwargs.find(key);
  if (it == kwargs.end()) return std::nullopt;
  if (!it->is_number() || !(it->get<double>() > 0))
    throw InvalidArgument(cat("code_interpreter: tools_kwargs.", key,
                              " must be a positive number, not ", it->dump()));
  return it->get<double>();
}

SandboxLimits limits_from(const nlohmann::json& kwargs) {
  SandboxLimits limits;
  if (!kwargs.is_object()) return limits;
  std::optional<double> wall = positive_number(kwargs, "timeout");
  if (!wall) wall = positive_number(kwargs, "default_timeout");
  if (wall) limits.wall_seconds = limits.cpu_seconds = *wall;
  if (const auto cpu = positive_number(kwargs, "cpu_seconds")) limits.cpu_seconds = *cpu;
  if (const auto mb = positive_number(kwargs, "memory_limit_mb"))
    limits.memory_bytes = static_cast<int64_t>(*mb * (1 << 20));
  if (const auto bytes = positive_number(kwargs, "output_bytes"))
    limits.output_bytes = static_cast<int64_t>(*bytes);
  return limits;
}

std::vector<std::string> interpreter_from(const nlohmann::json& kwargs) {
  const auto it = kwargs.is_object() ? kwargs.find("interpreter") : kwargs.end();
  if (!kwargs.is_object() || it == kwargs.end()) return {"python3", "-I", "-u", "-"};
  if (it->is_string() && !it->get_ref<const std::string&>().empty())
    return {it->get<std::string>()};
  std::vector<std::string> argv;
  if (it->is_array())
    for (const auto& arg : *it) {
      if (!arg.is_string()) break;
      argv.push_back(arg.get<std::string>());
    }
  if (argv.empty() || argv.size() != it->size() || argv[0].empty())
    throw InvalidArgument(cat("code_interpreter: tools_kwargs.interpreter must be a program's ",
                              "name or a non-empty list of strings (its argv), not ", it->dump()));
  return argv;
}

// Why the run failed, as the model is to read it; "" when it did not.
std::string error_line(const SandboxResult& r, const SandboxLimits& limits) {
  if (r.timed_out) return cat("Error: timed out after ", limits.wall_seconds, " s");
  switch (r.signal) {
    case 0:
      break;
    case SIGXCPU:
      return cat("Error: killed by SIGXCPU: over the CPU time limit of ", limits.cpu_seconds, " s");
    case SIGKILL:
      return cat("Error: killed by SIGKILL: over the CPU time limit of ", limits.cpu_seconds,
                 " s, or out of memory");
    case SIGXFSZ:
      return cat("Error: killed by SIGXFSZ: over the file size limit of ", limits.file_bytes,
                 " bytes");
    case SIGSEGV:
      return cat("Error: killed by SIGSEGV (segmentation fault; the memory limit is ",
                 limits.memory_bytes >> 20, " MB)");
    default: {
      const char* name = sigabbrev_np(r.signal);
      return name != nullptr ? cat("Error: killed by SIG", name)
                             : cat("Error: killed by signal ", r.signal);
    }
  }
  if (r.exit_code != 0) return cat("Error: exited with status ", r.exit_code);
  return "";
}

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD: the message goes through JSON
// and the tokenizer, which take valid UTF-8 only. nlohmann's replacing dump does the work.
std::string valid_utf8(const std::string& bytes) {
  const std::string quoted =
      nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(quoted).get<std::string>();
}

}  // namespace

nlohmann::ordered_json code_interpreter_tool_schema() {
  return nlohmann::ordered_json::parse(kSchema);
}

ToolResult code_interpreter_tool(const nlohmann::json& arguments,
                                 const nlohmann::json& tools_kwargs) {
  const auto code = arguments.find("code");
  if (code == arguments.end() || !code->is_string())
    throw InvalidArgument(R"(code_interpreter: "code" must be a string holding the program)");
  const SandboxLimits limits = limits_from(tools_kwargs);
  const SandboxResult r =
      run_sandboxed(interpreter_from(tools_kwargs), code->get_ref<const std::string&>(), limits);
  std::string text = r.stdout_text;
  if (!r.stderr_text.empty()) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += r.stderr_text;
  }
  const std::string error = error_line(r, limits);
  if (!error.empty()) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += error;
  }
  ToolResult result;
  result.text = valid_utf8(text);
  result.error = !error.empty() || r.output_truncated;
  result.metrics["sandbox_seconds"] = r.wall_seconds;
  return result;
}

}  // namespace baton::tools
