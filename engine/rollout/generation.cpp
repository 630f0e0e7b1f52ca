#include "engine/rollout/generation.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <future>
#include <numeric>
#include <optional>
#include <set>

#include "base/profiler.h"
#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/rollout/decode_graph.h"

namespace baton::engine {

struct GenerationEngine::Sequence {
  SequenceId id;
  GeneratedSequence out;
  std::vector<int64_t> tokens;  // prompt, then response
  int64_t cached = 0;           // leading positions whose keys/values are in the cache
  std::vector<int64_t> table;   // cache blocks
  SequenceRng rng{0};
  int64_t budget = 0;  // new tokens at most
};

// The device loop's step inputs and outputs on the model's device: `rows`
// rows (a batch bucket: the batch and idle padding rows) with block tables
// of `width` columns. With a graph, these are the captured addresses.
struct GenerationEngine::Bucket {
  int64_t rows = 0, width = 0;
  at::Tensor ids, positions, limits, tables;  // DecodeStep's, [rows] / [rows, width] int64
  at::Tensor uniforms;                        // [rows] fp64: this step's draws
  at::Tensor tokens, log_probs;               // [rows]: the step's sampled tokens
  std::unique_ptr<CapturedStep> graph;

  Bucket(int64_t r, int64_t w, at::Device device) : rows(r), width(w) {
    auto longs = at::TensorOptions().dtype(at::kLong).device(device);
    ids = at::zeros({r}, longs);
    positions = at::zeros({r}, longs);
    limits = at::zeros({r}, longs);
    tables = at::zeros({r, w}, longs);
    uniforms = at::zeros({r}, longs.dtype(at::kDouble));
    tokens = at::zeros({r}, longs);
    log_probs = at::zeros({r}, longs.dtype(at::kFloat));
  }

  // One decode step: forward, draw on the device, feed the draws back.
  void run(Transformer& model, KvCache& cache, const SamplingParams& params) {
    at::Tensor logits = model.forward_decode({ids, positions, limits, tables}, cache);
    DeviceSampled drawn = sample_on_device(logits, params, uniforms);
    tokens.copy_(drawn.tokens);
    log_probs.copy_(drawn.log_probs);
    ids.copy_(drawn.tokens);
    positions.add_(1);
  }
};

// Releases every sequence's blocks when destroyed: whatever happens (a TP
// peer failing mid-step, say), no block outlives the generate call.
class GenerationEngine::CacheBlocks final : public SequenceBlocks {
 public:
  CacheBlocks(KvCache& cache, std::vector<std::unique_ptr<Sequence>>& seqs)
      : cache_(cache), seqs_(seqs) {}
  ~CacheBlocks() override {
    for (auto& s : seqs_) cache_.release(s->table);
  }
  int64_t block_size() const override { return cache_.block_size(); }
  int64_t free_blocks() const override { return cache_.free_blocks(); }
  bool reserve(SequenceId seq, int64_t tokens) override {
    return cache_.reserve(seqs_[seq.value]->table, tokens);
  }
  void release(SequenceId seq) override {
    Sequence& s = *seqs_[seq.value];
    cache_.release(s.table);
    s.cached = 0;
  }

