// The HybridEngine over real Gloo processes: training layouts TP2 × PP2,
// TP2 and PP2 switch into rollout layouts TP2 and TP1, generate what the
// single-process engine generates on the full HF weights, report rollout
// log-probs that agree with the training engine's log-probs of the same tokens
// (within the rounding of a log-prob's chain, model_tolerance.h), free the
// rollout memory on exit (or keep the KV cache, free_cache off), and after an
// optimizer step generate from the new weights.
#include "engine/rollout/hybrid_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::run_world;
using test::Tolerance;
using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

const std::vector<std::vector<int64_t>> kPrompts = {
    {5, 17, 33, 9}, {60}, {12, 7, 99, 4, 31, 8, 77}, {3, 3, 3}, {101, 55}, {9, 8, 7, 6, 5}};

SamplingParams sampled() {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.95;
  p.max_new_tokens = 8;
  p.n = 2;
  p.seed = 77;
  return p;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 8;
  p.ignore_eos = true;
  return p;
}

// The training model of this rank, loaded from the fixture for its layout.
std::shared_ptr<Transformer> training_model(const std::string& fixture,
                                            std::shared_ptr<ParallelState> ps) {
  auto dir = kFixtures + "/" + fixture;
  auto cfg = ModelConfig::load(dir);
  ps->set_num_layers(cfg.num_layers);
  const auto& pc = ps->config();
  auto split = pc.layer_split.empty() ? even_layer_split(cfg.num_layers, pc.pp) : pc.layer_split;
  auto model = std::make_shared<Transformer>(cfg, ps);
  model->load_state_dict(
      hf_to_shard(read_hf_weights(dir), cfg,
                  ShardSpec::for_rank(cfg, ps->coords().tp, pc.tp, ps->coords().pp, split)));
  return model;
}

// What one process generates on the full weights of `model_weights`.
std::vector<GeneratedSequence> reference(const ModelConfig& cfg, const TensorMap& full,
                                         const SamplingParams& params) {
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  model->load_state_dict(
      hf_to_shard(full, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
  GenerationEngine engine(model, GenerationOptions().set_cache_bytes(1 << 20));
  return engine.generate(kPrompts, params);
}

std::vector<int64_t> tokens_of(const GeneratedSequence& s) {
  std::vector<int64_t> all = s.prompt;
  all.insert(all.end(), s.response.begin(), s.response.end());
  return all;
}

// Log-probs of the same tokens from a rollout layout and from one process
// differ by kernels and the TP split: the chain of a log-prob over the
// longest sequence, at the scale of the one-process model's logits.
Tolerance log_prob_tolerance(const ModelConfig& cfg, const TensorMap& full,
                             const std::vector<GeneratedSequence>& seqs) {
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  model->load_state_dict(
      hf_to_shard(full, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
  std::vector<std::vector<int64_t>> all;
  size_t longest = 0;
  for (const auto& s : seqs) {
    all.push_back(tokens_of(s));
    longest = std::max(longest, all.back().size());
  }
  return Tolerance::fp32(test::log_prob_terms(cfg, static_cast<int64_t>(longest)),
                         test::max_abs_logit(*model, all));
}

void expect_same_sequences(const std::vector<GeneratedSequence>& got,
                           const std::vector<GeneratedSequence>& want, const Tolerance& tol,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].response, want[i].response) << what << " sequence " << i;
    expect_close(got[i].log_probs, want[i].log_probs, tol, what + " sequence " + std::to_string(i));
  }
}

// expect_same_sequences against what one process generates on `full`.
void expect_reference_sequences(const std::vector<GeneratedSequence>& got, const ModelConfig& cfg,
                                const TensorMap& full, const SamplingParams& params,
                                const std::string& what) {
  const auto want = reference(cfg, full, params);
  expect_same_sequences(got, want, log_prob_tolerance(cfg, full, want), what);
}

// The training engine's log-probs of the batch's response tokens (pipeline
// forward; defined on the last stage only), and the tolerance of comparing
// them with the rollout's: the chain of a log-prob, at the scale of the
// logits.
struct TrainingLogProbs {
  at::Tensor log_probs;
  Tolerance tolerance;
};

TrainingLogProbs training_log_probs(Transformer& model, const RolloutBatch& batch) {
  MicroBatch mb;
  mb.input_ids = batch.input_ids;
  mb.position_ids = batch.position_ids;
  mb.attention_mask = batch.attention_mask;
  int64_t p = batch.prompts.size(1), r = batch.responses.size(1);
  const Group& tp = model.parallel().tp();
  double scale = 1;
  auto out = forward_only(model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
    // The largest |logit| over the TP group (a shard may hold only padding).
    std::vector<at::Tensor> shard_max{
        at::full({1}, test::max_abs(logits, m.attention_mask), at::kDouble)};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    tp.pg->allreduce(shard_max, max)->wait();
    scale = std::max(scale, shard_max[0].item<double>());
    return next_token_log_probs(logits, m.input_ids, tp).narrow(1, p - 1, r);
  });
  return {out.empty() ? at::Tensor() : out[0],
          Tolerance::fp32(test::log_prob_terms(model.config(), p + r), scale)};
}

