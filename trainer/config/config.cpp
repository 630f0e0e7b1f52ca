#include "trainer/config/config.h"
#include "trainer/config/verl_keys.h"

#include "base/did_you_mean.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

namespace baton::trainer {

enum class Kind { kNull, kBool, kInt, kFloat, kString, kList, kMap };

// One value of the tree. Mappings keep their keys in file order (the saved
// config reads like the file it came from).
struct ConfigNode {
  Kind kind = Kind::kMap;
  std::string text;                  // scalars: the value as written ("true"/"false" for bools)
  std::vector<std::string> names;    // kMap: the keys of `children`
  std::vector<ConfigNode> children;  // kMap and kList
  std::string origin;                // where the value came from, for errors
  // Set on a value assigned where null stood: the key has no type (Hydra's
  // Any), so a later assignment may change it again (a string, then a list).
  bool untyped = false;

  ConfigNode* child(std::string_view name) {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return &children[i];
    return nullptr;
  }
  const ConfigNode* child(std::string_view name) const {
    return const_cast<ConfigNode*>(this)->child(name);
  }
};

namespace {

using baton::detail::cat;

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kMap:
      return "mapping";
  }
  return "?";
}

// "an int", "a float", ...
std::string a_kind(Kind kind) {
  return std::string(kind == Kind::kInt ? "an " : "a ") + kind_name(kind);
}

bool is_scalar(Kind kind) { return kind != Kind::kList && kind != Kind::kMap; }

std::string join_key(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : cat(prefix, ".", name);
}

// The type of an unquoted scalar, as YAML 1.2's core schema reads it (plus
// `1e-6` without a dot as a float, as OmegaConf does; bools are only
// true/false in any case, as in Hydra's override grammar).
Kind classify_plain(const std::string& text) {
  static const std::regex kNull("~|null|Null|NULL");
  static const std::regex kBool("true|false", std::regex::icase);
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|"
      "NAN)");
  if (text.empty() || std::regex_match(text, kNull)) return Kind::kNull;
  if (std::regex_match(text, kBool)) return Kind::kBool;
  if (std::regex_match(text, kInt)) return Kind::kInt;
  if (std::regex_match(text, kFloat)) return Kind::kFloat;
  return Kind::kString;
}

ConfigNode scalar_node(const std::string& text, bool quoted, const std::string& origin) {
  ConfigNode node;
  node.origin = origin;
  node.kind = quoted ? Kind::kString : classify_plain(text);
  node.text = text;
  if (node.kind == Kind::kBool) node.text = (text[0] == 't' || text[0] == 'T') ? "true" : "false";
  if (node.kind == Kind::kNull) node.text.clear();
  return node;
}

ConfigNode from_yaml_node(const YAML::Node& yaml, const std::string& where) {
  const std::string origin = yaml.Mark().is_null() ? where : cat(where, ":", yaml.Mark().line + 1);
  ConfigNode node;
  node.origin = origin;
  switch (yaml.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      node.kind = Kind::kNull;
      return node;
    case YAML::NodeType::Scalar:
      // yaml-cpp tags quoted scalars "!" and plain ones "?".
      return scalar_node(yaml.Scalar(), yaml.Tag() == "!", origin);
    case YAML::NodeType::Sequence:
      node.kind = Kind::kList;
      for (const auto& item : yaml) node.children.push_back(from_yaml_node(item, where));
      return node;
    case YAML::NodeType::Map:
      node.kind = Kind::kMap;
      for (const auto& field : yaml) {
        if (!field.first.IsScalar())
          throw ConfigError(cat(origin, ": a mapping key must be a plain name"));
        const std::string name = field.first.Scalar();
        if (node.child(name))
          throw ConfigError(cat(where, ":", field.first.Mark().line + 1, ": key '", name,
                                "' appears twice in one mapping"));
        node.names.push_back(name);
        node.children.push_back(from_yaml_node(field.second, where));
      }
      return node;
  }
  return node;
}

std::vector<std::string> split_key(std::string_view key, const std::string& origin) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string_view part =
        key.substr(start, dot == std::string_view::npos ? dot : dot - start);
    // A leading '+' marks the whole key as added (+a.b, ++a.b); a name never starts with one.
    if (part.empty() || part[0] == '+')
      throw ConfigError(cat("malformed config key '", key, "' (", origin,
                            "): expected names separated by single dots, like a.b.c"));
    parts.emplace_back(part);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

