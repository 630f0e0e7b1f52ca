// Multi-turn generation (GenerationEngine::generate with a TurnHandler): a
// sequence that stops pauses on its turn's appended tokens, keeps its KV
// cache, and continues as if those tokens had been generated. Checked on the
// fixture models, one process, fp32: the trajectory against a greedy
// continuation of the same tokens as one longer prompt, the prefill counting
// only what was appended (nothing recomputed), the other sequences decoding
// while one waits, the budget, and a failing turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/rollout/generation.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/fixture_model.h"
#include "tests/engine/model_tolerance.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::Tolerance;
using testing::expect_error;

std::vector<std::vector<int64_t>> some_prompts(int64_t vocab) {
  std::vector<std::vector<int64_t>> out;
  SequenceRng rng(91);
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int64_t> p(3 + rng.next() % 8);
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng.next() % (vocab - 3));
    out.push_back(p);
  }
  return out;
}

// A tenth of the vocabulary stops a turn: most sequences stop within a few
// tokens.
SamplingParams stopping(int64_t vocab, int64_t max_new, double temperature) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.log_probs = true;
  p.seed = 5;
  for (int64_t t = 3; t < vocab; t += 10) p.stop_token_ids.push_back(t);
  return p;
}

// Appends `tokens` (shifted by the request, so rows differ) at a sequence's
// first stop; finishes it at the second.
struct FixedTool : TurnHandler {
  std::vector<int64_t> tokens;
  int64_t calls = 0;
  explicit FixedTool(std::vector<int64_t> t) : tokens(std::move(t)) {}
  std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
      const GeneratedSequence& seq) override {
    ++calls;
    if (seq.turns > 1) return std::nullopt;
    std::vector<int64_t> mine = tokens;
    for (auto& t : mine) t += seq.request;
    std::promise<std::vector<int64_t>> p;
    p.set_value(mine);
    return p.get_future().share();
  }
};

class MultiTurn : public ::testing::TestWithParam<std::string> {};

// Greedy, host loop, device loop and packed CPU steps: a two-turn trajectory
// is the first turn, the appended tokens, then exactly what a greedy
// continuation of prompt + first turn + appended tokens generates; the
// appended tokens are masked out and carry log-prob 0; the prefill covers
// each prompt once plus the appended tokens (the kept cache is not
// recomputed); every block goes back.
TEST_P(MultiTurn, ATurnContinuesOnItsKeptCacheAsTheLongerPromptWould) {
  auto model = test::load_fixture_model(GetParam());
  const int64_t vocab = model->config().vocab_size;
  const auto ps = some_prompts(vocab);
  const SamplingParams params = stopping(vocab, 20, 0);
  const std::vector<int64_t> appended{4, 9, 14, 21, 30};
  GenerationOptions host;
  host.packed_cpu_steps = false;
  host.device_decode_steps = 0;
  GenerationOptions device = host;
  device.device_decode_steps = 4;
  GenerationOptions packed;
  packed.packed_cpu_steps = true;
  for (const auto& [name, options] :
       std::vector<std::pair<std::string, GenerationOptions>>{
           {"host loop", host}, {"device loop", device}, {"packed", packed}}) {
    SCOPED_TRACE(name);
    GenerationEngine engine(model, GenerationOptions(options).set_cache_bytes(1 << 20));
    FixedTool tool(appended);
    const auto out = engine.generate(ps, params, {}, {}, &tool);
    const GenerationStats stats = engine.last_stats();
    ASSERT_EQ(out.size(), ps.size());
    // prefilled: each prompt, then for each sequence that continued, its
    // stop token (sampled, not yet fed) and the appended tokens.
    int64_t two_turns = 0, prompt_tokens = 0, prefilled_after = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const GeneratedSequence& s = out[i];
      SCOPED_TRACE("sequence " + std::to_string(i));
      prompt_tokens += static_cast<int64_t>(s.prompt.size());
      ASSERT_EQ(s.generated_mask.size(), s.response.size());
      ASSERT_EQ(s.log_probs.size(), s.response.size());
      if (std::count(s.generated_mask.begin(), s.generated_mask.end(), 0) == 0) {
        EXPECT_EQ(s.turns, 1);
        continue;
      }
      ++two_turns;
      // The first turn ends at its stop token; the appended tokens follow.
      const auto first_zero = std::find(s.generated_mask.begin(), s.generated_mask.end(), 0);
      const int64_t turn1 = first_zero - s.generated_mask.begin();
      ASSERT_GT(turn1, 0);
      const std::set<int64_t> stop(params.stop_token_ids.begin(), params.stop_token_ids.end());
      EXPECT_TRUE(stop.count(s.response[turn1 - 1])) << "the first turn ends at a stop token";
      const int64_t added = std::min<int64_t>(appended.size(), params.max_new_tokens - turn1);
      if (turn1 + added < params.max_new_tokens) prefilled_after += 1 + added;
      for (int64_t j = 0; j < added; ++j) {
        EXPECT_EQ(s.response[turn1 + j], appended[j] + s.request);
        EXPECT_EQ(s.generated_mask[turn1 + j], 0);
        EXPECT_EQ(s.log_probs[turn1 + j], 0.0f);
      }
      for (size_t j = turn1 + added; j < s.response.size(); ++j) EXPECT_EQ(s.generated_mask[j], 1);
      EXPECT_EQ(s.turns, turn1 + added < params.max_new_tokens ? 2 : 1);
      // The same tokens as one prompt, continued greedily.
      std::vector<int64_t> longer = s.prompt;
      longer.insert(longer.end(), s.response.begin(), s.response.begin() + turn1 + added);
      if (turn1 + added >= params.max_new_tokens) continue;
      GenerationEngine reference(model, GenerationOptions(host).set_cache_bytes(1 << 20));
      const auto want =
          reference.generate({longer}, params, {}, {Continuation{0, turn1 + added}})[0];
      const std::vector<int64_t> rest(s.response.begin() + turn1 + added, s.response.end());
      EXPECT_EQ(rest, want.response);
      EXPECT_EQ(s.finish_reason, want.finish_reason);
      const Tolerance tol =
          Tolerance::fp32(test::log_prob_terms(model->config(), 10 + params.max_new_tokens),
                          test::max_abs_logit(*model, {longer}));
      const std::vector<float> rest_lp(s.log_probs.begin() + turn1 + added, s.log_probs.end());
      expect_close(rest_lp, want.log_probs, tol, "the second turn's log-probs");
    }
    EXPECT_GT(two_turns, 0) << "the stop ids were meant to end some first turns";
    EXPECT_EQ(stats.turn_pauses, two_turns);
    EXPECT_EQ(stats.preemptions, 0);
    // Each prompt once, then only what the turns added: nothing recomputed.
    EXPECT_EQ(stats.prefill_tokens, prompt_tokens + prefilled_after);
    EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MultiTurn, ::testing::Values("tiny-llama", "tiny-qwen2"));