 private:
  KvCache& cache_;
  std::vector<std::unique_ptr<Sequence>>& seqs_;
};

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::set<int64_t> stop_tokens(const ModelConfig& cfg, const SamplingParams& params) {
  std::set<int64_t> stop(params.stop_token_ids.begin(), params.stop_token_ids.end());
  if (!params.ignore_eos) {
    const std::vector<int64_t>& eos = cfg.stop_token_ids();
    stop.insert(eos.begin(), eos.end());
  }
  return stop;
}

void check_prompts(const std::vector<std::vector<int64_t>>& prompts, const ModelConfig& cfg,
                   const SamplingParams& params, const std::vector<uint64_t>& request_seeds,
                   const std::vector<Continuation>& continuations) {
  params.validate(cfg.vocab_size);
  if (!request_seeds.empty() && request_seeds.size() != prompts.size())
    throw EngineError(detail::cat("generate: ", request_seeds.size(), " request seeds for ",
                                  prompts.size(), " prompts (give one per prompt, or none)"));
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw EngineError(detail::cat("generate: prompt ", i, " is empty"));
    for (int64_t t : prompts[i])
      if (t < 0 || t >= cfg.vocab_size)
        throw EngineError(detail::cat("generate: prompt ", i, " has token ", t,
                                      " outside the vocabulary [0, ", cfg.vocab_size, ")"));
  }
  if (continuations.empty()) return;
  if (continuations.size() != prompts.size())
    throw EngineError(detail::cat("generate: ", continuations.size(), " continuations for ",
                                  prompts.size(), " prompts (give one per prompt, or none)"));
  if (params.n != 1)
    throw EngineError(detail::cat(
        "generate: continuations resume one sample per prompt; n must be 1, got ", params.n));
  if (params.temperature > 0 && request_seeds.empty())
    throw EngineError(
        "generate: sampled continuations need request_seeds (the resumed requests' seeds: "
        "params.seed mixed with this call's request index would be another stream)");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Continuation& c = continuations[i];
    const int64_t len = static_cast<int64_t>(prompts[i].size());
    if (c.sample < 0)
      throw EngineError(
          detail::cat("generate: continuation of request ", i, " has sample ", c.sample, " < 0"));
    if (c.generated < 0 || c.generated >= params.max_new_tokens || c.generated >= len)
      throw EngineError(detail::cat("generate: continuation of request ", i, " has generated ",
                                    c.generated, "; it must be >= 0, below max_new_tokens ",
                                    params.max_new_tokens,
                                    " (the whole response's budget) and below the prompt's length ",
                                    len, " (which ends with those tokens)"));
  }
}

// The new tokens sequence `request` may draw.
int64_t budget_of(const SamplingParams& params, const std::vector<Continuation>& continuations,
                  size_t request) {
  return params.max_new_tokens - (continuations.empty() ? 0 : continuations[request].generated);
}

// Throws when a request could not fit in the whole cache, even alone.
void check_capacity(const KvCache& cache, const std::vector<std::vector<int64_t>>& prompts,
                    const SamplingParams& params, const std::vector<Continuation>& continuations) {
  int64_t capacity = cache.usable_blocks() * cache.block_size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    // The last sampled token is never fed back, so a sequence needs
    // prompt + its new tokens - 1 positions at most.
    const int64_t budget = budget_of(params, continuations, i);
    int64_t need = static_cast<int64_t>(prompts[i].size()) + budget - 1;
    if (need > capacity)
      throw EngineError(detail::cat(
          "generate: request ", i, " needs up to ", need, " cached tokens (prompt ",
          prompts[i].size(), " + max_new_tokens ", params.max_new_tokens,
          continuations.empty() ? std::string()
                                : detail::cat(" - generated ", continuations[i].generated),
          " - 1) but the KV cache holds ", capacity, "; raise the cache budget"));
  }
}

void require_one_stage_lm(const Transformer& model, const char* who) {
  if (!model.first_stage() || !model.last_stage() || model.options().value_model)
    throw EngineError(std::string(who) +
                      ": generation needs an LM whose whole model is on one stage (pp = 1)");
}

// Appends a sampled token; true when the sequence is finished (a stop token,
// or `budget` new tokens).
bool append(GeneratedSequence& out, std::vector<int64_t>& tokens, const Sampled& s,
            const SamplingParams& params, int64_t budget, const std::set<int64_t>& stop) {
  tokens.push_back(s.token);
  out.response.push_back(s.token);
  if (params.log_probs) out.log_probs.push_back(static_cast<float>(s.log_prob));
  if (stop.count(s.token)) {
    out.finish_reason = "stop";
    return true;
  }
  if (static_cast<int64_t>(out.response.size()) >= budget) {
    out.finish_reason = "length";
    return true;
  }
  return false;
}

// The stream of sample `sample` of `request`, or the one its continuation
// resumes, after the draws of the tokens already generated.
SequenceRng stream_of(const SamplingParams& params, const std::vector<uint64_t>& request_seeds,
                      const std::vector<Continuation>& continuations, int64_t request,
                      int64_t sample) {
  uint64_t seed = request_seeds.empty() ? SequenceRng::request_seed(params.seed, request)
                                        : request_seeds[request];
  if (continuations.empty()) return SequenceRng::for_sample(seed, sample);
  const Continuation& c = continuations[request];
  SequenceRng rng = SequenceRng::for_sample(seed, c.sample);
  // One uniform per sampled token; greedy draws none (sampling.h).
  if (params.temperature > 0) rng.skip(static_cast<uint64_t>(c.generated));
  return rng;
}

}  // namespace

KvCacheOptions capped_cache_options(const GenerationOptions& options, const ModelConfig& config) {
  KvCacheOptions cache = options.cache;
  if (cache.max_tokens == 0) cache.max_tokens = options.max_batch * config.max_position_embeddings;
  return cache;
}