void collect_paths(const ConfigNode& node, const std::string& prefix,
                   std::vector<std::string>& out) {
  if (node.kind != Kind::kMap) return;
  for (size_t i = 0; i < node.names.size(); ++i) {
    const std::string path = join_key(prefix, node.names[i]);
    out.push_back(path);
    collect_paths(node.children[i], path, out);
  }
}

[[noreturn]] void throw_unknown_key(const ConfigNode& root, const std::string& key,
                                    const std::string& origin, const std::string& hint) {
  std::vector<std::string> known;
  collect_paths(root, "", known);
  const std::string suggestion = closest_match(key, known);
  std::string message = cat("unknown config key '", key, "' (", origin, ")");
  if (!suggestion.empty()) message += cat("; did you mean '", suggestion, "'?");
  message += hint;
  throw ConfigError(message);
}

// The node at `key`, or nullptr if a name along the path is missing. A path
// through a value that is not a mapping throws.
const ConfigNode* find_node(const ConfigNode& root, std::string_view key) {
  const ConfigNode* node = &root;
  std::string walked;
  for (const std::string& part : split_key(key, "lookup")) {
    if (node->kind != Kind::kMap)
      throw ConfigError(cat("config key '", key, "': '", walked, "' is a ", kind_name(node->kind),
                            ", not a mapping"));
    node = node->child(part);
    if (!node) return nullptr;
    walked = join_key(walked, part);
  }
  return node;
}

const ConfigNode& require_node(const ConfigNode& root, std::string_view key) {
  const ConfigNode* node = find_node(root, key);
  if (!node) throw_unknown_key(root, std::string(key), "lookup", "");
  return *node;
}

// ---- interpolation -------------------------------------------------------

constexpr int kMaxInterpolationDepth = 64;

ConfigNode resolve(const ConfigNode& root, const ConfigNode& node, const std::string& key,
                   std::vector<std::string>& chain);

ConfigNode resolve_reference(const ConfigNode& root, const std::string& target,
                             const std::string& key, const std::string& text,
                             std::vector<std::string>& chain) {
  if (std::find(chain.begin(), chain.end(), target) != chain.end() ||
      static_cast<int>(chain.size()) > kMaxInterpolationDepth) {
    std::string cycle;
    for (const auto& k : chain) cycle += k + " -> ";
    throw ConfigError(cat("config interpolation cycle: ", cycle, target));
  }
  const ConfigNode* found = nullptr;
  try {
    found = find_node(root, target);
  } catch (const ConfigError&) {
  }
  if (!found) throw_unknown_key(root, target, cat("in '", text, "', the value of '", key, "'"), "");
  chain.push_back(target);
  ConfigNode value = resolve(root, *found, target, chain);
  chain.pop_back();
  return value;
}

ConfigNode resolve(const ConfigNode& root, const ConfigNode& node, const std::string& key,
                   std::vector<std::string>& chain) {
  if (node.kind == Kind::kMap || node.kind == Kind::kList) {
    ConfigNode out = node;
    for (size_t i = 0; i < out.children.size(); ++i) {
      const std::string child_key =
          node.kind == Kind::kMap ? join_key(key, node.names[i]) : cat(key, "[", i, "]");
      out.children[i] = resolve(root, node.children[i], child_key, chain);
    }
    return out;
  }
  if (node.kind != Kind::kString || node.text.find("${") == std::string::npos) return node;
  const std::string& text = node.text;
  // The whole value is one reference: it takes the referenced value's type.
  if (text.size() > 3 && text.rfind("${", 0) == 0 && text.back() == '}' &&
      text.find('}') == text.size() - 1) {
    ConfigNode value = resolve_reference(root, text.substr(2, text.size() - 3), key, text, chain);
    value.origin = node.origin;
    return value;
  }
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find("${", pos);
    if (open == std::string::npos) {
      out += text.substr(pos);
      break;
    }
    const size_t close = text.find('}', open);
    if (close == std::string::npos)
      throw ConfigError(
          cat("config key '", key, "': unterminated '${' in '", text, "' (", node.origin, ")"));
    out += text.substr(pos, open - pos);
    const std::string target = text.substr(open + 2, close - open - 2);
    const ConfigNode value = resolve_reference(root, target, key, text, chain);
    if (!is_scalar(value.kind) || value.kind == Kind::kNull)
      throw ConfigError(cat("config key '", key, "': '${", target, "}' inside '", text, "' is a ",
                            kind_name(value.kind),
                            "; only non-null scalars can be part of a string"));
    out += value.text;
    pos = close + 1;
  }
  ConfigNode value = node;
  value.text = out;
  return value;
}

