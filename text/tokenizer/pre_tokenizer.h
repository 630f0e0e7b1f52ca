// The `pre_tokenizer` of an HF tokenizer.json: how text is cut into pieces that the model then
// tokenizes one at a time. Supported: ByteLevel, Split, Digits, Whitespace and Sequence, with
// the semantics of HF `tokenizers` (Split's behaviours removed, isolated, merged_with_previous,
// merged_with_next and contiguous, and `invert`).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Cuts every piece further, in order; empty pieces are dropped. REQUIRES: valid UTF-8.
  // Thread-safe.
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// Builds the pre-tokenizer `config` describes; null JSON gives nullptr (the whole text is one
// piece). Throws TokenizerError naming `where` (file and JSON path) and the type or field for
// an unsupported pre-tokenizer, behaviour or pattern.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config,
                                                 const std::string& where);

// The pieces of `text` (one piece when `pre_tokenizer` is null).
std::vector<std::string> pre_tokenize(const PreTokenizer* pre_tokenizer, std::string_view text);

}  // namespace baton::data
