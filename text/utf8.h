// UTF-8 decoding and encoding for the tokenizer (code points as char32_t).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace baton::data::utf8 {

// Appends the UTF-8 encoding of `cp` (REQUIRES: a Unicode scalar value).
void append(std::string& out, char32_t cp);

// The length in bytes of the UTF-8 sequence that starts with `lead` (1 for a byte that
// cannot start one).
std::size_t sequence_length(unsigned char lead);

// Decodes valid UTF-8 into code points. REQUIRES: is_valid(text).
std::vector<char32_t> decode(std::string_view text);
std::string encode(const std::vector<char32_t>& cps);

// The byte offset of the first invalid sequence, or text.size() when `text` is valid UTF-8.
std::size_t first_invalid(std::string_view text);
inline bool is_valid(std::string_view text) { return first_invalid(text) == text.size(); }

// As Rust's String::from_utf8_lossy: every maximal invalid subsequence becomes one U+FFFD.
std::string from_bytes_lossy(std::string_view bytes);

}  // namespace baton::data::utf8
