// The GSM8K reward (verl's gsm8k.compute_score, data source openai/gsm8k):
// the answer after `#### ` compared as a string with the ground truth.
//
// Only the last 300 characters of the response are read (as verl does).
//   strict   (verl's default): the last `#### <number>` where the number is an
//            optional '-' then digits, '.' and ','; commas are removed.
//   flexible: the last number-like run (optional '-', digits, '.', ',') other
//            than "" and "."; commas are kept.
// No answer scores 0; an answer equal to the ground truth scores `score`,
// any other answer `format_score`.
//
// Example:
//   gsm8k_score("3 + 4 = 7\n#### 7", "7");                  // 1.0
//   gsm8k_score("so 7", "7");                               // 0.0: no "#### "
//   gsm8k_score("so 7", "7", {.method = Gsm8kMethod::kFlexible});  // 1.0
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace baton::rewards {

enum class Gsm8kMethod { kStrict, kFlexible };

struct Gsm8kOptions {
  Gsm8kMethod method = Gsm8kMethod::kStrict;
  double format_score = 0.0;  // an answer was found but is wrong
  double score = 1.0;         // the answer equals the ground truth
};

// verl's extract_solution: the answer text, or nullopt when there is none.
std::optional<std::string> extract_gsm8k_answer(std::string_view response,
                                                Gsm8kMethod method = Gsm8kMethod::kStrict);

double gsm8k_score(std::string_view response, std::string_view ground_truth,
                   const Gsm8kOptions& options = {});

}  // namespace baton::rewards
