// The sharded on-disk model format ("baton-sharded-v1"): one safetensors file
// of engine-named tensors per (tp, pp) rank, so that a rank loads only its own
// part. Checkpoints store their model weights in it.
//
//   DIR/config.json                  the HF config (value model: …ForTokenClassification)
//   DIR/layout.json                  {"format": "baton-sharded-v1", "tp": T, "pp": P,
//                                     "layer_split": [...], "value_model": bool,
//                                     "make_vocab_size_divisible_by": D,
//                                     "padded_vocab_size": Vp}
//   DIR/model-tp{t}-pp{p}.safetensors   hf_to_shard's tensors of rank (t, p)
//
// Example (HF → TP=2 × PP=2, then one rank loads its part):
//   auto m = load_hf_model(hf_dir);
//   ShardedLayout layout{.tp = 2, .pp = 2, .layer_split = even_layer_split(L, 2)};
//   save_sharded(out, m.config, layout, shard_all(m.weights, m.config, layout));
//   TensorMap mine = load_sharded_rank(out, /*tp_rank=*/1, /*pp_rank=*/0);
//
// Errors: EngineError naming the file and what does not fit. Blocking:
// synchronous file I/O. Each file is written atomically, layout.json last;
// the directory as a whole is not replaced atomically (checkpoint.h does that).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/parallel/vocab_padding.h"

namespace baton::engine {

constexpr const char* kShardedFormat = "baton-sharded-v1";

struct ShardedLayout {
  int64_t tp = 1;
  int64_t pp = 1;
  std::vector<int64_t> layer_split{};  // layers per stage; empty means even_layer_split
  bool value_model = false;
  // The vocabulary padding of the shards (vocab_padding.h). A layout.json
  // without it predates padding: its vocabulary divided tp, read as 1.
  int64_t make_vocab_size_divisible_by = kDefaultVocabDivisibleBy;

  int64_t padded_vocab_size(const ModelConfig& cfg) const {
    return engine::padded_vocab_size(cfg.vocab_size, tp, make_vocab_size_divisible_by);
  }
};

// "model-tp{t}-pp{p}.safetensors".
std::string sharded_rank_file(int64_t tp_rank, int64_t pp_rank);

// Every rank's shard of a whole HF checkpoint, `[pp][tp]` (hf_to_shard per
// rank). Fills an empty `layout.layer_split` in the result's layout.
std::vector<std::vector<TensorMap>> shard_all(const TensorMap& hf, const ModelConfig& cfg,
                                              const ShardedLayout& layout);

// Writes config.json (hf_config_json; `base_config` keeps a source config's
// extra keys) and layout.json. Throws EngineError for a layout that does not
// fit the config (layer split, TP divisibility).
void write_sharded_layout(const std::filesystem::path& dir, const ModelConfig& cfg,
                          const ShardedLayout& layout, const nlohmann::json* base_config = nullptr);
// Writes one rank's file; ranks may call this concurrently for their own files.
void write_sharded_rank(const std::filesystem::path& dir, int64_t tp_rank, int64_t pp_rank,
                        const TensorMap& shard);
// Writes every rank's file (`shards[pp][tp]`, matching the layout), then the
// config and layout, then removes rank files a previous layout left in `dir`.
void save_sharded(const std::filesystem::path& dir, const ModelConfig& cfg,
                  const ShardedLayout& layout, const std::vector<std::vector<TensorMap>>& shards,
                  const nlohmann::json* base_config = nullptr);

// Reads and validates layout.json against DIR/config.json (format, sizes, the
// split summing to the layers, TP divisibility, a recorded padded_vocab_size
// equal to the one the layout implies); the split is always filled.
ShardedLayout load_sharded_layout(const std::filesystem::path& dir);
// One rank's tensors (engine names). Throws EngineError for a rank outside the
// layout or a missing or corrupt file.
TensorMap load_sharded_rank(const std::filesystem::path& dir, int64_t tp_rank, int64_t pp_rank);
// Every rank's tensors, `[pp][tp]`.
std::vector<std::vector<TensorMap>> load_sharded_all(const std::filesystem::path& dir);

}  // namespace baton::engine
