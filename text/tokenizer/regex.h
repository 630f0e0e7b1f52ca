// A compiled PCRE2 regular expression over UTF-8 text, with Unicode classes (UTF + UCP), as the
// tokenizer's Split pre-tokenizer and Replace decoder need it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class Regex {
 public:
  enum class Syntax {
    kRegex,    // a pattern (Oniguruma/Ruby-like: ^ and $ match at line boundaries)
    kLiteral,  // the exact string
  };

  // Throws TokenizerError naming `where` and PCRE2's message when the pattern does not
  // compile.
  Regex(std::string_view pattern, Syntax syntax, const std::string& where);
  // The "pattern" field of an HF Split or Replace: {"String": literal} or {"Regex": pattern}.
  static Regex from_pattern_field(const nlohmann::json& owner, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Every non-overlapping match as byte offsets [begin, end), left to right. An empty match
  // advances the search by one character. REQUIRES: `text` is valid UTF-8. Thread-safe.
  // Throws TokenizerError if PCRE2 fails (a match or depth limit), naming the pattern.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

  bool matches_anywhere(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::data
