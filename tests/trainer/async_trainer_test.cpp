// The fully-async trainer end to end (trainer/async/async_trainer.h), and its
// RolloutWorker's weight sync: one actor and one RolloutWorker process on the toy task's data and
// its untrained tiny model, the rollouter generating while the actor trains, weights synced through
// WeightSender/WeightReceiver.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <chrono>
#include <cstdlib>
#include <future>
#include <thread>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "engine/io/hf_model.h"
#include "runtime/resource_pool.h"
#include "runtime/worker_group.h"
#include "tests/engine/temp_dir.h"
#include "tests/tolerance.h"
#include "tests/trainer/toy_task_fixture.h"
#include "trainer/async/chunked_rollout.h"
#include "trainer/async/rollout_ledger.h"
#include "trainer/config/config.h"
#include "trainer/ppo_trainer.h"
#include "workers/rewards/reward_registry.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/rollout_worker.h"

namespace baton::trainer {
namespace {

// The untrained toy model never answers right, so the GSM8K reward would be 0
// everywhere and GRPO's advantages with it: this one (digits in the response,
// a tenth each) differs between samples, so every update has a gradient.
BATON_REWARD_FUNCTION("test_async_digits", [](const rewards::RewardInput& in) {
  double digits = 0;
  for (char ch : in.response) digits += (ch >= '0' && ch <= '9') ? 0.1 : 0.0;
  return digits;
});

namespace fs = std::filesystem;
using engine::testing::TempDir;

class AsyncTrainerTest : public ToyTaskTest {
 protected:
  // configs/grpo_toy_async.yaml on the toy data, small and short.
  static Config config(const fs::path& out) {
    return toy_config("grpo_toy_async", out,
                      {
                          "data.train_batch_size=4",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                          "actor_rollout_ref.rollout.n=2",
                          "trainer.total_training_steps=5",
                          "trainer.test_freq=5",
                          "trainer.val_before_train=false",
                          "custom_reward_function.name=test_async_digits",
                          // A larger rate than the toy config's, so that each update moves the
                          // rollout's next batches measurably off the actor's weights.
                          "actor_rollout_ref.actor.optim.lr=1e-3",
                      });
  }

  static std::vector<nlohmann::json> steps_of(const fs::path& out) {
    std::vector<nlohmann::json> steps;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("async/param_version")) steps.push_back(j);
    }
    return steps;
  }
};

// The fixture's configs for the free functions below.
struct AsyncTrainerTestAccess : AsyncTrainerTest {
  using AsyncTrainerTest::config;
};

double metric(const nlohmann::json& j, const std::string& key) {
  EXPECT_TRUE(j.contains(key)) << "missing metric " << key << " in " << j.dump();
  return j.contains(key) ? j.at(key).get<double>() : NAN;
}

TEST_F(AsyncTrainerTest, WaitPolicyTrainsWithinTheStalenessThresholdAndVersionsIncrease) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides(
      {"async_training.trigger_parameter_sync_step=2", "async_training.staleness_threshold=2"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 5);
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
  for (const char* key : {"actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
                          "async/staleness_mean", "async/staleness_max", "async/queue_depth",
                          "async/rollouter_idle_s", "async/trainer_idle_s", "async/sync_s",
                          "async/tis_weight_mean", "async/tis_clip_frac", "async/dropped_batches",
                          "timing_s/gen", "timing_s/update_actor", "perf/throughput",
                          // trainer.balance_batch (on by default) applies here too.
                          "global_seqlen/balanced_max"}) {
    EXPECT_EQ(r.last_metrics.count(key), 1u) << "missing metric " << key;
  }
  EXPECT_GT(r.last_metrics.at("actor/grad_norm"), 0);
  EXPECT_LE(r.last_metrics.at("async/staleness_max"), 2);
  EXPECT_EQ(r.last_metrics.at("async/dropped_batches"), 0);
  EXPECT_FALSE(r.last_validation.empty());
  // Truncated IS: the weights are capped at tis_cap (2) and positive.
  EXPECT_GT(r.last_metrics.at("async/tis_weight_mean"), 0);
  EXPECT_LE(r.last_metrics.at("async/tis_weight_mean"), 2.0);

  const std::vector<nlohmann::json> steps = steps_of(out.path());
  ASSERT_EQ(steps.size(), 5u);
  double previous = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    const double version = metric(steps[i], "async/param_version");
    const double staleness = metric(steps[i], "async/staleness");
    // Versions never go back; the batch of step t was made with weights of
    // version t - 1 - staleness, at most threshold (2) behind.
    EXPECT_GE(version, previous);
    previous = version;
    EXPECT_EQ(version, static_cast<double>(i) - staleness);
    EXPECT_GE(staleness, 0);
    EXPECT_LE(staleness, 2);
  }
  // The weights were synced (every 2 steps): later batches carry newer versions.
  EXPECT_GE(metric(steps.back(), "async/param_version"), 2);
  EXPECT_GT(metric(steps[1], "async/sync_s"), 0);
  EXPECT_NO_THROW(engine::load_hf_model(r.hf_dir));
}