GenerationEngine::GenerationEngine(std::shared_ptr<Transformer> model, GenerationOptions options)
    : model_(std::move(model)), options_(options) {
  require_one_stage_lm(*model_, "GenerationEngine");
  if (model_->options().sequence_parallel)
    throw EngineError("GenerationEngine: build the rollout model without sequence parallelism");
  // Every replica decodes its own prompts for its own number of steps: no
  // all-to-all could pair them up. The rollout layout holds every expert.
  if (model_->parallel().config().ep > 1 && model_->has_sparse_layers())
    throw EngineError(detail::cat(
        "GenerationEngine: build the rollout model without expert "
        "parallelism (layout ",
        model_->parallel().config().to_string(), "); the rollout layout holds every expert"));
  ENGINE_CHECK(options_.max_batch >= 1, "GenerationEngine: max_batch must be >= 1, got ",
               options_.max_batch);
  ENGINE_CHECK(options_.device_decode_steps >= 0,
               "GenerationEngine: device_decode_steps must be >= 0, got ",
               options_.device_decode_steps);
  options_.cache = capped_cache_options(options_, model_->config());
  cache_ = model_->make_kv_cache(options_.cache);
  tensors_ = model_->named_params().front().second.options();
  packed_ = options_.packed_cpu_steps && model_->supports_paged_step();
  device_decode_ = !packed_ && options_.device_decode_steps > 0;
  graphs_ = device_decode_ && options_.cuda_graphs && tensors_.device().is_cuda() &&
            model_->supports_graph_capture() && cuda_graphs_available();
}

GenerationEngine::~GenerationEngine() = default;

void GenerationEngine::sleep() { cache_->sleep(); }
void GenerationEngine::wake() { cache_->wake(); }
bool GenerationEngine::awake() const { return cache_->awake(); }

