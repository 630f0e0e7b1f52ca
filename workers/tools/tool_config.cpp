#include "workers/tools/tool_config.h"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include <yaml-cpp/yaml.h>

#include "base/errors.h"
#include "workers/tools/tool_registry.h"

namespace baton::tools {
namespace {

using detail::cat;

// "<file>:<line>" for a node that knows its line, "<file>" otherwise.
std::string location(const std::string& file, const YAML::Mark& mark) {
  return mark.is_null() ? file : cat(file, ":", mark.line + 1);
}

// A plain (unquoted) scalar as YAML 1.2's core schema reads it.
nlohmann::ordered_json plain_scalar(const std::string& text) {
  static const std::regex kNull("~|null|Null|NULL");
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  static const std::regex kInf("[-+]?\\.(inf|Inf|INF)");
  if (text.empty() || std::regex_match(text, kNull)) return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  const bool plus = text[0] == '+';  // from_chars takes no '+'
  const char* first = text.data() + (plus ? 1 : 0);
  const char* last = text.data() + text.size();
  if (std::regex_match(text, kInt)) {
    int64_t value = 0;
    if (std::from_chars(first, last, value).ec == std::errc()) return value;
    // Too large for int64: a float, as JSON readers take it.
  }
  if (std::regex_match(text, kInt) || std::regex_match(text, kFloat)) {
    double value = 0;
    if (std::from_chars(first, last, value).ec == std::errc()) return value;
  }
  if (std::regex_match(text, kInf))
    return text[0] == '-' ? -std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::infinity();
  return text;
}

nlohmann::ordered_json to_json(const YAML::Node& node, const std::string& file) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar:
      // yaml-cpp tags quoted scalars "!" and plain ones "?"; !!str is a string too.
      if (node.Tag() == "?") return plain_scalar(node.Scalar());
      return node.Scalar();
    case YAML::NodeType::Sequence: {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const auto& item : node) list.push_back(to_json(item, file));
      return list;
    }
    case YAML::NodeType::Map: {
      nlohmann::ordered_json map = nlohmann::ordered_json::object();
      for (const auto& field : node) {
        if (!field.first.IsScalar())
          throw InvalidArgument(
              cat(location(file, field.first.Mark()), ": a mapping key must be a plain name"));
        const std::string& key = field.first.Scalar();
        if (map.contains(key))
          throw InvalidArgument(cat(location(file, field.first.Mark()), ": key '", key,
                                    "' appears twice in one mapping"));
        map[key] = to_json(field.second, file);
      }
      return map;
    }
  }
  return nullptr;
}

std::string read_file(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw FileError(cat("cannot read ", what, " ", path.string(), ": ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// One entry of the `tools` list. `where` is "<file>:<line>: tools[<i>]".
ConfiguredTool read_entry(const nlohmann::ordered_json& entry, const std::string& where) {
  const auto fail = [&](const std::string& what) { throw InvalidArgument(where + ": " + what); };
  if (!entry.is_object())
    fail("an entry must be a mapping with class_name, config and tool_schema");
  ConfiguredTool tool;

  const auto schema = entry.find("tool_schema");
  if (schema == entry.end() || schema->is_null())
    fail("missing 'tool_schema' (the tool's OpenAI function schema)");
  if (!schema->is_object()) fail("'tool_schema' must be a mapping");
  const auto function = schema->find("function");
  if (function == schema->end() || !function->is_object())
    fail("missing 'tool_schema.function' (a mapping with name, description and parameters)");
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    fail("missing 'tool_schema.function.name' (the name of a registered tool)");
  tool.name = name->get<std::string>();
  try {
    find_tool(tool.name);
  } catch (const InvalidArgument& e) {
    fail(cat("'tool_schema.function.name': ", e.what()));
  }
  tool.schema = *schema;

  if (const auto class_name = entry.find("class_name"); class_name != entry.end()) {
    if (!class_name->is_string()) fail("'class_name' must be a string");
    tool.class_name = class_name->get<std::string>();
  }
  tool.config = nlohmann::json::object();
  if (const auto config = entry.find("config"); config != entry.end() && !config->is_null()) {
    if (!config->is_object()) fail("'config' must be a mapping of the tool's settings");
    tool.config = *config;
  }
  return tool;
}

}  // namespace

std::vector<ConfiguredTool> load_tool_config(const std::filesystem::path& path) {
  const std::string file = path.string();
  const std::string text = read_file(path, "the tool config");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InvalidArgument(
        cat(location(file, e.mark), ": the tool config is not valid YAML: ", e.msg));
  }
  const std::string format_hint =
      "a tool config is a mapping whose 'tools' lists entries with class_name, config and "
      "tool_schema (verl's format)";
  if (!root.IsMap()) throw InvalidArgument(cat(file, ": ", format_hint));
  const YAML::Node list = root["tools"];
  if (!list) throw InvalidArgument(cat(file, ": missing 'tools' (", format_hint, ")"));
  if (list.IsNull()) return {};
  if (!list.IsSequence())
    throw InvalidArgument(
        cat(location(file, list.Mark()), ": 'tools' must be a list (", format_hint, ")"));

  std::vector<ConfiguredTool> tools;
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node node = list[i];
    const std::string where = cat(location(file, node.Mark()), ": tools[", i, "]");
    ConfiguredTool tool = read_entry(to_json(node, file), where);
    if (const auto [it, added] = index_of.emplace(tool.name, i); !added)
      throw InvalidArgument(cat(where, ": 'tool_schema.function.name': tool '", tool.name,
                                "' is listed twice (also tools[", it->second, "])"));
    tools.push_back(std::move(tool));
  }
  return tools;
}

nlohmann::ordered_json read_yaml_file(const std::filesystem::path& path, const std::string& what) {
  const std::string file = path.string();
  const std::string text = read_file(path, what);
  try {
    return to_json(YAML::Load(text), file);
  } catch (const YAML::Exception& e) {
    throw InvalidArgument(cat(location(file, e.mark), ": ", what, " is not valid YAML: ", e.msg));
  }
}

nlohmann::ordered_json tool_schemas_for_template(const std::vector<ConfiguredTool>& tools) {
  nlohmann::ordered_json schemas = nlohmann::ordered_json::array();
  for (const ConfiguredTool& tool : tools) schemas.push_back(tool.schema);
  return schemas;
}

}  // namespace baton::tools