ConfigNode resolve_key(const ConfigNode& root, std::string_view key) {
  std::vector<std::string> chain{std::string(key)};
  return resolve(root, require_node(root, key), std::string(key), chain);
}

// Strips `+` / `++` from the keys of a value that is stored whole: a file
// without a base (it defines the keys), a new key's value, a value for an
// untyped (null) key.
void strip_add_markers(ConfigNode& node) {
  if (node.kind == Kind::kMap) {
    for (size_t i = 0; i < node.names.size(); ++i) {
      const std::string written = node.names[i];
      node.names[i].erase(0, written.find_first_not_of('+'));
      // `a` and `+a` in one mapping would be one key twice.
      for (size_t j = 0; j < i; ++j)
        if (node.names[j] == node.names[i])
          throw ConfigError(cat(node.children[i].origin, ": key '", written, "' is '",
                                node.names[i], "' again, which this mapping already has"));
    }
  }
  for (auto& child : node.children) strip_add_markers(child);
}

// ---- assignment with type checks -----------------------------------------

// The kind a key expects: that of its current value, following an
// interpolation (an unresolvable one expects nothing in particular).
Kind expected_kind(const ConfigNode& root, const ConfigNode& current, const std::string& key) {
  if (current.kind != Kind::kString || current.text.find("${") == std::string::npos)
    return current.kind;
  try {
    std::vector<std::string> chain{key};
    return resolve(root, current, key, chain).kind;
  } catch (const ConfigError&) {
    return Kind::kNull;
  }
}

std::string describe(const ConfigNode& value) {
  if (is_scalar(value.kind) && value.kind != Kind::kNull)
    return cat(a_kind(value.kind), " ('", value.text, "')");
  return a_kind(value.kind);
}

[[noreturn]] void throw_type_error(const std::string& key, Kind expected, const ConfigNode& given) {
  throw ConfigError(cat("config key '", key, "' expects ", a_kind(expected), ", got ",
                        describe(given), " from ", given.origin));
}

// `value` converted for a key whose current value has kind `expected`;
// throws for incompatible types.
ConfigNode checked_value(const ConfigNode& value, Kind expected, const ConfigNode* current,
                         const std::string& key) {
  if (expected == Kind::kNull || value.kind == expected) {
    if (expected == Kind::kList && current && !current->children.empty()) {
      // A list whose elements share one scalar type keeps that type.
      const Kind element = current->children.front().kind;
      const bool uniform = is_scalar(element) && element != Kind::kNull &&
                           std::all_of(current->children.begin(), current->children.end(),
                                       [&](const ConfigNode& c) { return c.kind == element; });
      if (uniform) {
        ConfigNode out = value;
        for (size_t i = 0; i < out.children.size(); ++i)
          out.children[i] =
              checked_value(value.children[i], element, nullptr, cat(key, "[", i, "]"));
        return out;
      }
    }
    return value;
  }
  if (value.kind == Kind::kNull && expected != Kind::kMap) return value;
  if (expected == Kind::kFloat && value.kind == Kind::kInt) {
    ConfigNode out = value;
    out.kind = Kind::kFloat;
    return out;
  }
  if (expected == Kind::kString && is_scalar(value.kind) && value.kind != Kind::kNull) {
    ConfigNode out = value;
    out.kind = Kind::kString;
    return out;
  }
  throw_type_error(key, expected, value);
}

void merge_map(const ConfigNode& root_for_errors, ConfigNode& root, ConfigNode& dst,
               const ConfigNode& src, const std::string& prefix);