std::vector<GeneratedSequence> GenerationEngine::generate(
    const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params,
    const std::vector<uint64_t>& request_seeds, const std::vector<Continuation>& continuations,
    TurnHandler* turns) {
  BATON_PROFILE_SCOPE("engine", "generate");
  const ModelConfig& cfg = model_->config();
  check_prompts(prompts, cfg, params, request_seeds, continuations);
  if (!cache_->awake())
    throw EngineError("GenerationEngine::generate: the KV cache is released (sleep); call wake()");
  check_capacity(*cache_, prompts, params, continuations);
  stats_ = GenerationStats{};
  auto stop = stop_tokens(cfg, params);
  // The packed step multiplies by a packed copy of the weights, taken here
  // (weights change between generate calls, as the trainer updates them)
  // and dropped on the way out, exceptions included.
  struct PackedWeights {
    Transformer& model;
    bool on;
    ~PackedWeights() {
      if (on) model.drop_paged_weights();
    }
  } packed_weights{*model_, packed_ && model_->param_bytes() >= options_.pack_min_weight_bytes &&
                                model_->pack_paged_weights()};
  stats_.packed_weights = packed_weights.on;

  // The device loop's block tables cover the call's longest sequence. A
  // sliding window past its length takes the host loop (which refuses it).
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    longest = std::max<int64_t>(
        longest, static_cast<int64_t>(prompts[i].size()) + budget_of(params, continuations, i) - 1);
  const int64_t width = cache_->blocks_for(longest);
  const bool on_device = device_decode_ && (!cfg.sliding_window || longest <= *cfg.sliding_window);
  // Graphs hold the addresses of this call's weights and cache.
  struct DropGraphs {
    std::vector<std::unique_ptr<Bucket>>& buckets;
    ~DropGraphs() { buckets.clear(); }
  } drop_graphs{buckets_};

  std::vector<std::unique_ptr<Sequence>> all;
  CacheBlocks blocks(*cache_, all);
  Scheduler scheduler(
      {options_.max_batch, options_.max_prefill_tokens, options_.share_prompt_prefill}, blocks);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t j = 0; j < params.n; ++j) {
      auto s = std::make_unique<Sequence>();
      const int64_t length = static_cast<int64_t>(prompts[i].size());
      s->id = scheduler.add(static_cast<int64_t>(i), length,
                            length + budget_of(params, continuations, i) - 1);
      s->out.request = static_cast<int64_t>(i);
      s->out.sample = continuations.empty() ? j : continuations[i].sample;
      s->out.prompt = prompts[i];
      s->tokens = prompts[i];
      s->rng = stream_of(params, request_seeds, continuations, static_cast<int64_t>(i), j);
      s->budget = budget_of(params, continuations, i);
      if (turns) s->out.generated_mask.reserve(static_cast<size_t>(s->budget));
      all.push_back(std::move(s));
    }
  }
  auto sequences = [&](const std::vector<SequenceId>& ids) {
    std::vector<Sequence*> batch;
    for (SequenceId id : ids) batch.push_back(all[id.value].get());
    return batch;
  };
  auto note_peak = [&] {
    stats_.peak_running = std::max<int64_t>(stats_.peak_running, scheduler.running().size());
    stats_.peak_cache_blocks =
        std::max(stats_.peak_cache_blocks, cache_->usable_blocks() - cache_->free_blocks());
  };

  // Multi-turn: the sequences paused on their turn's appended tokens.
  struct Paused {
    SequenceId id;
    std::shared_future<std::vector<int64_t>> tokens;
  };
  std::vector<Paused> paused;
  // A step's finished sequences, less those the TurnHandler pauses.
  auto complete = [&](std::vector<SequenceId> finished) {
    std::vector<SequenceId> pausing;
    if (turns) {
      for (SequenceId id : finished) {
        Sequence& s = *all[id.value];
        s.out.generated_mask.resize(s.out.response.size(), 1);
        if (s.out.finish_reason != "stop" ||
            static_cast<int64_t>(s.out.response.size()) >= s.budget)
          continue;
        if (auto next = turns->on_stop(s.out)) {
          paused.push_back({id, std::move(*next)});
          pausing.push_back(id);
        }
      }
      std::erase_if(finished, [&](SequenceId id) {
        return std::find(pausing.begin(), pausing.end(), id) != pausing.end();
      });
      stats_.turn_pauses += static_cast<int64_t>(pausing.size());
    }
    scheduler.complete(finished, pausing);
  };
  // Paused sequences whose tokens arrived continue (or finish); with nothing
  // else to run, waits for the first to arrive.
  auto resume_ready = [&] {
    const bool idle = scheduler.running().empty() && scheduler.waiting().empty();
    if (idle && !paused.empty()) {
      auto start = Clock::now();
      while (std::none_of(paused.begin(), paused.end(), [](const Paused& p) {
        return p.tokens.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready;
      }))
        paused.front().tokens.wait_for(std::chrono::milliseconds(1));
      stats_.turn_wait_seconds += seconds_since(start);
    }
    for (auto it = paused.begin(); it != paused.end();) {
      if (it->tokens.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
        ++it;
        continue;
      }
      Sequence& s = *all[it->id.value];
      std::vector<int64_t> added;
      try {
        added = it->tokens.get();
      } catch (const std::exception& e) {
        throw EngineError(detail::cat("generate: the turn of request ", s.out.request,
                                      " (sample ", s.out.sample, ") failed: ", e.what()));
      }
      for (int64_t t : added)
        if (t < 0 || t >= cfg.vocab_size)
          throw EngineError(detail::cat("generate: the turn appended to request ", s.out.request,
                                        " (sample ", s.out.sample, ") has token ", t,
                                        " outside the vocabulary [0, ", cfg.vocab_size, ")"));
      const int64_t room = s.budget - static_cast<int64_t>(s.out.response.size());
      const int64_t n = std::min<int64_t>(room, static_cast<int64_t>(added.size()));
      for (int64_t j = 0; j < n; ++j) {
        s.tokens.push_back(added[j]);
        s.out.response.push_back(added[j]);
        s.out.generated_mask.push_back(0);
        if (params.log_probs) s.out.log_probs.push_back(0.0f);
      }
      if (n == 0 || n < static_cast<int64_t>(added.size()) || n == room) {
        // Nothing to continue with, or no budget left after it.
        if (n > 0) s.out.finish_reason = "length";
        scheduler.finish_paused(it->id);
      } else {
        s.out.finish_reason.clear();
        ++s.out.turns;
        scheduler.resume(it->id, n);
      }
      it = paused.erase(it);
    }
  };

  while (!scheduler.done()) {
    if (!paused.empty()) resume_ready();
    if (scheduler.done()) break;
    const Scheduler::Prefill prefill = scheduler.admit();
    if (!prefill.rows.empty()) {
      std::vector<Sequence*> batch = sequences(prefill.rows);
      std::vector<Follower> followers;
      for (const Scheduler::Follower& f : prefill.followers)
        followers.push_back({all[f.seq.value].get(), f.leader});
      note_peak();
      std::vector<SequenceId> finished = step(batch, params, stop, /*prefill=*/true, followers);
      // Blocks for the copies were set aside at admission.
      for (const Follower& f : followers)
        ENGINE_CHECK(cache_->share_prefix(batch[f.leader]->table, f.seq->cached, f.seq->table),
                     "GenerationEngine: no block for a shared prompt's copy");
      note_peak();
      complete(std::move(finished));
    }
    // Every running sequence feeds its last token (and in the device loop
    // up to k - 1 more), some maybe preempted to make room for it. k: no more
    // steps than the longest remaining budget.
    int64_t k = 1;
    if (on_device) {
      int64_t remaining = 1;
      for (SequenceId id : scheduler.running()) {
        const Sequence& s = *all[id.value];
        remaining =
            std::max<int64_t>(remaining, s.budget - static_cast<int64_t>(s.out.response.size()));
      }
      k = std::min(options_.device_decode_steps, remaining);
    }
    std::vector<Sequence*> batch = sequences(scheduler.decode(k));
    stats_.preemptions = scheduler.preemptions();
    if (batch.empty()) continue;
    note_peak();
    complete(on_device ? decode_on_device(batch, params, stop, k, width)
                       : step(batch, params, stop, /*prefill=*/false));
  }

  std::vector<GeneratedSequence> out;
  out.reserve(all.size());
  for (auto& s : all) {
    if (turns) s->out.generated_mask.resize(s->out.response.size(), 1);
    out.push_back(std::move(s->out));
  }
  return out;
}

