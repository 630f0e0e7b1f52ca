// The fit loop end to end in worker processes, on the toy task's data and its
// (untrained) tiny model: a few GRPO and PPO steps in DP2, TP2 and PP2
// layouts with every metric present and finite, validation, the HF export,
// and a checkpoint resumed so that the next step is the uninterrupted one.
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "tests/engine/temp_dir.h"
#include "tests/file_faults.h"
#include "tests/tolerance.h"
#include "tests/trainer/toy_task_fixture.h"
#include "text/tokenizer/tokenizer.h"
#include "trainer/config/config.h"
#include "trainer/ppo_trainer.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/policy_loss.h"
#include "workers/rewards/reward_registry.h"
#include "workers/roles/actor_rollout_ref_worker.h"

namespace baton::trainer {
namespace {

// A user's extensions, registered by the macros at namespace scope: in this
// executable's every process, the driver and the workers it spawns. The loss
// runs in the workers (an extension registered only in the driver would fail
// there at the first update); it marks its metrics so that the test sees it ran.
std::atomic<int> g_estimator_calls{0}, g_reward_calls{0};

BATON_POLICY_LOSS("test_marked_vanilla", [](const at::Tensor& old_lp, const at::Tensor& lp,
                                            const at::Tensor& adv, const at::Tensor& mask,
                                            const algos::PolicyLossOptions& o,
                                            const std::optional<at::Tensor>& w) {
  algos::PolicyLossResult r = algos::vanilla_policy_loss(old_lp, lp, adv, mask, o, w);
  r.metrics["actor/test_marked_loss"] = 1.0;
  return r;
});
BATON_ADVANTAGE_ESTIMATOR("test_counted_grpo",
                          [](const algos::AdvantageInputs& in, const algos::AdvantageOptions& o) {
                            ++g_estimator_calls;
                            return algos::compute_advantage("grpo", in, o);
                          });
BATON_REWARD_FUNCTION("test_counted_gsm8k", [](const rewards::RewardInput& in) {
  ++g_reward_calls;
  return rewards::find_reward_function("gsm8k")(in);
});
// For dynamic sampling: a prompt a+b with an even a scores 0 whatever the
// response (its group never varies); an odd a scores the parity of the
// response's length, which the untrained model varies.
BATON_REWARD_FUNCTION("test_odd_a_varies", [](const rewards::RewardInput& in) {
  if (nlohmann::json::parse(in.extra_info).at("a").get<int64_t>() % 2 == 0) return 0.0;
  return static_cast<double>(in.response.size() % 2);
});
BATON_REWARD_FUNCTION("test_always_zero", [](const rewards::RewardInput&) { return 0.0; });

namespace fs = std::filesystem;
using engine::testing::TempDir;

class PpoTrainerTest : public ToyTaskTest {
 protected:
  // configs/<name>.yaml on the toy data, small and short, writing under `out`.
  static Config config(const std::string& name, const fs::path& out) {
    return toy_config(name, out,
                      {
                          "data.train_batch_size=4",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "critic.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.rollout.n=2",
                          "trainer.total_training_steps=2",
                          "trainer.test_freq=2",
                      });
  }
};

void expect_finite_metrics(const FitResult& r, const std::vector<std::string>& required) {
  for (const auto& key : required) {
    auto it = r.last_metrics.find(key);
    ASSERT_NE(it, r.last_metrics.end()) << "missing metric " << key;
  }
  for (const auto& [k, v] : r.last_metrics) EXPECT_TRUE(std::isfinite(v)) << k << " = " << v;
}

const std::vector<std::string> kActorMetrics = {
    "critic/score/mean",      "critic/rewards/mean",
    "critic/advantages/mean", "critic/returns/mean",
    "actor/pg_loss",          "actor/entropy",
    "actor/pg_clipfrac",      "actor/ppo_kl",
    "actor/grad_norm",        "actor/lr",
    "response_length/mean",   "response_length/clip_ratio",
    "prompt_length/mean",     "timing_s/gen",
    "timing_s/old_log_prob",  "timing_s/adv",
    "timing_s/update_actor",  "timing_s/step",
    "perf/throughput",        "val-core/openai/gsm8k/reward/mean@1"};

TEST_F(PpoTrainerTest, GrpoStepsInEveryLayoutReportFiniteMetricsAndExportTheActor) {
  // DP2, TP2, PP2 on 2 workers; TP2 x PP2 on 4 (more processes than cores,
  // which only slows it down).
  for (const auto& [tp, pp] :
       {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    SCOPED_TRACE("tp" + std::to_string(tp) + " pp" + std::to_string(pp));
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_overrides({
        "trainer.n_gpus_per_node=" + std::to_string(tp * pp == 4 ? 4 : 2),
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" + std::to_string(tp),
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=" + std::to_string(pp),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=" + std::to_string(tp),
    });
    PpoTrainer trainer(c);
    const FitResult r = trainer.fit();
    EXPECT_EQ(r.steps, 2);
    expect_finite_metrics(r, kActorMetrics);
    // balance_batch (on by default, as verl): the actor's DP ranks (2 in DP2,
    // 1 otherwise) get token counts at most one sequence apart (the
    // differencing heuristic's bound; seqlen_balancing_test.cpp).
    const auto& lm = r.last_metrics;
    ASSERT_EQ(lm.count("global_seqlen/balanced_max"), 1u);
    EXPECT_LE(lm.at("global_seqlen/balanced_max") - lm.at("global_seqlen/balanced_min"),
              lm.at("prompt_length/max") + lm.at("response_length/max"));
    EXPECT_GE(lm.at("global_seqlen/balanced_max"), lm.at("global_seqlen/mean"));
    // No KL: no reference policy is built or asked, no critic either.
    EXPECT_EQ(r.last_metrics.count("timing_s/ref"), 0u);
    EXPECT_EQ(r.last_metrics.count("timing_s/values"), 0u);
    EXPECT_FALSE(r.first_validation.empty());
    // The resolved config, the metrics of every step, and a loadable HF actor.
    EXPECT_TRUE(fs::exists(out / "config.yaml"));
    std::ifstream jsonl(out / "metrics.jsonl");
    int lines = 0;
    for (std::string line; std::getline(jsonl, line);) lines += !line.empty();
    EXPECT_EQ(lines, 3);  // validation before training, then steps 1 and 2
    EXPECT_NO_THROW(engine::load_hf_model(r.hf_dir));
    EXPECT_TRUE(fs::exists(fs::path(r.hf_dir) / "tokenizer.json"));
  }
}

TEST_F(PpoTrainerTest, PpoWithACriticAndKlInTheRewardReportsCriticMetrics) {
  TempDir out;
  Config c = config("ppo_toy", out.path());
  c.apply_overrides({"algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                     "actor_rollout_ref.rollout.val_kwargs.n=3",
                     "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                     "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  // Validation with 3 samples per prompt: worst <= mean <= best.
  const double mean = r.last_validation.at("val-core/openai/gsm8k/reward/mean@3");
  EXPECT_LE(r.last_validation.at("val-aux/openai/gsm8k/reward/worst@3"), mean);
  EXPECT_GE(r.last_validation.at("val-core/openai/gsm8k/reward/best@3"), mean);
  std::vector<std::string> keys = kActorMetrics;
  for (const char* k :
       {"critic/values/mean", "critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm",
        "critic/kl", "critic/kl_coef", "timing_s/ref", "timing_s/values", "timing_s/update_critic"})
    keys.push_back(k);
  std::erase(keys, "val-core/openai/gsm8k/reward/mean@1");
  expect_finite_metrics(r, keys);
  // The run's log file has the driver's lines and both worker processes'
  // (the colocated critic logs its fresh value head on each rank).
  std::ifstream in(out / "baton.log");
  const std::string log_text(std::istreambuf_iterator<char>(in), {});
  for (const char* want :
       {"[baton] [info] run ", ":0] [baton] [info] value model", ":1] [baton] [info] value model"})
    EXPECT_NE(log_text.find(want), std::string::npos) << want << " not in:\n" << log_text;
}

// bf16 parameters (fp32 masters and AdamW state in the optimizer) for the
// actor, its reference copy and the critic: PPO with the KL loss trains,
// reports finite metrics, and exports bf16 weights.
TEST_F(PpoTrainerTest, Bf16ParametersTrainActorReferenceAndCriticAndExportBf16) {
  TempDir out;
  Config c = config("ppo_toy", out.path());
  c.apply_overrides({"actor_rollout_ref.actor.megatron.dtype=bfloat16",
                     "critic.megatron.dtype=bfloat16", "actor_rollout_ref.actor.use_kl_loss=true",
                     "trainer.test_freq=-1"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 2);
  std::vector<std::string> keys = kActorMetrics;
  for (const char* k : {"critic/values/mean", "critic/vf_loss", "critic/grad_norm", "actor/kl_loss",
                        "timing_s/ref"})
    keys.push_back(k);
  std::erase(keys, "val-core/openai/gsm8k/reward/mean@1");
  expect_finite_metrics(r, keys);
  EXPECT_GT(r.last_metrics.at("actor/grad_norm"), 0.0);
  const engine::HfModel hf = engine::load_hf_model(r.hf_dir);
  ASSERT_FALSE(hf.weights.empty());
  for (const auto& [name, w] : hf.weights) EXPECT_EQ(w.scalar_type(), at::kBFloat16) << name;
}

// verl's dumps: trainer.rollout_data_dir gets <step>.jsonl per training step,
// a line per sample whose scores average to critic/score/mean;
// trainer.validation_data_dir gets one per validation (step 0 before
// training, then at test_freq), a line per val sample.
TEST_F(PpoTrainerTest, RolloutAndValidationDumpsHoldEachSampleAndItsScore) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides({"trainer.rollout_data_dir=" + (out / "rollouts").string(),
                     "trainer.validation_data_dir=" + (out / "val").string(),
                     "trainer.log_val_generations=2"});
  const FitResult r = PpoTrainer(c).fit();
  const auto lines_of = [](const fs::path& file) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  for (int step : {1, 2}) {
    const auto lines = lines_of(out / "rollouts" / (std::to_string(step) + ".jsonl"));
    ASSERT_EQ(lines.size(), 8u) << "4 prompts x 2 samples";
    double total = 0;
    for (const auto& l : lines) {
      EXPECT_EQ(l["step"], step);
      EXPECT_TRUE(l["input"].is_string() && !l["input"].get<std::string>().empty()) << l;
      EXPECT_NE(l["input"].get<std::string>().find('+'), std::string::npos) << "an a+b= prompt";
      EXPECT_TRUE(l["output"].is_string()) << l;
      EXPECT_TRUE(l["gts"].is_string() && !l["gts"].get<std::string>().empty()) << l;
      EXPECT_TRUE(l.contains("acc")) << "the reward's per-row values: " << l;
      total += l["score"].get<double>();
    }
    if (step == 2) {
      EXPECT_DOUBLE_EQ(total / 8, r.last_metrics.at("critic/score/mean"));
    }
  }
  const size_t val_rows = lines_of(out / "val" / "0.jsonl").size();
  EXPECT_GT(val_rows, 0u);
  EXPECT_EQ(lines_of(out / "val" / "2.jsonl").size(), val_rows);
}

TEST_F(PpoTrainerTest, AValueModelRewardReplacesTheRuleRewardInTrainingAndValidation) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  // The toy LM as the reward model: its value head is fresh (seeded), so the
  // scores are arbitrary but finite and nonzero, unlike the rule reward's
  // 0/1 on an untrained model.
  c.apply_overrides(
      {"reward_model.enable=true", "reward_model.model.path=" + toy_->path().string() + "/model"});
  const FitResult r = PpoTrainer(c).fit();
  expect_finite_metrics(r, kActorMetrics);
  const double score = r.last_metrics.at("critic/score/mean");
  EXPECT_NE(score, 0.0);
  EXPECT_NE(score, 1.0);
  EXPECT_NE(r.last_validation.at("val-core/openai/gsm8k/reward/mean@1"), 0.0);
}

// reward_model.centralized: one copy of the reward model in a process of its
// own scores every replica's rows; the training ranks hold half of what they
// held with a copy beside each (2 ranks), and the scores are the same rows
// scored by the same model. With prefetch the scores are collected only
// before the advantages (timing_s/reward_wait), without it at once.
TEST_F(PpoTrainerTest, ACentralizedRewardModelScoresForEveryRankAndPrefetches) {
  std::map<std::string, FitResult> runs;
  for (const char* v : {"colocated", "centralized", "centralized_no_prefetch"}) {
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_overrides({"reward_model.enable=true",
                       "reward_model.model.path=" + toy_->path().string() + "/model",
                       "trainer.total_training_steps=2", "trainer.test_freq=-1",
                       "trainer.val_before_train=false"});
    if (std::string(v) != "colocated") c.apply_overrides({"reward_model.centralized=true"});
    if (std::string(v) == "centralized_no_prefetch")
      c.apply_overrides({"reward_model.prefetch=false"});
    runs[v] = PpoTrainer(c).fit();
  }
  const auto& colocated = runs["colocated"].last_metrics;
  for (const char* v : {"centralized", "centralized_no_prefetch"}) {
    const auto& m = runs[v].last_metrics;
    // The same sequences (the same seeds and weights) scored by the same
    // model in another batch split: equal to fp32 rounding.
    const double want = colocated.at("critic/score/mean");
    test::expect_near(m.at("critic/score/mean"), want, test::Tolerance::fp32(1000, 1.0), v);
    EXPECT_DOUBLE_EQ(m.at("reward_model/param_bytes_per_training_rank"),
                     colocated.at("reward_model/param_bytes_per_training_rank") / 2)
        << v;
  }
  EXPECT_TRUE(runs["centralized"].last_metrics.count("timing_s/reward_wait"));
  EXPECT_FALSE(runs["centralized_no_prefetch"].last_metrics.count("timing_s/reward_wait"));
}

TEST_F(PpoTrainerTest, AResumedRunTakesTheSameNextStepAsAnUninterruptedOne) {
  TempDir straight, split;
  FitResult expected;
  {
    Config c = config("grpo_toy", straight.path());
    c.apply_overrides({"trainer.total_training_steps=3", "trainer.test_freq=-1"});
    expected = PpoTrainer(c).fit();
  }
  {
    Config c = config("grpo_toy", split.path());
    c.apply_overrides(
        {"trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=2"});
    PpoTrainer(c).fit();
  }
  ASSERT_TRUE(fs::exists(split / "global_step_2" / "trainer_state.json"));
  Config c = config("grpo_toy", split.path());
  c.apply_overrides({"trainer.total_training_steps=3", "trainer.test_freq=-1"});
  const FitResult resumed = PpoTrainer(c).fit();
  ASSERT_EQ(resumed.steps, 3);
  // metrics.jsonl keeps the first run's steps and goes on with the resumed one's.
  std::ifstream jsonl(split / "metrics.jsonl");
  std::set<std::string> steps;
  for (std::string line; std::getline(jsonl, line);) steps.insert(line.substr(0, line.find(',')));
  for (const char* step : {"{\"step\":1", "{\"step\":2", "{\"step\":3"})
    EXPECT_TRUE(steps.count(step)) << step << " missing from metrics.jsonl";
  // Same data order, seeds, weights and optimizer state: the same tokens are
  // sampled and scored, so the discrete outcomes are equal exactly. The
  // losses, norms and entropy are the same computation on the same inputs,
  // but MKL may pick kernels by buffer alignment, which a restarted process
  // does not reproduce: they agree to fp32 rounding over the chain behind a
  // log-prob (Tolerance::fp32 with the tiny model's ~10^3 terms).
  for (const char* k : {"critic/score/mean", "response_length/mean", "critic/advantages/mean"}) {
    EXPECT_EQ(resumed.last_metrics.at(k), expected.last_metrics.at(k)) << k;
  }
  for (const char* k : {"actor/pg_loss", "actor/grad_norm", "actor/entropy"}) {
    const double want = expected.last_metrics.at(k);
    test::expect_near(resumed.last_metrics.at(k), want, test::Tolerance::fp32(1000, std::abs(want)),
                      k);
  }
}

// A checkpoint that cannot be written (here a file stands where the actor's
// checkpoint directory must go; a full disk fails the same way, test
// Checkpoint.ASaveIntoAFullDisk...) stops the run with an error naming it:
// the step's directory is removed, latest_checkpointed_iteration.txt still
// names the previous checkpoint, and the next run resumes from it.
TEST_F(PpoTrainerTest, AFailedCheckpointStopsTheRunAndKeepsThePreviousOne) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides(
      {"trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=1"});
  fs::create_directories(out / "global_step_2");
  std::ofstream(out / "global_step_2" / "actor") << "in the way";
  const fs::path latest = out / "latest_checkpointed_iteration.txt";
  try {
    PpoTrainer(c).fit();
    FAIL() << "the run went on without its checkpoint";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the checkpoint of step 2"), std::string::npos) << what;
    EXPECT_NE(what.find(latest.string() + " still names step 1; stopping"), std::string::npos)
        << what;
    EXPECT_NE(what.find((out / "global_step_2" / "actor").string()), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(out / "global_step_2"));
  EXPECT_EQ(read_step_file(latest), 1);
  const FitResult resumed = PpoTrainer(c).fit();
  EXPECT_EQ(resumed.steps, 2);
  EXPECT_TRUE(fs::exists(out / "global_step_2" / "trainer_state.json"));
  EXPECT_TRUE(fs::exists(out / "global_step_2" / kChecksumManifestFile));

  // The run's HF export lists the tokenizer copied into it with the weights:
  // a flipped byte in either is refused naming the file and the byte range.
  const fs::path hf = resumed.hf_dir;
  const std::optional<ChecksumManifest> manifest = ChecksumManifest::read(hf);
  ASSERT_TRUE(manifest.has_value());
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"})
    EXPECT_NE(manifest->find(name), nullptr) << name;
  baton::testing::flip_byte(hf / "tokenizer.json", 100);
  try {
    data::Tokenizer::load(hf);
    ADD_FAILURE() << "a flipped tokenizer.json loaded";
  } catch (const data::TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find((hf / "tokenizer.json").string() + ": bytes [0, "),
              std::string::npos)
        << e.what();
  }
  baton::testing::flip_byte(hf / "tokenizer.json", 100);
  EXPECT_NO_THROW(data::Tokenizer::load(hf));
  baton::testing::flip_byte(hf / "model.safetensors", fs::file_size(hf / "model.safetensors") / 2);
  EXPECT_THROW(engine::load_hf_model(hf), engine::EngineError);
}

// trainer.max_restarts: a worker SIGKILLed mid-run; the trainer respawns the
// groups, resumes from the latest checkpoint and ends where an
// uninterrupted run ends (as the resume test: discrete outcomes exactly,
// losses to fp32 rounding).
TEST_F(PpoTrainerTest, AKilledWorkerIsRespawnedAndTheRunResumesFromTheLatestCheckpoint) {
  TempDir straight, killed;
  const std::vector<std::string> run = {"trainer.total_training_steps=4", "trainer.test_freq=-1",
                                        "trainer.save_freq=1"};
  Config a = config("grpo_toy", straight.path());
  a.apply_overrides(run);
  const FitResult expected = PpoTrainer(a).fit();
  EXPECT_EQ(expected.restarts, 0);

  Config b = config("grpo_toy", killed.path());
  b.apply_overrides(run);
  b.apply_overrides({"trainer.max_restarts=1"});
  PpoTrainer trainer(b);
  std::future<FitResult> fit = std::async(std::launch::async, [&] { return trainer.fit(); });
  ASSERT_TRUE(kill_a_worker_once_logged(killed.path(), workers::actor_rollout_ref_worker_class(),
                                        2, fit));
  const FitResult r = fit.get();
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.restarts, 1);
  for (const char* k : {"critic/score/mean", "response_length/mean", "critic/advantages/mean"})
    EXPECT_EQ(r.last_metrics.at(k), expected.last_metrics.at(k)) << k;
  for (const char* k : {"actor/pg_loss", "actor/grad_norm", "actor/entropy"}) {
    const double want = expected.last_metrics.at(k);
    test::expect_near(r.last_metrics.at(k), want, test::Tolerance::fp32(1000, std::abs(want)), k);
  }
  // metrics.jsonl has each step once, the steps after the checkpoint from the restarted run.
  EXPECT_EQ(logged_steps(killed.path()), 4u);
  std::ifstream log(killed / "baton.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("restarting every worker group (restart 1 of trainer.max_restarts = 1)"),
            std::string::npos);
}

TEST_F(PpoTrainerTest, WithoutMaxRestartsAKilledWorkerFailsTheRunNamingIt) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides({"trainer.total_training_steps=50", "trainer.test_freq=-1"});
  PpoTrainer trainer(c);
  std::future<FitResult> fit = std::async(std::launch::async, [&] { return trainer.fit(); });
  ASSERT_TRUE(
      kill_a_worker_once_logged(out.path(), workers::actor_rollout_ref_worker_class(), 1, fit));
  try {
    fit.get();
    FAIL() << "the run went on without a worker";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("SIGKILL"), std::string::npos) << e.what();
  }
}

