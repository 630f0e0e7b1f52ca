#include "workers/rewards/exact_match_reward.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "workers/rewards/reward_text.h"

namespace baton::rewards {
namespace {

constexpr std::string_view kOpen = "<answer>";
constexpr std::string_view kClose = "</answer>";
constexpr size_t kMaxTags = 10;

bool is_ascii_punctuation(unsigned char c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
         (c >= 123 && c <= 126);
}

// Python's str.split() separators among ASCII.
bool is_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 28 && c <= 31); }

// A character of a regex word (\w): letters, digits, '_' and, approximately,
// every non-ASCII byte (letters of other scripts).
bool is_word(unsigned char c) {
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z');
}

}  // namespace

std::optional<std::string> extract_tagged_answer(std::string_view response) {
  std::optional<std::string> last;
  size_t pos = 0;
  while (true) {
    const size_t open = response.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    const size_t close = response.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) break;
    const size_t begin = open + kOpen.size();
    last = std::string(text::strip(response.substr(begin, close - begin)));
    pos = close + kClose.size();
  }
  return last;
}

std::string normalize_answer(std::string_view input) {
  // lower, then punctuation removed.
  std::string s;
  for (const char ch : input) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_ascii_punctuation(c)) continue;
    s += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : ch;
  }
  // \b(a|an|the)\b → " ".
  std::string no_articles;
  for (size_t i = 0; i < s.size();) {
    if (!is_word(static_cast<unsigned char>(s[i]))) {
      no_articles += s[i++];
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_word(static_cast<unsigned char>(s[j]))) ++j;
    const std::string_view word(s.data() + i, j - i);
    if (word == "a" || word == "an" || word == "the")
      no_articles += ' ';
    else
      no_articles.append(word);
    i = j;
  }
  // " ".join(text.split()).
  std::string out;
  for (size_t i = 0; i < no_articles.size();) {
    if (is_space(static_cast<unsigned char>(no_articles[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < no_articles.size() && !is_space(static_cast<unsigned char>(no_articles[j]))) ++j;
    if (!out.empty()) out += ' ';
    out.append(no_articles, i, j - i);
    i = j;
  }
  return out;
}

double exact_match_score(std::string_view response, const std::vector<std::string>& ground_truths,
                         const ExactMatchOptions& options) {
  const std::optional<std::string> answer = extract_tagged_answer(response);
  if (!answer) return 0.0;
  const std::string normalized = normalize_answer(*answer);
  for (const std::string& truth : ground_truths) {
    if (normalize_answer(truth) != normalized) continue;
    if (text::count(response, kOpen) > kMaxTags || text::count(response, kClose) > kMaxTags)
      return options.score / 4;
    return options.score;
  }
  return options.format_score;
}

std::vector<std::string> parse_ground_truths(std::string_view ground_truth) {
  const std::string_view trimmed = text::strip(ground_truth);
  if (trimmed.empty() || (trimmed.front() != '[' && trimmed.front() != '{'))
    return {std::string(ground_truth)};
  nlohmann::json json = nlohmann::json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
  if (json.is_object() && json.contains("target")) json = json["target"];
  if (json.is_string()) return {json.get<std::string>()};
  if (json.is_array() && !json.empty() &&
      std::all_of(json.begin(), json.end(), [](const auto& v) { return v.is_string(); })) {
    std::vector<std::string> out;
    for (const auto& v : json) out.push_back(v.get<std::string>());
    return out;
  }
  return {std::string(ground_truth)};
}

}  // namespace baton::rewards