// Assigns `value` to the existing node `dst` at `key` (mappings merge key by key).
void assign(ConfigNode& root, ConfigNode& dst, const ConfigNode& value, const std::string& key) {
  if (dst.kind == Kind::kMap && value.kind == Kind::kMap) {
    merge_map(root, root, dst, value, key);
    return;
  }
  if (dst.kind == Kind::kNull || dst.untyped) {
    dst = value;
    dst.untyped = true;
    strip_add_markers(dst);
    return;
  }
  const Kind expected = expected_kind(root, dst, key);
  // A string where a list of strings stands is a list of one (verl's scripts
  // pass data.train_files=$HOME/data/gsm8k/train.parquet).
  const bool strings = std::all_of(dst.children.begin(), dst.children.end(),
                                   [](const ConfigNode& c) { return c.kind == Kind::kString; });
  if (expected == Kind::kList && value.kind == Kind::kString && strings) {
    ConfigNode list;
    list.kind = Kind::kList;
    list.origin = value.origin;
    list.children.push_back(value);
    dst = checked_value(list, expected, &dst, key);
  } else {
    dst = checked_value(value, expected, &dst, key);
  }
  strip_add_markers(dst);
}

enum class SetMode { kExisting, kAdd, kAddOrSet };

void set_path(ConfigNode& root, const std::vector<std::string>& parts, const ConfigNode& value,
              SetMode mode, const std::string& origin) {
  ConfigNode* node = &root;
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const bool last = i + 1 == parts.size();
    if (node->kind != Kind::kMap)
      throw ConfigError(cat("config key '", join_key(walked, part), "' (", origin, "): '", walked,
                            "' is a ", kind_name(node->kind), ", not a mapping"));
    const std::string key = join_key(walked, part);
    ConfigNode* next = node->child(part);
    if (!next) {
      if (mode == SetMode::kExisting) {
        std::string full = key;
        for (size_t j = i + 1; j < parts.size(); ++j) full += "." + parts[j];
        throw_unknown_key(root, full, origin, cat(" (to add a new key, write '+", full, "=...')"));
      }
      node->names.push_back(part);
      ConfigNode created;
      created.origin = origin;
      node->children.push_back(last ? value : created);
      strip_add_markers(node->children.back());
      if (last) return;
      next = &node->children.back();
    } else if (last) {
      if (mode == SetMode::kAdd)
        throw ConfigError(
            cat("config key '", key, "' already exists (", origin, "); set it without the '+'"));
      assign(root, *next, value, key);
      return;
    }
    node = next;
    walked = key;
  }
}

// Merges the mapping `src` (a file over its base, or a mapping override) into
// `dst`. Keys written `+name` are added, `++name` added or set; others must exist.
void merge_map(const ConfigNode& root_for_errors, ConfigNode& root, ConfigNode& dst,
               const ConfigNode& src, const std::string& prefix) {
  for (size_t i = 0; i < src.names.size(); ++i) {
    std::string name = src.names[i];
    SetMode mode = SetMode::kExisting;
    if (name.rfind("++", 0) == 0) {
      mode = SetMode::kAddOrSet;
      name = name.substr(2);
    } else if (name.rfind("+", 0) == 0) {
      mode = SetMode::kAdd;
      name = name.substr(1);
    }
    const ConfigNode& value = src.children[i];
    if (!name.empty() && name[0] == '+')
      throw ConfigError(cat(value.origin, ": key '", src.names[i],
                            "': a name never starts with '+' (+name adds a key, ++name adds or "
                            "sets it)"));
    const std::string key = join_key(prefix, name);
    ConfigNode* existing = dst.child(name);
    if (!existing) {
      if (mode == SetMode::kExisting)
        throw_unknown_key(root_for_errors, key, value.origin,
                          cat(" (to add a new key, write it as '+", name, "')"));
      dst.names.push_back(name);
      dst.children.push_back(value);
      strip_add_markers(dst.children.back());
      continue;
    }
    if (mode == SetMode::kAdd)
      throw ConfigError(
          cat("config key '", key, "' already exists (", value.origin, "); drop the '+'"));
    assign(root, *existing, value, key);
  }
}

std::string trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  const size_t end = s.find_last_not_of(" \t");
  return std::string(s.substr(begin, end - begin + 1));
}

ConfigNode parse_yaml_text(std::string_view text, const std::string& where) {
  try {
    return from_yaml_node(YAML::Load(std::string(text)), where);
  } catch (const YAML::Exception& e) {
    throw ConfigError(cat("cannot parse YAML in ", where,
                          e.mark.is_null() ? std::string() : cat(":", e.mark.line + 1), ": ",
                          e.msg));
  }
}

