#include "text/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/tokenizer_error.h"
#include "text/utf8.h"

namespace baton::data {
namespace {

// Unicode White_Space, as Rust's \s in HF's lstrip/rstrip.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The start of the last character before `end`.
std::size_t previous_char(std::string_view text, std::size_t end) {
  std::size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t char_at(std::string_view text, std::size_t pos) {
  const std::size_t n = utf8::sequence_length(static_cast<unsigned char>(text[pos]));
  return utf8::decode(text.substr(pos, n))[0];
}

}  // namespace

AddedVocabulary::AddedVocabulary(const nlohmann::json& tokens, const Normalizer* normalizer,
                                 const std::string& where)
    : word_char_(std::make_unique<Regex>(R"(\A[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])",
                                         Regex::Syntax::kRegex, where)) {
  if (tokens.is_null()) return;
  if (!tokens.is_array()) throw TokenizerError(where + ": expected an array of added tokens");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string here = where + "[" + std::to_string(i) + "]";
    const auto& t = tokens[i];
    AddedToken token;
    token.content = json_string(t, "content", here);
    const int64_t id = json_int(t, "id", here);
    // One past the largest id (vocab_size) must be an int32 too.
    if (id < 0 || id >= INT32_MAX) {
      throw TokenizerError(here + ".id: expected an id from 0 to " + std::to_string(INT32_MAX - 1));
    }
    token.id = static_cast<int32_t>(id);
    token.single_word = json_bool(t, "single_word", false, here);
    token.lstrip = json_bool(t, "lstrip", false, here);
    token.rstrip = json_bool(t, "rstrip", false, here);
    token.special = json_bool(t, "special", false, here);
    token.normalized = json_bool(t, "normalized", !token.special, here);
    if (token.content.empty()) continue;  // HF ignores empty added tokens
    if (!utf8::is_valid(token.content)) throw TokenizerError(here + ".content: invalid UTF-8");
    std::string form = token.content;
    if (token.normalized && normalizer != nullptr) form = normalizer->normalize(form);
    if (form.empty()) continue;
    starts_[token.normalized ? 1 : 0][static_cast<unsigned char>(form[0])].push_back(
        tokens_.size());
    has_normalized_ = has_normalized_ || token.normalized;
    by_content_[token.content] = token.id;
    by_id_[token.id] = tokens_.size();
    tokens_.push_back(std::move(token));
    match_form_.push_back(std::move(form));
  }
}

AddedVocabulary::~AddedVocabulary() = default;
AddedVocabulary::AddedVocabulary(AddedVocabulary&&) noexcept = default;

std::optional<int32_t> AddedVocabulary::find(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::token(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string* AddedVocabulary::decoded(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &match_form_[it->second];
}

bool AddedVocabulary::is_special(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it != by_content_.end() && token(it->second)->special;
}

// HF's AddedVocabulary::find_matches: leftmost-longest matches of the tokens of one kind,
// with single_word, lstrip and rstrip applied.
std::vector<AddedVocabulary::Segment> AddedVocabulary::find_in(std::string_view text,
                                                               bool normalized) const {
  std::vector<Segment> out;
  std::size_t offset = 0;  // end of the last emitted match
  std::size_t search = 0;
  while (search < text.size()) {
    // The leftmost position where a token starts, and the longest token there.
    std::size_t start = text.size(), best = tokens_.size();
    const auto& by_first_byte = starts_[normalized ? 1 : 0];
    for (std::size_t pos = search; pos < text.size() && best == tokens_.size(); ++pos) {
      for (std::size_t k : by_first_byte[static_cast<unsigned char>(text[pos])]) {
        const std::string& form = match_form_[k];
        if (text.compare(pos, form.size(), form) == 0 &&
            (best == tokens_.size() || form.size() > match_form_[best].size())) {
          best = k;
          start = pos;
        }
      }
    }
    if (best == tokens_.size()) break;
    const AddedToken& token = tokens_[best];
    std::size_t stop = start + match_form_[best].size();
    search = stop;
    if (token.single_word) {
      const bool word_before =
          start > 0 && word_char_->matches_anywhere(text.substr(previous_char(text, start)));
      const bool word_after = stop < text.size() && word_char_->matches_anywhere(text.substr(stop));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      std::size_t s = start;
      while (s > 0 && is_white_space(char_at(text, previous_char(text, s))))
        s = previous_char(text, s);
      start = std::max(s, offset);
    }
    if (token.rstrip) {
      while (stop < text.size() && is_white_space(char_at(text, stop))) {
        stop += utf8::sequence_length(static_cast<unsigned char>(text[stop]));
      }
      search = stop;
    }
    if (offset < start)
      out.push_back({std::string(text.substr(offset, start - offset)), std::nullopt});
    out.push_back({std::string(text.substr(start, stop - start)), token.id});
    offset = stop;
  }
  if (offset < text.size()) out.push_back({std::string(text.substr(offset)), std::nullopt});
  return out;
}

std::vector<AddedVocabulary::Segment> AddedVocabulary::split(std::string_view text,
                                                             const Normalizer* normalizer) const {
  std::vector<Segment> out;
  for (Segment& raw : find_in(text, /*normalized=*/false)) {
    if (raw.id) {
      out.push_back(std::move(raw));
      continue;
    }
    std::string norm = normalizer != nullptr ? normalizer->normalize(raw.text) : raw.text;
    if (!has_normalized_) {
      if (!norm.empty()) out.push_back({std::move(norm), std::nullopt});
      continue;
    }
    for (Segment& seg : find_in(norm, /*normalized=*/true)) {
      if (!seg.text.empty()) out.push_back(std::move(seg));
    }
  }
  return out;
}

}  // namespace baton::data