std::vector<SequenceId> GenerationEngine::step(const std::vector<Sequence*>& batch,
                                               const SamplingParams& params,
                                               const std::set<int64_t>& stop, bool prefill,
                                               const std::vector<Follower>& followers) {
  auto start = Clock::now();
  int64_t real = 0;
  for (Sequence* s : batch) real += static_cast<int64_t>(s->tokens.size()) - s->cached;
  auto logits = packed_ ? forward_packed(batch) : forward_padded(batch);
  // Every sequence samples from its own row; a follower from its leader's.
  std::vector<Sequence*> samplers = batch;
  std::vector<SequenceRng*> rngs;
  for (Sequence* s : batch) rngs.push_back(&s->rng);
  if (!followers.empty()) {
    std::vector<int64_t> rows(batch.size());
    std::iota(rows.begin(), rows.end(), 0);
    for (const Follower& f : followers) {
      rows.push_back(static_cast<int64_t>(f.leader));
      samplers.push_back(f.seq);
      rngs.push_back(&f.seq->rng);
      stats_.shared_prefill_tokens += static_cast<int64_t>(f.seq->tokens.size());
    }
    logits = logits.index_select(0, at::tensor(rows, at::kLong).to(logits.device()));
  }
  std::vector<Sampled> sampled;
  {
    RECORD_FUNCTION("baton::sample_tokens", std::vector<c10::IValue>());
    sampled = sample_tokens(logits, params, rngs);
  }
  std::vector<SequenceId> finished;
  for (size_t r = 0; r < samplers.size(); ++r) {
    Sequence* s = samplers[r];
    s->cached = static_cast<int64_t>(s->tokens.size());
    if (append(s->out, s->tokens, sampled[r], params, s->budget, stop)) finished.push_back(s->id);
  }
  ++stats_.steps;
  if (prefill) {
    stats_.prefill_tokens += real;
    stats_.prefill_seconds += seconds_since(start);
  } else {
    stats_.decode_tokens += real;
    stats_.decode_seconds += seconds_since(start);
  }
  return finished;
}

namespace {

// The batch bucket of `n` rows: the next power of two.
int64_t bucket_rows(int64_t n) {
  int64_t rows = 1;
  while (rows < n) rows *= 2;
  return rows;
}

}  // namespace

GenerationEngine::Bucket& GenerationEngine::bucket_for(int64_t rows, int64_t width,
                                                       const SamplingParams& params) {
  for (auto& b : buckets_)
    if (b->rows == rows && b->width == width) return *b;
  auto b = std::make_unique<Bucket>(rows, width, tensors_.device());
  if (graphs_) {
    Bucket& bucket = *b;
    bucket.graph = std::make_unique<CapturedStep>(
        [this, &bucket, &params] { bucket.run(*model_, *cache_, params); });
    ++stats_.graph_captures;
  }
  buckets_.push_back(std::move(b));
  return *buckets_.back();
}