void set_origin(ConfigNode& node, const std::string& origin) {
  node.origin = origin;
  for (auto& child : node.children) set_origin(child, origin);
}

ConfigNode empty_map(const std::string& origin) {
  ConfigNode node;
  node.kind = Kind::kMap;
  node.origin = origin;
  return node;
}

ConfigNode load_file(const std::filesystem::path& path,
                     std::vector<std::filesystem::path>& visiting);

// Parses one file's text; with a `base:` key, merges it over its base.
ConfigNode load_tree(std::string_view yaml, const std::string& where,
                     const std::filesystem::path& base_dir,
                     std::vector<std::filesystem::path>& visiting) {
  ConfigNode file = parse_yaml_text(yaml, where);
  if (file.kind == Kind::kNull) file = empty_map(where);
  if (file.kind != Kind::kMap)
    throw ConfigError(
        cat(where, ": the top level of a config must be a mapping, got ", describe(file)));
  const ConfigNode* base = file.child("base");
  if (!base) {
    strip_add_markers(file);
    return file;
  }
  if (base->kind != Kind::kString)
    throw ConfigError(cat(base->origin,
                          ": 'base' must name the YAML file this config overrides, got ",
                          describe(*base)));
  std::filesystem::path base_path = base->text;
  if (base_path.is_relative()) base_path = base_dir / base_path;
  ConfigNode root = load_file(base_path, visiting);
  ConfigNode overrides = file;
  for (size_t i = 0; i < overrides.names.size(); ++i)
    if (overrides.names[i] == "base") {
      overrides.names.erase(overrides.names.begin() + static_cast<std::ptrdiff_t>(i));
      overrides.children.erase(overrides.children.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  const ConfigNode schema = root;
  merge_map(schema, root, root, overrides, "");
  return root;
}

ConfigNode load_file(const std::filesystem::path& path,
                     std::vector<std::filesystem::path>& visiting) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(cat("cannot read config file '", path.string(),
                          "': ", std::filesystem::exists(path) ? "not readable" : "no such file"));
  std::stringstream text;
  text << in.rdbuf();
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path);
  if (std::find(visiting.begin(), visiting.end(), canonical) != visiting.end()) {
    std::string chain;
    for (const auto& p : visiting) chain += p.string() + " -> ";
    throw ConfigError(cat("config files name each other as base: ", chain, canonical.string()));
  }
  visiting.push_back(canonical);
  ConfigNode tree = load_tree(text.str(), path.string(), path.parent_path(), visiting);
  visiting.pop_back();
  return tree;
}

// ---- emission -------------------------------------------------------------

void emit(YAML::Emitter& out, const ConfigNode& node) {
  switch (node.kind) {
    case Kind::kNull:
      out << YAML::Null;
      return;
    case Kind::kBool:
    case Kind::kInt:
      out << node.text;
      return;
    case Kind::kFloat:
      // An int given for a float key keeps its text; write it as a float.
      out << (classify_plain(node.text) == Kind::kFloat ? node.text : node.text + ".0");
      return;
    case Kind::kString:
      // A string that would read back as another type is quoted, and so is one with a control
      // character (yaml-cpp writes a '\r' as it is, which reads back as a line break).
      if (classify_plain(node.text) != Kind::kString ||
          std::any_of(node.text.begin(), node.text.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
        out << YAML::DoubleQuoted << node.text;
      else
        out << node.text;
      return;
    case Kind::kList: {
      const bool flat = std::all_of(node.children.begin(), node.children.end(),
                                    [](const ConfigNode& c) { return is_scalar(c.kind); });
      if (flat) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& child : node.children) emit(out, child);
      out << YAML::EndSeq;
      return;
    }
    case Kind::kMap:
      if (node.children.empty()) out << YAML::Flow;
      out << YAML::BeginMap;
      for (size_t i = 0; i < node.names.size(); ++i) {
        out << YAML::Key << node.names[i] << YAML::Value;
        emit(out, node.children[i]);
      }
      out << YAML::EndMap;
      return;
  }
}

std::string format_double(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// ---- typed reads ----------------------------------------------------------

const ConfigNode& require_kind(const ConfigNode& value, Kind expected, const std::string& key) {
  if (value.kind == Kind::kNull)
    throw ConfigError(cat("config key '", key, "' is null (", value.origin, "); expected ",
                          a_kind(expected), ": set it, e.g. ", key, "=..."));
  if (value.kind != expected && !(expected == Kind::kFloat && value.kind == Kind::kInt))
    throw ConfigError(cat("config key '", key, "' expects ", a_kind(expected), ", got ",
                          describe(value), " from ", value.origin));
  return value;
}

bool read_bool(const ConfigNode& value, const std::string& key) {
  return require_kind(value, Kind::kBool, key).text == "true";
}

int64_t read_int(const ConfigNode& value, const std::string& key) {
  const std::string& text = require_kind(value, Kind::kInt, key).text;
  const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
  int64_t out = 0;
  const auto result = std::from_chars(begin, text.data() + text.size(), out);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size())
    throw ConfigError(cat("config key '", key, "': '", text, "' does not fit a 64-bit integer (",
                          value.origin, ")"));
  return out;
}

double read_double(const ConfigNode& value, const std::string& key) {
  std::string text = require_kind(value, Kind::kFloat, key).text;
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const bool negative = !text.empty() && text[0] == '-';
  const std::string magnitude = negative ? text.substr(1) : text;
  std::string lower = magnitude;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower == ".inf")
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  if (lower == ".nan") return std::numeric_limits<double>::quiet_NaN();
  double out = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), out);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size())
    throw ConfigError(cat("config key '", key, "': '", value.text, "' is not a usable float (",
                          value.origin, ")"));
  return out;
}

