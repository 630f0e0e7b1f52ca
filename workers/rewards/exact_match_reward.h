// The exact-match reward (verl's search_r1_like_qa_em, data sources
// searchR1_*): the last `<answer>...</answer>` of the response (it may span
// lines), normalised, equal to one of the normalised ground truths.
//
// Normalisation (SQuAD's): lower case, ASCII punctuation removed, the words
// a/an/the removed, whitespace runs collapsed to one space. Lower-casing is
// ASCII only (verl's Python lowers every script).
//
// No tagged answer scores 0; a match scores `score` (divided by 4 when the
// response has more than 10 opening or closing tags, verl's guard against
// tag spam); anything else `format_score`.
//
// Example:
//   exact_match_score("<answer>The Eiffel Tower.</answer>", {"eiffel tower"});  // 1.0
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::rewards {

struct ExactMatchOptions {
  double format_score = 0.0;
  double score = 1.0;
};

// The stripped content of the last `<answer>...</answer>`, or nullopt.
std::optional<std::string> extract_tagged_answer(std::string_view response);

// SQuAD's normalize_answer (above).
std::string normalize_answer(std::string_view text);

double exact_match_score(std::string_view response, const std::vector<std::string>& ground_truths,
                         const ExactMatchOptions& options = {});

// The ground truths of a `reward_model.ground_truth` value as text: a JSON
// list of strings, a JSON object with a "target" string or list (verl's
// search-R1 data), or otherwise the text itself as the one ground truth.
std::vector<std::string> parse_ground_truths(std::string_view ground_truth);

}  // namespace baton::rewards