std::vector<SequenceId> GenerationEngine::decode_on_device(const std::vector<Sequence*>& batch,
                                                           const SamplingParams& params,
                                                           const std::set<int64_t>& stop,
                                                           int64_t steps, int64_t width) {
  RECORD_FUNCTION("baton::decode_on_device", std::vector<c10::IValue>());
  auto start = Clock::now();
  const int64_t n = static_cast<int64_t>(batch.size());
  // Uncaptured, the step runs on the batch as it is, its tables as wide as
  // its longest; captured, on the bucket's fixed shapes.
  int64_t rows = n;
  if (!graphs_) {
    width = 1;
    for (const Sequence* s : batch) width = std::max<int64_t>(width, s->table.size());
  } else {
    rows = bucket_rows(n);
  }
  std::optional<Bucket> uncaptured;
  if (!graphs_) uncaptured.emplace(rows, width, tensors_.device());
  Bucket& bucket = graphs_ ? bucket_for(rows, width, params) : *uncaptured;

  // Every input in one host tensor, one copy to the device: per row its
  // token, position, limit (the last position it may write: prompt +
  // budget - 2) and block table. Padding rows stay zero: scratch block 0.
  auto inputs = at::zeros({rows, 3 + width}, at::kLong);
  int64_t* in = inputs.data_ptr<int64_t>();
  std::vector<SequenceRng*> rngs;
  for (int64_t r = 0; r < n; ++r) {
    const Sequence* s = batch[r];
    int64_t* row = in + r * (3 + width);
    row[0] = s->tokens.back();
    row[1] = static_cast<int64_t>(s->tokens.size()) - 1;
    row[2] = static_cast<int64_t>(s->tokens.size() - s->out.response.size()) + s->budget - 2;
    std::copy(s->table.begin(), s->table.end(), row + 3);
    rngs.push_back(&batch[r]->rng);
  }
  auto device_inputs = inputs.to(tensors_.device());
  bucket.ids.copy_(device_inputs.select(1, 0));
  bucket.positions.copy_(device_inputs.select(1, 1));
  bucket.limits.copy_(device_inputs.select(1, 2));
  bucket.tables.copy_(device_inputs.narrow(1, 3, width));
  // Each step's uniforms [steps, rows] (greedy draws none: zeros).
  auto uniforms = at::zeros({steps, rows}, at::kDouble);
  if (params.temperature > 0) uniforms.narrow(1, 0, n).copy_(peek_uniforms(rngs, steps));
  uniforms = uniforms.to(tensors_.device());

  auto longs = at::TensorOptions().dtype(at::kLong).device(tensors_.device());
  auto tokens = at::empty({steps, rows}, longs);
  auto log_probs = at::empty({steps, rows}, longs.dtype(at::kFloat));
  for (int64_t j = 0; j < steps; ++j) {
    bucket.uniforms.copy_(uniforms[j]);
    if (bucket.graph) {
      bucket.graph->replay();
      ++stats_.graph_replays;
    } else {
      bucket.run(*model_, *cache_, params);
    }
    tokens[j].copy_(bucket.tokens);
    log_probs[j].copy_(bucket.log_probs);
  }
  // The one synchronisation of the run: the tokens back to the host, where
  // each row keeps its tokens up to its stop and its stream moves past the
  // draws of the tokens it kept.
  auto host_tokens = tokens.narrow(1, 0, n).to(at::kCPU).contiguous();
  auto host_log_probs = log_probs.narrow(1, 0, n).to(at::kCPU).contiguous();
  const int64_t* t = host_tokens.data_ptr<int64_t>();
  const float* lp = host_log_probs.data_ptr<float>();
  std::vector<SequenceId> finished;
  int64_t kept_total = 0;
  for (int64_t r = 0; r < n; ++r) {
    Sequence* s = batch[r];
    int64_t kept = 0;
    bool done = false;
    for (int64_t j = 0; j < steps && !done; ++j, ++kept)
      done =
          append(s->out, s->tokens, Sampled{t[j * n + r], lp[j * n + r]}, params, s->budget, stop);
    if (params.temperature > 0) s->rng.skip(static_cast<uint64_t>(kept));
    s->cached = static_cast<int64_t>(s->tokens.size()) - 1;
    kept_total += kept;
    if (done) finished.push_back(s->id);
  }
  stats_.steps += steps;
  ++stats_.device_runs;
  stats_.decode_tokens += kept_total;
  stats_.decode_seconds += seconds_since(start);
  return finished;
}

