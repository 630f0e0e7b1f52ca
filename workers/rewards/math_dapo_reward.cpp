#include "workers/rewards/math_dapo_reward.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "workers/rewards/reward_text.h"

namespace baton::rewards {
namespace {

// The code point at byte `i` (an invalid byte stands for itself).
uint32_t code_point_at(std::string_view s, size_t i) {
  const size_t size = text::code_point_size(s, i);
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (size) {
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default:
      return b(0);
  }
}

// Python's str.isspace(), which `\s` of a str pattern matches.
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// Bytes of the whitespace code points starting at `i`.
size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_python_space(code_point_at(s, i))) i += text::code_point_size(s, i);
  return i;
}

// (?i)answer at `i`: its length in bytes, or 0. Case folding as Python's
// re.IGNORECASE for str: ASCII, plus U+017F (long s), which matches 's'.
size_t match_answer_word(std::string_view s, size_t i) {
  static constexpr std::string_view kWord = "answer";
  const size_t start = i;
  for (char w : kWord) {
    if (i >= s.size()) return 0;
    const char c = s[i];
    if (c == w || c == w - 'a' + 'A') {
      ++i;
    } else if (w == 's' && s.substr(i, 2) == "\xC5\xBF") {
      i += 2;
    } else {
      return 0;
    }
  }
  return i - start;
}

// The group of the last non-overlapping match of (?i)Answer\s*:\s*([^\n]+).
std::optional<std::string> last_answer(std::string_view s) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < s.size()) {
    const size_t word = match_answer_word(s, i);
    if (word == 0) {
      ++i;
      continue;
    }
    const size_t colon = skip_space(s, i + word);
    if (colon >= s.size() || s[colon] != ':') {
      ++i;
      continue;
    }
    // \s* is greedy and gives back code points until [^\n]+ can start.
    std::vector<size_t> starts{colon + 1};
    while (starts.back() < s.size() && is_python_space(code_point_at(s, starts.back())))
      starts.push_back(starts.back() + text::code_point_size(s, starts.back()));
    size_t group = std::string_view::npos;
    for (auto it = starts.rbegin(); it != starts.rend(); ++it)
      if (*it < s.size() && s[*it] != '\n') {
        group = *it;
        break;
      }
    if (group == std::string_view::npos) {
      ++i;
      continue;
    }
    size_t end = s.find('\n', group);
    if (end == std::string_view::npos) end = s.size();
    last = std::string(s.substr(group, end - group));
    i = end;
  }
  return last;
}

// re.sub(r"(<open>)(.*?)(\})", r"\2", s) (lazy) or re.sub(r"(<open>)(.*)(\})", r"\2", s)
// (greedy): `.` stops at a newline.
std::string unwrap(std::string_view s, std::string_view open, bool greedy) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.substr(i, open.size()) == open) {
      const size_t from = i + open.size();
      size_t line_end = s.find('\n', from);
      if (line_end == std::string_view::npos) line_end = s.size();
      const std::string_view line = s.substr(from, line_end - from);
      const size_t close = greedy ? line.rfind('}') : line.find('}');
      if (close != std::string_view::npos) {
        out.append(line.substr(0, close));
        i = from + close + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s): a line with two '$' becomes
// "$" + what lies between its first two + "$".
std::string keep_first_math(std::string_view s) {
  std::string out;
  bool first_line = true;
  for (const std::string& line : text::split(s, "\n")) {
    if (!first_line) out.push_back('\n');
    first_line = false;
    const size_t first = line.find('$');
    const size_t second = first == std::string::npos ? first : line.find('$', first + 1);
    if (second == std::string::npos)
      out += line;
    else
      out += "$" + line.substr(first + 1, second - first - 1) + "$";
  }
  return out;
}

// re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s) and re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s):
// `name` then `arguments` code points, the first not '{', the others not '\n'.
std::string brace_shorthand(std::string_view s, std::string_view name, int arguments) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.substr(i, name.size()) == name) {
      size_t j = i + name.size();
      std::string braced(name);
      int taken = 0;
      for (; taken < arguments && j < s.size(); ++taken) {
        if (taken == 0 ? s[j] == '{' : s[j] == '\n') break;
        const size_t size = text::code_point_size(s, j);
        braced += "{" + std::string(s.substr(j, size)) + "}";
        j += size;
      }
      if (taken == arguments) {
        out += braced;
        i = j;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

bool is_ascii_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// math_dapo's last_boxed_only_string + remove_boxed: the content of the last
// `\boxed{...}` (braces matched), or nullopt.
std::optional<std::string> last_boxed_content(std::string_view s) {
  static constexpr std::string_view kOpen = "\\boxed{";
  const size_t start = s.rfind(kOpen);
  if (start == std::string_view::npos) return std::nullopt;
  int open = 0;
  for (size_t i = start; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}' && --open == 0)
      return std::string(s.substr(start + kOpen.size(), i - start - kOpen.size()));
  }
  return std::nullopt;
}

}  // namespace

std::string normalize_final_answer(std::string_view answer) {
  static const std::pair<std::string_view, std::string_view> kSubstitutions[] = {
      {"an ", ""},      {"a ", ""},        {".$", "$"},
      {"\\$", ""},      {"\\ ", ""},       {" ", ""},
      {"mbox", "text"}, {",\\text{and}", ","}, {"\\text{and}", ","},
      {"\\text{m}", "\\text{}"},
  };
  static const std::string_view kRemoved[] = {
      "square",    "ways",       "integers",  "dollars",      "mph",
      "inches",    "hours",      "km",        "units",        "\\ldots",
      "sue",       "points",     "feet",      "minutes",      "digits",
      "cents",     "degrees",    "cm",        "gm",           "pounds",
      "meters",    "meals",      "edges",     "students",     "childrentickets",
      "multiples", "\\text{s}",  "\\text{.}", "\\text{\ns}",  "\\text{}^2",
      "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ",
      "^{\\circ}", "\\;",        ",\\!",      "{,}",          "\"",
      "\\dots",
  };
  std::string s(text::split(answer, "=").back());
  for (const auto& [from, to] : kSubstitutions) s = text::replace_all(s, from, to);
  for (std::string_view removed : kRemoved) s = text::replace_all(s, removed, "");
  s = keep_first_math(s);
  s = unwrap(s, "\\text{", false);
  s = unwrap(s, "\\textbf{", false);
  s = unwrap(s, "\\overline{", false);
  s = unwrap(s, "\\boxed{", true);
  s = brace_shorthand(s, "frac", 2);
  s = brace_shorthand(s, "sqrt", 1);
  s = text::replace_all(s, "$", "");
  if (is_ascii_digits(text::replace_all(s, ",", ""))) s = text::replace_all(s, ",", "");
  return std::string(text::strip(s));
}

std::string math_dapo_prediction(std::string_view response, const MathDapoOptions& options) {
  const std::string_view tail = text::last_code_points(response, 300);
  if (options.strict_box_verify)
    return last_boxed_content(text::last_code_points(tail, 100)).value_or("[INVALID]");
  return normalize_final_answer(last_answer(tail).value_or("[INVALID]"));
}

double math_dapo_score(std::string_view response, std::string_view ground_truth,
                       const MathDapoOptions& options) {
  const std::string prediction = math_dapo_prediction(response, options);
  const bool correct = options.strict_box_verify
                           ? prediction == ground_truth
                           : prediction == normalize_final_answer(ground_truth);
  return correct ? 1.0 : -1.0;
}

}  // namespace baton::rewards
