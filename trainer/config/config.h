// Config: a tree of YAML settings with verl's key names (configs/ppo_trainer.yaml),
// command-line overrides, `${...}` interpolations and typed access.
//
// Files. `Config::load(path)` reads a YAML mapping. A file may name the config it
// overrides with a top-level key `base: <file>` (a path relative to the file's
// folder; bases may have bases, cycles are an error): the base is loaded first
// and the file is merged over it, key by key. A key the base does not have is an
// error, as on the command line, unless it is written `+key:` (adds it).
//
// Overrides (`apply_override`, Hydra's spelling, as verl's command lines use):
//   a.b.c=value    sets an existing key; the value is a YAML scalar
//                  (`3`, `0.5`, `1e-6`, `true`, `null`, `text`, `'3'` quoted is a
//                  string), a list `[a,b]` or a mapping `{x: 1}`; `a.b=` is "".
//   +a.new=value   adds a key that does not exist (an error if it does).
//   ++a.b=value    sets the key, adding it if missing.
//
// Types. A key's type is that of its current value: an int, float, bool, string,
// list or mapping (the base config's defaults fix them). A new value must be of
// that type, except that an int is accepted for a float, any scalar for a
// string (kept as its text), and null (which disables a setting) for anything.
// A key whose value is null takes any value, and goes on taking any value
// (it has no type, as Hydra's Any: a path, then a list of paths). Lists whose
// elements share one scalar type take new elements of that type. Violations
// throw ConfigError naming the key, the expected and the given type, and
// where the value came from (the file or the override).
//
// Unknown keys throw ConfigError naming the key and the closest known key (by
// edit distance over full dotted paths).
//
// Interpolations. A string value `${a.b}` stands for the value of key `a.b`
// (any type); `text/${a.b}/${c}` is a string with the scalar values
// substituted. They are resolved when read (so an override of `a.b` is seen by
// every key that refers to it), and in `resolved()` / `save()`. A key path does
// not lead through a reference to a mapping (`a.b` when a is `${x}`): refer to
// the leaves instead.
//
// Example:
//   Config config = Config::load("configs/grpo_toy.yaml");
//   config.apply_overrides({"data.train_batch_size=16", "trainer.logger=[console]"});
//   int64_t batch = config.get<int64_t>("data.train_batch_size");
//   std::optional<int64_t> micro =
//       config.get_optional<int64_t>("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu");
//   config.save(run_dir / "config.yaml");   // resolved: no `${...}` left
//
// Thread safety: const members may be called concurrently; others need
// exclusive access.
#pragma once

#include "base/errors.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::trainer {

// A config that cannot be used: an unknown key, a wrong type, a bad file or
// override, impossible sizes. what() names the key(s) and where they came from.
class ConfigError : public baton::Error {
 public:
  using baton::Error::Error;
};

struct ConfigNode;  // the tree (config.cpp)

class Config {
 public:
  // An empty mapping.
  Config();
  ~Config();
  Config(const Config& other);
  Config& operator=(const Config& other);
  Config(Config&& other) noexcept;
  Config& operator=(Config&& other) noexcept;

  // Reads `path` (and its `base:` chain). Throws ConfigError for a missing or
  // unparsable file (naming it and the line), a top level that is not a
  // mapping, or a key/type error in a file that has a base.
  static Config load(const std::filesystem::path& path);
  // Parses YAML text; `where` names it in errors. A `base:` key is resolved
  // relative to `base_dir` (the current directory when empty).
  static Config from_yaml(std::string_view yaml, const std::string& where = "<string>",
                          const std::filesystem::path& base_dir = {});

  // Applies one override (syntax above). Throws ConfigError for a malformed
  // override, an unknown key, a `+` key that exists, or a wrong type.
  void apply_override(std::string_view override_text);
  void apply_overrides(const std::vector<std::string>& overrides);

  // Sets an existing key (same rules as an override of that key).
  void set(std::string_view key, bool value);
  void set(std::string_view key, int value);
  void set(std::string_view key, int64_t value);
  void set(std::string_view key, double value);
  void set(std::string_view key, const char* value);
  void set(std::string_view key, const std::string& value);

  // Whether the key exists (a dotted path; interpolations are not followed).
  bool has(std::string_view key) const;
  // Whether the key's (resolved) value is null. Throws ConfigError for an unknown key.
  bool is_null(std::string_view key) const;
  // The names of a mapping's children, in file order ("" is the top level).
  std::vector<std::string> keys(std::string_view section = "") const;

