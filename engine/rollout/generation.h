// GenerationEngine: batched autoregressive generation (the rollout engine) on
// the engine's own Transformer, with a paged KV cache under a memory budget
// and continuous batching:
//   - every prompt × n becomes a sequence in a FIFO of waiting sequences;
//   - each iteration admits waiting sequences while blocks, `max_batch` and
//     `max_prefill_tokens` allow, prefills them as one batch (their first
//     token comes from the prefill), then runs one decode step over every
//     running sequence;
//   - the samples of one prompt admitted together prefill it once (prefix
//     sharing): the first computes it, the others share its full cache
//     blocks (KvCache::share_prefix), copy its partly filled last one, and
//     draw their first token from its logits with their own random streams;
//   - a finished sequence (EOS / stop token, or max_new_tokens) leaves at
//     once and its blocks go to the next waiting prompt;
//   - when a decode step needs a block and none is free, the most recently
//     admitted sequence is preempted (its blocks freed, itself put back at the
//     head of the queue, recomputed from its tokens when readmitted);
//   - multi-turn (a TurnHandler given to generate): a sequence that stops at
//     a stop token may pause instead of finishing (its turn's tool calls
//     run); it leaves the batch keeping its KV cache while the others go on
//     decoding, and when its appended tokens (the tool results, rendered)
//     arrive it re-enters at the head of the queue, prefills only those on
//     top of its cache, and decodes its next turn.
// Those decisions are the Scheduler's (engine/rollout/scheduler.h); the
// engine steps the model over the batches it hands out.
// Sampling is per sequence (engine/rollout/sampling.h), so results do not depend on
// how sequences were batched.
//
// Tensor parallel: build the model on a TP group (pp = 1) and call generate
// on every TP rank with the same prompts and params; the ranks make the same
// scheduling decisions and sample the same tokens (logits are gathered to the
// full vocabulary on every rank), so they return identical results.
//
// Example (one process):
//   auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
//   model->load_state_dict(...);
//   GenerationEngine engine(model, GenerationOptions().set_cache_bytes(64 << 20));
//   SamplingParams p;  p.max_new_tokens = 32;  p.temperature = 0;
//   auto out = engine.generate({{1, 5, 9}, {1, 7}}, p);   // out[i].response
//   engine.sleep();   // frees the KV cache between rollouts; wake() takes it back
//
// Thread safety: none; one worker thread drives an engine.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/rollout/kv_cache.h"
#include "engine/rollout/sampling.h"
#include "engine/rollout/scheduler.h"

namespace baton::engine {

struct GenerationOptions {
  KvCacheOptions cache;
  int64_t max_batch = 64;             // running sequences at most
  int64_t max_prefill_tokens = 4096;  // padded tokens per prefill step (one
                                      // sequence is always admitted)
  // On the CPU with fp32 weights: packed steps (no padding) through
  // engine/kernels/decode_kernels.h, keys and values read in place from the cache.
  // Off, or on other devices and dtypes: padded steps of LibTorch operations
  // (Transformer::forward_cached). Both give the same tokens up to fp32
  // rounding.
  bool packed_cpu_steps = true;
  // The n samples of a prompt admitted together prefill it once. Off: each
  // prefills it (the same tokens up to the rounding of the batch's kernels).
  bool share_prompt_prefill = true;
  // Packed steps multiply by a copy of the weights packed for oneDNN once per
  // generate call, when the model's weights hold at least this many bytes.
  // Packing costs about half a millisecond per weight whatever its size and
  // pays off when the weights leave the cache between steps: a 4 MB model
  // (1M parameters, 10 new tokens) generated 1.5x faster unpacked, a 17 MB
  // one (32 new tokens) 2.5x faster packed (docs/benchmarks.md).
  int64_t pack_min_weight_bytes = int64_t{8} << 20;
  // The device decode loop, for padded steps (GPUs, bf16, packed_cpu_steps
  // off): up to this many decode steps run on the model's device back to
  // back (each step's token sampled there, from uniforms uploaded once, and
  // fed to the next) before the host copies the tokens back and checks the
  // stops; a sequence that stopped within them keeps its tokens up to the
  // stop. 0: the host loop (a host draw and check after every step). The
  // same tokens either way up to the rounding of the two attention paths.
  int64_t device_decode_steps = 8;
  // On CUDA, the device loop's step is captured in a CUDA graph per batch
  // bucket (powers of two: a batch of 37 runs as 64, padding rows idle) and
  // replayed (decode_graph.h). Needs Transformer::supports_graph_capture();
  // otherwise the steps run uncaptured. Graphs live one generate call (the
  // weights and the cache may move between calls).
  bool cuda_graphs = true;

