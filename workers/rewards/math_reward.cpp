#include "workers/rewards/math_reward.h"

#include <vector>

#include "workers/rewards/reward_text.h"

namespace baton::rewards {
namespace {

using text::code_point_size;
using text::replace_all;
using text::split;

// `\text{ unit}` on the right; verl asserts there is at most one.
std::optional<std::string> remove_right_units(const std::string& s) {
  if (s.find("\\text{ ") == std::string::npos) return s;
  const std::vector<std::string> parts = split(s, "\\text{ ");
  if (parts.size() != 2) return std::nullopt;
  return parts[0];
}

// `\sqrt3` → `\sqrt{3}` (one character); verl fails on a `\sqrt` at the end.
std::optional<std::string> fix_sqrt(const std::string& s) {
  if (s.find("\\sqrt") == std::string::npos) return s;
  const std::vector<std::string> parts = split(s, "\\sqrt");
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (part.empty()) return std::nullopt;
    if (part[0] != '{') {
      const size_t first = code_point_size(part, 0);
      out += "\\sqrt{" + part.substr(0, first) + "}" + part.substr(first);
    } else {
      out += "\\sqrt" + part;
    }
  }
  return out;
}

// `\frac12` → `\frac{1}{2}`, `\frac1{2}` → `\frac{1}{2}`; a `\frac` followed
// by one character leaves the string as it was; verl fails on one at the end.
std::optional<std::string> fix_fracs(const std::string& s) {
  const std::vector<std::string> parts = split(s, "\\frac");
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    out += "\\frac";
    if (part.empty()) return std::nullopt;
    if (part[0] == '{') {
      out += part;
      continue;
    }
    const size_t a_size = code_point_size(part, 0);
    if (a_size >= part.size()) return s;  // fewer than 2 characters
    const std::string a = part.substr(0, a_size);
    const size_t b_size = code_point_size(part, a_size);
    const std::string b = part.substr(a_size, b_size);
    const std::string rest = part.substr(a_size + b_size);
    if (b != "{")
      out += "{" + a + "}{" + b + "}" + rest;
    else
      out += "{" + a + "}" + b + rest;
  }
  return out;
}

// Python's str(int(x)) == x: an optional '-', then digits without a leading 0.
bool is_canonical_int(std::string_view x) {
  if (!x.empty() && x[0] == '-') x.remove_prefix(1);
  if (x.empty() || (x.size() > 1 && x[0] == '0')) return false;
  for (char c : x)
    if (c < '0' || c > '9') return false;
  return true;
}

// `a/b` with integers a, b → `\frac{a}{b}`.
std::string fix_a_slash_b(const std::string& s) {
  const std::vector<std::string> parts = split(s, "/");
  if (parts.size() != 2) return s;
  if (!is_canonical_int(parts[0]) || !is_canonical_int(parts[1]) || parts[0] == "-0" ||
      parts[1] == "-0")
    return s;
  return "\\frac{" + parts[0] + "}{" + parts[1] + "}";
}

}  // namespace

std::optional<std::string> last_boxed_only_string(std::string_view text) {
  constexpr std::string_view kSpaced = "\\boxed ";
  if (text.find(kSpaced) != std::string_view::npos) {
    const std::string_view after = text.substr(text.rfind(kSpaced) + kSpaced.size());
    return std::string(kSpaced) + std::string(after.substr(0, after.find('$')));
  }
  size_t start = text.rfind("\\boxed");
  if (start == std::string_view::npos) start = text.rfind("\\fbox");
  if (start == std::string_view::npos) return std::nullopt;
  int open = 0;
  for (size_t i = start; i < text.size(); ++i) {
    if (text[i] == '{') ++open;
    if (text[i] == '}' && --open == 0) return std::string(text.substr(start, i - start + 1));
  }
  return std::nullopt;
}

std::optional<std::string> remove_boxed(std::string_view boxed) {
  constexpr std::string_view kSpaced = "\\boxed ";
  if (boxed.find(kSpaced) != std::string_view::npos) {
    if (boxed.substr(0, kSpaced.size()) != kSpaced) return std::nullopt;
    return std::string(boxed.substr(kSpaced.size()));
  }
  constexpr std::string_view kLeft = "\\boxed{";
  if (boxed.substr(0, kLeft.size()) != kLeft || boxed.size() <= kLeft.size() || boxed.back() != '}')
    return std::nullopt;
  return std::string(boxed.substr(kLeft.size(), boxed.size() - kLeft.size() - 1));
}

std::optional<std::string> normalize_math_answer(std::string_view answer) {
  std::string s = replace_all(answer, "\n", "");
  s = replace_all(s, "\\!", "");
  s = replace_all(s, "\\\\", "\\");
  s = replace_all(s, "tfrac", "frac");
  s = replace_all(s, "dfrac", "frac");
  s = replace_all(s, "\\left", "");
  s = replace_all(s, "\\right", "");
  s = replace_all(s, "^{\\circ}", "");
  s = replace_all(s, "^\\circ", "");
  s = replace_all(s, "\\$", "");
  const std::optional<std::string> without_units = remove_right_units(s);
  if (!without_units) return std::nullopt;
  s = *without_units;
  s = replace_all(s, "\\\\%", "");
  s = replace_all(s, "\\%", "");
  s = replace_all(s, " .", " 0.");
  s = replace_all(s, "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  const std::vector<std::string> sides = split(s, "=");
  if (sides.size() == 2 && text::code_point_count(sides[0]) <= 2) s = sides[1];
  const std::optional<std::string> sqrt_fixed = fix_sqrt(s);
  if (!sqrt_fixed) return std::nullopt;
  s = replace_all(*sqrt_fixed, " ", "");
  const std::optional<std::string> fracs_fixed = fix_fracs(s);
  if (!fracs_fixed) return std::nullopt;
  s = *fracs_fixed;
  if (s == "0.5") s = "\\frac{1}{2}";
  return fix_a_slash_b(s);
}

bool math_answers_equivalent(std::string_view a, std::string_view b) {
  const std::optional<std::string> na = normalize_math_answer(a);
  const std::optional<std::string> nb = normalize_math_answer(b);
  if (!na || !nb) return a == b;
  return *na == *nb;
}

double math_score(std::string_view response, std::string_view ground_truth) {
  const std::optional<std::string> boxed = last_boxed_only_string(response);
  if (!boxed) return 0.0;
  const std::optional<std::string> answer = remove_boxed(*boxed);
  if (!answer) return 0.0;
  return math_answers_equivalent(*answer, ground_truth) ? 1.0 : 0.0;
}

}  // namespace baton::rewards