TEST_F(AsyncTrainerTest, DropPolicyTrainsEveryStepWithoutStaleBatches) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides({"async_training.staleness_policy=drop", "async_training.staleness_threshold=0",
                     "async_training.max_queue_size=1", "trainer.total_training_steps=3",
                     "trainer.test_freq=-1", "async_training.tis_cap=null"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.last_metrics.at("async/staleness_max"), 0);
  EXPECT_EQ(r.last_metrics.count("async/tis_weight_mean"), 0u);
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
}

// algorithm.rollout_correction in the async loop (its TIS off): sequence-
// level IS weights of stale batches, with verl's metrics.
TEST_F(AsyncTrainerTest, RolloutCorrectionReplacesTheAsyncTis) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides({"trainer.total_training_steps=2", "trainer.test_freq=-1",
                     "async_training.tis_cap=null",
                     "algorithm.rollout_correction.rollout_is=sequence",
                     "algorithm.rollout_correction.rollout_is_threshold=5.0"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.last_metrics.count("async/tis_weight_mean"), 0u);
  for (const char* key : {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_seq_max",
                          "rollout_corr/chi2_seq", "rollout_corr/kl"})
    EXPECT_EQ(r.last_metrics.count(key), 1u) << "missing metric " << key;
  EXPECT_LE(r.last_metrics.at("rollout_corr/rollout_is_seq_max"), 5.0);
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
}

// A reward model (centralized, its scoring overlapping the log-prob pass)
// scores the async trainer's batches as it does the synchronous loop's: its
// scores replace the rule reward's (the test reward gives multiples of 0.1).
TEST_F(AsyncTrainerTest, ACentralizedRewardModelScoresTheAsyncBatches) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides(
      {"reward_model.enable=true", "reward_model.model.path=" + (toy_->path() / "model").string(),
       "reward_model.centralized=true", "trainer.total_training_steps=2", "trainer.test_freq=-1"});
  const FitResult r = PpoTrainer(c).fit();
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.last_metrics.count("timing_s/reward_wait"), 1u);
  EXPECT_GT(r.last_metrics.at("reward_model/param_bytes_per_training_rank"), 0);
  const double score = r.last_metrics.at("critic/score/mean");
  EXPECT_TRUE(std::isfinite(score));
  EXPECT_GT(std::abs(score * 10 - std::round(score * 10)), 1e-6) << score;
}

