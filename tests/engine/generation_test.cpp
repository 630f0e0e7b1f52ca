// The generation engine on the fixture models, one process, fp32: the paged
// KV cache against full forwards without a cache, continuous batching against
// one-by-one generation, stop conditions, sleep/wake, the training-side batch
// layout and rollout log-probs against the training log-probs.
#include "engine/rollout/generation.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/kernels/packed_linear.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/fixture_model.h"
#include "tests/engine/model_tolerance.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::Tolerance;
using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

std::shared_ptr<Transformer> load_model(const std::string& name) {
  return test::load_fixture_model(name);
}

// Prompts of assorted lengths (1 to 13 tokens) over the vocabulary.
std::vector<std::vector<int64_t>> prompts(int64_t count, int64_t vocab, uint64_t seed) {
  SequenceRng rng(seed);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> p(1 + rng.next() % 13);
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng.next() % (vocab - 3));
    out.push_back(p);
  }
  return out;
}

// Temperature 1 over the whole vocabulary, EOS ignored: n samples per prompt.
SamplingParams sampled(int64_t max_new, int64_t n, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.n = n;
  p.seed = seed;
  return p;
}

SamplingParams greedy(int64_t max_new) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  return p;
}

// Argmax over full forwards of the whole sequence, one token at a time.
std::vector<int64_t> argmax_without_cache(Transformer& model, std::vector<int64_t> tokens,
                                          int64_t max_new) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < max_new; ++i) {
    auto n = static_cast<int64_t>(tokens.size());
    auto ids = at::tensor(tokens, at::kLong).view({1, n});
    auto logits =
        model.forward(ids, at::arange(n, at::kLong).view({1, n}), at::ones({1, n}, at::kLong));
    int64_t next = logits[0][n - 1].argmax().item<int64_t>();
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

// Log-probs of `out`'s tokens computed by other kernels: the chain of a
// log-prob over up to `longest` tokens, at the scale of their logits.
Tolerance log_prob_tolerance(Transformer& model, const std::vector<GeneratedSequence>& out,
                             int64_t longest) {
  std::vector<std::vector<int64_t>> whole;
  for (const auto& s : out) {
    whole.push_back(s.prompt);
    whole.back().insert(whole.back().end(), s.response.begin(), s.response.end());
  }
  return Tolerance::fp32(test::log_prob_terms(model.config(), longest),
                         test::max_abs_logit(model, whole));
}

// GenerationEngine::generate or generate_without_cache, on one model.
using Generate = std::function<std::vector<GeneratedSequence>(
    const std::vector<std::vector<int64_t>>&, const SamplingParams&, const std::vector<uint64_t>&,
    const std::vector<Continuation>&)>;

std::vector<std::pair<std::string, Generate>> generators(GenerationEngine& engine,
                                                         Transformer& model) {
  return {
      {"engine", [&engine](const auto& ps, const auto& params, const auto& seeds,
                           const auto& cont) { return engine.generate(ps, params, seeds, cont); }},
      {"without cache",
       [&model](const auto& ps, const auto& params, const auto& seeds, const auto& cont) {
         return generate_without_cache(model, ps, params, seeds, cont);
       }}};
}

// Generates params.n samples of each of `ps` as the fully-async trainer
// does, in calls whose budgets (max_new_tokens) are `caps`, increasing, the
// last the whole response's: the first call draws each sample's first
// caps[0] tokens; each later call resumes every sequence that has not
// stopped, one row per sequence (n = 1, Continuation), from its prompt and
// its tokens so far. Returns the joined sequences in (request, sample)
// order with their own prompts; `resumed` gets the rows of each later call.
std::vector<GeneratedSequence> generate_in_chunks(const Generate& generate,
                                                  const std::vector<std::vector<int64_t>>& ps,
                                                  SamplingParams params,
                                                  const std::vector<uint64_t>& seeds,
                                                  const std::vector<int64_t>& caps,
                                                  std::vector<int64_t>& resumed) {
  params.max_new_tokens = caps[0];
  auto joined = generate(ps, params, seeds, {});
  for (size_t c = 1; c < caps.size(); ++c) {
    std::vector<std::vector<int64_t>> rows;
    std::vector<uint64_t> row_seeds;
    std::vector<Continuation> continuations;
    std::vector<size_t> of_row;  // the joined sequence each row resumes
    for (size_t i = 0; i < joined.size(); ++i) {
      const GeneratedSequence& s = joined[i];
      if (s.finish_reason == "stop") continue;
      EXPECT_EQ(static_cast<int64_t>(s.response.size()), caps[c - 1]) << "sequence " << i;
      rows.push_back(s.prompt);
      rows.back().insert(rows.back().end(), s.response.begin(), s.response.end());
      row_seeds.push_back(seeds[s.request]);
      continuations.push_back({s.sample, static_cast<int64_t>(s.response.size())});
      of_row.push_back(i);
    }
    resumed.push_back(static_cast<int64_t>(rows.size()));
    if (rows.empty()) break;
    SamplingParams next = params;
    next.n = 1;
    next.max_new_tokens = caps[c];
    auto more = generate(rows, next, row_seeds, continuations);
    EXPECT_EQ(more.size(), rows.size());
    for (size_t r = 0; r < more.size(); ++r) {
      GeneratedSequence& s = joined[of_row[r]];
      EXPECT_EQ(more[r].request, static_cast<int64_t>(r));
      EXPECT_EQ(more[r].sample, s.sample);
      EXPECT_EQ(more[r].prompt, rows[r]);
      EXPECT_LE(static_cast<int64_t>(more[r].response.size()), caps[c] - caps[c - 1]);
      s.response.insert(s.response.end(), more[r].response.begin(), more[r].response.end());
      s.log_probs.insert(s.log_probs.end(), more[r].log_probs.begin(), more[r].log_probs.end());
      s.finish_reason = more[r].finish_reason;
    }
  }
  return joined;
}

class Generation : public ::testing::TestWithParam<std::string> {};

TEST_P(Generation, GreedyWithCacheEqualsArgmaxOverFullForwards) {
  auto model = load_model(GetParam());
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  auto ps = prompts(6, model->config().vocab_size, 7);
  auto out = engine.generate(ps, greedy(10));
  ASSERT_EQ(out.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(out[i].request, static_cast<int64_t>(i));
    EXPECT_EQ(out[i].prompt, ps[i]);
    EXPECT_EQ(out[i].response, argmax_without_cache(*model, ps[i], 10)) << "prompt " << i;
    EXPECT_EQ(out[i].finish_reason, "length");
    EXPECT_EQ(out[i].log_probs.size(), 10u);
  }
  // The library's own uncached baseline (left-padded static batch) agrees too.
  // Its log-probs come from other kernels (padded batch vs paged cache): the
  // chain of a log-prob over up to 23 tokens, at the scale of their logits.
  auto uncached = generate_without_cache(*model, ps, greedy(10));
  const Tolerance tol = log_prob_tolerance(*model, out, 13 + 10);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(uncached[i].response, out[i].response) << "prompt " << i;
    expect_close(uncached[i].log_probs, out[i].log_probs, tol, "prompt " + std::to_string(i));
  }
}

