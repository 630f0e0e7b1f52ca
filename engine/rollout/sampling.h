// Sampling: how the generation engine picks each next token from a row of
// full-vocabulary logits. Greedy (temperature 0) takes the argmax; otherwise
// the logits are divided by the temperature, truncated to the top-k tokens and
// then to the smallest set whose probability reaches top-p, and one token is
// drawn from the renormalised distribution with ONE uniform number from the
// sequence's own random stream (SequenceRng). A sequence's tokens therefore
// depend only on its seed and logits, not on which other sequences share its
// batch, and every TP rank (same logits, same seed) draws the same token.
//
// The log-probability reported for a sampled token (rollout log-prob) is
// log_softmax(logits / T) at that token, before top-k/top-p truncation (T = 1
// for greedy): the quantity the training side computes from the same logits
// (verl divides the actor's logits by the rollout temperature the same way).
//
// Example:
//   SamplingParams p;  p.temperature = 0.7;  p.top_p = 0.9;  p.seed = 42;
//   SequenceRng rng = SequenceRng::for_sample(SequenceRng::request_seed(p.seed, 3), /*sample=*/0);
//   Sampled t = sample_token(logits_row, p, rng);   // t.token, t.log_prob
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace baton::engine {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k truncation
  double top_p = 1.0;        // 1: no nucleus truncation
  int64_t n = 1;             // samples per prompt
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;              // do not stop on the model's EOS ids
  uint64_t seed = 0;                    // with the request and sample index, seeds each sequence
  bool log_probs = true;                // report each sampled token's log-prob

  // Throws EngineError naming the field: temperature < 0, top_k < 0, top_p
  // outside (0, 1], n < 1, max_new_tokens < 1, a stop id outside [0, vocab).
  void validate(int64_t vocab_size) const;
  std::string to_string() const;
};

// A sequence's random stream: splitmix64 over a 64-bit state, so that it is
// the same on every platform and standard library.
class SequenceRng {
 public:
  explicit SequenceRng(uint64_t state) : state_(state) {}
  // The stream of sample `sample` of a request seeded `request_seed`.
  static SequenceRng for_sample(uint64_t request_seed, int64_t sample);
  // The seed of request `request` of a call seeded `seed` (no per-request seeds).
  static uint64_t request_seed(uint64_t seed, int64_t request);
  uint64_t next();
  // Advances the stream as if next() had been called `draws` times, in O(1)
  // (each next() moves the state by the same constant). With one uniform()
  // per sampled token (temperature > 0, see sample_token), skip(k) resumes a
  // sequence's stream after its first k tokens.
  void skip(uint64_t draws);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t state_;
};

struct Sampled {
  int64_t token = 0;
  double log_prob = 0;  // see the header comment
};

// Draws one token from `logits` [V] (any float dtype, any device; computed
// in fp32 on the host, where the row is copied first). Greedy draws no
// random number.
Sampled sample_token(const at::Tensor& logits, const SamplingParams& params, SequenceRng& rng);

// sample_token on each row of `logits` [B, V], row i drawing from *rngs[i]:
// the same tokens, computed for the whole batch at once: one copy to the
// host, one pass over the logits for the argmax and the log-sum-exp
// (cpu::argmax_log_sum_exp) and, without top-k / top-p, one softmax and one
// cumulative sum. Log-probs equal sample_token's up to fp32 rounding.
std::vector<Sampled> sample_tokens(const at::Tensor& logits, const SamplingParams& params,
                                   const std::vector<SequenceRng*>& rngs);

// The distribution sample_token draws from (after temperature, top-k, top-p),
// as probabilities [V] in fp64 on the host; greedy is one-hot at the argmax.
// For tests and diagnostics.
at::Tensor sampling_distribution(const at::Tensor& logits, const SamplingParams& params);

}  // namespace baton::engine
