// "Did you mean": the edit distance every module's error messages use to
// suggest the name a user probably meant (an unknown config key, dispatch
// mode, policy loss, advantage estimator, ...).
//
//   closest_match("vanila", {"vanilla", "gspo"}, 2)  → "vanilla"
//   closest_match("ppo", {"vanilla", "gspo"}, 2)     → "" (nothing that near)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// Levenshtein distance (insertions, deletions, substitutions of bytes);
// ignore_case compares ASCII letters case-insensitively.
size_t edit_distance(std::string_view a, std::string_view b, bool ignore_case = false);

// The candidate nearest `word` (the first of equals) if it is at most
// `max_distance` away, else "".
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates,
                          size_t max_distance = SIZE_MAX, bool ignore_case = false);

}  // namespace baton
