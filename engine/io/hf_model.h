// HF model directories as a whole: `config.json` plus safetensors weights, for
// a causal LM or a value model (HF's token-classification form with one
// label, whose `score` is the value head).
//
// Example:
//   HfModel m = load_hf_model("models/qwen2-0.5b");
//   save_hf_model("out/", m.config, m.weights, m.value_model);
//
// Errors: EngineError naming the file (see model_config.h, safetensors.h).
// Blocking: synchronous file I/O.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <filesystem>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"

namespace baton::engine {

struct HfModel {
  ModelConfig config;
  bool value_model = false;  // the architecture is <Family>ForTokenClassification
  TensorMap weights;         // HF names, as read_hf_weights returns them
};

// Reads `dir/config.json` and the weights. Does not check the weights against
// the config (hf_to_shard does).
HfModel load_hf_model(const std::filesystem::path& dir);

// Reads a JSON file (e.g. a config.json) as is, checked against its
// directory's checksum manifest (safetensors.h); EngineError names the file.
nlohmann::json read_json_file(const std::filesystem::path& file);

// The config.json of `cfg` as a causal LM or, for a value model, as
// <Family>ForTokenClassification with one label. When `base` (the source
// model's config.json) is given, its keys that ModelConfig does not model
// (token ids, ...) are kept; ModelConfig's keys override.
nlohmann::json hf_config_json(const ModelConfig& cfg, bool value_model,
                              const nlohmann::json* base = nullptr);

// Writes the weights (write_hf_weights), `dir/config.json` (hf_config_json),
// each file atomically, then the directory's checksum manifest
// (base/checksum_manifest.h; HF's loaders ignore the extra file). Throws
// FileError naming the file for an I/O failure such as a full disk.
void save_hf_model(const std::filesystem::path& dir, const ModelConfig& cfg,
                   const TensorMap& weights, bool value_model,
                   int64_t max_shard_bytes = kDefaultMaxShardBytes,
                   const nlohmann::json* base_config = nullptr);

}  // namespace baton::engine
