// to_nfc: text that is already NFC is copied, and only the runs of characters NFC may change
// (with the character before each) are normalized. Expected values are Python's
// unicodedata.normalize("NFC", ...) (Unicode 14, as the tables).
#include "text/tokenizer/unicode_nfc.h"

#include <gtest/gtest.h>

namespace baton::data {
namespace {

TEST(UnicodeNfc, LeavesStableTextAsItIs) {
  // CJK, Cyrillic, an emoji ZWJ sequence, precomposed Latin, Hangul syllables.
  const std::string text =
      "\u4e2d\u6587 \u041f\u0440\u0438\u0432\u0435\u0442 \U0001F468\u200d\U0001F469 caf\u00e9 "
      "\uac00\ud7a3 \u00c5";
  EXPECT_EQ(to_nfc(text), text);
  // Devanagari with a nukta and a virama is NFC too (nothing to reorder or compose).
  EXPECT_EQ(to_nfc("\u0915\u093c\u0915\u094d\u0937"), "\u0915\u093c\u0915\u094d\u0937");
  EXPECT_EQ(to_nfc(""), "");
}

TEST(UnicodeNfc, NormalizesEachRunThatMayChangeWithTheCharacterBeforeIt) {
  EXPECT_EQ(to_nfc("\u4e2d cafe\u0301 \u4e2d e\u0323\u0301 \uac00\u11a8 \u2126 x"),
            "\u4e2d caf\u00e9 \u4e2d \u1eb9\u0301 \uac01 \u03a9 x");
  // A Hangul L jamo (stable) composes with the V and T jamo after it.
  EXPECT_EQ(to_nfc("\u1100\u1161\u11a8!"), "\uac01!");
  // Marks are reordered within a run, and a later run is normalized on its own.
  EXPECT_EQ(to_nfc("a\u0301\u0323b\u0301"), "\u1ea1\u0301b\u0301");
  // A precomposed character (stable alone) decomposes when a mark that sorts first follows.
  EXPECT_EQ(to_nfc("\u00e9\u0323"), "\u1eb9\u0301");
}

}  // namespace
}  // namespace baton::data