// PPO with a critic (GAE) in the async loop: values of each popped batch,
// the critic's update beside the actor's.
TEST_F(AsyncTrainerTest, PpoWithACriticTrainsInTheAsyncLoop) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides({"algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4",
                     "trainer.total_training_steps=2", "trainer.test_freq=-1"});
  const FitResult r = PpoTrainer(c).fit();
  EXPECT_EQ(r.steps, 2);
  for (const char* key : {"critic/vf_loss", "critic/grad_norm", "critic/values/mean",
                          "timing_s/values", "timing_s/update_critic", "actor/pg_loss"})
    EXPECT_EQ(r.last_metrics.count(key), 1u) << "missing metric " << key;
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
  EXPECT_GT(r.last_metrics.at("critic/grad_norm"), 0);
}

// The runs below are on-policy (threshold 0, a sync every step): the batch of
// step t is made with the weights after step t - 1 whatever the timing, so an
// async run repeats exactly, and a resumed or restarted one must equal it.
Config on_policy_config(const fs::path& out, const std::vector<std::string>& more) {
  Config c = AsyncTrainerTestAccess::config(out);
  c.apply_overrides({"async_training.staleness_threshold=0",
                     "async_training.trigger_parameter_sync_step=1", "trainer.test_freq=-1",
                     "trainer.total_training_steps=4"});
  c.apply_overrides(more);
  return c;
}

// As the synchronous resume test: the discrete outcomes exactly, the losses
// and norms to fp32 rounding (MKL's kernels may differ in a new process).
void expect_same_step(const nlohmann::json& got, const nlohmann::json& want) {
  for (const char* k : {"critic/score/mean", "response_length/mean", "async/param_version"})
    EXPECT_EQ(metric(got, k), metric(want, k)) << k;
  for (const char* k : {"actor/pg_loss", "actor/grad_norm"}) {
    const double w = metric(want, k);
    test::expect_near(metric(got, k), w, test::Tolerance::fp32(1000, std::abs(w)), k);
  }
}

// A checkpoint written while batches are queued or being generated holds
// them (the rollout ledger); the resumed run trains them first and goes on
// exactly as the uninterrupted run did.
TEST_F(AsyncTrainerTest, AResumeTrainsTheSavedQueueAndInFlightBatchesAndContinuesExactly) {
  TempDir straight, resumed_dir;
  const FitResult expected =
      PpoTrainer(on_policy_config(straight.path(), {"trainer.save_freq=2"})).fit();
  ASSERT_EQ(expected.steps, 4);
  const fs::path ckpt = straight.path() / "global_step_2";
  ASSERT_TRUE(fs::exists(ckpt / "rollout_ledger" / "rollout_ledger.json"));
  // After step 2's sync the rollouter may start step 3's batch at once: it is
  // in the ledger, generated or not, unless the save came first.
  const std::vector<LedgerEntry> saved = load_ledger(ckpt / "rollout_ledger");
  EXPECT_LE(saved.size(), 1u);
  for (const LedgerEntry& e : saved) EXPECT_EQ(e.step, 3);

  const FitResult resumed =
      PpoTrainer(on_policy_config(resumed_dir.path(),
                                  {"trainer.resume_mode=resume_path",
                                   "trainer.resume_from_path=" + ckpt.string()}))
          .fit();
  ASSERT_EQ(resumed.steps, 4);
  const std::vector<nlohmann::json> want = steps_of(straight.path());
  const std::vector<nlohmann::json> got = steps_of(resumed_dir.path());
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 3));
    expect_same_step(got[i], want[i + 2]);
  }
  // It says what it restored: the samples of the saved entries, at its first step.
  const int64_t samples = ledger_samples(saved, /*n=*/2);
  if (samples > 0) {
    EXPECT_EQ(metric(got[0], "async/restored_samples"), static_cast<double>(samples));
  } else {
    EXPECT_FALSE(got[0].contains("async/restored_samples"));
  }
  EXPECT_FALSE(got[1].contains("async/restored_samples"));
}