  GenerationOptions& set_cache_bytes(int64_t bytes) {
    cache.budget_bytes = bytes;
    return *this;
  }
  GenerationOptions& set_max_batch(int64_t n) {
    max_batch = n;
    return *this;
  }
  GenerationOptions& set_packed_cpu_steps(bool on) {
    packed_cpu_steps = on;
    return *this;
  }
  GenerationOptions& set_pack_min_weight_bytes(int64_t bytes) {
    pack_min_weight_bytes = bytes;
    return *this;
  }
  GenerationOptions& set_share_prompt_prefill(bool on) {
    share_prompt_prefill = on;
    return *this;
  }
  GenerationOptions& set_device_decode_steps(int64_t steps) {
    device_decode_steps = steps;
    return *this;
  }
  GenerationOptions& set_cuda_graphs(bool on) {
    cuda_graphs = on;
    return *this;
  }
};

// options.cache with its max_tokens filled in where 0: no running batch holds
// more than max_batch sequences of at most max_position_embeddings positions,
// so a memory_utilization pool past that would never be used.
KvCacheOptions capped_cache_options(const GenerationOptions& options, const ModelConfig& config);

// A request that resumes an earlier generation (partial rollout: a response
// generated in chunks, with new weights possibly loaded between them). The
// request's prompt already ends with the first `generated` response tokens
// of sample `sample` of its request seed; the sequence draws from that
// sample's stream after those tokens' draws (SequenceRng::skip; greedy draws
// none), so with unchanged weights the chunks give the tokens of one
// uninterrupted call. SamplingParams::max_new_tokens stays the budget of the
// whole response: the sequence draws at most max_new_tokens - generated new
// tokens. Its GeneratedSequence has this `sample`, the given prompt (prefix
// included) and only the new tokens in `response` and `log_probs`.
//
// Example (a response of up to 16 tokens in chunks of 4; p.n = 1):
//   p.max_new_tokens = 4;
//   auto first = engine.generate({prompt}, p, {seed})[0];
//   std::vector<int64_t> resumed = prompt;
//   resumed.insert(resumed.end(), first.response.begin(), first.response.end());
//   p.max_new_tokens = 8;   // the response's tokens after this call, at most
//   auto next = engine.generate({resumed}, p, {seed}, {Continuation{first.sample, 4}})[0];
struct Continuation {
  int64_t sample = 0;     // whose random stream the response draws from
  int64_t generated = 0;  // response tokens at the end of the prompt
};

struct GeneratedSequence {
  int64_t request = 0;  // index of its prompt in the call
  int64_t sample = 0;   // 0 .. n-1
  std::vector<int64_t> prompt;
  std::vector<int64_t> response;  // includes the EOS / stop token that ended it
  std::vector<float> log_probs;   // one per response token (empty if not asked)
  std::string finish_reason;      // "stop" or "length"
  // With a TurnHandler: one per response token, 1 where the model generated
  // it, 0 where a turn appended it; empty without one.
  std::vector<uint8_t> generated_mask;
  int64_t turns = 1;  // assistant turns: 1 + the pauses that resumed
};

// Multi-turn generation (an agent loop: tool calls between assistant turns).
// GenerationEngine::generate calls on_stop, on its own thread, whenever a
// sequence ends at a stop token with budget left (`seq.response` ends with
// that token; `seq.generated_mask` marks what earlier turns appended).
// nullopt: it finishes. A future: the sequence pauses, keeping its KV cache,
// and the others decode meanwhile; once the future is ready its tokens are
// appended to the response (generated_mask 0, log-prob 0) as if generated,
// prefilled on top of the kept cache, and the sequence decodes again under
// the same max_new_tokens budget for everything after the prompt. No tokens
// finish it; more than the budget has left are cut there and it finishes
// with "length". A future that throws ends the call with an EngineError
// naming the request and the exception's message (every block goes back).
//
// Example (a tool that always answers the same tokens, two turns at most):
//   struct Tools : TurnHandler {
//     std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
//         const GeneratedSequence& seq) override {
//       if (std::count(seq.generated_mask.begin(), seq.generated_mask.end(), 0) > 0)
//         return std::nullopt;  // a second stop: done
//       std::promise<std::vector<int64_t>> p;
//       p.set_value({7, 8, 9});  // a tool's result, as tokens
//       return p.get_future().share();
//     }
//   } tools;
//   auto out = engine.generate(prompts, params, {}, {}, &tools);
class TurnHandler {
 public:
  virtual ~TurnHandler() = default;
  virtual std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
      const GeneratedSequence& seq) = 0;
};