// An on-policy step (one epoch, one mini-batch) takes its old log-probs from
// the update's own forward pass instead of a separate pass: that pass is not
// run, and the run is the same as with it. The recomputed old log-probs equal
// the update's to fp32 rounding (another micro-batching), so the ratio is 1 up
// to that rounding and no token is clipped: the same tokens are sampled in
// step 2 and the losses and norms agree to fp32 rounding.
TEST_F(PpoTrainerTest, AnOnPolicyStepSkipsTheOldLogProbPassAndTrainsTheSame) {
  FitResult runs[2];
  for (bool skip : {false, true}) {
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_overrides({"actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.test_freq=-1",
                       std::string("actor_rollout_ref.actor.skip_old_log_prob_on_policy=") +
                           (skip ? "true" : "false")});
    runs[skip] = PpoTrainer(c).fit();
    ASSERT_EQ(runs[skip].steps, 2);
    EXPECT_EQ(runs[skip].last_metrics.count("timing_s/old_log_prob"), skip ? 0u : 1u);
    for (const char* k : {"actor/entropy", "actor/update_entropy", "actor/pg_loss", "actor/ppo_kl",
                          "actor/pg_clipfrac"})
      ASSERT_EQ(runs[skip].last_metrics.count(k), 1u) << k;
  }
  EXPECT_EQ(runs[1].last_metrics.at("actor/pg_clipfrac"), 0.0);
  for (const char* k : {"critic/score/mean", "response_length/mean", "critic/advantages/mean"}) {
    EXPECT_EQ(runs[1].last_metrics.at(k), runs[0].last_metrics.at(k)) << k;
  }
  for (const char* k : {"actor/pg_loss", "actor/grad_norm", "actor/entropy"}) {
    const double want = runs[0].last_metrics.at(k);
    test::expect_near(runs[1].last_metrics.at(k), want, test::Tolerance::fp32(1000, std::abs(want)),
                      k);
  }
  // Several mini-batches are off-policy after the first: the pass runs.
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides({"trainer.total_training_steps=1", "trainer.test_freq=-1"});
  EXPECT_EQ(PpoTrainer(c).fit().last_metrics.count("timing_s/old_log_prob"), 1u);
}

