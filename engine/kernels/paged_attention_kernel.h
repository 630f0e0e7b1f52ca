// The CUDA side of paged decode attention (engine/kernels/paged_attention.h):
// a launcher over raw pointers and strides, compiled by nvcc without any
// LibTorch header (paged_attention_kernel.cu). paged_attention.cpp checks
// the tensors and fills PagedDecodeArgs; nothing else calls this.
//
// The kernel: one thread block per (sequence, kv head), which scores the
// query heads of that kv head together against each key row it reads once,
// in tiles of 256 positions with an online softmax (running max, running
// sum, rescaled fp32 accumulator), keys and values read in place through the
// block table. No host synchronisation: it can be captured in a CUDA graph.
// Deterministic: a rerun gives the same bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace baton::engine::cuda {

// The element type of q, the caches and the output (all the same).
enum class PagedDtype { kFloat32, kBFloat16, kFloat16 };

// Sizes are in elements, strides in elements of their tensor.
struct PagedDecodeArgs {
  const void* q = nullptr;  // [batch, q_heads, head_dim]
  int64_t q_stride[3] = {0, 0, 0};
  const void* k_cache = nullptr;  // [slots, kv_heads, head_dim], last dim contiguous
  int64_t k_stride[2] = {0, 0};   // slot, head
  const void* v_cache = nullptr;  // as k_cache
  int64_t v_stride[2] = {0, 0};
  const void* block_tables = nullptr;  // [batch, max_blocks] of block ids
  bool block_tables_int64 = true;      // int64, else int32
  int64_t block_tables_stride[2] = {0, 0};
  const int64_t* context_lens = nullptr;  // [batch]
  int64_t context_lens_stride = 1;
  void* out = nullptr;  // [batch, q_heads, head_dim], contiguous
  int64_t batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t max_blocks = 0, block_size = 0;
  float scale = 1;
  PagedDtype dtype = PagedDtype::kFloat32;
};

// Whether the kernel handles these sizes: head_dim in [1, 256], 1 to 16 query
// heads per kv head, block ids addressable with 64-bit slots. Callers fall
// back to another path otherwise.
bool paged_decode_supported(int64_t head_dim, int64_t q_heads, int64_t kv_heads);

// Queues the kernel on `stream` and returns cudaGetLastError() after the
// launch (cudaSuccess when batch is 0: nothing to launch). Asynchronous.
// REQUIRES: paged_decode_supported(...); 1 <= context_lens[b] <= max_blocks *
// block_size (the kernel clamps to that range rather than read out of
// bounds; 0 gives a zero row); block ids within the caches.
cudaError_t launch_paged_decode_attention(const PagedDecodeArgs& args, cudaStream_t stream);

}  // namespace baton::engine::cuda
