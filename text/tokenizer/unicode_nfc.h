// Unicode Normalization Form C (canonical decomposition, then canonical composition), with
// tables generated from the Unicode Character Database (see make_unicode_nfc_tables.py).
#pragma once

#include <string>
#include <string_view>

namespace baton::data {

// REQUIRES: `text` is valid UTF-8. Thread-safe.
std::string to_nfc(std::string_view text);

}  // namespace baton::data