// rollout.packed_cpu_steps=false (padded generation steps) against the
// default packed steps: the same tokens are sampled and scored, so the
// discrete outcomes and the validation accuracy are equal exactly. (The two
// paths' probabilities differ by fp32 rounding; a draw could only differ if
// its uniform number fell within that rounding of a CDF boundary, about 1e-6
// per draw, for the ~200 draws here.)
TEST_F(PpoTrainerTest, PaddedRolloutStepsSampleWhatPackedStepsSample) {
  std::map<std::string, FitResult> runs;
  for (const char* packed : {"true", "false"}) {
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_overrides({std::string("actor_rollout_ref.rollout.packed_cpu_steps=") + packed});
    runs[packed] = PpoTrainer(c).fit();
  }
  for (const char* k : {"critic/score/mean", "response_length/mean", "critic/advantages/mean",
                        "val-core/openai/gsm8k/reward/mean@1"}) {
    EXPECT_EQ(runs["false"].last_metrics.at(k), runs["true"].last_metrics.at(k)) << k;
  }
}

TEST_F(PpoTrainerTest, ExtensionsRegisteredByMacroTrainOverTwoWorkerProcesses) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides({"trainer.n_gpus_per_node=2",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                     "algorithm.adv_estimator=test_counted_grpo",
                     "actor_rollout_ref.actor.policy_loss.loss_mode=test_marked_vanilla",
                     "custom_reward_function.name=test_counted_gsm8k"});
  g_estimator_calls = 0;
  g_reward_calls = 0;
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 2);
  expect_finite_metrics(r, kActorMetrics);
  ASSERT_EQ(r.last_metrics.count("actor/test_marked_loss"), 1u)
      << "the workers did not run the loss";
  EXPECT_EQ(r.last_metrics.at("actor/test_marked_loss"), 1.0);
  EXPECT_EQ(g_estimator_calls.load(), 2);  // once per step
  // 4 prompts x 2 samples per step, and every validation prompt before and after.
  EXPECT_GE(g_reward_calls.load(), 2 * 4 * 2);
}

