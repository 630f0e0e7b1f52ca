// KvCache: the paged key/value cache of the generation engine. Memory is a
// pool of fixed-size blocks (`block_size` token positions each, every layer's
// keys and values for this rank's kv heads), sized from a byte budget each
// time it is allocated; each sequence holds a block table and grows it a
// block at a time, so a sequence costs what it uses, rounded up to one block,
// and a finished one gives its blocks back for waiting prompts (continuous
// batching).
//
// The budget is KvCacheOptions::budget_bytes, or, on a CUDA device with
// memory_utilization > 0, a fraction of the device's memory as vLLM's
// gpu_memory_utilization (kv_budget_from_memory), measured whenever the pool
// is allocated: at construction and at every wake().
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
//   // On a GPU: half of the device's memory, less what is in use there now.
//   KvCache gpu_cache(cfg, cfg.num_layers, 2, at::TensorOptions(at::kCUDA).dtype(at::kBFloat16),
//                     KvCacheOptions{.memory_utilization = 0.5});
//
// Thread safety: none; one generation engine owns it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/model_config.h"

namespace baton::engine {

struct KvCacheOptions {
  // Keys + values of every layer, all blocks: the budget on the CPU (which
  // has no device memory of its own), and on a GPU when memory_utilization
  // is 0.
  int64_t budget_bytes = 256 << 20;
  int64_t block_size = 16;  // token positions per block
  // > 0, on a CUDA device: the budget is this fraction of the device's total
  // memory less what is in use on it when the pool is allocated (vLLM's
  // gpu_memory_utilization; kv_budget_from_memory), and budget_bytes is
  // ignored. 0, or another device: budget_bytes.
  double memory_utilization = 0;
  // > 0: a memory_utilization pool holds at most the blocks of this many
  // token positions (plus scratch), what the engine can ever hold at once
  // (GenerationEngine: max_batch × max_position_embeddings), so that a small
  // model does not take half a GPU. budget_bytes is never capped: it is the
  // user's own number.
  int64_t max_tokens = 0;
};

// A device's memory in bytes: its total, and what is in use on it (by every
// process) that this process's tensors cannot reuse.
struct DeviceMemory {
  int64_t total_bytes = 0;
  int64_t in_use_bytes = 0;
};

// `device`'s memory now: for a CUDA device, cudaMemGetInfo's total and
// total − free, less what this process's caching allocator holds without
// having handed it out (the cache's tensors reuse that memory before the
// allocator asks the driver for more). nullopt for other devices (the CPU
// has no memory of its own to divide) and in builds without BATON_CUDA.
std::optional<DeviceMemory> device_memory(at::Device device);

// The KV-cache budget that `utilization` (0, 1] of `memory` leaves:
// utilization × total − in_use bytes. Throws EngineError naming the numbers
// when that holds fewer than two blocks of `bytes_per_block` (one usable
// besides scratch).
int64_t kv_budget_from_memory(const DeviceMemory& memory, double utilization,
                              int64_t bytes_per_block);

// Which budget `options` puts in force for a cache on `device`, for a log
// line: "budget_bytes 64.0 MiB", or "memory_utilization 0.50 of 79.6 GiB on
// cuda:0, 12.3 GiB in use: 27.5 GiB now". Queries the device (device_memory).
std::string describe_kv_budget(const KvCacheOptions& options, at::Device device);

class KvCache {
 public:
  // `tensors`: the cache's dtype and device (the model's). Throws EngineError when the budget holds
  // fewer than two blocks (one usable besides scratch) or block_size < 1. Allocates the pool
  // (awake), sized as KvCacheOptions says.
  KvCache(const ModelConfig& config, int64_t num_layers, int64_t local_kv_heads,
          at::TensorOptions tensors, KvCacheOptions options = {});

  int64_t block_size() const { return options_.block_size; }
  // Blocks a sequence may use (the scratch block excluded).
  int64_t usable_blocks() const { return num_blocks_ - 1; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_for(int64_t tokens) const;
  // Keys and values of one token position over every layer on this rank.
  int64_t bytes_per_token() const { return bytes_per_token_; }
  // Keys and values of one block over every layer on this rank.
  int64_t bytes_per_block() const { return bytes_per_token_ * options_.block_size; }
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
  // otherwise, naming how many are still held). wake() allocates it again,
  // sized anew when the budget comes from the device's memory (the block
  // count may change; EngineError, the cache left asleep, when it holds
  // fewer than two blocks).
  void sleep();
  void wake();
  bool awake() const { return awake_; }

 private:
  // The budget now, as KvCacheOptions says; sets num_blocks_ (EngineError
  // below two blocks).
  void size_pool();

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