TEST(HybridEngine, Tp2Pp2TrainingGeneratesInTp2RolloutAndFollowsTraining) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.tp = 2;
    pc.pp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto train = training_model("tiny-qwen2", ps);
    const auto& cfg = train->config();
    auto full = read_hf_weights(kFixtures + "/tiny-qwen2");
    HybridEngineOptions options;
    options.rollout_tp = 2;
    options.generation.cache.budget_bytes = 1 << 20;
    options.reshard.bucket_bytes = 16 << 10;
    HybridEngine hybrid(train, store, options);
    EXPECT_EQ(hybrid.rollout_replicas(), 2);
    EXPECT_EQ(hybrid.rollout_replica(), rank / 2);
    expect_error([&] { hybrid.generate(kPrompts, greedy()); }, {"not in rollout"});

    // Gradients from a backward exist before the rollout and are released by it.
    std::vector<MicroBatch> mbs(1);
    mbs[0].input_ids =
        at::tensor(std::vector<int64_t>{5, 17, 33, 9, 60, 12}, at::kLong).view({1, 6});
    mbs[0].position_ids = at::arange(6, at::kLong).view({1, 6});
    mbs[0].attention_mask = at::ones({1, 6}, at::kLong);
    const Group& tp = ps->tp();
    forward_backward(*train, mbs, [&](const at::Tensor& logits, const MicroBatch& mb) {
      return -next_token_log_probs(logits, mb.input_ids, tp).mean();
    });
    ASSERT_TRUE(train->named_params()[0].second.grad().defined());

    auto stats = hybrid.enter_rollout();
    EXPECT_GT(stats.buckets, 1);
    for (const auto& [name, p] : train->named_params())
      EXPECT_FALSE(p.grad().defined()) << name << " kept its gradient during rollout";
    EXPECT_GT(hybrid.rollout_bytes(), 0);
    expect_error([&] { hybrid.enter_rollout(); }, {"already in rollout"});

    // Both replicas (ranks 0-1 and 2-3) generate what one process does.
    expect_reference_sequences(hybrid.generate(kPrompts, greedy()), cfg, full, greedy(), "greedy");
    auto seqs = hybrid.generate(kPrompts, sampled());
    expect_reference_sequences(seqs, cfg, full, sampled(), "sampled");

    // Rollout log-probs against the training engine's, same tokens.
    auto batch = to_rollout_batch(seqs);
    hybrid.exit_rollout();
    EXPECT_FALSE(hybrid.in_rollout());
    EXPECT_EQ(hybrid.rollout_bytes(), 0);
    auto before = training_log_probs(*train, batch);
    ASSERT_EQ(before.log_probs.defined(), train->last_stage());
    if (before.log_probs.defined())
      expect_close(batch.rollout_log_probs, before.log_probs, before.tolerance,
                   "rollout vs training log-probs", batch.response_mask);

    // One optimizer step on the rollout batch; the next rollout follows it.
    Optimizer opt(train, OptimizerOptions().set_lr(2e-2));
    opt.zero_grad();
    MicroBatch step;
    step.input_ids = batch.input_ids;
    step.position_ids = batch.position_ids;
    step.attention_mask = batch.attention_mask;
    forward_backward(*train, {step}, [&](const at::Tensor& logits, const MicroBatch& mb) {
      return -next_token_log_probs(logits, mb.input_ids, tp).mean();
    });
    opt.step();
    auto old_tokens_now = training_log_probs(*train, batch);
    if (old_tokens_now.log_probs.defined()) {
      EXPECT_FALSE(test::tensors_close(old_tokens_now.log_probs, before.log_probs,
                                       old_tokens_now.tolerance, batch.response_mask))
          << "the step was meant to change the log-probs beyond rounding";
    }

    hybrid.enter_rollout();
    auto after = to_rollout_batch(hybrid.generate(kPrompts, sampled()));
    hybrid.exit_rollout();
    auto train_after = training_log_probs(*train, after);
    if (train_after.log_probs.defined())
      expect_close(after.rollout_log_probs, train_after.log_probs, train_after.tolerance,
                   "rollout after the step must use the new weights", after.response_mask);
  });
}

struct Layouts {
  std::string name;
  int64_t tp, pp, rollout_tp;
};