TEST_F(PpoTrainerTest, UnknownNamesFailBeforeAnyWorkerStarts) {
  for (const std::string& o : {std::string("algorithm.adv_estimator=grpo_typo"),
                               std::string("actor_rollout_ref.actor.policy_loss.loss_mode=vanila"),
                               std::string("custom_reward_function.name=gsm9k")}) {
    SCOPED_TRACE(o);
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_override(o);
    const std::string bad = o.substr(o.find('=') + 1);
    try {
      PpoTrainer trainer(c);
      ADD_FAILURE() << "a trainer started with " << o;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
    // Nothing was read or written past the config: no data loaded, no worker's output.
    EXPECT_FALSE(fs::exists(out / "config.yaml"));
  }
}

// DAPO (algorithm.filter_groups, reward_manager dapo with its overlong
// buffer): the groups trained on are exactly data.train_batch_size, each
// with a varied acc; the even-a prompts, whose acc never varies, are dropped
// wherever they were generated. Validation reports acc as the core value.
TEST_F(PpoTrainerTest, DynamicSamplingTrainsOnlyOnGroupsWhoseAccVaries) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides(
      {"custom_reward_function.name=test_odd_a_varies", "algorithm.filter_groups.enable=true",
       "algorithm.filter_groups.metric=acc", "data.gen_batch_size=8",
       "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true",
       "reward_model.overlong_buffer.len=2", "reward_model.overlong_buffer.penalty_factor=0.5",
       "reward_model.overlong_buffer.log=true", "trainer.test_freq=-1",
       "trainer.rollout_data_dir=" + (out / "rollouts").string()});
  const FitResult r = PpoTrainer(c).fit();
  ASSERT_EQ(r.steps, 2);
  std::vector<std::string> keys = kActorMetrics;
  std::erase(keys, "val-core/openai/gsm8k/reward/mean@1");
  keys.push_back("train/num_gen_batches");
  expect_finite_metrics(r, keys);
  EXPECT_GE(r.last_metrics.at("train/num_gen_batches"), 1.0);
  for (const char* k :
       {"val-core/openai/gsm8k/acc/mean@1", "val-aux/openai/gsm8k/reward/mean@1",
        "val-aux/openai/gsm8k/overlong_reward/mean@1", "val-aux/openai/gsm8k/overlong/mean@1"})
    EXPECT_EQ(r.first_validation.count(k), 1u) << k;
  EXPECT_EQ(r.first_validation.count("val-core/openai/gsm8k/reward/mean@1"), 0u);
  for (int step : {1, 2}) {
    std::map<std::string, std::vector<double>> acc_by_prompt;
    std::ifstream in(out / "rollouts" / (std::to_string(step) + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json l = nlohmann::json::parse(line);
      acc_by_prompt[l["input"].get<std::string>()].push_back(l["acc"].get<double>());
      // The overlong penalty is in the score, not in acc.
      EXPECT_DOUBLE_EQ(l["score"].get<double>(),
                       l["acc"].get<double>() + l["overlong_reward"].get<double>())
          << line;
    }
    ASSERT_EQ(acc_by_prompt.size(), 4u) << "step " << step << ": data.train_batch_size groups";
    for (const auto& [prompt, acc] : acc_by_prompt) {
      EXPECT_EQ(std::stoi(prompt.substr(0, prompt.find('+'))) % 2, 1) << prompt;
      ASSERT_EQ(acc.size(), 2u) << prompt;
      EXPECT_NE(acc[0], acc[1]) << prompt << ": a group whose acc does not vary was trained on";
    }
  }
}

// Every generation batch's groups have the same reward: after
// max_num_gen_batches batches the run stops naming the key, before any step
// is logged.
TEST_F(PpoTrainerTest, DynamicSamplingStopsAfterMaxNumGenBatchesNamingTheKey) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides(
      {"custom_reward_function.name=test_always_zero", "algorithm.filter_groups.enable=true",
       "algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.max_num_gen_batches=2",
       "trainer.val_before_train=false"});
  PpoTrainer trainer(c);
  try {
    trainer.fit();
    ADD_FAILURE() << "a run without a varied group trained";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("after algorithm.filter_groups.max_num_gen_batches = 2 "
                                         "generation batches, 0 groups have a varied seq_reward"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(logged_steps(out.path()), 0u);
}

// Dynamic sampling with a critic, a reward model and a KL penalty in the
// reward, on seq_final_reward: the log-prob passes and the penalty run on the
// generation batch before the filter (verl's DAPO trainer), the reward
// model's scores are collected for it at once, and the step trains.
TEST_F(PpoTrainerTest, DynamicSamplingRunsWithACriticARewardModelAndKlInTheReward) {
  TempDir out;
  Config c = config("ppo_toy", out.path());
  c.apply_overrides(
      {"reward_model.enable=true", "reward_model.model.path=" + toy_->path().string() + "/model",
       "reward_model.centralized=true", "algorithm.use_kl_in_reward=true",
       "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_final_reward",
       "algorithm.filter_groups.max_num_gen_batches=3", "trainer.test_freq=-1",
       "trainer.val_before_train=false"});
  const FitResult r = PpoTrainer(c).fit();
  ASSERT_EQ(r.steps, 2);
  std::vector<std::string> keys = kActorMetrics;
  std::erase(keys, "val-core/openai/gsm8k/reward/mean@1");
  for (const char* k : {"critic/values/mean", "critic/vf_loss", "critic/kl", "timing_s/ref",
                        "timing_s/values", "train/num_gen_batches"})
    keys.push_back(k);
  expect_finite_metrics(r, keys);
  // The reward model's continuous scores vary in every group: one batch a step.
  EXPECT_EQ(r.last_metrics.at("train/num_gen_batches"), 1.0);
  EXPECT_EQ(r.last_metrics.count("timing_s/reward_wait"), 0u);
}

TEST_F(PpoTrainerTest, RemaxScoresEachPromptsGreedyResponseAsItsBaseline) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  c.apply_overrides({"algorithm.adv_estimator=remax", "trainer.n_gpus_per_node=2",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 2);
  expect_finite_metrics(r, kActorMetrics);
  // The greedy pass ran (verl's gen_max phase); its baselines reach the
  // estimator, which would throw without them.
  EXPECT_EQ(r.last_metrics.count("timing_s/gen_max"), 1u);
}

// algorithm.rollout_correction in the synchronous loop (verl's decoupled
// mode): the rollout's log-probs against the old-log-prob pass's (which runs
// although the step is on-policy), token TIS weights into the update and a
// token_k1 rejection mask, with verl's rollout_corr/* metrics.
TEST_F(PpoTrainerTest, RolloutCorrectionWeighsAndRejectsWithVerlsMetrics) {
  TempDir out;
  Config c = config("grpo_toy", out.path());
  const std::string k = "algorithm.rollout_correction.";
  c.apply_overrides({"trainer.total_training_steps=1", "trainer.val_before_train=false",
                     "trainer.test_freq=-1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                     k + "rollout_is=token", k + "rollout_is_threshold=2.0",
                     k + "rollout_rs=token_k1", k + "rollout_rs_threshold=0.5_2.0"});
  PpoTrainer trainer(c);
  const FitResult r = trainer.fit();
  EXPECT_EQ(r.steps, 1);
  std::vector<std::string> keys = {"timing_s/old_log_prob", "actor/pg_loss"};
  for (const char* name : {"rollout_is_mean", "rollout_is_max", "rollout_is_eff_sample_size",
                           "rollout_is_ratio_fraction_high", "rollout_rs_token_k1_mean",
                           "rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction",
                           "training_ppl", "rollout_ppl", "kl", "k3_kl", "chi2_token", "chi2_seq"})
    keys.push_back(std::string("rollout_corr/") + name);
  expect_finite_metrics(r, keys);
  const auto& m = r.last_metrics;
  // The rollout engine and the actor compute one policy's log-probs (fp32 on
  // the CPU, in another kernel order): ratios near 1, none truncated or
  // rejected at these loose bounds.
  EXPECT_LE(m.at("rollout_corr/rollout_is_max"), 2.0);
  EXPECT_NEAR(m.at("rollout_corr/rollout_is_mean"), 1.0, 1e-2);
  EXPECT_EQ(m.at("rollout_corr/rollout_rs_masked_fraction"), 0.0);
  EXPECT_NEAR(m.at("rollout_corr/kl"), 0.0, 1e-2);
}

// The optimal-token-baseline estimators in the synchronous loop: the
// old-log-prob pass returns Σπ² (unfused LM head) and the advantages are the
// OTB's (they would throw without it).
TEST_F(PpoTrainerTest, OptimalTokenBaselinesTrainOnTheActorsSumPiSquared) {
  for (const char* estimator : {"optimal_token_baseline", "tir_optimal_token_baseline"}) {
    SCOPED_TRACE(estimator);
    TempDir out;
    Config c = config("grpo_toy", out.path());
    c.apply_overrides({"trainer.total_training_steps=1", "trainer.val_before_train=false",
                       "trainer.test_freq=-1", std::string("algorithm.adv_estimator=") + estimator,
                       "actor_rollout_ref.model.use_fused_kernels=false"});
    PpoTrainer trainer(c);
    const FitResult r = trainer.fit();
    EXPECT_EQ(r.steps, 1);
    expect_finite_metrics(r, {"critic/advantages/mean", "critic/returns/mean", "actor/pg_loss",
                              "timing_s/old_log_prob"});
  }
}

}  // namespace
}  // namespace baton::trainer
