// Command-line parsing shared by the tools and benchmarks: numbers and
// separated lists, each failing with a UsageError that names the option and
// the text, which main() prints with its usage line.
//
// Example:
//   try {
//     args.tp = cli::parse_int(value, "--tp");
//     args.prompts = cli::split(value, ';');   // "1,2;3" -> {"1,2", "3"}
//   } catch (const cli::UsageError& e) { usage(e.what()); }
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace baton::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