std::string read_string(const ConfigNode& value, const std::string& key) {
  if (value.kind == Kind::kNull || !is_scalar(value.kind)) require_kind(value, Kind::kString, key);
  return value.text;
}

template <typename T, typename Read>
std::vector<T> read_list(const ConfigNode& value, const std::string& key, Read read) {
  require_kind(value, Kind::kList, key);
  std::vector<T> out;
  for (size_t i = 0; i < value.children.size(); ++i)
    out.push_back(read(value.children[i], cat(key, "[", i, "]")));
  return out;
}

}  // namespace

// ---- Config ----------------------------------------------------------------

struct Config::ReadLog {
  std::mutex mutex;
  std::set<std::string, std::less<>> keys;
};

Config::Config() : root_(std::make_unique<ConfigNode>()) {}
Config::~Config() = default;
Config::Config(std::unique_ptr<ConfigNode> root) : root_(std::move(root)) {}
Config::Config(const Config& other)
    : root_(std::make_unique<ConfigNode>(*other.root_)),
      reads_(other.reads_),
      prefix_(other.prefix_) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) {
    root_ = std::make_unique<ConfigNode>(*other.root_);
    reads_ = other.reads_;
    prefix_ = other.prefix_;
  }
  return *this;
}
Config::Config(Config&& other) noexcept
    : root_(std::move(other.root_)),
      reads_(std::move(other.reads_)),
      prefix_(std::move(other.prefix_)) {
  other.root_ = std::make_unique<ConfigNode>();
}
Config& Config::operator=(Config&& other) noexcept {
  std::swap(root_, other.root_);
  std::swap(reads_, other.reads_);
  std::swap(prefix_, other.prefix_);
  return *this;
}

Config Config::derived(std::unique_ptr<ConfigNode> root, std::string prefix) const {
  Config out(std::move(root));
  out.reads_ = reads_;
  out.prefix_ = std::move(prefix);
  return out;
}

void Config::note_read(std::string_view key) const {
  if (!reads_) return;
  std::lock_guard<std::mutex> lock(reads_->mutex);
  reads_->keys.insert(prefix_ + std::string(key));
}

void Config::track_reads() {
  if (!reads_) reads_ = std::make_shared<ReadLog>();
}

std::vector<std::string> Config::unread_keys() const {
  std::set<std::string, std::less<>> read;
  if (reads_) {
    std::lock_guard<std::mutex> lock(reads_->mutex);
    read = reads_->keys;
  }
  // A leaf counts as read when its path, or a path above it, was read.
  std::vector<std::string> out;
  auto walk = [&](auto&& self, const ConfigNode& node, const std::string& path) -> void {
    const std::string full = prefix_ + path;
    if (!path.empty() && read.count(full)) return;
    if (node.kind != Kind::kMap || node.children.empty()) {
      out.push_back(path);
      return;
    }
    for (size_t i = 0; i < node.children.size(); ++i)
      self(self, node.children[i], join_key(path, node.names[i]));
  };
  walk(walk, *root_, "");
  return out;
}

