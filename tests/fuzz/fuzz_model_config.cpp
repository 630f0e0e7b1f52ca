// Fuzzes an HF model's config.json as the engine reads it
// (ModelConfig::from_hf_json): architectures, sizes, rope settings, tied
// embeddings, the fields a model directory brings. A malformed or
// inconsistent config must throw (EngineError, or nlohmann's errors), never
// crash; one that is accepted must write back (to_hf_json) and read again to
// the same config.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, false);
  if (json.is_discarded()) return 0;
  baton::engine::ModelConfig config;
  try {
    config = baton::engine::ModelConfig::from_hf_json(json, "fuzz/config.json");
  } catch (const std::exception&) {
    return 0;  // refused with a message
  }
  const nlohmann::json again = config.to_hf_json();
  const baton::engine::ModelConfig back =
      baton::engine::ModelConfig::from_hf_json(again, "round trip");
  if (back.to_hf_json() != again) __builtin_trap();
  return 0;
}
