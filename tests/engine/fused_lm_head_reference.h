// References for fused_lm_head_log_probs_entropy (engine/parallel/fused_lm_head.h)
// and the tolerances of comparisons with it: the unfused path it replaces
// (at::linear, padding columns -inf, / T, vocab_parallel_log_probs_entropy),
// and a plain fp64 log_softmax over the real vocabulary.
//
// Tolerances (tests/tolerance.h, counted as tests/engine/model_tolerance.h
// does): a log-prob or entropy sums H products for its own logit and, through
// the log-sum-exp, the others' (2H terms), then V exponentials with the max,
// the shift and the log (V + 3); the terms are up to the largest |logit / T|,
// and at least 1 + log V (the entropy's scale). A gradient adds V terms of the
// softmax in each logit's gradient and the backward product's sum, over the V
// rows (hidden's gradient) or the N tokens (the weight's); its terms are a
// logit's gradient, up to (1 + log V + max |logit / T|)·max |upstream|, times
// an element of the other factor (up to max(|hidden|, |weight|)) over T.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/parallel/parallel_state.h"
#include "engine/parallel/vocab_parallel.h"
#include "tests/tolerance.h"

namespace baton::engine::test {

using namespace ::baton::test;  // Tolerance, expect_close, max_abs

struct LmHeadResults {
  at::Tensor log_probs, entropy;        // [N]
  at::Tensor grad_hidden, grad_weight;  // of Σ up_lp·log_probs + Σ up_ent·entropy
};

// The unfused path on this rank's shard (what the last pipeline stage does
// without the fused op), in the inputs' dtype.
inline LmHeadResults unfused_lm_head(const at::Tensor& hidden, const at::Tensor& weight_shard,
                                     int64_t real_rows, const at::Tensor& targets, const Group& tp,
                                     double temperature, const at::Tensor& up_lp,
                                     const at::Tensor& up_ent) {
  at::Tensor h = hidden.detach().clone().requires_grad_(true);
  at::Tensor w = weight_shard.detach().clone().requires_grad_(true);
  at::Tensor logits = at::linear(h, w);
  const int64_t rows = w.size(0);
  if (real_rows < rows)
    logits.narrow(-1, real_rows, rows - real_rows).fill_(-std::numeric_limits<double>::infinity());
  LogProbsEntropy both = vocab_parallel_log_probs_entropy(logits / temperature, targets, tp);
  ((both.log_probs * up_lp).sum() + (both.entropy * up_ent).sum()).backward();
  return {both.log_probs.detach(), both.entropy.detach(), h.grad(), w.grad()};
}

// fp64 log_softmax of hidden · weight[:real_vocab]ᵀ / T over one process's
// whole vocabulary; weight rows from real_vocab on (padding) get a zero
// gradient.
inline LmHeadResults fp64_lm_head(const at::Tensor& hidden, const at::Tensor& weight,
                                  int64_t real_vocab, const at::Tensor& targets, double temperature,
                                  const at::Tensor& up_lp, const at::Tensor& up_ent) {
  at::Tensor h = hidden.detach().to(at::kDouble).requires_grad_(true);
  at::Tensor w = weight.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor logp =
      at::log_softmax(at::linear(h, w.narrow(0, 0, real_vocab)) / temperature, -1);
  const at::Tensor lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  const at::Tensor ent = -(logp.exp() * logp).sum(-1);
  ((lp * up_lp.to(at::kDouble)).sum() + (ent * up_ent.to(at::kDouble)).sum()).backward();
  return {lp.detach(), ent.detach(), h.grad(), w.grad()};
}

// Largest |logit / T| of hidden · weight[:real_rows]ᵀ.
inline double max_scaled_logit(const at::Tensor& hidden, const at::Tensor& weight,
                               int64_t real_rows, double temperature) {
  return max_abs(
             at::linear(hidden.to(at::kDouble), weight.narrow(0, 0, real_rows).to(at::kDouble))) /
         temperature;
}

// Two fp32 computations of the log-probs and entropies (see the top).
inline Tolerance lm_head_value_tolerance(int64_t h, int64_t v, double max_logit) {
  return Tolerance::fp32(2.0 * h + v + 3, std::max(1 + std::log(double(v)), max_logit));
}

// The scale of one logit's gradient (see the top).
inline double lm_head_logit_grad(int64_t v, double max_logit, double max_upstream) {
  return (1 + std::log(double(v)) + max_logit) * max_upstream;
}

// Two fp32 computations of the gradients of hidden and the weight.
inline Tolerance lm_head_grad_tolerance(int64_t h, int64_t v, int64_t n, double max_logit,
                                        double max_upstream, double max_factor,
                                        double temperature) {
  return Tolerance::fp32(2.0 * h + 2.0 * v + n + 3,
                         lm_head_logit_grad(v, max_logit, max_upstream) * max_factor / temperature);
}

}  // namespace baton::engine::test
