// KvCache: the paged key/value cache of the generation engine. Memory is a
// pool of fixed-size blocks (`block_size` token positions each, every layer's
// keys and values for this rank's kv heads), sized once from a byte budget;
// each sequence holds a block table and grows it a block at a time, so a
// sequence costs what it uses, rounded up to one block, and a finished one
// gives its blocks back for waiting prompts (continuous batching).
//
// Block 0 is scratch: padding tokens write there and padded reads point
// there (masked out). Blocks are reference-counted so that sequences can
// share a prompt's full blocks (share_prefix). sleep() frees the whole pool between rollouts and
// wake() allocates it again; block tables do not survive a sleep.
//
// Example:
//   KvCache cache(cfg, /*layers=*/cfg.num_layers, /*kv heads=*/2, at::kFloat,  // dtype, device
//                 KvCacheOptions{.budget_bytes = 64 << 20});
//   std::vector<int64_t> table;
//   if (cache.reserve(table, prompt_len + 1)) { ... cache.slot(table, pos) ... }
//   cache.release(table);
//
// Thread safety: none; one generation engine owns it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/io/model_config.h"

namespace baton::engine {

struct KvCacheOptions {
  int64_t budget_bytes = 256 << 20;  // keys + values of every layer, all blocks
  int64_t block_size = 16;           // token positions per block
};

class KvCache {
 public:
  // `tensors`: the cache's dtype and device (the model's). Throws EngineError when the budget holds
  // fewer than two blocks (one usable besides scratch) or block_size < 1. Allocates the pool
  // (awake).
  KvCache(const ModelConfig& config, int64_t num_layers, int64_t local_kv_heads,
          at::TensorOptions tensors, KvCacheOptions options = {});

  int64_t block_size() const { return options_.block_size; }
  // Blocks a sequence may use (the scratch block excluded).
  int64_t usable_blocks() const { return num_blocks_ - 1; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_for(int64_t tokens) const;
  // Keys and values of one token position over every layer on this rank.
  int64_t bytes_per_token() const { return bytes_per_token_; }
  // Bytes the pool holds now (0 while asleep).
  int64_t allocated_bytes() const;

  // Grows `table` to cover `tokens` positions. False (and `table` unchanged)
  // when there are not enough free blocks.
  bool reserve(std::vector<int64_t>& table, int64_t tokens);
  // Drops `table`'s hold on each of its blocks (a block shared by
  // share_prefix returns to the pool with its last holder) and clears it.
  void release(std::vector<int64_t>& table);
  // Makes the empty `table` cover the first `tokens` positions of the
  // sequence whose table is `from` (prefix sharing: the n samples of one
  // prompt prefill it once). Its full blocks are shared, reference-counted
  // (nobody writes positions below `tokens` again); the partly filled last
  // block, if any, is copied into a block of its own, which the new sequence
  // goes on writing. False (`table` unchanged) when no block is free for the
  // copy. REQUIRES: `from` covers `tokens` positions.
  bool share_prefix(const std::vector<int64_t>& from, int64_t tokens, std::vector<int64_t>& table);
  // The cache slot of position `pos` of a sequence; slot 0 is scratch.
  int64_t slot(const std::vector<int64_t>& table, int64_t pos) const {
    return table[pos / options_.block_size] * options_.block_size + pos % options_.block_size;
  }

  // Keys / values of one local layer: [slots, local_kv_heads, head_dim].
  // REQUIRES: awake.
  at::Tensor& keys(int64_t layer) { return keys_[layer]; }
  at::Tensor& values(int64_t layer) { return values_[layer]; }

  // Frees the pool (every block must have been released: EngineError
  // otherwise, naming how many are still held). wake() allocates it again.
  void sleep();
  void wake();
  bool awake() const { return awake_; }

 private:
  int64_t num_layers_, kv_heads_, head_dim_;
  at::TensorOptions tensors_;
  KvCacheOptions options_;
  int64_t bytes_per_token_ = 0;
  int64_t num_blocks_ = 0;
  bool awake_ = false;
  std::vector<int64_t> free_;     // a stack: the most recently freed block first
  std::vector<int32_t> holders_;  // per block: tables holding it (0: free)
  std::vector<at::Tensor> keys_, values_;
};

}  // namespace baton::engine