TEST_P(Generation, ContinuousBatchingEqualsOneByOne) {
  auto model = load_model(GetParam());
  auto ps = prompts(10, model->config().vocab_size, 11);
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < ps.size(); ++i) seeds.push_back(1000 + i);
  SamplingParams top_k = sampled(12, 2, /*seed=*/0);
  top_k.top_k = 20;
  for (const auto& params : {greedy(12), top_k}) {
    SCOPED_TRACE(params.to_string());
    // A cache of 12 blocks of 4 tokens and at most 3 running: prompts wait,
    // join as others finish, and get preempted when blocks run out.
    GenerationOptions tight;
    tight.cache.block_size = 4;
    tight.cache.budget_bytes = 13 * 4 * model->make_kv_cache({})->bytes_per_token();
    tight.max_batch = 3;
    GenerationEngine batched(model, tight);
    auto together = batched.generate(ps, params, seeds);
    const auto& stats = batched.last_stats();
    EXPECT_LE(stats.peak_running, 3);
    EXPECT_LE(stats.peak_cache_blocks, 12);
    EXPECT_GT(stats.preemptions, 0) << "the cache was meant to run out";
    EXPECT_EQ(batched.cache().free_blocks(), batched.cache().usable_blocks());

    GenerationEngine alone(model, GenerationOptions().set_cache_bytes(1 << 20));
    ASSERT_EQ(together.size(), ps.size() * params.n);
    for (size_t i = 0; i < ps.size(); ++i) {
      auto single = alone.generate({ps[i]}, params, {seeds[i]});
      for (int64_t j = 0; j < params.n; ++j) {
        const auto& t = together[i * params.n + j];
        EXPECT_EQ(t.request, static_cast<int64_t>(i));
        EXPECT_EQ(t.sample, j);
        EXPECT_EQ(t.response, single[j].response) << "prompt " << i << " sample " << j;
      }
    }
  }
}

// The packed CPU step (engine/kernels/decode_kernels.h) against the padded step of
// LibTorch operations: the same tokens, greedy and sampled (the same draws
// from probabilities equal up to fp32 rounding), and log-probs within the
// chain of a log-prob over up to 23 tokens. Prefills of several sequences
// and decode steps of sequences of different lengths are both exercised.
TEST_P(Generation, PackedStepsEqualPaddedSteps) {
  auto model = load_model(GetParam());
  auto ps = prompts(6, model->config().vocab_size, 13);
  GenerationEngine packed(model, GenerationOptions().set_cache_bytes(1 << 20));
  GenerationEngine padded(model,
                          GenerationOptions().set_cache_bytes(1 << 20).set_packed_cpu_steps(false));
  ASSERT_TRUE(packed.packed_steps());
  ASSERT_FALSE(padded.packed_steps());
  for (const auto& params : {greedy(10), sampled(10, 2, 5)}) {
    SCOPED_TRACE(params.to_string());
    auto a = packed.generate(ps, params);
    auto b = padded.generate(ps, params);
    ASSERT_EQ(a.size(), b.size());
    const Tolerance tol = log_prob_tolerance(*model, a, 13 + 10);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].response, b[i].response) << "sequence " << i;
      expect_close(a[i].log_probs, b[i].log_probs, tol, "sequence " + std::to_string(i));
    }
    EXPECT_EQ(packed.cache().free_blocks(), packed.cache().usable_blocks());
  }
}

