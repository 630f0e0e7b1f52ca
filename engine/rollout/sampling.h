// Sampling: how the generation engine picks each next token from a row of
// full-vocabulary logits. Greedy (temperature 0) takes the argmax; otherwise
// the logits are divided by the temperature, truncated to the top-k tokens and
// then to the smallest set whose probability reaches top-p, and one token is
// drawn from the renormalised distribution with ONE uniform number from the
// sequence's own random stream (SequenceRng). A sequence's tokens therefore
// depend only on its seed and logits, not on which other sequences share its
// batch, and every TP rank (same logits, same seed) draws the same token.
//
// Truncation ranks the candidates by scaled logit, tied logits by token id
// (lower first), as a stable sort does on any device, so that the device
// draw (sample_on_device) ranks them the same way.
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

// sample_tokens' draw for the device decode loop: tensor operations on the
// logits' own device, with the random numbers read ahead of the draws, so
// that no step waits for the host (and a CUDA graph can capture it).
//
// Example (k decode steps of B sequences, temperature > 0):
//   at::Tensor u = peek_uniforms(rngs, k).to(device);        // [k, B], one upload
//   for (int64_t s = 0; s < k; ++s) {
//     DeviceSampled next = sample_on_device(step_logits(), p, u[s]);  // [B] each
//     ...
//   }
//   for (int64_t i = 0; i < B; ++i) rngs[i]->skip(tokens_kept[i]);
struct DeviceSampled {
  at::Tensor tokens;     // [B] int64, on the logits' device
  at::Tensor log_probs;  // [B] fp32, on the logits' device: see the header comment
};

// Draws a token from each row of `logits` [B, V] (any float dtype, any
// device) with row i's uniform `uniforms[i]` ([B] fp64 on the same device:
// the next SequenceRng::uniform() of row i's stream; read but unused for
// greedy). Given the same uniforms, the tokens are sample_tokens' tokens,
// computed the same way: the fp64 softmax of logits / T (over the top-k
// candidates, ranked by sort, with the tokens outside the top-p prefix at
// probability 0), its cumulative sum c, and the first candidate with
// c > u · c[last] that has a probability; greedy takes the first maximum.
// On the CPU the tokens are bit for bit sample_tokens'; on a GPU the sums
// may round differently, which moves a token only when u falls within
// rounding (~1e-15) of a boundary of the CDF. Log-probs are log_softmax in
// fp32, equal to sample_tokens' up to fp32 rounding.
//
// Blocking: none. It enqueues work on the current stream and returns without
// synchronising with the device (no copy to the host, no value read, no
// shape that depends on values), so it can be captured in a CUDA graph.
// Memory: a few [B, V] fp64 temporaries. Throws EngineError naming the
// shapes, dtype and devices when logits are not [B, V] or uniforms not [B]
// fp64 on the logits' device (checks of metadata only).
DeviceSampled sample_on_device(const at::Tensor& logits, const SamplingParams& params,
                               const at::Tensor& uniforms);

// The next `steps` uniforms of each stream, [steps, B] fp64 on the host:
// element [s, i] is what the s-th next rngs[i]->uniform() returns. The
// streams are not advanced (it draws from copies); after using the first k
// rows the caller advances each stream with skip(k). Throws EngineError when
// steps < 0.
at::Tensor peek_uniforms(const std::vector<SequenceRng*>& rngs, int64_t steps);

// The distribution sample_token draws from (after temperature, top-k, top-p),
// as probabilities [V] in fp64 on the host; greedy is one-hot at the argmax.
// For tests and diagnostics.
at::Tensor sampling_distribution(const at::Tensor& logits, const SamplingParams& params);

}  // namespace baton::engine
