#include "text/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/tokenizer_error.h"

namespace baton::data {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// Rust's char::is_alphanumeric-based \w and char::is_whitespace, as HF's `regex` crate uses
// them for the Whitespace pre-tokenizer (PCRE2's own \w is narrower).
constexpr const char* kWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control})";

// The matches of `regex` in `text` and the gaps between them, covering all of `text`
// (HF's Pattern::find_matches).
std::vector<Span> find_matches(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, invert}};
  std::size_t prev = 0;
  for (const auto& [begin, end] : regex.find_all(text)) {
    if (prev != begin) spans.push_back({prev, begin, invert});
    spans.push_back({begin, end, !invert});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

// NormalizedString::split of HF tokenizers: what each behaviour keeps of the spans.
std::vector<std::pair<std::size_t, std::size_t>> apply_behavior(const std::vector<Span>& spans,
                                                                Behavior behavior) {
  std::vector<std::pair<std::size_t, std::size_t>> kept;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) kept.emplace_back(s.begin, s.end);
      }
      break;
    case Behavior::kIsolated:
      for (const Span& s : spans) kept.emplace_back(s.begin, s.end);
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty())
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty())
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty())
          kept.back().first = it->begin;
        else
          kept.emplace_back(it->begin, it->end);
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  return kept;
}

void split_all(std::vector<std::string>& pieces, const Regex& regex, Behavior behavior,
               bool invert) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (const std::string& piece : pieces) {
    for (const auto& [begin, end] : apply_behavior(find_matches(regex, piece, invert), behavior)) {
      if (end > begin) out.push_back(piece.substr(begin, end - begin));
    }
  }
  pieces = std::move(out);
}

class Split final : public PreTokenizer {
 public:
  Split(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    split_all(pieces, regex_, behavior_, invert_);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      // GPT-2's pattern, as HF's ByteLevel hard-codes it.
      regex_ = std::make_unique<Regex>(
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
          Regex::Syntax::kRegex, where);
    }
  }
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_) {
      for (std::string& piece : pieces) {
        if (piece.empty() || piece.front() != ' ') piece.insert(piece.begin(), ' ');
      }
    }
    if (regex_) split_all(pieces, *regex_, Behavior::kIsolated, false);
    for (std::string& piece : pieces) piece = byte_level::encode(piece);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& part : parts_) part->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Behavior parse_behavior(const nlohmann::json& config, const std::string& where) {
  const std::string name = json_string(config, "behavior", where);
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw TokenizerError(where + ".behavior: unknown split behaviour '" + name +
                       "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config,
                                                 const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = json_array(config, "pretokenizers", where);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto part = make_pre_tokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    return std::make_unique<Split>(Regex::from_pattern_field(config, where),
                                   parse_behavior(config, where),
                                   json_bool(config, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(json_bool(config, "add_prefix_space", true, where),
                                       json_bool(config, "use_regex", true, where), where);
  }
  if (type == "Digits") {
    // char::is_numeric: every digit alone, or runs of digits kept together.
    const bool individual = json_bool(config, "individual_digits", false, where);
    return std::make_unique<Split>(Regex(R"(\p{N})", Regex::Syntax::kRegex, where),
                                   individual ? Behavior::kIsolated : Behavior::kContiguous, false);
  }
  if (type == "Whitespace") {
    const std::string w = kWordClass;
    return std::make_unique<Split>(
        Regex("[" + w + "]+|[^" + w + R"(\p{White_Space}]+)", Regex::Syntax::kRegex, where),
        Behavior::kRemoved, true);
  }
  throw TokenizerError(where + ": unsupported pre-tokenizer type '" + type +
                       "' (baton supports ByteLevel, Split, Digits, Whitespace and Sequence)");
}

std::vector<std::string> pre_tokenize(const PreTokenizer* pre_tokenizer, std::string_view text) {
  std::vector<std::string> pieces;
  if (!text.empty()) pieces.emplace_back(text);
  if (pre_tokenizer != nullptr) pre_tokenizer->pre_tokenize(pieces);
  return pieces;
}

}  // namespace baton::data