// The packed step multiplies by oneDNN-packed copies of the weights
// (engine/kernels/packed_linear.h), taken at the start of each generate() and
// dropped at its end, when the weights are large enough to be worth it. After
// the parameters change, the next generate follows
// them: the same tokens as the padded step, which multiplies the parameters
// themselves, and log-probs within the chain of a log-prob.
TEST(Generation, PackedWeightsFollowTheParameters) {
  auto model = load_model("tiny-qwen2");
  ASSERT_TRUE(packed_linear_available()) << "x86-64 LibTorch ships oneDNN";
  auto ps = prompts(4, model->config().vocab_size, 29);
  // The tiny model is under the default size to pack (its weights stay in
  // the cache): packed only when asked.
  {
    GenerationEngine small(model, GenerationOptions().set_cache_bytes(1 << 20));
    small.generate(ps, greedy(2));
    EXPECT_FALSE(small.last_stats().packed_weights);
  }
  GenerationEngine engine(
      model, GenerationOptions().set_cache_bytes(1 << 20).set_pack_min_weight_bytes(0));
  const auto before = engine.generate(ps, greedy(8));
  EXPECT_TRUE(engine.last_stats().packed_weights);
  EXPECT_FALSE(model->paged_weights_packed());
  {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    for (auto& [name, p] : model->named_params())
      if (p.dim() == 2) p.add_(at::randn(p.sizes(), gen) * p.std());
  }
  const auto after = engine.generate(ps, greedy(8));
  EXPECT_TRUE(engine.last_stats().packed_weights);
  GenerationEngine padded(model,
                          GenerationOptions().set_cache_bytes(1 << 20).set_packed_cpu_steps(false));
  const auto want = padded.generate(ps, greedy(8));
  ASSERT_EQ(after.size(), want.size());
  const Tolerance tol = log_prob_tolerance(*model, want, 13 + 8);
  bool changed = false;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(after[i].response, want[i].response) << "sequence " << i;
    expect_close(after[i].log_probs, want[i].log_probs, tol, "sequence " + std::to_string(i));
    changed = changed || after[i].response != before[i].response;
  }
  EXPECT_TRUE(changed) << "the new weights were meant to change some tokens";
}

// Prefix sharing: the n samples of a prompt admitted together prefill it
// once. Against an engine that prefills each sample: the same tokens (the
// followers draw from the leader's logits, equal to their own prefill's up
// to the rounding of the batch's kernels) and log-probs within the chain of
// a log-prob; prompt tokens prefilled once instead of n times. Blocks of 4
// tokens, so that prompts end both inside a block (copied) and at its end.
TEST_P(Generation, SamplesOfAPromptShareItsPrefill) {
  auto model = load_model(GetParam());
  auto ps = prompts(5, model->config().vocab_size, 17);
  GenerationOptions options;
  options.cache.block_size = 4;
  options.cache.budget_bytes = 1 << 20;
  GenerationEngine shared(model, options);
  GenerationEngine alone(model, GenerationOptions(options).set_share_prompt_prefill(false));
  const SamplingParams p = sampled(8, 3, 23);
  auto a = shared.generate(ps, p);
  auto b = alone.generate(ps, p);
  int64_t prompt_tokens = 0;
  for (const auto& x : ps) prompt_tokens += static_cast<int64_t>(x.size());
  EXPECT_EQ(shared.last_stats().prefill_tokens, prompt_tokens);
  EXPECT_EQ(shared.last_stats().shared_prefill_tokens, 2 * prompt_tokens);
  EXPECT_EQ(alone.last_stats().prefill_tokens, 3 * prompt_tokens);
  EXPECT_EQ(alone.last_stats().shared_prefill_tokens, 0);
  EXPECT_EQ(shared.cache().free_blocks(), shared.cache().usable_blocks());
  ASSERT_EQ(a.size(), b.size());
  const Tolerance tol = log_prob_tolerance(*model, a, 13 + 8);
  std::set<std::vector<int64_t>> distinct;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].request, b[i].request);
    EXPECT_EQ(a[i].sample, b[i].sample);
    EXPECT_EQ(a[i].response, b[i].response) << "sequence " << i;
    expect_close(a[i].log_probs, b[i].log_probs, tol, "sequence " + std::to_string(i));
    distinct.insert(a[i].response);
  }
  EXPECT_GT(distinct.size(), ps.size()) << "the samples of a prompt were meant to differ";
}

