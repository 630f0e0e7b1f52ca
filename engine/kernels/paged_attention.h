// Decode attention over the paged KV cache (engine/rollout/kv_cache.h): one
// query token per sequence attends to its sequence's cached keys and values,
// read in place through its block table, without gathering the context or
// repeating the kv heads for grouped-query attention. On CUDA tensors a
// CUDA kernel (paged_attention_kernel.h); on any other device, and for sizes
// the kernel does not take (head_dim > 256, more than 16 query heads per kv
// head), the reference below.
//
// Layout: q [B, Hq, D]; k_cache, v_cache [slots, Hkv, D] with slot = block ·
// block_size + offset (KvCache's layout of one layer); block_tables [B, W]
// int32 or int64 block ids; context_lens [B] int64. Query head h attends with
// kv head h / (Hq / Hkv), over positions 0 .. context_lens[b] − 1.
//
// Example (one layer of a decode step):
//   at::Tensor ctx = paged_decode_attention(q, k_cache, v_cache, tables, lens,
//                                           cache.block_size(), 1 / std::sqrt(d));
//
// Thread safety: reentrant. Blocking: none on CUDA — the kernel is queued on
// the current stream, shapes come from the arguments' sizes and no value is
// read back to the host, so the call can be captured in a CUDA graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace baton::engine {

// Attention of each row's query over positions 0 .. context_lens[b] − 1 of
// its paged context, softmax(q·kᵀ · scale) · v, accumulated in fp32. Returns
// [B, Hq, D] in q's dtype on q's device. Deterministic on a given device.
// Throws EngineError naming the shapes (sizes only: no device read) when the
// ranks, head counts (Hq a multiple of Hkv), head dims or batch sizes
// disagree, k_cache and v_cache differ in shape, the dtypes are not fp32,
// bf16 or fp16 (q and the caches alike), block_tables are not int32/int64 or
// context_lens not int64, the tensors are on different devices, or
// block_size < 1.
// REQUIRES (not checked: values): 1 <= context_lens[b] <= W · block_size;
// the block ids a row uses are within the caches.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size, double scale);

// The same by LibTorch ops on any device: gathers each row's W · block_size
// slots (every block id of block_tables must be within the caches), masks
// the positions >= context_lens[b], softmax in fp32, the kv heads shared by
// their query heads through a view (no repeat). The CPU path and the
// kernel's yardstick; the same checks.
at::Tensor paged_decode_attention_reference(const at::Tensor& q, const at::Tensor& k_cache,
                                            const at::Tensor& v_cache,
                                            const at::Tensor& block_tables,
                                            const at::Tensor& context_lens, int64_t block_size,
                                            double scale);

}  // namespace baton::engine
