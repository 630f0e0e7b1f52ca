#include "engine/rollout/kv_cache.h"

#include <cstdio>

#include "engine/errors.h"

#if defined(BATON_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace baton::engine {
namespace {

// "64.0 MiB", "-2.1 GiB".
std::string bytes_text(int64_t bytes) {
  const double gib = static_cast<double>(int64_t{1} << 30);
  const double mib = static_cast<double>(int64_t{1} << 20);
  const double b = static_cast<double>(bytes);
  char text[32];
  if (b >= gib || b <= -gib)
    std::snprintf(text, sizeof text, "%.1f GiB", b / gib);
  else
    std::snprintf(text, sizeof text, "%.1f MiB", b / mib);
  return text;
}

int64_t fraction_of(double utilization, int64_t bytes) {
  return static_cast<int64_t>(utilization * static_cast<double>(bytes));
}

}  // namespace

std::optional<DeviceMemory> device_memory(at::Device device) {
#if defined(BATON_CUDA)
  if (!device.is_cuda()) return std::nullopt;
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDAGuard guard(index);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  // Memory the caching allocator holds but has not handed out is free for
  // this process's next tensors: the allocator reuses it (and on a miss
  // releases it to the driver before failing), so it is not "in use".
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t cached = stats.reserved_bytes[all].current - stats.allocated_bytes[all].current;
  return DeviceMemory{static_cast<int64_t>(total), static_cast<int64_t>(total - free) - cached};
#else
  (void)device;
  return std::nullopt;
#endif
}

int64_t kv_budget_from_memory(const DeviceMemory& memory, double utilization,
                              int64_t bytes_per_block) {
  if (!(utilization > 0 && utilization <= 1))
    throw EngineError(
        detail::cat("KvCache: memory_utilization must be in (0, 1], got ", utilization));
  const int64_t budget = fraction_of(utilization, memory.total_bytes) - memory.in_use_bytes;
  if (budget < 2 * bytes_per_block)
    throw EngineError(detail::cat(
        "KvCache: memory_utilization (verl's gpu_memory_utilization) ", utilization, " of ",
        bytes_text(memory.total_bytes), " leaves ", bytes_text(budget), " after the ",
        bytes_text(memory.in_use_bytes), " in use on the device; the cache needs at least 2 ",
        "blocks of ", bytes_per_block, " bytes (one is scratch): raise the fraction or free ",
        "device memory"));
  return budget;
}

std::string describe_kv_budget(const KvCacheOptions& options, at::Device device) {
  if (options.memory_utilization <= 0) return "budget_bytes " + bytes_text(options.budget_bytes);
  const auto memory = device_memory(device);
  if (!memory)
    return detail::cat("budget_bytes ", bytes_text(options.budget_bytes),
                       " (memory_utilization applies to CUDA devices only, not ", device.str(),
                       ")");
  char fraction[16];
  std::snprintf(fraction, sizeof fraction, "%.2f", options.memory_utilization);
  return detail::cat("memory_utilization ", fraction, " of ", bytes_text(memory->total_bytes),
                     " on ", device.str(), ", ", bytes_text(memory->in_use_bytes), " in use: ",
                     bytes_text(fraction_of(options.memory_utilization, memory->total_bytes) -
                                memory->in_use_bytes),
                     " now",
                     options.max_tokens > 0
                         ? detail::cat(", capped at ", options.max_tokens,
                                       " token positions (max_batch × max_position_embeddings)")
                         : std::string());
}

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
  wake();
}

void KvCache::size_pool() {
  if (options_.memory_utilization > 0) {
    if (const auto memory = device_memory(tensors_.device())) {
      num_blocks_ = kv_budget_from_memory(*memory, options_.memory_utilization, bytes_per_block()) /
                    bytes_per_block();
      if (options_.max_tokens > 0)
        num_blocks_ = std::min(num_blocks_, blocks_for(options_.max_tokens) + 1);
      return;
    }
  }
  const int64_t blocks = options_.budget_bytes / bytes_per_block();
  if (blocks < 2)
    throw EngineError(detail::cat("KvCache: a budget of ", options_.budget_bytes, " bytes holds ",
                                  blocks, " blocks of ", options_.block_size, " tokens × ",
                                  bytes_per_token_,
                                  " bytes; at least 2 are needed (one is scratch)"));
  num_blocks_ = blocks;
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
  // Nothing is allocated now: the device's memory in use is everything but
  // this cache.
  size_pool();
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