// Partial rollout: a response generated in chunks (budgets 3, 7, 10), each
// call resuming the sequences that have not stopped from prompt + tokens so
// far (Continuation), gives the tokens of one uninterrupted call, and their
// log-probs up to the rounding of other kernels (a resumed prefix is
// prefilled, not decoded token by token): the chain of a log-prob over up
// to 13 + 10 tokens. Sampled over the whole vocabulary and with top-k (the
// per-row draw), and greedy; on the engine and the uncached baseline. Stop
// tokens taken from a free run end some sequences in the first chunk, so
// that only the others are resumed.
TEST_P(Generation, ChunkedGenerationEqualsOneCall) {
  auto model = load_model(GetParam());
  auto ps = prompts(2, model->config().vocab_size, 31);
  const std::vector<uint64_t> seeds{77, 78};
  const std::vector<int64_t> caps{3, 7, 10};
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  SamplingParams top_k = sampled(10, 3, 0);
  top_k.top_k = 20;
  SamplingParams greedy_n = greedy(10);
  greedy_n.n = 2;
  for (SamplingParams params : {sampled(10, 3, 0), top_k, greedy_n}) {
    SCOPED_TRACE(params.to_string());
    // A stop token among sample 0 of prompt 0's first tokens that prompt 1
    // never draws: that sample stops in the first chunk, prompt 1's go on.
    const auto free_run = engine.generate(ps, params, seeds);
    std::set<int64_t> later;
    for (int64_t j = 0; j < params.n; ++j)
      later.insert(free_run[params.n + j].response.begin(), free_run[params.n + j].response.end());
    for (int64_t t = 0; t < caps[0] && params.stop_token_ids.empty(); ++t)
      if (!later.count(free_run[0].response[t])) params.stop_token_ids = {free_run[0].response[t]};
    ASSERT_FALSE(params.stop_token_ids.empty()) << "no token to stop prompt 0 alone";
    for (const auto& [name, generate] : generators(engine, *model)) {
      SCOPED_TRACE(name);
      const auto whole = generate(ps, params, seeds, {});
      std::vector<int64_t> resumed;
      const auto chunked = generate_in_chunks(generate, ps, params, seeds, caps, resumed);
      ASSERT_EQ(chunked.size(), whole.size());
      const Tolerance tol = log_prob_tolerance(*model, whole, 13 + 10);
      int64_t stopped_early = 0;
      for (size_t i = 0; i < whole.size(); ++i) {
        EXPECT_EQ(chunked[i].request, whole[i].request);
        EXPECT_EQ(chunked[i].sample, whole[i].sample);
        EXPECT_EQ(chunked[i].prompt, whole[i].prompt);
        EXPECT_EQ(chunked[i].response, whole[i].response) << "sequence " << i;
        EXPECT_EQ(chunked[i].finish_reason, whole[i].finish_reason) << "sequence " << i;
        expect_close(chunked[i].log_probs, whole[i].log_probs, tol,
                     "sequence " + std::to_string(i));
        stopped_early += whole[i].finish_reason == "stop" &&
                         static_cast<int64_t>(whole[i].response.size()) <= caps[0];
      }
      EXPECT_GT(stopped_early, 0) << "a sequence was meant to stop in the first chunk";
      ASSERT_EQ(resumed.size(), 2u) << "every chunk was meant to resume some sequences";
      EXPECT_GT(resumed[1], 0);
      EXPECT_LT(resumed[0], static_cast<int64_t>(whole.size()));
    }
    EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
  }
}

// The device decode loop (k decode steps on the device, each token drawn
// there and fed back, one copy to the host per k) against the host loop
// (device_decode_steps 0: a forward and a host draw per token): the same
// tokens and log-probs within the chain of a log-prob, greedy and sampled
// with top-k, with stop tokens met inside a run of k steps, in a cache tight
// enough that sequences wait, join as others finish and get preempted, and
// for continuations (partial rollout).
TEST_P(Generation, DeviceDecodeLoopEqualsTheHostLoop) {
  auto model = load_model(GetParam());
  const int64_t vocab = model->config().vocab_size;
  auto ps = prompts(8, vocab, 17);
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < ps.size(); ++i) seeds.push_back(500 + i);
  SamplingParams top_k = sampled(14, 2, 0);
  top_k.top_k = 20;
  SamplingParams stopping = sampled(14, 2, 3);
  // A tenth of the vocabulary stops a sequence: most stop within 14 tokens,
  // many inside a run.
  for (int64_t t = 3; t < vocab; t += 10) stopping.stop_token_ids.push_back(t);
  GenerationOptions tight;
  tight.cache.block_size = 4;
  tight.cache.budget_bytes = 16 * 4 * model->make_kv_cache({})->bytes_per_token();
  tight.max_batch = 4;
  tight.packed_cpu_steps = false;
  GenerationEngine host(model, GenerationOptions(tight).set_device_decode_steps(0));
  GenerationEngine device(model, GenerationOptions(tight).set_device_decode_steps(4));
  ASSERT_FALSE(host.device_decode());
  ASSERT_TRUE(device.device_decode());
  EXPECT_FALSE(device.cuda_graphs()) << "no graphs on the CPU";
  for (const auto& params : {greedy(14), top_k, stopping}) {
    SCOPED_TRACE(params.to_string());
    auto a = host.generate(ps, params, seeds);
    auto b = device.generate(ps, params, seeds);
    ASSERT_EQ(a.size(), b.size());
    const Tolerance tol = log_prob_tolerance(*model, a, 13 + 14);
    int64_t stopped = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].response, b[i].response) << "sequence " << i;
      EXPECT_EQ(a[i].finish_reason, b[i].finish_reason) << "sequence " << i;
      expect_close(a[i].log_probs, b[i].log_probs, tol, "sequence " + std::to_string(i));
      stopped += a[i].finish_reason == "stop";
    }
    const GenerationStats& stats = device.last_stats();
    EXPECT_GT(stats.device_runs, 0);
    EXPECT_GT(stats.preemptions + stats.peak_running, 0);
    // Fewer host copies than decode tokens: up to 4 steps per copy.
    EXPECT_LT(stats.device_runs, stats.decode_tokens);
    EXPECT_EQ(device.cache().free_blocks(), device.cache().usable_blocks());
    if (!params.stop_token_ids.empty()) {
      EXPECT_GT(stopped, 0) << "the stop ids were meant to stop some";
    }
  }
  // A partial rollout resumed in chunks: the host loop's tokens again.
  std::vector<int64_t> resumed_host, resumed_device;
  auto chunked_host = generate_in_chunks(generators(host, *model)[0].second, ps, top_k, seeds,
                                         {5, 9, 14}, resumed_host);
  auto chunked_device = generate_in_chunks(generators(device, *model)[0].second, ps, top_k, seeds,
                                           {5, 9, 14}, resumed_device);
  EXPECT_EQ(resumed_host, resumed_device);
  for (size_t i = 0; i < chunked_host.size(); ++i)
    EXPECT_EQ(chunked_host[i].response, chunked_device[i].response) << "sequence " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Generation, ::testing::Values("tiny-llama", "tiny-qwen2"));