  // Typed access to a resolved value. T is one of bool, int64_t, double,
  // std::string, std::vector<int64_t>, std::vector<double>,
  // std::vector<std::string>. Throws ConfigError naming the key for an unknown
  // key, a null value, or a value of another type (naming expected and given
  // type); a float never converts to an int. get<std::string> accepts any scalar
  // (its text).
  template <typename T>
  T get(std::string_view key) const;
  // As get, but nullopt for a null value.
  template <typename T>
  std::optional<T> get_optional(std::string_view key) const {
    if (is_null(key)) return std::nullopt;
    return get<T>(key);
  }

  // The mapping at `section` as a config of its own (resolved, so its
  // interpolations need not point inside it). Throws ConfigError if the key is
  // unknown or not a mapping.
  Config section(std::string_view key) const;

  // A copy with every interpolation replaced by its value. Throws ConfigError
  // for an interpolation naming an unknown key (with the closest known key) or
  // a cycle.
  Config resolved() const;
  // Read tracking, for finding keys nothing reads (a config key that is
  // accepted and then ignored). After track_reads(), every get / get_optional /
  // is_null of this config records its key, and so do the copies, sections
  // and resolved() configs made from it afterwards (one shared record; a
  // section records full paths). unread_keys() lists this config's leaves
  // (scalars, lists, nulls, empty mappings), as dotted paths in file order,
  // that no such read has named. Without track_reads() nothing is recorded
  // and unread_keys() lists every leaf.
  void track_reads();
  std::vector<std::string> unread_keys() const;

  // YAML text of the config as it is (interpolations kept). Strings that would
  // read back as another type are quoted, so from_yaml(to_yaml()) is the same
  // config.
  std::string to_yaml() const;
  // Writes `resolved().to_yaml()` to `path` (folders created), with a comment
  // saying what it is. Throws ConfigError if it cannot be written.
  void save(const std::filesystem::path& path) const;

 private:
  struct ReadLog;
  explicit Config(std::unique_ptr<ConfigNode> root);
  Config derived(std::unique_ptr<ConfigNode> root, std::string prefix) const;
  void note_read(std::string_view key) const;
  std::unique_ptr<ConfigNode> root_;
  std::shared_ptr<ReadLog> reads_;  // null: not tracking
  std::string prefix_;              // this config's path in the tracked one ("" or "a.b.")
};

template <>
bool Config::get<bool>(std::string_view key) const;
template <>
int64_t Config::get<int64_t>(std::string_view key) const;
template <>
double Config::get<double>(std::string_view key) const;
template <>
std::string Config::get<std::string>(std::string_view key) const;
template <>
std::vector<int64_t> Config::get<std::vector<int64_t>>(std::string_view key) const;
template <>
std::vector<double> Config::get<std::vector<double>>(std::string_view key) const;
template <>
std::vector<std::string> Config::get<std::vector<std::string>>(std::string_view key) const;

// A driver's command line, as `build/examples/grpo --config configs/grpo_toy.yaml
// data.train_batch_size=16 +trainer.note=x` gives it: the file of `--config FILE`
// (or `--config=FILE`; `default_config` when absent), then every `key=value`
// argument (`+key=`, `++key=` too) applied as an override, in order. Arguments
// that start with '-' or have no '=' are the driver's own: they are returned
// in `other_args`, in order. argv[0] is skipped.
//
// verl's command lines run as they are: `--config-path DIR --config-name
// NAME` (Hydra's, `=` or a space) loads DIR/NAME[.yaml], and verl's own
// `ppo_trainer` / `ppo_megatron_trainer` (not a file there) stand for
// `default_config` (configs/ppo_trainer.yaml when there is none); an
// override of a verl key baton lacks is decided by its verl entry
// (trainer/config/verl_keys.h). What either did is in `notes`, one line each,
// for the driver to log.
struct CommandLineConfig {
  Config config;
  std::vector<std::string> other_args;
  std::vector<std::string> notes;
};
// Throws ConfigError when there is no config file (no --config and no
// default), `--config` has no value, or the file or an override fails.
CommandLineConfig config_from_command_line(int argc, const char* const* argv,
                                           const std::filesystem::path& default_config = {});


}  // namespace baton::trainer
