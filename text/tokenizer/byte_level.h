// GPT-2's byte-level alphabet: every byte stands for one printable character (space is 'Ġ',
// newline 'Ċ'), so that byte-level BPE vocabularies are valid UTF-8 strings.
#pragma once

#include <string>
#include <string_view>

namespace baton::data::byte_level {

// Replaces every byte of `bytes` by the UTF-8 of its character.
std::string encode(std::string_view bytes);

// The byte that `cp` stands for, or -1 when `cp` is not in the alphabet.
int byte_of(char32_t cp);

}  // namespace baton::data::byte_level