TEST(Generation, SameSeedSameOutputAndSamplesDiffer) {
  auto model = load_model("tiny-llama");
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  SamplingParams p;
  p.temperature = 1.0;
  p.n = 4;
  p.max_new_tokens = 8;
  p.ignore_eos = true;
  p.seed = 5;
  auto ps = prompts(3, model->config().vocab_size, 3);
  auto a = engine.generate(ps, p);
  auto b = engine.generate(ps, p);
  ASSERT_EQ(a.size(), 12u);
  int64_t distinct = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].response, b[i].response);
    EXPECT_EQ(a[i].log_probs, b[i].log_probs);
    if (i % 4 != 0 && a[i].response != a[i - 1].response) ++distinct;
  }
  EXPECT_GT(distinct, 0) << "n samples of a prompt should not all be equal at temperature 1";
  p.seed = 6;
  auto c = engine.generate(ps, p);
  int64_t changed = 0;
  for (size_t i = 0; i < a.size(); ++i) changed += a[i].response != c[i].response;
  EXPECT_GT(changed, 0) << "another seed should change some samples";
}

TEST(Generation, StopsOnStopTokensAndEos) {
  auto model = load_model("tiny-llama");
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  std::vector<int64_t> prompt{5, 17, 33, 9};
  auto free_run = engine.generate({prompt}, greedy(12))[0].response;
  ASSERT_EQ(free_run.size(), 12u);
  // Stop on the 4th generated token: the response ends with it.
  auto params = greedy(12);
  params.stop_token_ids = {free_run[3]};
  auto stopped = engine.generate({prompt}, params)[0];
  size_t first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_EQ(stopped.response, std::vector<int64_t>(free_run.begin(), free_run.begin() + first + 1));
  // The model's EOS ids (config eos_token_id) end a sequence unless ignore_eos.
  ASSERT_EQ(model->config().eos_token_ids, std::vector<int64_t>{2});
  auto cfg = model->config();
  cfg.eos_token_ids = {free_run[3]};
  auto with_eos = std::make_shared<Transformer>(cfg, ParallelState::single());
  with_eos->load_state_dict(model->state_dict());
  GenerationEngine eos_engine(with_eos, GenerationOptions().set_cache_bytes(1 << 20));
  auto eos = greedy(12);
  eos.ignore_eos = false;
  auto ended = eos_engine.generate({prompt}, eos)[0];
  EXPECT_EQ(ended.finish_reason, "stop");
  EXPECT_EQ(ended.response, stopped.response);
  eos.ignore_eos = true;
  EXPECT_EQ(eos_engine.generate({prompt}, eos)[0].response, free_run);

  // generation_config.json's ids (several, as instruct checkpoints list) are
  // the stop set when present, config.json's are not.
  auto gen_cfg = model->config();
  int64_t unused = 0;
  while (std::find(free_run.begin(), free_run.end(), unused) != free_run.end()) ++unused;
  gen_cfg.generation_eos_token_ids = {unused, free_run[3]};
  auto with_gen = std::make_shared<Transformer>(gen_cfg, ParallelState::single());
  with_gen->load_state_dict(model->state_dict());
  GenerationEngine gen_engine(with_gen, GenerationOptions().set_cache_bytes(1 << 20));
  eos.ignore_eos = false;
  auto gen_ended = gen_engine.generate({prompt}, eos)[0];
  EXPECT_EQ(gen_ended.finish_reason, "stop");
  EXPECT_EQ(gen_ended.response, stopped.response);
}