// A rollout worker killed mid-run: the trainer reports it, spawns a new
// rollout group with the actor's weights, generates the lost batch again, and
// the run equals the uninterrupted one. A second failure beyond
// max_rollout_restarts would stop the run (the next test).
TEST_F(AsyncTrainerTest, AKilledRolloutWorkerIsRestartedAndTheRunEqualsAnUninterruptedOne) {
  TempDir straight, killed;
  const FitResult expected = PpoTrainer(on_policy_config(straight.path(), {})).fit();
  ASSERT_EQ(expected.steps, 4);

  PpoTrainer trainer(on_policy_config(killed.path(), {}));
  std::future<FitResult> run = std::async(std::launch::async, [&] { return trainer.fit(); });
  // Once step 2 is logged, kill the rollout worker (it is generating or
  // waiting for step 3's batch).
  ASSERT_TRUE(kill_a_worker_once_logged(killed.path(), workers::rollout_worker_class(), 2, run))
      << "no rollout worker to kill after step 2";
  const FitResult r = run.get();
  ASSERT_EQ(r.steps, 4);
  EXPECT_EQ(r.last_metrics.at("async/rollout_restarts"), 1);
  const std::vector<nlohmann::json> want = steps_of(straight.path());
  const std::vector<nlohmann::json> got = steps_of(killed.path());
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    expect_same_step(got[i], want[i]);
  }
}

TEST_F(AsyncTrainerTest, ARolloutFailureBeyondMaxRolloutRestartsStopsTheRunNamingIt) {
  TempDir out;
  PpoTrainer trainer(on_policy_config(out.path(), {"async_training.max_rollout_restarts=0",
                                                   "trainer.total_training_steps=50"}));
  std::future<FitResult> run = std::async(std::launch::async, [&] { return trainer.fit(); });
  ASSERT_TRUE(kill_a_worker_once_logged(out.path(), workers::rollout_worker_class(), 1, run));
  try {
    run.get();
    FAIL() << "the run went on without its rollout";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the rollout failed at step"), std::string::npos) << what;
    EXPECT_NE(what.find("max_rollout_restarts = 0"), std::string::npos) << what;
    EXPECT_NE(what.find("RolloutWorker"), std::string::npos) << what;
  }
}

