// Log-probabilities and entropy from logits sharded over the vocabulary, without
// gathering the full vocabulary on one rank (the "efficient entropy and cross
// entropy" of Megatron backends).
//
// logits_shard: [.., V/tp] on each rank of `tp`; rank k holds vocabulary ids
// [k·V/tp, (k+1)·V/tp) (a ColumnParallelLinear LM head without gather_output;
// V may be a padded vocabulary, see below).
// targets: global token ids, int64, shape logits_shard.shape[:-1].
//
// Every result is replicated on all tp ranks, has shape logits.shape[:-1], and
// is fp32 for fp16/bf16 logits (logits' dtype otherwise). The softmax is taken
// after subtracting the global max (one all-reduce MAX), then one all-reduce
// SUM carries the partition function and the other per-position sums, so large
// logits do not overflow. Logits must be finite, or -inf for a column that
// is not part of the distribution (vocabulary padding, as Transformer's LM
// head leaves it; a shard may hold nothing else, but some rank must hold a
// finite logit): such a column gets probability exactly 0, adds nothing to
// the entropy (0, where 0·log 0 would be NaN) and gets a zero gradient, so
// the results are those of the vocabulary without it.
//
// Differentiable with respect to the logits through a hand-written backward
// that needs no communication: d log p(t)/dl = onehot(t) - softmax, and
// dH/dl = softmax · (E_softmax[l] - l). Backward recomputes the softmax from the
// saved logits instead of keeping a second vocabulary-sized tensor.
//
// Collective over `tp` and blocking (forward only); size 1 runs no collective.
//
// Example (per-token log-probs and entropy of a rollout, last pipeline stage):
//   at::Tensor logits = lm_head(hidden);             // [B, S, V/tp]
//   auto [log_probs, entropy] = vocab_parallel_log_probs_entropy(logits, tokens, ps->tp());
#pragma once

#include <ATen/ATen.h>

#include "engine/parallel/parallel_state.h"

namespace baton::engine {

// log softmax(logits)[target] per position. Throws EngineError for targets
// outside [0, V) or of the wrong shape or dtype.
at::Tensor vocab_parallel_log_probs(const at::Tensor& logits_shard, const at::Tensor& targets,
                                    const Group& tp);

// Entropy -Σ p log p of softmax(logits) per position.
at::Tensor vocab_parallel_entropy(const at::Tensor& logits_shard, const Group& tp);

struct LogProbsEntropy {
  at::Tensor log_probs;
  at::Tensor entropy;
};

// Both at once, sharing the softmax and the collectives (two all-reduces in
// all, as for either alone).
LogProbsEntropy vocab_parallel_log_probs_entropy(const at::Tensor& logits_shard,
                                                 const at::Tensor& targets, const Group& tp);

// Σ_v softmax(logits)_v² per position (verl's sum_pi_squared, the input of
// the optimal-token-baseline estimators): exp(logsumexp(2l) − 2·logsumexp(l)),
// computed as Σ e^{2(l − max)} / (Σ e^{l − max})² after the global max, so it
// neither overflows nor underflows to 0 (the sum holds a 1). A -inf column
// adds 0. Forward only: the result carries no gradient. One all-reduce MAX
// and one SUM.
at::Tensor vocab_parallel_sum_pi_squared(const at::Tensor& logits_shard, const Group& tp);

}  // namespace baton::engine