// Every sequence of a prefill may end on its first token while nothing else
// runs and prompts still wait (max_batch 1, every token a stop token): the
// waiting prompts are admitted next (the scheduler, engine/rollout/scheduler.h)
// and every sequence ends with one token. Before the scheduler this threw "no
// sequence fits in the free KV cache".
TEST(Generation, APrefillThatEndsEverySequenceAdmitsTheWaitingOnes) {
  auto model = load_model("tiny-llama");
  GenerationOptions one_at_a_time = GenerationOptions().set_cache_bytes(1 << 20);
  one_at_a_time.max_batch = 1;
  GenerationEngine engine(model, one_at_a_time);
  auto params = greedy(8);
  for (int64_t id = 0; id < model->config().vocab_size; ++id) params.stop_token_ids.push_back(id);
  const std::vector<std::vector<int64_t>> ps{{5, 17, 33}, {9, 4}, {12, 40, 7, 3}};
  const auto out = engine.generate(ps, params);
  ASSERT_EQ(out.size(), ps.size());
  for (const auto& s : out) {
    EXPECT_EQ(s.response.size(), 1u) << "request " << s.request;
    EXPECT_EQ(s.finish_reason, "stop") << "request " << s.request;
  }
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
}

TEST(Generation, SleepReleasesTheCacheAndWakeRestoresIt) {
  auto model = load_model("tiny-qwen2");
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(2 << 20));
  auto ps = prompts(4, model->config().vocab_size, 1);
  auto before = engine.generate(ps, greedy(6));
  EXPECT_GT(engine.cache().allocated_bytes(), (2 << 20) * 9 / 10);
  engine.sleep();
  EXPECT_FALSE(engine.awake());
  EXPECT_EQ(engine.cache().allocated_bytes(), 0);
  expect_error([&] { engine.generate(ps, greedy(6)); }, {"sleep", "wake"});
  engine.wake();
  auto after = engine.generate(ps, greedy(6));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(before[i].response, after[i].response);
}

TEST(Generation, BadRequestsNameWhatIsWrong) {
  auto model = load_model("tiny-llama");
  GenerationOptions small;
  small.cache.block_size = 4;
  small.cache.budget_bytes = 5 * 4 * model->make_kv_cache({})->bytes_per_token();  // 16 usable
  GenerationEngine engine(model, small);
  expect_error(
      [&] {
        engine.generate({{1, 2}, std::vector<int64_t>(10, 3)}, greedy(8));
      },
      {"request 1", "17", "16"});
  expect_error([&] { engine.generate({{1, 2}, {}}, greedy(4)); }, {"prompt 1", "empty"});
  expect_error([&] { engine.generate({{1, 999}}, greedy(4)); }, {"prompt 0", "999", "128"});
  auto p = greedy(4);
  p.top_p = 0;
  expect_error([&] { engine.generate({{1}}, p); }, {"top_p", "0"});
  expect_error(
      [&] {
        engine.generate({{1}, {2}}, greedy(4), {7});
      },
      {"1 request seeds", "2 prompts"});
  expect_error([&] { KvCache(model->config(), 4, 2, at::kFloat, {.budget_bytes = 100}); },
               {"100 bytes", "at least 2"});
}

// Continuations are checked where the prompts are, on both paths: one per
// prompt, n = 1, 0 <= generated < max_new_tokens and below the prompt's
// length, sample >= 0, request seeds when sampling. The cache has to hold the
// prompt and the budget left (max_new_tokens - generated), not the whole
// budget again.
TEST(Generation, BadContinuationsNameWhatIsWrong) {
  auto model = load_model("tiny-llama");
  GenerationOptions small;
  small.cache.block_size = 4;
  small.cache.budget_bytes = 5 * 4 * model->make_kv_cache({})->bytes_per_token();  // 16 usable
  GenerationEngine engine(model, small);
  const std::vector<std::vector<int64_t>> ps{{1, 2, 3}, {4, 5}};
  const std::vector<uint64_t> seeds{1, 2};
  const SamplingParams p = sampled(4, 1, 0);
  SamplingParams two = p;
  two.n = 2;
  for (const auto& [name, generate] : generators(engine, *model)) {
    SCOPED_TRACE(name);
    expect_error([&] { generate(ps, p, seeds, {{0, 1}}); }, {"1 continuations", "2 prompts"});
    expect_error([&] { generate(ps, two, seeds, {{0, 1}, {0, 1}}); }, {"n must be 1", "got 2"});
    expect_error(
        [&] {
          generate(ps, p, seeds, {{0, 1}, {0, 4}});
        },
        {"request 1", "generated 4", "max_new_tokens 4"});
    expect_error(
        [&] {
          generate(ps, p, seeds, {{0, 3}, {0, 1}});
        },
        {"request 0", "generated 3", "length 3"});
    expect_error([&] { generate(ps, p, seeds, {{0, -1}, {0, 1}}); }, {"request 0", "generated -1"});
    expect_error([&] { generate(ps, p, seeds, {{-2, 1}, {0, 1}}); }, {"request 0", "sample -2"});
    expect_error([&] { generate(ps, p, {}, {{0, 1}, {0, 1}}); }, {"request_seeds"});
    // Greedy draws nothing: no seeds needed. The budget left is what is drawn.
    auto out = generate(ps, greedy(4), {}, {{1, 2}, {0, 1}});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].sample, 1);
    EXPECT_EQ(out[0].response.size(), 2u);
    EXPECT_EQ(out[1].response.size(), 3u);
    EXPECT_EQ(out[1].finish_reason, "length");
  }
  // 10 + 8 - 1 = 17 positions do not fit in 16; with 1 of the 8 generated, 16 do.
  const std::vector<std::vector<int64_t>> long_prompt{std::vector<int64_t>(10, 3)};
  expect_error(
      [&] {
        engine.generate(long_prompt, greedy(8), {}, {{0, 0}});
      },
      {"request 0", "17", "- generated 0", "16"});
  EXPECT_NO_THROW(engine.generate(long_prompt, greedy(8), {}, {{0, 1}}));
}

