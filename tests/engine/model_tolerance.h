// How many fp32 terms a transformer sums on the way to its outputs, and how
// large they get: the two inputs of Tolerance::fp32 (tests/tolerance.h) for
// comparisons between two computations of a model's logits, values,
// log-probs, entropies and gradients (HF against baton, cached against
// uncached, one process against a parallel layout, one kernel against another).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/model/transformer.h"
#include "tests/tolerance.h"

namespace baton::engine::test {

using namespace ::baton::test;  // Tolerance, expect_close, ...

// Terms summed on the way to one logit (or value) of a sequence of `seq_len`
// tokens. Per layer: the input RMSNorm's mean of squares (hidden), the q/k/v
// projection (hidden), the attention scores (head_dim), the softmax and the
// weighted sum of values over at most seq_len keys (2·seq_len), the output
// projection (heads·head_dim), the post-attention RMSNorm (hidden), gate/up
// (hidden) and down (intermediate) projections; then the final RMSNorm and
// the LM (or value) head (2·hidden).
inline double logit_terms(const ModelConfig& c, int64_t seq_len) {
  const int64_t per_layer = c.hidden_size           // input RMSNorm
                            + c.hidden_size         // q/k/v projection
                            + c.head_dim            // scores
                            + 2 * seq_len           // softmax, weighted values
                            + c.q_size()            // output projection
                            + c.hidden_size         // post-attention RMSNorm
                            + c.hidden_size         // gate/up projection
                            + c.intermediate_size;  // down projection
  return static_cast<double>(c.num_layers * per_layer + 2 * c.hidden_size);
}

// Behind a log-prob or an entropy: the logit's own terms, those of the
// logits in the log-sum-exp (their errors add once more), and the sum over
// the vocabulary.
inline double log_prob_terms(const ModelConfig& c, int64_t seq_len) {
  return 2 * logit_terms(c, seq_len) + static_cast<double>(c.vocab_size);
}

// Behind a parameter's gradient of a loss over `tokens` positions: the
// forward to the log-probs, the backward through the layers again, and the
// sum over the positions.
inline double gradient_terms(const ModelConfig& c, int64_t seq_len, int64_t tokens) {
  return log_prob_terms(c, seq_len) + logit_terms(c, seq_len) + static_cast<double>(tokens);
}

// Largest |logit| of a whole-vocabulary (tp 1, single-stage) `model` over
// `sequences`, each run alone: the magnitude of the terms behind their
// log-probs. At least 1 (the scale of the normalised hidden states).
inline double max_abs_logit(Transformer& model,
                            const std::vector<std::vector<int64_t>>& sequences) {
  at::NoGradGuard no_grad;
  double m = 1;
  for (const auto& s : sequences) {
    const auto n = static_cast<int64_t>(s.size());
    const at::Tensor ids = at::tensor(s, at::kLong).view({1, n});
    const at::Tensor logits =
        model.forward(ids, at::arange(n, at::kLong).view({1, n}), at::ones({1, n}, at::kLong));
    m = std::max(m, logits.abs().max().item<double>());
  }
  return m;
}

}  // namespace baton::engine::test
