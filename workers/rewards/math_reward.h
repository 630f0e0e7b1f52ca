// The MATH reward (verl's math_reward.compute_score, data sources
// lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500):
// the content of the response's last \boxed{...}, normalised, compared as a
// string with the normalised ground truth. 1.0 if equal, else 0.0.
//
// Normalisation (verl's strip_string, from the Hendrycks MATH harness), in order:
// newlines and `\!` removed; `\\` → `\`; tfrac/dfrac → frac; `\left`, `\right`,
// `^{\circ}`, `^\circ`, `\$` removed; a trailing unit `\text{ ...}` removed;
// `\%` removed; " ." → " 0.", "{." → "{0.", a leading "." gets a 0; a short
// `k=` prefix (≤ 2 characters before the only '=') removed; `\sqrt3` →
// `\sqrt{3}`; spaces removed; `\frac12` → `\frac{1}{2}`, `\frac1{2}` →
// `\frac{1}{2}`; exactly "0.5" → `\frac{1}{2}`; an integer fraction `a/b` →
// `\frac{a}{b}`.
//
// Like verl, and unlike some other MATH graders: "5.0" and "5" differ, "1,000"
// and "1000" differ, and an answer in \fbox{...} scores 0.
//
// Example:
//   math_score("so the answer is $\\boxed{\\dfrac{1}{2}}$", "0.5");   // 1.0
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace baton::rewards {

// The last `\boxed{...}` (braces matched) or `\fbox{...}` of `text`, the
// delimiters included; `\boxed <answer>` (a space, no braces) up to the next
// '$' takes precedence wherever it is. nullopt if there is none or its braces
// never close.
std::optional<std::string> last_boxed_only_string(std::string_view text);

// The content of a string from last_boxed_only_string; nullopt if it is not a
// `\boxed{...}` / `\boxed ...` (verl's assertion fails and the score is 0).
std::optional<std::string> remove_boxed(std::string_view boxed);

// verl's strip_string (above); nullopt where verl's raises (two `\text{ `
// units, a `\sqrt` or `\frac` at the very end), in which case answers are
// compared unnormalised.
std::optional<std::string> normalize_math_answer(std::string_view answer);

// verl's is_equiv: normalised strings equal (unnormalised if either fails).
bool math_answers_equivalent(std::string_view a, std::string_view b);

double math_score(std::string_view response, std::string_view ground_truth);

}  // namespace baton::rewards