// A step that fails mid-generate (here: an LM head of the wrong shape) leaves
// no block held: the cache can sleep, and generation works again once fixed.
TEST(Generation, AFailedGenerateReleasesItsBlocks) {
  auto model = load_model("tiny-llama");
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  auto ps = prompts(4, model->config().vocab_size, 5);
  auto good = engine.generate(ps, greedy(4));
  at::Tensor head;
  for (auto& [name, t] : model->named_params())
    if (name == "output_layer.weight") head = t;
  ASSERT_TRUE(head.defined());
  auto saved = head.detach().clone();
  {
    at::NoGradGuard no_grad;
    head.set_(at::zeros({3, 3}));
  }
  EXPECT_ANY_THROW(engine.generate(ps, greedy(4)));
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
  {
    at::NoGradGuard no_grad;
    head.set_(saved);
  }
  engine.sleep();
  engine.wake();
  auto again = engine.generate(ps, greedy(4));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(again[i].response, good[i].response);
}

TEST(Generation, ForwardCachedChecksItsStep) {
  auto model = load_model("tiny-llama");
  auto cache = model->make_kv_cache({});
  auto ids = at::ones({2, 3}, at::kLong);
  CacheStep bad{at::zeros({5}, at::kLong), at::zeros({2, 4}, at::kLong), at::zeros({2, 1, 3, 4})};
  expect_error([&] { model->forward_cached(ids, ids, bad, *cache, at::zeros({2}, at::kLong)); },
               {"write_slots [6]", "[5]"});
  CacheStep far{at::full({6}, 1 << 30, at::kLong), at::zeros({2, 4}, at::kLong),
                at::zeros({2, 1, 3, 4})};
  expect_error([&] { model->forward_cached(ids, ids, far, *cache, at::zeros({2}, at::kLong)); },
               {"cache slot outside"});
}

TEST(Generation, ForwardDecodeChecksItsShapes) {
  auto model = load_model("tiny-llama");
  auto cache = model->make_kv_cache({});
  auto longs = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong); };
  DecodeStep ok{longs({5, 6}), longs({0, 0}), longs({3, 3}), at::ones({2, 1}, at::kLong)};
  auto logits = model->forward_decode(ok, *cache);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, model->config().vocab_size}));
  DecodeStep bad = ok;
  bad.positions = longs({0, 0, 0});
  expect_error([&] { model->forward_decode(bad, *cache); }, {"forward_decode", "[2]", "[3]"});
  bad = ok;
  bad.block_tables = at::ones({3, 1}, at::kLong);
  expect_error([&] { model->forward_decode(bad, *cache); }, {"block_tables [B, W]", "[3, 1]"});
}

TEST(Generation, ForwardPagedChecksItsStep) {
  auto model = load_model("tiny-llama");
  ASSERT_TRUE(model->supports_paged_step());
  auto cache = model->make_kv_cache({});
  auto longs = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong); };
  // Two tokens of one sequence in block 0.
  PagedStep ok{longs({5, 6}), longs({0, 1}),           longs({0, 1}),
               longs({0, 0}), longs({0}).view({1, 1}), longs({1})};
  auto logits = model->forward_paged(ok, *cache);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{1, model->config().vocab_size}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());

  PagedStep bad = ok;
  bad.positions = longs({0, 1, 2});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"forward_paged", "int64 [2]", "[3]"});
  bad = ok;
  bad.ids = longs({5, 1 << 20});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"token id 1048576", "vocabulary"});
  bad = ok;
  bad.positions = longs({0, 1 << 20});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"token 1", "position 1048576"});
  bad = ok;
  bad.block_tables = longs({1 << 30}).view({1, 1});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"block id 1073741824"});
  bad = ok;
  bad.last = longs({2});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"last token index 2"});
  bad = ok;
  bad.block_tables = longs({0, 0}).view({2, 1});
  expect_error([&] { model->forward_paged(bad, *cache); }, {"1 sequences", "[2, 1]"});
}