struct GenerationStats {
  int64_t steps = 0;                  // forward passes (prefill + decode)
  int64_t prefill_tokens = 0;         // real tokens prefilled (recomputation included)
  int64_t shared_prefill_tokens = 0;  // prompt tokens a sample took from another's prefill
  int64_t decode_tokens = 0;          // tokens decoded one at a time
  int64_t preemptions = 0;
  int64_t turn_pauses = 0;          // sequences paused by a TurnHandler
  double turn_wait_seconds = 0;     // idle: every sequence left waits on a turn
  int64_t peak_running = 0;  // most sequences running at once
  int64_t peak_cache_blocks = 0;
  bool packed_weights = false;  // packed steps multiplied by oneDNN-packed weights
  int64_t device_runs = 0;      // device-loop runs: one token copy to the host each
  int64_t graph_captures = 0;   // CUDA graphs captured (one per batch bucket used)
  int64_t graph_replays = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class GenerationEngine {
 public:
  // REQUIRES: the model is one stage (pp = 1), an LM, without sequence
  // parallelism (EngineError otherwise). Allocates the KV cache (awake).
  GenerationEngine(std::shared_ptr<Transformer> model, GenerationOptions options = {});
  ~GenerationEngine();

  // Generates for every prompt × params.n. Results are ordered by (request,
  // sample). Sample j of request i draws from
  // SequenceRng::for_sample(seed_i, j), where seed_i is request_seeds[i] when
  // given (one per prompt) and else params.seed mixed with i.
  // `continuations`: none, or one per prompt, each resuming its request's
  // response (see Continuation). They require params.n == 1,
  // 0 <= generated < max_new_tokens, generated < the prompt's length,
  // sample >= 0 and, when sampling (temperature > 0), request_seeds (the
  // original requests' seeds: the call's request indices are not theirs).
  // Throws EngineError for invalid params or continuations, an empty prompt, a token
  // outside the vocabulary, a sequence that cannot fit in the whole cache
  // (prompt + max_new_tokens - generated - 1 positions), or a call while
  // asleep — each naming the request and the numbers.
  std::vector<GeneratedSequence> generate(const std::vector<std::vector<int64_t>>& prompts,
                                          const SamplingParams& params,
                                          const std::vector<uint64_t>& request_seeds = {},
                                          const std::vector<Continuation>& continuations = {},
                                          TurnHandler* turns = nullptr);

  // Frees the KV cache (nothing is running between calls); wake() takes it
  // back. generate() requires awake.
  void sleep();
  void wake();
  bool awake() const;

  const GenerationStats& last_stats() const { return stats_; }
  const KvCache& cache() const { return *cache_; }
  // Whether steps run packed on the CPU kernels (GenerationOptions::packed_cpu_steps
  // and a model that supports them).
  bool packed_steps() const { return packed_; }
  // Whether decode steps run in the device loop (GenerationOptions::device_decode_steps,
  // padded steps, no sliding window), and whether they are captured in CUDA graphs.
  bool device_decode() const { return device_decode_; }
  bool cuda_graphs() const { return graphs_; }
  Transformer& model() { return *model_; }

 private:
  struct Sequence;
  // The Scheduler's view of the cache: each sequence's block table.
  class CacheBlocks;
  // A sample that takes its prompt's prefill from the sequence in row
  // `leader` of the prefill batch.
  struct Follower {
    Sequence* seq;
    size_t leader;
  };
  // One forward over `batch` and a sampled token per sequence (and per
  // follower, from its leader's logits); `stop` are the token ids that
  // finish a sequence. Returns the sequences that finished.
  std::vector<SequenceId> step(const std::vector<Sequence*>& batch, const SamplingParams& params,
                               const std::set<int64_t>& stop, bool prefill,
                               const std::vector<Follower>& followers = {});
  // The step's logits [B, V] for each sequence's next token.
  at::Tensor forward_packed(const std::vector<Sequence*>& batch);
  at::Tensor forward_padded(const std::vector<Sequence*>& batch);
  // `steps` decode steps of `batch` in the device loop (see
  // GenerationOptions::device_decode_steps); returns the sequences that
  // finished. `width`: block-table columns (the call's longest sequence).
  struct Bucket;
  std::vector<SequenceId> decode_on_device(const std::vector<Sequence*>& batch,
                                           const SamplingParams& params,
                                           const std::set<int64_t>& stop, int64_t steps,
                                           int64_t width);
  // The graph-captured step of a bucket of `rows` rows, captured on first use
  // in this call.
  Bucket& bucket_for(int64_t rows, int64_t width, const SamplingParams& params);

  std::shared_ptr<Transformer> model_;
  GenerationOptions options_;
  std::unique_ptr<KvCache> cache_;
  at::TensorOptions tensors_;  // the model's dtype and device
  bool packed_ = false;
  bool device_decode_ = false;
  bool graphs_ = false;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // this call's captured steps
  GenerationStats stats_;
};

// The same generation without a KV cache: every step runs the full forward
// over each row's whole sequence so far (static batch, left-padded), and
// samples the next token of each unfinished row with the same per-sequence
// streams as GenerationEngine, and takes the same continuations (checked
// the same way). The baseline of the cache's tests and of
// bench/rollout_bench; collective over the TP group.
std::vector<GeneratedSequence> generate_without_cache(
    Transformer& model, const std::vector<std::vector<int64_t>>& prompts,
    const SamplingParams& params, const std::vector<uint64_t>& request_seeds = {},
    const std::vector<Continuation>& continuations = {});

// Generated sequences in the layout the training side consumes (verl's
// rollout batch): prompts left-padded to the longest prompt, responses
// right-padded to the longest response, with `pad_token_id` in padding.
struct RolloutBatch {
  at::Tensor prompts;            // [N, P] int64
  at::Tensor responses;          // [N, R] int64
  at::Tensor input_ids;          // [N, P + R] = cat(prompts, responses)
  at::Tensor attention_mask;     // [N, P + R] int64, 1 on real tokens
  at::Tensor position_ids;       // [N, P + R] int64, cumsum(mask) - 1, 0 on padding
  at::Tensor response_mask;      // [N, R] int64, 1 on generated tokens
  at::Tensor rollout_log_probs;  // [N, R] fp32, 0 on padding (undefined if none)
};
RolloutBatch to_rollout_batch(const std::vector<GeneratedSequence>& sequences,
                              int64_t pad_token_id = 0);

}  // namespace baton::engine
