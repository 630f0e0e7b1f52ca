#include "text/tokenizer/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace baton::data::byte_level {
namespace {

// bytes_char() of HF tokenizers (pre_tokenizers/byte_level.rs): printable Latin-1 bytes map to
// themselves, the others to U+0100 upwards in byte order.
struct Alphabet {
  std::array<char32_t, 256> char_of{};
  std::array<std::string, 256> utf8_of;
  std::array<int, 512> byte_of;  // every character of the alphabet is below U+0200
  Alphabet() {
    byte_of.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      char_of[b] = printable(b) ? static_cast<char32_t>(b) : next++;
      utf8::append(utf8_of[b], char_of[b]);
      byte_of[char_of[b]] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet table;
  return table;
}

}  // namespace

std::string encode(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += a.utf8_of[static_cast<unsigned char>(c)];
  return out;
}

int byte_of(char32_t cp) { return cp < 512 ? alphabet().byte_of[cp] : -1; }

}  // namespace baton::data::byte_level
