// Fuzzes the trainer's config (trainer/config/config.h): the input is a YAML config,
// optionally followed by a NUL byte and command-line overrides, one a line
// (`a.b=1`, `+a.new=[x]`, ...). A config that loads is read as a driver reads
// it: every leaf through its interpolations, resolved(), to_yaml(); and
// to_yaml() must read back as the same config. Bad YAML, keys, types or
// overrides must throw ConfigError.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/config/config.h"

namespace {

using baton::trainer::Config;
using baton::trainer::ConfigError;

// An empty folder: a `base:` with a relative path names nothing there.
const std::filesystem::path& base_dir() {
  static const std::filesystem::path dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "baton-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) __builtin_trap();
    return std::filesystem::path(pattern);
  }();
  return dir;
}

std::vector<std::string> lines(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    out.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

void read_every_leaf(const Config& config) {
  for (const std::string& key : config.unread_keys()) {
    try {
      if (!config.is_null(key)) config.get<std::string>(key);
    } catch (const ConfigError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view yaml = input.substr(0, nul);
  try {
    Config config = Config::from_yaml(yaml, "fuzz.yaml", base_dir());
    if (nul != std::string_view::npos) {
      for (const std::string& line : lines(input.substr(nul + 1))) {
        try {
          config.apply_override(line);
        } catch (const ConfigError&) {
        }
      }
    }
    read_every_leaf(config);
    const std::string text = config.to_yaml();
    const Config again = Config::from_yaml(text, "fuzz.yaml (written back)", base_dir());
    if (again.to_yaml() != text) __builtin_trap();
    const Config resolved = config.resolved();
    read_every_leaf(resolved);
    resolved.to_yaml();
  } catch (const ConfigError&) {
  }
  return 0;
}