at::Tensor GenerationEngine::forward_packed(const std::vector<Sequence*>& batch) {
  int64_t b = static_cast<int64_t>(batch.size()), t = 0, width = 0;
  for (Sequence* s : batch) {
    t += static_cast<int64_t>(s->tokens.size()) - s->cached;
    width = std::max<int64_t>(width, s->table.size());
  }
  RECORD_FUNCTION("baton::forward_packed", std::vector<c10::IValue>());
  PagedStep st;
  st.ids = at::empty({t}, at::kLong);
  st.positions = at::empty({t}, at::kLong);
  st.write_slots = at::empty({t}, at::kLong);
  st.rows = at::empty({t}, at::kLong);
  st.block_tables = at::zeros({b, width}, at::kLong);
  st.last = at::empty({b}, at::kLong);
  int64_t* ids = st.ids.data_ptr<int64_t>();
  int64_t* pos = st.positions.data_ptr<int64_t>();
  int64_t* write = st.write_slots.data_ptr<int64_t>();
  int64_t* rows = st.rows.data_ptr<int64_t>();
  int64_t* tables = st.block_tables.data_ptr<int64_t>();
  int64_t* last = st.last.data_ptr<int64_t>();
  int64_t i = 0;
  for (int64_t r = 0; r < b; ++r) {
    const Sequence* s = batch[r];
    std::copy(s->table.begin(), s->table.end(), tables + r * width);
    for (int64_t p = s->cached; p < static_cast<int64_t>(s->tokens.size()); ++p, ++i) {
      ids[i] = s->tokens[p];
      pos[i] = p;
      write[i] = cache_->slot(s->table, p);
      rows[i] = r;
    }
    last[r] = i - 1;
  }
  return model_->forward_paged(st, *cache_);
}

at::Tensor GenerationEngine::forward_padded(const std::vector<Sequence*>& batch) {
  int64_t b = static_cast<int64_t>(batch.size());
  int64_t q = 0, l = 0;
  for (Sequence* s : batch) {
    int64_t len = static_cast<int64_t>(s->tokens.size());
    q = std::max(q, len - s->cached);
    l = std::max(l, len);
  }
  auto ids = at::zeros({b, q}, at::kLong);
  auto pos = at::zeros({b, q}, at::kLong);
  auto write = at::zeros({b * q}, at::kLong);  // padding writes go to scratch slot 0
  auto read = at::zeros({b, l}, at::kLong);    // padded reads come from slot 0, masked
  auto last = at::zeros({b}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto pos_a = pos.accessor<int64_t, 2>();
  auto write_a = write.accessor<int64_t, 1>();
  auto read_a = read.accessor<int64_t, 2>();
  auto last_a = last.accessor<int64_t, 1>();
  for (int64_t r = 0; r < b; ++r) {
    Sequence* s = batch[r];
    int64_t len = static_cast<int64_t>(s->tokens.size());
    for (int64_t j = 0; j < len - s->cached; ++j) {
      int64_t p = s->cached + j;
      ids_a[r][j] = s->tokens[p];
      pos_a[r][j] = p;
      write_a[r * q + j] = cache_->slot(s->table, p);
    }
    for (int64_t p = 0; p < len; ++p) read_a[r][p] = cache_->slot(s->table, p);
    last_a[r] = len - s->cached - 1;
  }
  // Query at position p sees keys 0..p of its row; keys past a row's length
  // are beyond every real query's position. Padding queries see key 0.
  auto allowed = at::arange(l, at::kLong).view({1, 1, l}).le(pos.unsqueeze(2));  // [B, Q, L]
  auto dtype = tensors_.dtype().toScalarType();
  auto device = tensors_.device();
  auto bias = at::zeros({b, q, l}, at::TensorOptions().dtype(dtype))
                  .masked_fill(allowed.logical_not(), masked_score(dtype))
                  .unsqueeze(1);
  CacheStep cs{write.to(device), read.to(device), bias.to(device)};
  return model_->forward_cached(ids.to(device), pos.to(device), cs, *cache_, last.to(device));
}

std::vector<GeneratedSequence> generate_without_cache(
    Transformer& model, const std::vector<std::vector<int64_t>>& prompts,
    const SamplingParams& params, const std::vector<uint64_t>& request_seeds,
    const std::vector<Continuation>& continuations) {
  require_one_stage_lm(model, "generate_without_cache");
  check_prompts(prompts, model.config(), params, request_seeds, continuations);
  auto stop = stop_tokens(model.config(), params);
  struct Row {
    GeneratedSequence out;
    std::vector<int64_t> tokens;
    SequenceRng rng{0};
    int64_t budget = 0;
    bool finished = false;
  };
  std::vector<Row> rows;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t j = 0; j < params.n; ++j) {
      Row r;
      r.out.request = static_cast<int64_t>(i);
      r.out.sample = continuations.empty() ? j : continuations[i].sample;
      r.out.prompt = prompts[i];
      r.tokens = prompts[i];
      r.rng = stream_of(params, request_seeds, continuations, static_cast<int64_t>(i), j);
      r.budget = budget_of(params, continuations, i);
      rows.push_back(std::move(r));
    }
  auto device = model.named_params()[0].second.device();
  at::NoGradGuard no_grad;
  while (true) {
    std::vector<Row*> active;
    int64_t s = 0;
    for (auto& r : rows)
      if (!r.finished) {
        active.push_back(&r);
        s = std::max<int64_t>(s, r.tokens.size());
      }
    if (active.empty()) break;
    int64_t b = static_cast<int64_t>(active.size());
    auto ids = at::zeros({b, s}, at::kLong);
    auto mask = at::zeros({b, s}, at::kLong);
    for (int64_t i = 0; i < b; ++i) {
      const auto& t = active[i]->tokens;
      int64_t pad = s - static_cast<int64_t>(t.size());
      ids[i].narrow(0, pad, t.size()).copy_(at::tensor(t, at::kLong));
      mask[i].narrow(0, pad, t.size()).fill_(1);
    }
    auto pos = (mask.cumsum(1) - 1).clamp_min(0);
    auto shard = model.forward(ids.to(device), pos.to(device), mask.to(device)).select(1, s - 1);
    auto logits = gather_from_tp_region(shard, model.parallel().tp())
                      .narrow(1, 0, model.config().vocab_size)  // without the padding columns
                      .to(at::kCPU, at::kFloat);
    std::vector<SequenceRng*> rngs;
    for (Row* r : active) rngs.push_back(&r->rng);
    auto sampled = sample_tokens(logits, params, rngs);
    for (int64_t i = 0; i < b; ++i) {
      Row* r = active[i];
      r->finished = append(r->out, r->tokens, sampled[i], params, r->budget, stop);
    }
  }
  std::vector<GeneratedSequence> out;
  for (auto& r : rows) out.push_back(std::move(r.out));
  return out;
}

