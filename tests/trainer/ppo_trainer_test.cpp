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
#include <set>
#include <string>

#include "engine/io/hf_model.h"
#include "tests/engine/temp_dir.h"
#include "tests/tolerance.h"
#include "tests/trainer/toy_task_fixture.h"
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

}  // namespace
}  // namespace baton::trainer