// While one sequence waits on its turn, the others go on decoding: the first
// pause's tokens are released only by another sequence's later stop (a
// watchdog releases them after 30 s so that a wrong engine fails rather than
// hangs).
TEST(MultiTurn, OtherSequencesDecodeWhileOneWaitsOnItsTurn) {
  auto model = test::load_fixture_model("tiny-llama");
  const int64_t vocab = model->config().vocab_size;
  SamplingParams params = stopping(vocab, 24, 1.0);
  params.n = 4;
  struct HeldTool : TurnHandler {
    std::promise<std::vector<int64_t>> first;
    std::shared_future<std::vector<int64_t>> first_future = first.get_future().share();
    std::once_flag paused_once, released_once;
    bool paused_any = false;
    bool released_by_another = false;
    std::pair<int64_t, int64_t> held{-1, -1};
    std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
        const GeneratedSequence& seq) override {
      if (!paused_any) {
        paused_any = true;
        held = {seq.request, seq.sample};
        return first_future;
      }
      if (std::pair{seq.request, seq.sample} != held) {
        std::call_once(released_once, [&] {
          released_by_another = true;
          first.set_value({5, 6, 7});
        });
      }
      return std::nullopt;
    }
  } tool;
  std::thread watchdog([&] {
    if (tool.first_future.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      std::call_once(tool.released_once, [&] { tool.first.set_value({5, 6, 7}); });
  });
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  const auto out = engine.generate({{3, 4, 5, 6}}, params, {}, {}, &tool);
  watchdog.join();
  ASSERT_TRUE(tool.paused_any) << "no sequence stopped";
  EXPECT_TRUE(tool.released_by_another)
      << "the engine waited on the paused sequence instead of decoding the others";
  for (const auto& s : out) {
    const int64_t appended = std::count(s.generated_mask.begin(), s.generated_mask.end(), 0);
    if (std::pair{s.request, s.sample} == tool.held)
      EXPECT_GT(appended, 0) << "the held sequence's tokens were appended";
    else
      EXPECT_EQ(appended, 0);
  }
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
}

// Appended tokens count against max_new_tokens: past it they are cut and the
// sequence ends with "length".
TEST(MultiTurn, AppendedTokensPastTheBudgetAreCutAndEndTheSequence) {
  auto model = test::load_fixture_model("tiny-qwen2");
  const int64_t vocab = model->config().vocab_size;
  const SamplingParams params = stopping(vocab, 12, 0);
  FixedTool tool(std::vector<int64_t>(40, 7));
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  const auto out = engine.generate(some_prompts(vocab), params, {}, {}, &tool);
  int64_t cut = 0;
  for (const auto& s : out) {
    EXPECT_LE(static_cast<int64_t>(s.response.size()), params.max_new_tokens);
    if (s.turns == 1 && std::count(s.generated_mask.begin(), s.generated_mask.end(), 0) > 0) {
      ++cut;
      EXPECT_EQ(static_cast<int64_t>(s.response.size()), params.max_new_tokens);
      EXPECT_EQ(s.finish_reason, "length");
      EXPECT_EQ(s.generated_mask.back(), 0);
    }
  }
  EXPECT_GT(cut, 0) << "some sequence was meant to stop and be cut";
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
}

// A turn whose tokens fail (a tool that threw) ends the call with its error;
// a token outside the vocabulary is named; every block goes back either way.
TEST(MultiTurn, AFailedTurnEndsTheCallAndReleasesEveryBlock) {
  auto model = test::load_fixture_model("tiny-llama");
  const int64_t vocab = model->config().vocab_size;
  const SamplingParams params = stopping(vocab, 16, 0);
  struct Failing : TurnHandler {
    std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
        const GeneratedSequence&) override {
      std::promise<std::vector<int64_t>> p;
      p.set_exception(std::make_exception_ptr(std::runtime_error("the tool pool died")));
      return p.get_future().share();
    }
  } failing;
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  expect_error([&] { engine.generate(some_prompts(vocab), params, {}, {}, &failing); },
               {"the turn of request", "failed: the tool pool died"});
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
  FixedTool outside({vocab + 3});
  expect_error([&] { engine.generate(some_prompts(vocab), params, {}, {}, &outside); },
               {"the turn appended to request", "outside the vocabulary"});
  EXPECT_EQ(engine.cache().free_blocks(), engine.cache().usable_blocks());
}

}  // namespace
}  // namespace baton::engine
