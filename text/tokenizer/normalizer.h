// The `normalizer` of an HF tokenizer.json: NFC, or a Sequence of normalizers.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // REQUIRES: `text` is valid UTF-8. Thread-safe.
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds the normalizer `config` describes; null JSON gives nullptr (no normalization).
// Throws TokenizerError naming `where` (file and JSON path) and the type for anything else.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& where);

}  // namespace baton::data
