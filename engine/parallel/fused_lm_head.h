// The LM head and the log-probs/entropy of its vocabulary-parallel logits in
// one operation that never materialises the logits: tokens are processed in
// chunks, and only one chunk's logits [chunk, V/tp] (and a softmax-sized
// companion) live at a time, in forward and in backward.
//
// Semantics are those of the unfused path
//   logits = at::linear(hidden, weight_shard);       // [N, rows]
//   logits[:, real_rows:] = -inf;                    // vocabulary padding
//   vocab_parallel_log_probs_entropy(logits / temperature, targets, tp);
// (vocab_parallel.h): rank k of `tp` holds the vocabulary rows with global
// ids [k·rows, (k+1)·rows), of which the first real_rows are tokens and the
// rest padding with probability exactly 0 (a rank may hold only padding, but
// some rank must hold a token). Results are replicated on every tp rank, have
// shape [N] and are fp32 for fp32/fp16/bf16 inputs (fp64 for fp64). A target
// in the padding gets log-prob -inf.
//
// Differentiable with respect to `hidden` and `weight_shard`. Forward keeps
// up to three fp32 numbers per token (max, log partition function, mean shifted
// logit); backward recomputes each chunk's logits and softmax from them, so
// the memory is O(N + chunk·rows) besides the inputs and their gradients.
// With s = logits / T and p = softmax(s):
//   ∂ log p(t) / ∂s = onehot(t) − p,   ∂H / ∂s = −p·(log p + H),
// and the gradients of hidden and weight_shard are those of s times 1/T.
// The hidden gradient is this rank's partial sum over its vocabulary rows:
// as for any column-parallel layer, the caller's copy_to_tp_region (or
// gather_from_sequence_region) sums it over tp in its backward. The weight
// gradient of padding rows is 0.
//
// The matrix products run in the inputs' dtype (bf16 inputs use bf16 GEMMs
// with fp32 accumulation, as at::linear); the softmax runs in fp32. The
// weight gradient is accumulated in the weight's dtype over the chunks: for
// bf16 weights one rounding per chunk (the unfused path rounds once).
//
// Collective over `tp` and blocking: forward runs two all-reduces per chunk
// (MAX, then one SUM carrying every per-token sum), so every rank must use the
// same N and chunk size; backward needs no communication. Size 1 runs no
// collective. Without gradients (GradMode off, or neither hidden nor
// weight_shard requiring grad) nothing is saved.
//
// Example (the last pipeline stage, response positions only):
//   at::Tensor x = copy_to_tp_region(final_hidden, tp).reshape({-1, H});  // [N, H]
//   auto [lp, ent] = fused_lm_head_log_probs_entropy(
//       x, output_weight, vocab_shard.real, targets.reshape({-1}), tp,
//       FusedLmHeadOptions().set_temperature(0.7).set_chunk_tokens(1024));
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "engine/parallel/parallel_state.h"
#include "engine/parallel/vocab_parallel.h"

namespace baton::engine {

struct FusedLmHeadOptions {
  // Log-probs and entropy of softmax(logits / temperature). > 0.
  double temperature = 1.0;
  // Tokens per chunk; 0: as many as fit in chunk_bytes.
  int64_t chunk_tokens = 0;
  // With chunk_tokens 0: the bytes of one chunk's temporaries (the logits
  // in fp32, their softmax, and the logits in the inputs' dtype if that is
  // not fp32): at least one token per chunk whatever the budget.
  int64_t chunk_bytes = int64_t{256} << 20;
  // Compute the entropy too; otherwise LogProbsEntropy::entropy is undefined.
  bool with_entropy = true;

  FusedLmHeadOptions& set_temperature(double t) {
    temperature = t;
    return *this;
  }
  FusedLmHeadOptions& set_chunk_tokens(int64_t n) {
    chunk_tokens = n;
    return *this;
  }
  FusedLmHeadOptions& set_chunk_bytes(int64_t bytes) {
    chunk_bytes = bytes;
    return *this;
  }
  FusedLmHeadOptions& set_with_entropy(bool on) {
    with_entropy = on;
    return *this;
  }
};

// hidden: [N, H], already in the tensor-parallel region (replicated over tp).
// weight_shard: [rows, H], this rank's vocabulary rows, hidden's dtype and
// device. real_rows: 0 <= real_rows <= rows. targets: int64 [N], global ids
// in [0, rows·tp.size). Throws EngineError naming the shapes (or dtypes,
// values) for anything else.
LogProbsEntropy fused_lm_head_log_probs_entropy(const at::Tensor& hidden,
                                                const at::Tensor& weight_shard, int64_t real_rows,
                                                const at::Tensor& targets, const Group& tp,
                                                const FusedLmHeadOptions& options = {});

}  // namespace baton::engine