void PrintTo(const Layouts& l, std::ostream* os) { *os << l.name; }

class HybridLayouts : public ::testing::TestWithParam<Layouts> {};

// Layout `l`'s training model of tiny-llama on this rank of a world of 2, the
// fixture's HF weights, and HybridEngine options for its rollout layout.
struct LayoutRun {
  std::shared_ptr<Transformer> train;
  TensorMap full;
  HybridEngineOptions options;
};

LayoutRun layout_run(const Layouts& l, int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
  ParallelConfig pc;
  pc.tp = l.tp;
  pc.pp = l.pp;
  pc.dp = 2 / (l.tp * l.pp);
  LayoutRun run;
  run.train = training_model("tiny-llama", ParallelState::create(store, rank, pc));
  run.full = read_hf_weights(kFixtures + "/tiny-llama");
  run.options.rollout_tp = l.rollout_tp;
  run.options.generation.cache.budget_bytes = 1 << 20;
  return run;
}

TEST_P(HybridLayouts, RolloutGeneratesWhatOneProcessGenerates) {
  const Layouts l = GetParam();
  run_world(2, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto [train, full, options] = layout_run(l, rank, store);
    HybridEngine hybrid(train, store, options);
    const ReshardStats stats = hybrid.enter_rollout();
    EXPECT_EQ(hybrid.rollout_replicas(), 2 / l.rollout_tp);
    // Pure DP: the rollout is the training model itself, nothing resharded.
    const bool shared = l.tp == 1 && l.pp == 1 && l.rollout_tp == 1;
    EXPECT_EQ(hybrid.shares_training_weights(), shared);
    EXPECT_EQ(&hybrid.rollout_model() == train.get(), shared);
    EXPECT_EQ(stats.buckets == 0, shared);
    EXPECT_GT(stats.model_bytes, 0);
    expect_reference_sequences(hybrid.generate(kPrompts, greedy()), train->config(), full, greedy(),
                               l.name);
    expect_reference_sequences(hybrid.generate(kPrompts, sampled()), train->config(), full,
                               sampled(), l.name);
    hybrid.exit_rollout();
  });
}

// free_cache_engine off (HybridEngineOptions::free_cache): the KV cache is
// allocated at the first rollout and stays between rollouts while a
// resharded copy's weights are freed, and every rollout, also after the
// training weights changed, generates what an engine that frees the cache
// each time generates.
TEST_P(HybridLayouts, KeptCacheStaysBetweenRolloutsAndGeneratesTheSameTokens) {
  const Layouts l = GetParam();
  run_world(2, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto [train, full, options] = layout_run(l, rank, store);
    HybridEngine freed(train, store, options);
    HybridEngine kept(train, store, HybridEngineOptions(options).set_free_cache(false));
    EXPECT_EQ(kept.kv_cache_bytes(), 0) << "allocated before the first rollout";
    const bool shared = l.tp == 1 && l.pp == 1 && l.rollout_tp == 1;
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(l.name + ", rollout " + std::to_string(round));
      freed.enter_rollout();
      const auto want_greedy = freed.generate(kPrompts, greedy());
      const auto want_sampled = freed.generate(kPrompts, sampled());
      freed.exit_rollout();
      EXPECT_EQ(freed.kv_cache_bytes(), 0);

      kept.enter_rollout();
      const int64_t cache = kept.kv_cache_bytes();
      EXPECT_GT(cache, 0);
      const auto got_greedy = kept.generate(kPrompts, greedy());
      const auto got_sampled = kept.generate(kPrompts, sampled());
      const at::Tensor weight = kept.rollout_model().named_params().front().second;
      kept.exit_rollout();
      EXPECT_FALSE(kept.in_rollout());
      EXPECT_EQ(kept.kv_cache_bytes(), cache);
      // Outside rollout only the cache is held: a resharded copy's weights
      // are freed (the training model's, shared, are not the rollout's).
      EXPECT_EQ(kept.rollout_bytes(), cache);
      EXPECT_EQ(weight.storage().nbytes() == 0, !shared);

      const Tolerance tol = log_prob_tolerance(train->config(), full, want_sampled);
      expect_same_sequences(got_greedy, want_greedy, tol, "greedy");
      expect_same_sequences(got_sampled, want_sampled, tol, "sampled");

      // New training weights: the next rollout must reshard them into the
      // kept model (or generate with them, shared).
      at::NoGradGuard no_grad;
      for (auto& [name, p] : train->named_params()) p.mul_(1.05);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridLayouts,
                         ::testing::Values(Layouts{"tp2_to_tp1", 2, 1, 1},
                                           Layouts{"pp2_to_tp2", 1, 2, 2},
                                           Layouts{"dp2_to_tp1", 1, 1, 1}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace baton::engine