// share_prefix: full blocks are shared and outlive the sequence that wrote
// them; the partly filled last block is a copy of its own.
TEST(KvCache, SharedPrefixBlocksAreHeldUntilTheirLastHolderReleasesThem) {
  auto model = load_model("tiny-llama");
  KvCache cache(model->config(), model->config().num_layers, model->config().num_kv_heads,
                at::TensorOptions().dtype(at::kFloat),
                KvCacheOptions{.budget_bytes = 1 << 20, .block_size = 4});
  const int64_t usable = cache.usable_blocks();
  std::vector<int64_t> a, b, c;
  ASSERT_TRUE(cache.reserve(a, 10));  // blocks 0-3, 4-7 full; 8-9 in the third
  for (int64_t l = 0; l < model->config().num_layers; ++l) {
    cache.keys(l).normal_();
    cache.values(l).normal_();
  }
  ASSERT_TRUE(cache.share_prefix(a, 10, b));
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_NE(b[2], a[2]);
  for (int64_t l = 0; l < model->config().num_layers; ++l)
    for (int64_t pos : {8, 9}) {
      EXPECT_TRUE(at::equal(cache.keys(l)[cache.slot(b, pos)], cache.keys(l)[cache.slot(a, pos)]));
      EXPECT_TRUE(
          at::equal(cache.values(l)[cache.slot(b, pos)], cache.values(l)[cache.slot(a, pos)]));
    }
  ASSERT_TRUE(cache.share_prefix(a, 8, c));  // ends at a block's end: nothing to copy
  EXPECT_EQ(c, (std::vector<int64_t>{a[0], a[1]}));
  EXPECT_EQ(cache.free_blocks(), usable - 4);
  cache.release(a);  // a's last block goes back; the shared ones stay held
  EXPECT_EQ(cache.free_blocks(), usable - 3);
  cache.release(c);
  EXPECT_EQ(cache.free_blocks(), usable - 3);
  cache.release(b);
  EXPECT_EQ(cache.free_blocks(), usable);

  // No free block for the copy: refused, nothing taken.
  std::vector<int64_t> all, none;
  ASSERT_TRUE(cache.reserve(all, usable * 4 - 1));
  EXPECT_FALSE(cache.share_prefix(all, 6, none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(cache.free_blocks(), 0);
  cache.release(all);
  EXPECT_EQ(cache.free_blocks(), usable);
}

// On a GPU: the device loop with its step captured in CUDA graphs gives the
// tokens of the same loop uncaptured exactly (a graph replays the same
// kernels), and the host loop's up to the attention kernels' rounding.
TEST(Generation, CudaGraphsGiveTheUncapturedTokens_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto model = load_model("tiny-qwen2");
  model->to(at::Device(at::kCUDA, 0));
  auto ps = prompts(37, model->config().vocab_size, 19);
  GenerationOptions base = GenerationOptions().set_cache_bytes(8 << 20);
  GenerationEngine graphs(model, GenerationOptions(base).set_cuda_graphs(true));
  GenerationEngine eager(model, GenerationOptions(base).set_cuda_graphs(false));
  GenerationEngine host(model, GenerationOptions(base).set_device_decode_steps(0));
  ASSERT_TRUE(graphs.cuda_graphs());
  ASSERT_FALSE(eager.cuda_graphs());
  SamplingParams top_p = sampled(24, 2, 9);
  top_p.top_p = 0.9;
  for (const auto& params : {greedy(24), sampled(24, 2, 8), top_p}) {
    SCOPED_TRACE(params.to_string());
    auto a = graphs.generate(ps, params);
    auto b = eager.generate(ps, params);
    auto c = host.generate(ps, params);
    EXPECT_GT(graphs.last_stats().graph_replays, 0);
    EXPECT_GT(graphs.last_stats().graph_captures, 0);
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].response, b[i].response) << "sequence " << i;
      EXPECT_EQ(a[i].log_probs, b[i].log_probs) << "sequence " << i;
      differ += a[i].response != c[i].response;
    }
    // The host loop attends by other kernels: a near tie may flip a token.
    EXPECT_LE(differ, static_cast<int64_t>(a.size()) / 20) << "sequences that differ";
  }
}

TEST(Generation, RolloutLogProbsMatchTrainingLogProbs) {
  auto model = load_model("tiny-qwen2");
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = 10;
  p.seed = 9;
  p.n = 2;
  auto seqs = engine.generate(prompts(5, model->config().vocab_size, 21), p);
  auto batch = to_rollout_batch(seqs, /*pad_token_id=*/0);
  int64_t n = static_cast<int64_t>(seqs.size()), pl = batch.prompts.size(1),
          rl = batch.responses.size(1);
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{n, pl + rl}));
  for (int64_t i = 0; i < n; ++i) {
    // Prompts are left-padded, responses right-padded; positions count real tokens.
    auto mask = batch.attention_mask[i];
    int64_t plen = static_cast<int64_t>(seqs[i].prompt.size());
    int64_t rlen = static_cast<int64_t>(seqs[i].response.size());
    EXPECT_EQ(mask.sum().item<int64_t>(), plen + rlen);
    EXPECT_EQ(batch.prompts[i][pl - 1].item<int64_t>(), seqs[i].prompt.back());
    EXPECT_EQ(batch.response_mask[i].sum().item<int64_t>(), rlen);
    EXPECT_EQ(batch.position_ids[i][pl + rlen - 1].item<int64_t>(), plen + rlen - 1);
  }
  // The training side's log-probs of the same tokens: a full forward over the
  // padded batch, the response part of next_token_log_probs.
  at::Tensor train, logits;
  {
    at::NoGradGuard no_grad;
    logits = model->forward(batch.input_ids, batch.position_ids, batch.attention_mask);
    train =
        next_token_log_probs(logits, batch.input_ids, model->parallel().tp()).narrow(1, pl - 1, rl);
  }
  // The same log-probs from other kernels (a padded full forward vs the
  // paged cache): the chain of a log-prob, at the scale of the logits.
  expect_close(batch.rollout_log_probs, train,
               Tolerance::fp32(test::log_prob_terms(model->config(), pl + rl),
                               test::max_abs(logits, batch.attention_mask)),
               "rollout vs training log-probs", batch.response_mask);
}

}  // namespace
}  // namespace baton::engine
