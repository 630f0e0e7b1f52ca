// Fuzzes loading an HF tokenizer (text/tokenizer/tokenizer.h) from a model directory's
// files: the input is tokenizer.json, optionally followed by a NUL byte and
// tokenizer_config.json (a NUL cannot appear in JSON text, so it is a safe
// separator). A tokenizer that loads encodes and decodes a short fixed text.
// Malformed or unsupported files must throw TokenizerError.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace {

// ASCII, digits, spaces, a newline and multi-byte UTF-8: the paths of the
// pre-tokenizers and the byte-level model.
constexpr std::string_view kText =
    "Hello world, 12345 tokens!\n  caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view tokenizer_json = input.substr(0, nul);
  const std::string_view config_json =
      nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  try {
    const auto tok = baton::data::Tokenizer::from_json(tokenizer_json, config_json, "fuzz");
    for (const bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(kText, special);
      tok.decode(ids, special);
      for (const int32_t id : ids) {
        if (const auto token = tok.id_to_token(id)) tok.token_to_id(*token);
        tok.is_special(id);
      }
    }
    tok.vocab_size();
    for (const auto& [name, text] : tok.special_tokens()) tok.token_to_id(text);
  } catch (const baton::data::TokenizerError&) {
  }
  return 0;
}
