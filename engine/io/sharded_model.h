// The sharded on-disk model format ("baton-sharded-v1"): one safetensors file
// of engine-named tensors per (tp, pp) rank, so that a rank loads only its own
// part. Checkpoints store their model weights in it.
//
//   DIR/config.json                  the HF config (value model: …ForTokenClassification)
//   DIR/layout.json                  {"format": "baton-sharded-v1", "tp": T, "pp": P,
//                                     "layer_split": [...], "value_model": bool,
//                                     "make_vocab_size_divisible_by": D,
//                                     "padded_vocab_size": Vp, "ep": N (when > 1)}
//   DIR/model-tp{t}-pp{p}.safetensors   hf_to_shard's tensors of rank (t, p)
//   DIR/baton-checksums.txt          every file's CRC-32Cs (base/checksum_manifest.h)
//
// Expert parallelism (ep > 1, a MoE model): one file per (tp, pp, EP) rank,
// model-tp{t}-pp{p}-ep{e}.safetensors, holding hf_to_shard's tensors for EP
// rank e (experts [e·E/ep, (e+1)·E/ep), the other tensors as at ep = 1). A
// reader may ask for another ep: the files' experts are joined
// (join_expert_shards) and split again, so a checkpoint loads under any ep
// that divides num_experts.
//
// Example (HF → TP=2 × PP=2, then one rank loads its part):
//   auto m = load_hf_model(hf_dir);
//   ShardedLayout layout{.tp = 2, .pp = 2, .layer_split = even_layer_split(L, 2)};
//   save_sharded(out, m.config, layout, shard_all(m.weights, m.config, layout));
//   TensorMap mine = load_sharded_rank(out, /*tp_rank=*/1, /*pp_rank=*/0);
//
// Errors: EngineError naming the file and what does not fit. Blocking:
// synchronous file I/O. Each file is written atomically, layout.json last but
// for the checksum manifest; the directory as a whole is not replaced
// atomically (checkpoint.h does that). Every file read is checked against the
// manifest (safetensors.h).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
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
  // EP ranks whose experts are in files of their own (ParallelConfig::ep;
  // 1 for a dense model). A layout.json without it: 1.
  int64_t ep = 1;

  int64_t padded_vocab_size(const ModelConfig& cfg) const {
    return engine::padded_vocab_size(cfg.vocab_size, tp, make_vocab_size_divisible_by);
  }
};

// "model-tp{t}-pp{p}.safetensors"; with ep_size > 1
// "model-tp{t}-pp{p}-ep{e}.safetensors".
std::string sharded_rank_file(int64_t tp_rank, int64_t pp_rank, int64_t ep_rank = 0,
                              int64_t ep_size = 1);

// Every rank's shard of a whole HF checkpoint, `[pp][tp]` (hf_to_shard per
// rank), each with every expert (save_sharded splits them over layout.ep).
// Fills an empty `layout.layer_split` in the result's layout.
std::vector<std::vector<TensorMap>> shard_all(const TensorMap& hf, const ModelConfig& cfg,
                                              const ShardedLayout& layout);

// EP rank `ep_rank` of `ep_size`'s part of tensors that `saved_ep` EP ranks
// wrote, `read(j)` returning EP rank j's: that one when the sizes agree, else
// every EP rank's experts joined (join_expert_shards; the other tensors from
// EP rank 0) and re-split ep_size ways. Works for any tensors named after
// the engine's (optimizer state "exp_avg.<name>" too). Throws EngineError
// when the experts do not split ep_size ways.
TensorMap resplit_experts(int64_t saved_ep, int64_t ep_rank, int64_t ep_size,
                          const std::function<TensorMap(int64_t j)>& read);

// Writes config.json (hf_config_json; `base_config` keeps a source config's
// extra keys) and layout.json, and returns their checksums for the
// directory's manifest. Throws EngineError for a layout that does not fit the
// config (layer split, TP divisibility).
ChecksumManifest write_sharded_layout(const std::filesystem::path& dir, const ModelConfig& cfg,
                          const ShardedLayout& layout, const nlohmann::json* base_config = nullptr);
// Writes one rank's file (EP rank `ep_rank` of the layout's `ep_size`: its
// own experts) and returns its checksums; ranks may call this concurrently for
// their own files.
FileChecksum write_sharded_rank(const std::filesystem::path& dir, int64_t tp_rank, int64_t pp_rank,
                        const TensorMap& shard, int64_t ep_rank = 0, int64_t ep_size = 1);
// Writes every rank's file (`shards[pp][tp]` with every expert, matching the
// layout; split over layout.ep EP ranks' files), then the config and layout,
// then removes rank files a previous layout left in `dir`, then writes the
// checksum manifest (a previous one is removed before the first file).
void save_sharded(const std::filesystem::path& dir, const ModelConfig& cfg,
                  const ShardedLayout& layout, const std::vector<std::vector<TensorMap>>& shards,
                  const nlohmann::json* base_config = nullptr);

// Reads and validates layout.json against DIR/config.json (format, sizes, the
// split summing to the layers, TP divisibility, a recorded padded_vocab_size
// equal to the one the layout implies); the split is always filled.
ShardedLayout load_sharded_layout(const std::filesystem::path& dir);
// One rank's tensors (engine names): those of EP rank `ep_rank` of `ep_size`,
// whatever the layout's ep (resplit_experts; the default, every expert).
// Throws EngineError for a rank outside the layout, an ep_size that does not
// divide num_experts, or a missing or corrupt file.
TensorMap load_sharded_rank(const std::filesystem::path& dir, int64_t tp_rank, int64_t pp_rank,
                            int64_t ep_rank = 0, int64_t ep_size = 1);
// Every rank's tensors, `[pp][tp]`, each with every expert (what shards_to_hf
// takes).
std::vector<std::vector<TensorMap>> load_sharded_all(const std::filesystem::path& dir);

}  // namespace baton::engine
