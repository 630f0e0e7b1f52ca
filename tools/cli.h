// Command-line parsing shared by the tools and benchmarks: numbers and
// separated lists, each failing with a UsageError that names the option and
// the text, which main() prints with its usage line.
//
// Example:
//   try {
//     cli::for_each_option(argc, argv, {"--verbose"}, [&](const auto& key, const auto& value) {
//       if (key == "--tp") args.tp = cli::parse_int(value, key);
//       else if (key == "--verbose") args.verbose = true;
//       else cli::unknown_option(key);
//     });
//     auto prompts = cli::split("1,2;3", ';');   // {"1,2", "3"}
//   } catch (const cli::UsageError& e) { usage(e.what()); }
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Walks the "--key value" pairs of argv (and the `flags`, which take no
// value: then `on` gets an empty value), calling on(key, value) for each.
// Throws UsageError for an option without its value; `on` throws it for
// keys it does not know (see unknown_option).
inline void for_each_option(int argc, char** argv, const std::vector<std::string>& flags,
                            const std::function<void(const std::string&, const std::string&)>& on) {
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    if (std::find(flags.begin(), flags.end(), key) != flags.end()) {
      on(key, "");
      continue;
    }
    if (i + 1 >= argc) throw UsageError("missing value for " + key);
    on(key, argv[++i]);
  }
}

[[noreturn]] inline void unknown_option(const std::string& key) {
  throw UsageError("unknown option " + key);
}

// The parts of `text` between `sep`s ("a,,b" -> {"a", "", "b"}; "" -> {""}).
inline std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? at : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

// The whole of `text` as an integer, else UsageError("bad <what>: "<text>"").
inline int64_t parse_int(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("bad " + what + ": \"" + text + "\"");
}

inline double parse_double(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError("bad " + what + ": \"" + text + "\"");
}

// "1,2,3" -> {1, 2, 3}; every element must parse (an empty one does not).
inline std::vector<int64_t> parse_int_list(const std::string& text, char sep,
                                           const std::string& what) {
  std::vector<int64_t> out;
  for (const auto& part : split(text, sep)) out.push_back(parse_int(part, what));
  return out;
}

}  // namespace baton::cli
