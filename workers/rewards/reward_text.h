// String operations of Python's `str`, as verl's reward functions use them,
// for UTF-8 text: the rule-based rewards must extract and normalise answers
// exactly as verl does, and Python counts and slices code points, not bytes.
// Invalid UTF-8 bytes count as one code point each.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace baton::rewards::text {

// Bytes taken by the code point starting at byte `i` (1 to 4).
size_t code_point_size(std::string_view s, size_t i);
// Number of code points (Python's len()).
size_t code_point_count(std::string_view s);
// The last `n` code points (Python's s[-n:]); all of `s` if it has fewer.
std::string_view last_code_points(std::string_view s, size_t n);

// Python's s.replace(from, to): non-overlapping, left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
// Python's s.split(sep) with a non-empty separator (empty parts kept).
std::vector<std::string> split(std::string_view s, std::string_view sep);
// Python's s.count(sub) for a non-empty `sub`.
size_t count(std::string_view s, std::string_view sub);
// Python's s.strip() for ASCII whitespace.
std::string_view strip(std::string_view s);

}  // namespace baton::rewards::text
