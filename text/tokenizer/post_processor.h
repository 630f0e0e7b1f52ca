// The `post_processor` of an HF tokenizer.json: what encode(..., add_special_tokens = true)
// adds around the ids. Supported: TemplateProcessing (its "single" template), ByteLevel (adds
// nothing to ids) and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // The ids of one sequence with the special tokens added. Thread-safe.
  virtual std::vector<int32_t> process(std::vector<int32_t> ids) const = 0;
};

// Builds the post-processor `config` describes; null JSON gives nullptr (nothing added).
// Throws TokenizerError naming `where` and the type or field otherwise.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config,
                                                   const std::string& where);

}  // namespace baton::data
