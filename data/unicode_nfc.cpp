#include "data/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/utf8.h"

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

#include "data/unicode_nfc_tables.inc"

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

}  // namespace

std::string to_nfc(std::string_view text) {
  // Below U+0300 nothing decomposes or combines (Latin-1 letters compose only with marks).
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
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

}  // namespace baton::data
