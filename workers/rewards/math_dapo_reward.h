// The DAPO math reward (verl's math_dapo.compute_score, data sources
// math_dapo and aime*): 1.0 if the response's answer equals the ground truth
// after Minerva normalisation, else -1.0.
//
// Only the last 300 characters (code points) of the response are read. The
// answer is the text after the last `Answer:` (case-insensitive, whitespace
// allowed around the ':', a newline after it too) up to the end of its line;
// without one the answer is "[INVALID]".
//
// Normalisation (verl's normalize_final_answer, from Minerva / the
// lm-evaluation-harness), in order, for the answer and the ground truth alike:
// the text after the last '='; "an ", "a ", `\$`, `\ ` and spaces removed,
// ".$" → "$", "mbox" → "text", `,\text{and}` / `\text{and}` → ",",
// `\text{m}` → `\text{}`; units and words removed wherever they occur
// ("square", "ways", "dollars", "cm", "degrees", `\ldots`, `^\circ`, ... as
// verl lists them); a line holding two '$' replaced by what lies between
// them; `\text{x}`, `\textbf{x}`, `\overline{x}` → x, `\boxed{x}` → x;
// `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`; '$' removed; commas
// removed from a string of digits and commas; surrounding whitespace stripped.
// Like verl, and sometimes surprisingly: "Answer: 5 cm^2" reads "5^2",
// "Answer: Answer: 5" reads "Answer:5" (the first match takes the whole line).
//
// Where Python's rules are Unicode-wide, these are too for `\s` (Python's
// whitespace set) and the case-insensitive "answer" (U+017F matches 's'); the
// digit test and the final strip are ASCII (Python's isdigit() also accepts
// other scripts' digits and superscripts).
//
// With strict_box_verify (verl's option): the content of the last `\boxed{}`
// in the last 100 characters, compared unnormalised.
//
// Example:
//   math_dapo_score("6 * 7 = 42\nAnswer: $42$", "42");   // 1.0
//   math_dapo_score("6 * 7 = 42", "42");                 // -1.0: no "Answer:"
#pragma once

#include <string>
#include <string_view>

namespace baton::rewards {

struct MathDapoOptions {
  bool strict_box_verify = false;
};

// verl's normalize_final_answer (above).
std::string normalize_final_answer(std::string_view answer);

// The normalised prediction: the last `Answer:` line's text, or "[INVALID]",
// normalised; with strict_box_verify the last \boxed{} content, or "[INVALID]".
std::string math_dapo_prediction(std::string_view response, const MathDapoOptions& options = {});

double math_dapo_score(std::string_view response, std::string_view ground_truth,
                       const MathDapoOptions& options = {});

}  // namespace baton::rewards
