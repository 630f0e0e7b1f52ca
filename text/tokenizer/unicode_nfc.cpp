#include "text/tokenizer/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "text/utf8.h"

namespace baton::data {
namespace {

struct CombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: a singleton decomposition
};
struct Composition {
  char32_t first, second, composite;
};

#include "text/tokenizer/unicode_nfc_tables.inc"

// Hangul syllables decompose and compose arithmetically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCombiningClasses);
  const auto* it = std::lower_bound(std::begin(kCombiningClasses), end, cp,
                                    [](const CombiningClass& c, char32_t v) { return c.cp < v; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const auto* end = std::end(kDecompositions);
    const auto* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                      [](const Decomposition& d, char32_t v) { return d.cp < v; });
    if (it != end && it->cp == cp) {
      decompose(it->first, out);
      if (it->second != 0) decompose(it->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (first, second), or 0.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto* end = std::end(kCompositions);
  const auto* it =
      std::lower_bound(std::begin(kCompositions), end, std::pair{first, second},
                       [](const Composition& c, std::pair<char32_t, char32_t> v) {
                         return c.first != v.first ? c.first < v.first : c.second < v.second;
                       });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

// NFC by the book: decompose, reorder the marks, compose.
std::string nfc_in_full(std::string_view text) {
  std::vector<char32_t> cps;
  for (char32_t cp : utf8::decode(text)) decompose(cp, cps);

  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (std::size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(
        cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
        [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }

  // Canonical composition (the algorithm of UAX #15's sample code).
  std::ptrdiff_t starter = -1;  // the last starter kept, while nothing blocks it
  int last_class = 0;
  std::size_t out = 0;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const char32_t ch = cps[i];
    const int ch_class = combining_class(ch);
    if (starter >= 0 && (last_class < ch_class || last_class == 0)) {
      if (const char32_t composite = compose(cps[static_cast<std::size_t>(starter)], ch)) {
        cps[static_cast<std::size_t>(starter)] = composite;
        continue;
      }
    }
    if (ch_class == 0) starter = static_cast<std::ptrdiff_t>(out);
    last_class = ch_class;
    cps[out++] = ch;
  }
  cps.resize(out);
  return utf8::encode(cps);
}

// The code points NFC may change, or that may change their neighbour (the complement of
// UAX #15's NFC_Quick_Check=Yes with combining class 0): those with a combining class, those
// whose decomposition does not compose back to them, and the seconds of compositions (Hangul
// V and T jamo among them). A text without any is already NFC: each character decomposes and
// composes back alone, there are no marks to reorder, and no character composes with the one
// before it. Most text (CJK, Cyrillic, accented Latin, Arabic without marks, emoji) is such.
class MayChange {
 public:
  MayChange() : bits_((0x110000 + 63) / 64, 0) {
    for (const CombiningClass& c : kCombiningClasses) set(c.cp);
    // A decomposable character that composes back alone (é; Hangul syllables, decomposed
    // arithmetically, are such too) stays so between stable characters: the first character
    // of its decomposition is never the second of a composition (true of Unicode 14).
    for (const Decomposition& d : kDecompositions) {
      std::string one;
      utf8::append(one, d.cp);
      if (nfc_in_full(one) != one) set(d.cp);
    }
    for (const Composition& c : kCompositions) set(c.second);
    for (char32_t cp = kVBase; cp < kVBase + kVCount; ++cp) set(cp);
    for (char32_t cp = kTBase + 1; cp < kTBase + kTCount; ++cp) set(cp);
  }
  bool operator()(char32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }

 private:
  void set(char32_t cp) { bits_[cp >> 6] |= uint64_t{1} << (cp & 63); }
  std::vector<uint64_t> bits_;
};

// The code point of the UTF-8 sequence at `p` (valid UTF-8), and its length in bytes.
char32_t decode_at(const unsigned char* p, std::size_t& length) {
  const unsigned char b = p[0];
  if (b < 0x80) {
    length = 1;
    return b;
  }
  if (b < 0xE0) {
    length = 2;
    return (char32_t{b & 0x1Fu} << 6) | (p[1] & 0x3Fu);
  }
  if (b < 0xF0) {
    length = 3;
    return (char32_t{b & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
  }
  length = 4;
  return (char32_t{b & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
}

}  // namespace

std::string to_nfc(std::string_view text) {
  static const MayChange may_change;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  // Only the runs of characters that may change go through nfc_in_full, each with the stable
  // character before it (which they may compose with): nothing crosses a stable character
  // that starts a run, nor one that ends it.
  std::string out;
  std::size_t copied = 0;  // text[0, copied) is in `out`
  std::size_t stable = 0;  // where the last stable character starts
  for (std::size_t i = 0, n = 0; i < text.size(); i += n) {
    if (bytes[i] < 0x80) {  // ASCII is stable
      n = 1;
      stable = i;
      continue;
    }
    if (!may_change(decode_at(bytes + i, n))) {
      stable = i;
      continue;
    }
    std::size_t end = i + n;
    while (end < text.size() && may_change(decode_at(bytes + end, n))) end += n;
    out.append(text, copied, stable - copied);
    out += nfc_in_full(text.substr(stable, end - stable));
    copied = stable = i = end;
    n = 0;
  }
  if (copied == 0) return std::string(text);
  out.append(text, copied);
  return out;
}

}  // namespace baton::data