Config Config::load(const std::filesystem::path& path) {
  std::vector<std::filesystem::path> visiting;
  return Config(std::make_unique<ConfigNode>(load_file(path, visiting)));
}

Config Config::from_yaml(std::string_view yaml, const std::string& where,
                         const std::filesystem::path& base_dir) {
  std::vector<std::filesystem::path> visiting;
  return Config(std::make_unique<ConfigNode>(load_tree(yaml, where, base_dir, visiting)));
}

void Config::apply_override(std::string_view text) {
  const std::string origin = cat("override '", text, "'");
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError(
        cat("malformed ", origin, ": expected key=value (a.b.c=value, +a.new=value to add a key)"));
  std::string key = trim(text.substr(0, eq));
  SetMode mode = SetMode::kExisting;
  if (key.rfind("++", 0) == 0) {
    mode = SetMode::kAddOrSet;
    key.erase(0, 2);
  } else if (key.rfind("+", 0) == 0) {
    mode = SetMode::kAdd;
    key.erase(0, 1);
  }
  const std::vector<std::string> parts = split_key(key, origin);
  const std::string value_text = trim(text.substr(eq + 1));
  ConfigNode value;
  if (value_text.empty()) {
    value = scalar_node("", /*quoted=*/true, origin);
  } else if (std::string_view("[{'\"").find(value_text[0]) != std::string_view::npos) {
    value = parse_yaml_text(value_text, origin);
    set_origin(value, origin);
  } else {
    // Plain text is taken as it is (no YAML parsing: `a: b`, `#x` stay text).
    value = scalar_node(value_text, /*quoted=*/false, origin);
  }
  set_path(*root_, parts, value, mode, origin);
}

void Config::apply_overrides(const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(o);
}

namespace {
void set_scalar(ConfigNode& root, std::string_view key, Kind kind, std::string text) {
  const std::string origin = cat("Config::set(\"", key, "\")");
  ConfigNode value;
  value.kind = kind;
  value.text = std::move(text);
  value.origin = origin;
  set_path(root, split_key(key, origin), value, SetMode::kExisting, origin);
}
}  // namespace

void Config::set(std::string_view key, bool value) {
  set_scalar(*root_, key, Kind::kBool, value ? "true" : "false");
}
void Config::set(std::string_view key, int value) { set(key, static_cast<int64_t>(value)); }
void Config::set(std::string_view key, int64_t value) {
  set_scalar(*root_, key, Kind::kInt, std::to_string(value));
}
void Config::set(std::string_view key, double value) {
  set_scalar(*root_, key, Kind::kFloat, format_double(value));
}
void Config::set(std::string_view key, const char* value) { set(key, std::string(value)); }
void Config::set(std::string_view key, const std::string& value) {
  set_scalar(*root_, key, Kind::kString, value);
}

bool Config::has(std::string_view key) const {
  try {
    return find_node(*root_, key) != nullptr;
  } catch (const ConfigError&) {
    return false;
  }
}

bool Config::is_null(std::string_view key) const {
  note_read(key);
  return resolve_key(*root_, key).kind == Kind::kNull;
}

std::vector<std::string> Config::keys(std::string_view section) const {
  if (section.empty()) return root_->names;
  const ConfigNode value = resolve_key(*root_, section);
  require_kind(value, Kind::kMap, std::string(section));
  return value.names;
}

template <>
bool Config::get<bool>(std::string_view key) const {
  note_read(key);
  return read_bool(resolve_key(*root_, key), std::string(key));
}
template <>
int64_t Config::get<int64_t>(std::string_view key) const {
  note_read(key);
  return read_int(resolve_key(*root_, key), std::string(key));
}
template <>
double Config::get<double>(std::string_view key) const {
  note_read(key);
  return read_double(resolve_key(*root_, key), std::string(key));
}
template <>
std::string Config::get<std::string>(std::string_view key) const {
  note_read(key);
  return read_string(resolve_key(*root_, key), std::string(key));
}
template <>
std::vector<int64_t> Config::get<std::vector<int64_t>>(std::string_view key) const {
  note_read(key);
  return read_list<int64_t>(resolve_key(*root_, key), std::string(key), read_int);
}
template <>
std::vector<double> Config::get<std::vector<double>>(std::string_view key) const {
  note_read(key);
  return read_list<double>(resolve_key(*root_, key), std::string(key), read_double);
}
template <>
std::vector<std::string> Config::get<std::vector<std::string>>(std::string_view key) const {
  note_read(key);
  // A single string is a list of one, as verl's scripts pass
  // data.train_files=$HOME/data/gsm8k/train.parquet.
  const ConfigNode value = resolve_key(*root_, key);
  if (value.kind == Kind::kString) return {value.text};
  return read_list<std::string>(value, std::string(key), read_string);
}

