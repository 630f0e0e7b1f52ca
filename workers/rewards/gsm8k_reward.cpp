#include "workers/rewards/gsm8k_reward.h"

#include <vector>

#include "workers/rewards/reward_text.h"

namespace baton::rewards {
namespace {

// verl reads only the end of long responses (its regexes are slow on long text).
constexpr size_t kClipCodePoints = 300;

bool is_number_char(char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; }

// The match of `-?[0-9.,]+` starting at `i`, or 0 characters.
size_t number_length(std::string_view s, size_t i) {
  size_t j = i;
  if (j < s.size() && s[j] == '-') ++j;
  const size_t digits_start = j;
  while (j < s.size() && is_number_char(s[j])) ++j;
  return j > digits_start ? j - i : 0;
}

}  // namespace

std::optional<std::string> extract_gsm8k_answer(std::string_view response, Gsm8kMethod method) {
  const std::string_view text = text::last_code_points(response, kClipCodePoints);
  if (method == Gsm8kMethod::kStrict) {
    // re.findall("#### (-?[0-9.,]+)"), the last match.
    constexpr std::string_view kMarker = "#### ";
    std::optional<std::string> last;
    size_t pos = 0;
    while ((pos = text.find(kMarker, pos)) != std::string_view::npos) {
      const size_t length = number_length(text, pos + kMarker.size());
      if (length == 0) {
        ++pos;
        continue;
      }
      last = std::string(text.substr(pos + kMarker.size(), length));
      pos += kMarker.size() + length;
    }
    if (!last) return std::nullopt;
    return text::replace_all(text::replace_all(*last, ",", ""), "$", "");
  }
  // re.findall("(-?[0-9.,]+)"), the last that is not "" or "."; when all
  // are, Python's loop leaves the first one.
  std::vector<std::string> numbers;
  for (size_t i = 0; i < text.size();) {
    const size_t length = number_length(text, i);
    if (length == 0) {
      ++i;
      continue;
    }
    numbers.emplace_back(text.substr(i, length));
    i += length;
  }
  if (numbers.empty()) return std::nullopt;
  for (auto it = numbers.rbegin(); it != numbers.rend(); ++it)
    if (*it != "" && *it != ".") return *it;
  return numbers.front();
}

double gsm8k_score(std::string_view response, std::string_view ground_truth,
                   const Gsm8kOptions& options) {
  const std::optional<std::string> answer = extract_gsm8k_answer(response, options.method);
  if (!answer) return 0.0;
  return *answer == ground_truth ? options.score : options.format_score;
}

}  // namespace baton::rewards