RolloutBatch to_rollout_batch(const std::vector<GeneratedSequence>& sequences,
                              int64_t pad_token_id) {
  ENGINE_CHECK(!sequences.empty(), "to_rollout_batch: no sequences");
  int64_t n = static_cast<int64_t>(sequences.size()), p = 0, r = 0;
  bool with_log_probs = true;
  for (const auto& s : sequences) {
    p = std::max<int64_t>(p, s.prompt.size());
    r = std::max<int64_t>(r, s.response.size());
    with_log_probs = with_log_probs && s.log_probs.size() == s.response.size();
  }
  RolloutBatch out;
  out.prompts = at::full({n, p}, pad_token_id, at::kLong);
  out.responses = at::full({n, r}, pad_token_id, at::kLong);
  auto prompt_mask = at::zeros({n, p}, at::kLong);
  out.response_mask = at::zeros({n, r}, at::kLong);
  if (with_log_probs) out.rollout_log_probs = at::zeros({n, r}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = sequences[i];
    int64_t pl = static_cast<int64_t>(s.prompt.size()),
            rl = static_cast<int64_t>(s.response.size());
    out.prompts[i].narrow(0, p - pl, pl).copy_(at::tensor(s.prompt, at::kLong));
    prompt_mask[i].narrow(0, p - pl, pl).fill_(1);
    if (rl == 0) continue;
    out.responses[i].narrow(0, 0, rl).copy_(at::tensor(s.response, at::kLong));
    out.response_mask[i].narrow(0, 0, rl).fill_(1);
    if (with_log_probs)
      out.rollout_log_probs[i].narrow(0, 0, rl).copy_(at::tensor(s.log_probs, at::kFloat));
  }
  out.input_ids = at::cat({out.prompts, out.responses}, 1);
  out.attention_mask = at::cat({prompt_mask, out.response_mask}, 1);
  out.position_ids = (out.attention_mask.cumsum(1) - 1).clamp_min(0);
  return out;
}

}  // namespace baton::engine
