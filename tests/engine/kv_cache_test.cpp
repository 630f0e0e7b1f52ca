// The KV cache's budget: a byte count, or on a GPU a fraction of the
// device's memory (vLLM's gpu_memory_utilization) measured whenever the pool
// is allocated. The arithmetic runs on the CPU; a _CUDA test checks that a
// real allocation lands within the fraction.
#include "engine/rollout/kv_cache.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/rollout/generation.h"
#include "tests/engine/expect_error.h"

namespace baton::engine {
namespace {

using testing::expect_error;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

ModelConfig config_with_head_dim(int64_t head_dim) {
  ModelConfig cfg;
  cfg.head_dim = head_dim;
  return cfg;
}

TEST(KvCacheBudget, IsTheFractionOfTheDeviceLessWhatIsInUse) {
  EXPECT_EQ(
      kv_budget_from_memory({.total_bytes = 80 * kGiB, .in_use_bytes = 10 * kGiB}, 0.5, 2 * kMiB),
      30 * kGiB);
  EXPECT_EQ(kv_budget_from_memory({.total_bytes = 80 * kGiB, .in_use_bytes = 0}, 1.0, kMiB),
            80 * kGiB);
  // Exactly two blocks (scratch and one usable) is enough.
  EXPECT_EQ(kv_budget_from_memory({.total_bytes = 1000, .in_use_bytes = 300}, 0.5, 100), 200);
}

TEST(KvCacheBudget, LessThanTwoBlocksIsAnErrorNamingTheNumbers) {
  expect_error(
      [] {
        kv_budget_from_memory({.total_bytes = 80 * kGiB, .in_use_bytes = 26 * kGiB}, 0.3, kMiB);
      },
      {"memory_utilization", "gpu_memory_utilization", "0.3 of 80.0 GiB", "leaves -2.0 GiB",
       "after the 26.0 GiB in use", "2 blocks of 1048576 bytes"});
  expect_error([] { kv_budget_from_memory({.total_bytes = 1000, .in_use_bytes = 300}, 0.5, 101); },
               {"leaves 0.0 MiB", "2 blocks of 101 bytes"});
}

TEST(KvCacheBudget, UtilizationOutsideZeroToOneIsAnError) {
  for (double bad : {0.0, -0.5, 1.5})
    expect_error([&] { kv_budget_from_memory({.total_bytes = kGiB}, bad, 1); },
                 {"memory_utilization must be in (0, 1]"});
}

TEST(KvCacheBudget, OnTheCpuTheByteBudgetAppliesAndUtilizationIsIgnored) {
  EXPECT_FALSE(device_memory(at::Device(at::kCPU)).has_value());
  const ModelConfig cfg = config_with_head_dim(8);
  // 2 (keys, values) × 2 layers × 2 heads × 8 dims × 4 bytes = 256 bytes a
  // token, 4 KiB a block of 16: 64 KiB hold 16 blocks.
  KvCache by_bytes(cfg, 2, 2, at::kFloat, {.budget_bytes = 64 << 10});
  KvCache ignored(cfg, 2, 2, at::kFloat, {.budget_bytes = 64 << 10, .memory_utilization = 0.9});
  EXPECT_EQ(by_bytes.bytes_per_block(), 4096);
  EXPECT_EQ(by_bytes.allocated_bytes(), 64 << 10);
  EXPECT_EQ(ignored.allocated_bytes(), 64 << 10);
  EXPECT_EQ(ignored.usable_blocks(), 15);
  // Asleep and awake again: the same pool.
  ignored.sleep();
  EXPECT_EQ(ignored.allocated_bytes(), 0);
  ignored.wake();
  EXPECT_EQ(ignored.allocated_bytes(), 64 << 10);
  EXPECT_EQ(ignored.free_blocks(), 15);

  EXPECT_EQ(describe_kv_budget({.budget_bytes = 64 << 20}, at::Device(at::kCPU)),
            "budget_bytes 64.0 MiB");
  EXPECT_EQ(describe_kv_budget({.budget_bytes = 64 << 20, .memory_utilization = 0.5},
                               at::Device(at::kCPU)),
            "budget_bytes 64.0 MiB (memory_utilization applies to CUDA devices only, not cpu)");
}

// On a GPU: the cache takes what the fraction leaves, so that afterwards the
// memory in use is the fraction of the device, within a block (the pool is
// whole blocks) and the allocator's rounding; it is sized again at wake().
TEST(KvCacheBudget, AGpuCacheFillsTheDeviceUpToTheFraction_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  const ModelConfig cfg = config_with_head_dim(64);
  const auto before = device_memory(gpu);
  ASSERT_TRUE(before.has_value());
  ASSERT_GT(before->total_bytes, 0);
  // 256 MiB more than what is in use now.
  const double fraction = static_cast<double>(before->in_use_bytes + 256 * kMiB) /
                          static_cast<double>(before->total_bytes);
  ASSERT_LE(fraction, 1.0) << "the device is full";
  const auto tensors = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
  KvCache cache(cfg, 4, 2, tensors, {.budget_bytes = kMiB, .memory_utilization = fraction});
  const int64_t block = cache.bytes_per_block();
  EXPECT_GT(cache.allocated_bytes(), 256 * kMiB - block - kMiB);
  EXPECT_LE(cache.allocated_bytes(), 256 * kMiB);
  const auto after = device_memory(gpu);
  const double target = fraction * static_cast<double>(after->total_bytes);
  const double slack = static_cast<double>(block + 16 * kMiB);
  EXPECT_LE(static_cast<double>(after->in_use_bytes), target + slack);
  EXPECT_GE(static_cast<double>(after->in_use_bytes), target - slack);
  EXPECT_NE(describe_kv_budget({.memory_utilization = fraction}, gpu).find("on cuda:0"),
            std::string::npos);

  // Half of that room taken by another tensor: the next wake() sizes the
  // pool to what is left.
  const int64_t first = cache.allocated_bytes();
  cache.sleep();
  at::Tensor other = at::empty({128 * kMiB}, at::TensorOptions().dtype(at::kByte).device(gpu));
  cache.wake();
  EXPECT_LE(cache.allocated_bytes(), first - 128 * kMiB + block);
  // (Less the few MiB the first kernels' modules took since the first wake.)
  EXPECT_GT(cache.allocated_bytes(), first - 128 * kMiB - block - 16 * kMiB);

  // A fraction below what is in use leaves nothing: an error naming it.
  cache.sleep();
  const double too_small = static_cast<double>(device_memory(gpu)->in_use_bytes) /
                           static_cast<double>(before->total_bytes) / 2;
  expect_error([&] { KvCache(cfg, 4, 2, tensors, {.memory_utilization = too_small}); },
               {"memory_utilization", "in use on the device"});
}

// The engine caps a fraction-of-the-GPU pool at what its batch can hold:
// max_batch sequences of max_position_embeddings positions. A user's own
// max_tokens stays.
TEST(KvCacheBudget, TheEngineCapsTheFractionAtMaxBatchTimesMaxPositions) {
  ModelConfig cfg = config_with_head_dim(8);
  cfg.max_position_embeddings = 64;
  GenerationOptions options;
  options.max_batch = 8;
  options.cache.memory_utilization = 0.5;
  EXPECT_EQ(capped_cache_options(options, cfg).max_tokens, 8 * 64);
  EXPECT_EQ(capped_cache_options(options, cfg).memory_utilization, 0.5);
  options.cache.max_tokens = 100;
  EXPECT_EQ(capped_cache_options(options, cfg).max_tokens, 100);
  // The byte budget is the user's number: not capped (on the CPU, where
  // utilization does not apply, 64 KiB stay 16 blocks).
  KvCache cpu(cfg, 2, 2, at::kFloat,
              {.budget_bytes = 64 << 10, .memory_utilization = 0.5, .max_tokens = 16});
  EXPECT_EQ(cpu.allocated_bytes(), 64 << 10);
}

TEST(KvCacheBudget, AGpuCacheStopsAtMaxTokens_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  const ModelConfig cfg = config_with_head_dim(64);
  const auto tensors = at::TensorOptions().dtype(at::kBFloat16).device(gpu);
  // Half the device would be gigabytes; 100 positions are 7 blocks of 16,
  // plus the scratch block.
  KvCache cache(cfg, 4, 2, tensors, {.memory_utilization = 0.5, .max_tokens = 100});
  EXPECT_EQ(cache.allocated_bytes(), 8 * cache.bytes_per_block());
  EXPECT_NE(describe_kv_budget({.memory_utilization = 0.5, .max_tokens = 100}, gpu)
                .find("capped at 100 token positions"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::engine
