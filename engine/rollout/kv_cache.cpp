#include "engine/rollout/kv_cache.h"

#include "engine/errors.h"

namespace baton::engine {

KvCache::KvCache(const ModelConfig& config, int64_t num_layers, int64_t local_kv_heads,
                 at::TensorOptions tensors, KvCacheOptions options)
    : num_layers_(num_layers),
      kv_heads_(local_kv_heads),
      head_dim_(config.head_dim),
      tensors_(tensors),
      options_(options) {
  if (options_.block_size < 1)
    throw EngineError(detail::cat("KvCache: block_size must be >= 1, got ", options_.block_size));
  bytes_per_token_ =
      2 * num_layers_ * kv_heads_ * head_dim_ * static_cast<int64_t>(tensors_.dtype().itemsize());
  num_blocks_ = options_.budget_bytes / (bytes_per_token_ * options_.block_size);
  if (num_blocks_ < 2)
    throw EngineError(detail::cat("KvCache: a budget of ", options_.budget_bytes, " bytes holds ",
                                  num_blocks_, " blocks of ", options_.block_size, " tokens × ",
                                  bytes_per_token_,
                                  " bytes; at least 2 are needed (one is scratch)"));
  wake();
}

int64_t KvCache::blocks_for(int64_t tokens) const {
  return (tokens + options_.block_size - 1) / options_.block_size;
}

int64_t KvCache::allocated_bytes() const {
  return awake_ ? num_blocks_ * options_.block_size * bytes_per_token_ : 0;
}

bool KvCache::reserve(std::vector<int64_t>& table, int64_t tokens) {
  ENGINE_CHECK(awake_, "KvCache::reserve: the cache is asleep; call wake() first");
  int64_t need = blocks_for(tokens) - static_cast<int64_t>(table.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    holders_[free_.back()] = 1;
    free_.pop_back();
  }
  return true;
}

void KvCache::release(std::vector<int64_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it)
    if (--holders_[*it] == 0) free_.push_back(*it);
  table.clear();
}

bool KvCache::share_prefix(const std::vector<int64_t>& from, int64_t tokens,
                           std::vector<int64_t>& table) {
  const int64_t bs = options_.block_size, full = tokens / bs, rest = tokens % bs;
  ENGINE_CHECK(awake_ && table.empty() && tokens >= 0 &&
                   blocks_for(tokens) <= static_cast<int64_t>(from.size()),
               "KvCache::share_prefix: needs an awake cache, an empty table and a source "
               "covering ",
               tokens, " positions (it has ", from.size(), " blocks)");
  if (rest > 0 && free_.empty()) return false;
  for (int64_t i = 0; i < full; ++i) {
    table.push_back(from[i]);
    ++holders_[from[i]];
  }
  if (rest > 0) {
    const int64_t src = from[full], dst = free_.back();
    free_.pop_back();
    holders_[dst] = 1;
    for (int64_t l = 0; l < num_layers_; ++l) {
      keys_[l].narrow(0, dst * bs, rest).copy_(keys_[l].narrow(0, src * bs, rest));
      values_[l].narrow(0, dst * bs, rest).copy_(values_[l].narrow(0, src * bs, rest));
    }
    table.push_back(dst);
  }
  return true;
}

void KvCache::sleep() {
  if (!awake_) return;
  int64_t held = usable_blocks() - free_blocks();
  ENGINE_CHECK(held == 0, "KvCache::sleep: ", held, " blocks are still held by sequences");
  keys_.clear();
  values_.clear();
  free_.clear();
  awake_ = false;
}

void KvCache::wake() {
  if (awake_) return;
  int64_t slots = num_blocks_ * options_.block_size;
  for (int64_t l = 0; l < num_layers_; ++l) {
    keys_.push_back(at::zeros({slots, kv_heads_, head_dim_}, tensors_));
    values_.push_back(at::zeros({slots, kv_heads_, head_dim_}, tensors_));
  }
  // Low block ids on top of the stack: a fresh cache hands out 1, 2, 3, ...
  free_.clear();
  for (int64_t b = num_blocks_ - 1; b >= 1; --b) free_.push_back(b);
  holders_.assign(num_blocks_, 0);
  awake_ = true;
}

}  // namespace baton::engine