// The RolloutWorker's generation after a weight sync is the actor's own
// (colocated HybridEngine, same weights, same seeds), and before it the old
// weights'; every result carries the version it was made with.
TEST_F(AsyncTrainerTest, ARolloutWorkerGeneratesWithTheActorsWeightsOnceSynced) {
  workers::ActorRolloutRefOptions o;
  o.model.path = (toy_->path() / "model").string();
  o.rollout.response_length = 6;
  o.optim.lr = 5e-2;
  o.update.mini_batch_size = 4;
  o.update.micro_batch_size = 4;
  ResourcePool actor_pool = ResourcePool::cpu(1), rollout_pool = ResourcePool::cpu(1);
  WorkerGroup actor =
      WorkerGroup::spawn(workers::actor_rollout_ref_worker_class(), actor_pool, {o.to_json()});
  WorkerGroup rollout =
      WorkerGroup::spawn(workers::rollout_worker_class(), rollout_pool, {o.to_json(), int64_t{1}});
  actor.call("init_model", {}).get();
  rollout.call("init_model", {}).get();
  const Value endpoints = rollout.call("weight_sync_endpoint", {}).get();
  const std::string endpoint = endpoints.as_list().at(0).as_string();
  Future<Value> sender = actor.call("init_weight_sync", {endpoint, std::string("t"), int64_t{1}});
  rollout.call("init_weight_sync", {endpoint, std::string("t")}).get();
  sender.get();

  // Two prompts of the toy vocabulary (one token per character), 2 samples each.
  at::Tensor ids = at::tensor({5, 6, 7, 8, 9, 10, 11, 12}, at::kLong).view({2, 4});
  DataProto prompts;
  prompts.set_tensor("input_ids", ids);
  prompts.set_tensor("attention_mask", at::ones_like(ids));
  prompts.set_tensor("request_seed", at::tensor({3, 4}, at::kLong));
  prompts.set_meta("n", Value(int64_t{2}));
  prompts.set_meta("temperature", Value(1.0));
  auto generate = [&](WorkerGroup& g) {
    return g.call("generate_sequences", {prompts}).get().as<DataProto>();
  };
  const DataProto before = generate(rollout);
  EXPECT_EQ(before.meta_value("param_version")->as_int(), 0);
  EXPECT_TRUE(at::equal(before.tensor("responses"), generate(actor).tensor("responses")));

  // One update moves the actor off the weights the rollout holds.
  DataProto batch = generate(actor);
  batch.set_meta("temperature", Value(1.0));
  batch.set_tensor(
      "old_log_probs",
      actor.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs"));
  batch.set_tensor("advantages",
                   at::tensor({1.0f, -1.0f, -1.0f, 1.0f}).view({4, 1}).expand({4, 6}).contiguous());
  actor.call("update_actor", {batch}).get();
  const DataProto trained = generate(actor);
  const DataProto stale = generate(rollout);
  EXPECT_TRUE(at::equal(stale.tensor("rollout_log_probs"), before.tensor("rollout_log_probs")));
  EXPECT_FALSE(
      at::allclose(trained.tensor("rollout_log_probs"), before.tensor("rollout_log_probs")));

  Future<Value> sent = actor.call("send_weights", {int64_t{1}});
  const Value versions = rollout.call("receive_weights", {}).get();
  sent.get();
  EXPECT_EQ(versions.as_list().at(0).as_int(), 1);
  const DataProto synced = generate(rollout);
  EXPECT_EQ(synced.meta_value("param_version")->as_int(), 1);
  EXPECT_TRUE(at::equal(synced.tensor("responses"), trained.tensor("responses")));
  EXPECT_TRUE(at::allclose(synced.tensor("rollout_log_probs"), trained.tensor("rollout_log_probs"),
                           1e-5, 1e-6));
}

// Partial rollout (ChunkedRollout): a batch generated in chunks equals the
// one-call batch when the weights do not change, and a sync between chunks
// makes the unfinished samples continue from their prefix with the new
// weights, exactly as the actor would continue them.
class ChunkedRolloutTest : public AsyncTrainerTest {
 protected:
  void SetUp() override {
    o_.model.path = (toy_->path() / "model").string();
    o_.rollout.response_length = kLength;
    o_.optim.lr = 5e-2;
    o_.update.mini_batch_size = 4;
    o_.update.micro_batch_size = 4;
  }
  // Two prompts of the toy vocabulary, 2 samples each, sampled.
  static DataProto prompts() {
    at::Tensor ids = at::tensor({5, 6, 7, 8, 9, 10, 11, 12}, at::kLong).view({2, 4});
    DataProto p;
    p.set_tensor("input_ids", ids);
    p.set_tensor("attention_mask", at::ones_like(ids));
    p.set_tensor("request_seed", at::tensor({3, 4}, at::kLong));
    p.set_meta("n", Value(int64_t{2}));
    p.set_meta("temperature", Value(1.0));
    return p;
  }
  static DataProto generate(WorkerGroup& rollout, int64_t chunk, int64_t* calls = nullptr) {
    ChunkedRollout g(prompts(), kLength, chunk, /*replicas=*/1);
    while (!g.done()) g.step(rollout);
    if (calls != nullptr) *calls = g.calls();
    EXPECT_EQ(g.resumed_samples(), 0);
    return g.result();
  }
  static constexpr int64_t kLength = 8;
  workers::ActorRolloutRefOptions o_;
};

TEST_F(ChunkedRolloutTest, ChunksWithUnchangedWeightsGiveTheOneCallBatch) {
  ResourcePool pool = ResourcePool::cpu(1);
  WorkerGroup rollout =
      WorkerGroup::spawn(workers::rollout_worker_class(), pool, {o_.to_json(), int64_t{1}});
  rollout.call("init_model", {}).get();
  const DataProto plain = rollout.call("generate_sequences", {prompts()}).get().as<DataProto>();
  int64_t one_call = 0, chunked_calls = 0;
  const DataProto once = generate(rollout, kLength, &one_call);
  const DataProto chunked = generate(rollout, 3, &chunked_calls);
  EXPECT_EQ(one_call, 1);
  EXPECT_GE(chunked_calls, 2);
  for (const DataProto* d : {&once, &chunked}) {
    EXPECT_EQ(d->meta_value("param_version")->as_int(), 0);
    for (const char* k : {"prompts", "responses", "input_ids", "attention_mask", "position_ids",
                          "response_mask"})
      EXPECT_TRUE(at::equal(d->tensor(k), plain.tensor(k))) << k;
    // A continuation prefills its prefix instead of decoding it: fp32 rounding.
    EXPECT_TRUE(at::allclose(d->tensor("rollout_log_probs"), plain.tensor("rollout_log_probs"),
                             1e-4, 1e-5));
  }
  EXPECT_THROW(ChunkedRollout(prompts(), kLength, 0, 1), Error);
}

TEST_F(ChunkedRolloutTest, ASyncBetweenChunksContinuesTheUnfinishedSamplesWithTheNewWeights) {
  ResourcePool actor_pool = ResourcePool::cpu(1), rollout_pool = ResourcePool::cpu(1);
  WorkerGroup actor =
      WorkerGroup::spawn(workers::actor_rollout_ref_worker_class(), actor_pool, {o_.to_json()});
  WorkerGroup rollout =
      WorkerGroup::spawn(workers::rollout_worker_class(), rollout_pool, {o_.to_json(), int64_t{1}});
  actor.call("init_model", {}).get();
  rollout.call("init_model", {}).get();
  const std::string endpoint =
      rollout.call("weight_sync_endpoint", {}).get().as_list().at(0).as_string();
  Future<Value> sender = actor.call("init_weight_sync", {endpoint, std::string("t"), int64_t{1}});
  rollout.call("init_weight_sync", {endpoint, std::string("t")}).get();
  sender.get();
  const DataProto before = rollout.call("generate_sequences", {prompts()}).get().as<DataProto>();

  // The first chunk with version 0.
  constexpr int64_t kChunk = 3;
  ChunkedRollout g(prompts(), kLength, kChunk, 1);
  g.step(rollout);
  // One update of the actor, synced to the rollout as version 1.
  DataProto batch = actor.call("generate_sequences", {prompts()}).get().as<DataProto>();
  batch.set_meta("temperature", Value(1.0));
  batch.set_tensor(
      "old_log_probs",
      actor.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs"));
  batch.set_tensor("advantages", at::tensor({1.0f, -1.0f, -1.0f, 1.0f})
                                     .view({4, 1})
                                     .expand({4, kLength})
                                     .contiguous());
  actor.call("update_actor", {batch}).get();
  Future<Value> sent = actor.call("send_weights", {int64_t{1}});
  rollout.call("receive_weights", {}).get();
  sent.get();
  while (!g.done()) g.step(rollout);
  const DataProto out = g.result();
  EXPECT_EQ(out.meta_value("param_version")->as_int(), 0);  // the oldest version

  // The first chunk is version 0's: the one-call batch's tokens and log-probs.
  const at::Tensor first = out.tensor("responses").narrow(1, 0, kChunk);
  EXPECT_TRUE(at::equal(first, before.tensor("responses").narrow(1, 0, kChunk)));
  EXPECT_TRUE(at::allclose(out.tensor("rollout_log_probs").narrow(1, 0, kChunk),
                           before.tensor("rollout_log_probs").narrow(1, 0, kChunk), 1e-4, 1e-5));
  // The samples still running after it continue as the trained actor
  // continues the same prefix from the same stream position.
  const at::Tensor lengths = out.tensor("response_mask").sum(1);
  std::vector<int64_t> resumed;
  for (int64_t r = 0; r < out.size(); ++r)
    if (lengths[r].item<int64_t>() > kChunk) resumed.push_back(r);
  ASSERT_FALSE(resumed.empty()) << "every sample stopped within the first chunk";
  EXPECT_EQ(g.resumed_samples(), static_cast<int64_t>(resumed.size()));
  const int64_t rows = static_cast<int64_t>(resumed.size());
  at::Tensor ids = at::empty({rows, 4 + kChunk}, at::kLong);
  at::Tensor seeds = at::empty({rows}, at::kLong), sample = at::empty({rows}, at::kLong);
  for (int64_t u = 0; u < rows; ++u) {
    const int64_t r = resumed[static_cast<size_t>(u)];
    ids[u] = out.tensor("input_ids")[r].narrow(0, 0, 4 + kChunk);
    seeds[u] = prompts().tensor("request_seed")[r / 2];
    sample[u] = r % 2;
  }
  DataProto cont({{"input_ids", ids},
                  {"attention_mask", at::ones_like(ids)},
                  {"request_seed", seeds},
                  {"resume_sample", sample}});
  cont.set_meta("n", Value(int64_t{1}));
  cont.set_meta("temperature", Value(1.0));
  cont.set_meta("resume_generated", Value(kChunk));
  cont.set_meta("response_length", Value(kLength));
  const DataProto want = actor.call("generate_sequences", {cont}).get().as<DataProto>();
  for (int64_t u = 0; u < rows; ++u) {
    const int64_t r = resumed[static_cast<size_t>(u)];
    const int64_t extra = lengths[r].item<int64_t>() - kChunk;
    SCOPED_TRACE("sample " + std::to_string(r));
    EXPECT_EQ(want.tensor("response_mask")[u].sum().item<int64_t>(), extra);
    EXPECT_TRUE(at::equal(out.tensor("responses")[r].narrow(0, kChunk, extra),
                          want.tensor("responses")[u].narrow(0, 0, extra)));
    EXPECT_TRUE(at::allclose(out.tensor("rollout_log_probs")[r].narrow(0, kChunk, extra),
                             want.tensor("rollout_log_probs")[u].narrow(0, 0, extra), 1e-4, 1e-5));
  }
}

// The async loop with partial rollout on: on-policy (no sync can fall inside
// a batch), so it must train exactly as the one-call rollout does.
TEST_F(AsyncTrainerTest, PartialRolloutTrainsAsTheOneCallRolloutOnPolicy) {
  TempDir plain, partial;
  PpoTrainer(on_policy_config(plain.path(), {"trainer.total_training_steps=3"})).fit();
  const FitResult r =
      PpoTrainer(on_policy_config(partial.path(), {"trainer.total_training_steps=3",
                                                   "async_training.partial_rollout=true",
                                                   "async_training.partial_rollout_chunk=2"}))
          .fit();
  EXPECT_EQ(r.last_metrics.at("async/partial_resumed_samples"), 0);
  const std::vector<nlohmann::json> want = steps_of(plain.path());
  const std::vector<nlohmann::json> got = steps_of(partial.path());
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    expect_same_step(got[i], want[i]);
  }
}

// Off-policy with syncs falling inside batches (one token per call): it
// trains, and counts the samples drawn by two versions.
TEST_F(AsyncTrainerTest, PartialRolloutLetsASyncInterruptABatch) {
  TempDir out;
  Config c = config(out.path());
  c.apply_overrides({"async_training.partial_rollout=true", "async_training.partial_rollout_chunk=1",
                     "async_training.staleness_threshold=2", "trainer.total_training_steps=4",
                     "trainer.test_freq=-1"});
  const FitResult r = PpoTrainer(c).fit();
  EXPECT_EQ(r.steps, 4);
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
  for (const nlohmann::json& step : steps_of(out.path())) {
    const double resumed = metric(step, "async/partial_resumed_samples");
    EXPECT_GE(resumed, 0);
    EXPECT_LE(resumed, 8);  // train_batch_size 4 × n 2
  }
}

}  // namespace
}  // namespace baton::trainer
