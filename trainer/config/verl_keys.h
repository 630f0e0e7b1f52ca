// verl's config keys that baton's own config (configs/ppo_trainer.yaml) does
// not have, each with what baton does with it, so that a verl user's command
// line runs as it is instead of failing on the first key baton lacks.
//
// A key of verl's ppo_trainer.yaml / ppo_megatron_trainer.yaml (and of its
// example scripts) is either one of baton's own keys, read as verl reads it,
// or it has an entry here with one of four fates:
//   kMapped       baton has the setting under another name: the value is set
//                 there (a note says so).
//   kIgnored      accepted at any value, with no effect; a note says why
//                 (`rollout.name=vllm`: baton's own engine generates).
//   kDefaultOnly  accepted at the values where verl does nothing different
//                 from baton (its default), with no effect; any other value
//                 is refused, the error naming baton's equivalent.
//   kRefused      refused at any value, naming baton's equivalent.
// tests/trainer/verl_keys_test.cpp walks verl's YAML (copies under
// tests/fixtures/verl/) and fails on a key with neither; docs/verl-keys.md is
// this table as text (verl_keys_markdown), checked against it by that test.
//
// Patterns are dotted paths whose segments may be `*` (any one segment) or
// `**` (any number of segments, none included); the first entry that
// matches decides.
//
// Example:
//   Config config = Config::load("configs/ppo_trainer.yaml");
//   std::vector<std::string> notes;
//   apply_verl_override(config, "actor_rollout_ref.rollout.name=vllm", notes);
//   // notes: {"actor_rollout_ref.rollout.name=vllm: ignored: baton's own engine generates ..."}
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace baton::trainer {

class Config;

enum class VerlFate { kMapped, kIgnored, kDefaultOnly, kRefused };

struct VerlKey {
  const char* pattern;
  VerlFate fate;
  // kMapped: baton's key. Otherwise: why it has no effect (kIgnored,
  // kDefaultOnly) or what baton has instead (kDefaultOnly, kRefused).
  const char* detail;
  // kDefaultOnly: the accepted values, separated by '|' ("null" also stands
  // for an empty value and `~`; case does not matter). Unused otherwise.
  const char* accepted = "";
};

// Every entry, in match order.
std::span<const VerlKey> verl_keys();

// The entry deciding `key` (a dotted path), or nullptr.
const VerlKey* find_verl_key(std::string_view key);

// Applies one command-line override (`key=value`, `+key=value`,
// `++key=value`). A key that the config has, or an override that adds one
// (`+`), is applied as Config::apply_override does. A key it lacks is
// decided by its verl entry: kMapped sets baton's key, kIgnored and an
// accepted kDefaultOnly value change nothing; each appends a note to
// `notes`. Throws ConfigError for a refused key or value (naming the key,
// the value and baton's equivalent) and, for a key without an entry, as
// Config::apply_override does (naming the closest key).
void apply_verl_override(Config& config, std::string_view override_text,
                         std::vector<std::string>& notes);

// The table as Markdown (docs/verl-keys.md): one row per entry.
std::string verl_keys_markdown();

}  // namespace baton::trainer
