#include "text/tokenizer/regex.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/utf8.h"

namespace baton::data {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, Syntax syntax, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  // Oniguruma's Ruby syntax (HF's regex engine): ^ and $ are line anchors.
  const uint32_t options = syntax == Syntax::kLiteral ? PCRE2_UTF | PCRE2_LITERAL
                                                      : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                              &error, &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw TokenizerError(where + ": the regular expression '" + std::string(pattern) +
                         "' does not compile (PCRE2, at offset " + std::to_string(offset) +
                         "): " + reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only: without it pcre2_match interprets.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex Regex::from_pattern_field(const nlohmann::json& owner, const std::string& where) {
  const auto& pattern = json_field(owner, "pattern", where);
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    return Regex(pattern["String"].get<std::string>(), Syntax::kLiteral, where + ".pattern");
  }
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    return Regex(pattern["Regex"].get<std::string>(), Syntax::kRegex, where + ".pattern");
  }
  throw TokenizerError(where + ".pattern: expected {\"String\": ...} or {\"Regex\": ...}");
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {  // a resource limit: never drop the rest of the text silently
      pcre2_match_data_free(data);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw TokenizerError("the regular expression '" + impl_->pattern + "' failed at byte " +
                           std::to_string(start) + " of a " + std::to_string(text.size()) +
                           "-byte text: " + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const std::size_t begin = ovector[0], end = ovector[1];
    out.emplace_back(begin, end);
    if (end > begin) {
      start = end;
    } else if (end < text.size()) {
      start = end + utf8::sequence_length(static_cast<unsigned char>(text[end]));
    } else {
      break;
    }
  }
  pcre2_match_data_free(data);
  return out;
}

bool Regex::matches_anywhere(std::string_view text) const {
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_NO_UTF_CHECK, data, nullptr);
  pcre2_match_data_free(data);
  return rc >= 0;
}

}  // namespace baton::data
