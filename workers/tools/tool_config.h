// verl's tool config file (actor_rollout_ref.rollout.multi_turn.tool_config_path): the tools a
// multi-turn rollout offers the model, each a registered tool (workers/tools/tool_registry.h).
//
// The format, as verl's examples write it:
//   tools:
//     - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
//       config: {type: native}
//       tool_schema:
//         type: function
//         function:
//           name: calc_gsm8k_reward
//           description: ...
//           parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
//
// Each entry selects the registered tool named by tool_schema.function.name (class_name, a
// Python class in verl, is recorded and otherwise unused). The entry's tool_schema replaces the
// registered schema in the prompt (users edit the descriptions), and its config (per-tool
// settings such as a code runner's interpreter and timeouts) is kept as JSON for the tool's
// user to read. Other keys of an entry are ignored. YAML scalars become JSON as YAML 1.2's
// core schema reads them: quoted ones strings, plain ones null, true/false, integers, floats
// or strings.
//
// Example:
//   std::vector<ConfiguredTool> tools = load_tool_config("config/tool_config/gsm8k.yaml");
//   nlohmann::ordered_json extra = {{"tools", tool_schemas_for_template(tools)}};
//   std::string prompt = chat.render(messages, /*add_generation_prompt=*/true, extra);
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace baton::tools {

struct ConfiguredTool {
  std::string name;               // tool_schema.function.name: the registered tool it selects
  std::string class_name;         // verl's class_name ("" if absent); unused
  nlohmann::json config;          // the entry's config ({} if absent)
  nlohmann::ordered_json schema;  // the entry's tool_schema, keys in the file's order
};

// The tools of the config file at `path`, in the file's order. Throws baton::FileError when the
// file cannot be read, and baton::InvalidArgument naming the file (and the line), the entry's
// index and the key for bad YAML, a missing `tools` list, an entry without tool_schema or
// tool_schema.function.name, a config that is not a mapping, a tool listed twice, or a name no
// tool is registered as (listing the registered ones).
std::vector<ConfiguredTool> load_tool_config(const std::filesystem::path& path);

// The YAML file at `path` as JSON (YAML 1.2 core-schema scalars, keys in the
// file's order), for the other config files of multi-turn rollouts. `what`
// names the file in errors ("the interaction config"). Throws
// baton::FileError when it cannot be read and baton::InvalidArgument naming
// the file and line for bad YAML or a key given twice in one mapping.
nlohmann::ordered_json read_yaml_file(const std::filesystem::path& path, const std::string& what);

// The tools' schemas, in order: the list the chat template takes as `tools`.
nlohmann::ordered_json tool_schemas_for_template(const std::vector<ConfiguredTool>& tools);

}  // namespace baton::tools
