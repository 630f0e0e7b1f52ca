// Decode kernels: the CPU fp32 kernels of the generation engine's packed
// step (Transformer::forward_paged), written as plain loops over raw
// pointers so that a decode step costs its arithmetic, not one LibTorch
// dispatch per small operation. The matrix multiplies stay with LibTorch's
// BLAS; these cover everything between them:
//   - rms_norm: HF's RMSNorm of each row;
//   - argmax_log_sum_exp: the sampler's pass over the logits;
//   - silu_mul: silu(gate) * up of the MLP;
//   - PagedAttention: rotary embedding of q and k, the new keys and values
//     written into the paged KV cache, and causal attention of each new
//     token over its sequence's cached keys and values read in place through
//     the block table (no gather of the context into a contiguous copy).
// Each kernel computes a token from its own inputs only, so a token's result
// does not depend on which other sequences share the step. Inner loops are
// compiled three times (baseline x86-64, x86-64-v3: AVX2 + FMA, x86-64-v4:
// AVX-512) and the CPU picks at load time.
//
// Example (one layer of a step over T tokens):
//   cpu::rms_norm(h, w, normed, T, H, eps);
//   ... qkv = normed · Wqkvᵀ ...
//   cpu::PagedAttention a{...};
//   a.rotate_and_store(qkv, T);   // q, k rotated in place; k, v into the cache
//   a.attend(qkv, T, ctx);        // ctx [T, heads · head_dim]
//
// Thread safety: the functions are reentrant; they split their work over
// LibTorch's intra-op threads (at::parallel_for) when it is large enough.
#pragma once

#include <cstdint>

namespace baton::engine::cpu {

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * w for `rows` rows of
// `h` floats; x and y may be the same buffer.
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t h, double eps);

// y[i, j] = silu(x[i, j]) * x[i, n + j] for x [rows, 2n] (gate then up, as
// the fused fc1 lays them out) and y [rows, n].
void silu_mul(const float* x, float* y, int64_t rows, int64_t n);

// For each of `rows` rows of x [rows, v]: the index of its first maximum, and
// log Σ_j exp(x[i, j] / temperature) (fp32, the exponentials within 2 ulp).
// The sampler's greedy pick and log-prob normaliser in one pass over the
// logits. REQUIRES: temperature > 0.
void argmax_log_sum_exp(const float* x, int64_t rows, int64_t v, double temperature,
                        int64_t* argmax, float* lse);

// Attention of one step's new tokens over a paged KV cache. The fused qkv
// rows are laid out per kv group: `ratio` query heads, then the key head,
// then the value head, each `head_dim` floats (TransformerLayer's layout).
struct PagedAttention {
  int64_t groups = 0;  // kv heads on this rank
  int64_t ratio = 0;   // query heads per kv head
  int64_t head_dim = 0;
  int64_t block_size = 0;  // cache positions per block
  // Rotary tables [max position + 1, head_dim] (HF's cos / sin rows).
  const float* cos = nullptr;
  const float* sin = nullptr;
  // The layer's cache, [slots, groups, head_dim] each.
  float* k_cache = nullptr;
  float* v_cache = nullptr;
  // Per token: its position in its sequence, the cache slot it writes, and
  // its sequence's row in `block_tables` ([rows, table_stride] block ids).
  const int64_t* positions = nullptr;
  const int64_t* write_slots = nullptr;
  const int64_t* rows = nullptr;
  const int64_t* block_tables = nullptr;
  int64_t table_stride = 0;

  // Rotates every token's query and key heads of `qkv` [tokens, groups ·
  // (ratio + 2) · head_dim] in place, then writes its key and value heads to
  // the cache at its write slot.
  void rotate_and_store(float* qkv, int64_t tokens) const;
  // Causal attention: token t's query heads over positions 0 .. positions[t]
  // of its sequence (which must all be in the cache: run rotate_and_store
  // first). out: [tokens, groups · ratio · head_dim], heads in qkv's order.
  void attend(const float* qkv, int64_t tokens, float* out) const;
};

}  // namespace baton::engine::cpu