Config Config::section(std::string_view key) const {
  ConfigNode value = resolve_key(*root_, key);
  require_kind(value, Kind::kMap, std::string(key));
  return derived(std::make_unique<ConfigNode>(std::move(value)), prefix_ + std::string(key) + ".");
}

Config Config::resolved() const {
  std::vector<std::string> chain;
  return derived(std::make_unique<ConfigNode>(resolve(*root_, *root_, "", chain)), prefix_);
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);  // "null", as verl's files spell it
  emit(out, *root_);
  return std::string(out.c_str()) + "\n";
}

void Config::save(const std::filesystem::path& path) const {
  const std::string text =
      "# The resolved config of this run (base, file and overrides applied).\n" +
      resolved().to_yaml();
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out)
    throw ConfigError(cat("cannot write the config to '", path.string(), "'",
                          ec ? cat(": ", ec.message()) : std::string()));
}

CommandLineConfig config_from_command_line(int argc, const char* const* argv,
                                           const std::filesystem::path& default_config) {
  std::filesystem::path file = default_config;
  std::vector<std::string> overrides, others, notes;
  // Hydra's pair (verl's command lines): a folder and a file in it.
  std::optional<std::filesystem::path> hydra_dir;
  std::optional<std::string> hydra_name;
  const auto value_of = [&](int& i, std::string_view arg, std::string_view flag) {
    if (arg.size() > flag.size() && arg[flag.size()] == '=')
      return std::string(arg.substr(flag.size() + 1));
    if (i + 1 >= argc) throw ConfigError(std::string(flag) + " needs a value");
    return std::string(argv[++i]);
  };
  const auto is_flag = [](std::string_view arg, std::string_view flag) {
    return arg.rfind(flag, 0) == 0 && (arg.size() == flag.size() || arg[flag.size()] == '=');
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--config") {
      if (i + 1 >= argc) throw ConfigError("--config needs a file: --config path/to/config.yaml");
      file = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      file = arg.substr(std::string_view("--config=").size());
    } else if (is_flag(arg, "--config-path")) {
      hydra_dir = value_of(i, arg, "--config-path");
    } else if (is_flag(arg, "--config-name")) {
      hydra_name = value_of(i, arg, "--config-name");
    } else if (!arg.empty() && arg[0] != '-' && arg.find('=') != std::string_view::npos) {
      overrides.emplace_back(arg);
    } else {
      others.emplace_back(arg);
    }
  }
  if (hydra_name) {
    // A file of that name (".yaml" optional) in --config-path, else verl's
    // own config names, which baton's configs/ppo_trainer.yaml stands for.
    std::filesystem::path named = hydra_dir.value_or(".") / *hydra_name;
    if (named.extension() != ".yaml") named += ".yaml";
    const std::string stem = named.stem().string();
    if (std::filesystem::exists(named)) {
      file = named;
    } else if (stem == "ppo_trainer" || stem == "ppo_megatron_trainer") {
      if (file.empty()) file = "configs/ppo_trainer.yaml";
      notes.push_back("--config-name=" + *hydra_name + ": verl's config; baton's " +
                      file.string() + " has its keys (one config for both strategies)");
    } else {
      throw ConfigError("--config-name=" + *hydra_name + ": no such file " + named.string());
    }
  }
  if (file.empty())
    throw ConfigError(
        "no config file: pass --config path/to/config.yaml (e.g. configs/ppo_trainer.yaml)");
  CommandLineConfig result{Config::load(file), std::move(others), {}};
  for (const std::string& o : overrides) apply_verl_override(result.config, o, notes);
  result.notes = std::move(notes);
  return result;
}

}  // namespace baton::trainer
