// The `decoder` of an HF tokenizer.json: how tokens become text again. Supported: ByteLevel,
// Fuse, Strip, Replace and Sequence, with the semantics of HF `tokenizers`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of the chain: tokens in, (usually as many) strings out. Thread-safe.
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
  // The chain's strings joined.
  std::string decode(std::vector<std::string> tokens) const;
};

// Builds the decoder `config` describes; null JSON gives nullptr (tokens joined with spaces,
// as HF does without a decoder). Throws TokenizerError naming `where` and the type otherwise.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where);

}  // namespace baton::data
