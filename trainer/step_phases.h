// The phases of a training step that the synchronous trainer
// (trainer/ppo_trainer.cpp) and the fully-async one (trainer/async/async_trainer.cpp)
// run alike on a generated batch: the old-log-prob pass, the KL penalty in
// the reward and the advantages, and folding a worker's metric lists into the
// step's metrics.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/profiler.h"
#include "dispatch/data_proto.h"
#include "runtime/worker_group.h"
#include "trainer/config/settings.h"
#include "trainer/ppo_trainer.h"
#include "trainer/progress_line.h"
#include "workers/algos/kl.h"

namespace baton::trainer {

using Metrics = std::map<std::string, double>;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);

// A step's phases: timed(name, fn) runs fn, adds its seconds to
// timing[name] (timing_s/<name>; a phase run once per generation batch
// sums, as verl's timers do), records the phase's span when the step is
// profiled (base/profiler.h), and shows it on the progress line.
struct StepTimer {
  ProgressLine& progress;
  int64_t step;
  Metrics timing;

  template <typename Fn>
  void operator()(const char* name, Fn&& fn) {
    progress.update(step - 1, "step " + std::to_string(step) + ": " + name);
    profiler::Span span(name, "trainer");
    const auto t0 = Clock::now();
    fn();
    timing[name] += seconds_since(t0);
  }
};

// The actor's data-parallel size (world / (tp × pp)).
int64_t actor_dp(const TrainerSettings& s);

// trainer.balance_batch (verl's _balance_batch): the update and log-prob
// calls give DP rank r the r-th equal slice of the batch, so its rows are
// reordered for about equal tokens per rank (trainer/seqlen_balancing.h);
// metrics global_seqlen/*. Returns the order applied, empty when the rows do
// not split into `dp` equal slices (then nothing moves).
std::vector<int64_t> balance_batch(DataProto& batch, int64_t dp, Metrics& m);

// A worker result's meta "metrics" (lists per rank and micro-batch) reduced
// into `into` (trainer/metric_utils.h: reduce_metrics).
void merge_metrics(Metrics& into, const DataProto& result);

// A reward model's scores of a step's batch (reward_model.enable), as
// verl's naive manager: they replace the rule rewards. The call starts in
// start_reward_model, right after generation; collect() waits for it and
// sets token_level_scores.
class RewardModelScores {
 public:
  RewardModelScores() = default;
  RewardModelScores(Future<Value> scores, int64_t pad) : scores_(std::move(scores)), pad_(pad) {}
  bool pending() const { return scores_.has_value(); }
  void collect(DataProto& batch);

 private:
  std::optional<Future<Value>> scores_;
  int64_t pad_ = 0;
};

// Starts the reward model's scoring of `batch` (nothing without one; the
// batch padded to its replicas: one when centralized); metric
// reward_model/param_bytes_per_training_rank.
RewardModelScores start_reward_model(PpoTrainer::State& st, const DataProto& batch, Metrics& m);

// The step's "reward" phase: the rule reward (token_level_scores, and
// reward/errors with zero_on_error, summed over the step's generation
// batches), or the reward model's scores collected now unless
// reward_model.prefetch leaves them to a later reward_wait phase.
void reward_phase(PpoTrainer::State& st, DataProto& batch, RewardModelScores& rm, Metrics& m);

// The actor's log-probs of the batch's responses under the current weights:
// sets "old_log_probs" and the metric actor/entropy (verl's, aggregated with
// `loss_agg_mode`).
// With `sum_pi_squared` also Σπ² per token (sum_pi_squared, for the
// optimal-token-baseline estimators; the actor must not fuse its LM head).
void old_log_prob_pass(WorkerGroup& actor, DataProto& batch, const std::string& loss_agg_mode,
                       Metrics& m, bool sum_pi_squared = false);

// The reference policy's log-probs of the responses (ref_log_prob).
void ref_log_prob_pass(WorkerGroup& actor, DataProto& batch);

// The critic's values of the responses (values).
void values_pass(WorkerGroup& critic, DataProto& batch);

// verl's apply_kl_penalty: with use_kl_in_reward, token_level_rewards =
// token_level_scores − β·KL(old ‖ ref), β from `kl` which then adapts
// (metrics critic/kl, critic/kl_coef); without, token_level_rewards =
// token_level_scores.
void kl_in_reward(DataProto& batch, const TrainerSettings& s, algos::KLController& kl, Metrics& m);

// verl's compute_advantage: s.adv_estimator over token_level_rewards, the
// batch's uids, its values with a critic and `reward_baselines` for remax;
// sets advantages and returns.
void advantages(DataProto& batch, const TrainerSettings& s,
                const at::Tensor& reward_baselines = {});

// verl's compute_rollout_correction_and_add_to_batch, when
// algorithm.rollout_correction has rollout_is or rollout_rs: from
// old_log_probs against rollout_log_probs, rollout_is_weights (which the
// update multiplies the policy loss by) and the rejected tokens taken out of
// response_mask; metrics rollout_corr/* (workers/algos/rollout_correction.h).
// Nothing otherwise.
void rollout_correction(DataProto& batch, const TrainerSettings& s, Metrics& m);

// kl_in_reward, rollout_correction, then advantages.
void rewards_and_advantages(DataProto& batch, const TrainerSettings& s, algos::KLController& kl,
                            Metrics& m, const at::Tensor& reward_baselines = {});

// The start of a run: a checkpoint resumed as trainer.resume_mode says, the
// metrics logger opened (a resumed run keeps the metrics of the steps it
// resumed from) and, with trainer.val_before_train, a first validation
// (result.first_validation and last_validation).
void begin_run(PpoTrainer::State& st, FitResult& result, const std::function<Metrics()>& validate);

// trainer.test_freq's validation, when step st.global_step is due one (and
// after the last step): its metrics into `m`, timing["testing"], and
// result.last_validation (and first_validation, if none yet).
void validate_if_due(PpoTrainer::State& st, FitResult& result, Metrics& m, Metrics& timing,
                     const std::function<Metrics()>& validate);

// The step's data, timing and throughput metrics (verl's, over `batch`) into
// `m`, then the step logged (console, metrics.jsonl) and kept as
// result.last_metrics.
void log_step(PpoTrainer::State& st, FitResult& result, const DataProto& batch, Metrics& m,
              const Metrics& timing, ProgressLine& progress);

// A profiled step's end: its trace written (global_profiler), the path logged.
void end_profiled_step(PpoTrainer::State& st);

// The end of a run: the actor exported as an HF directory (result.hf_dir =
// <out_dir>/actor_hf) and, with the file logger, the curves plotted
// (result.plot; left empty, with a warning, when gnuplot fails).
void export_and_plot(PpoTrainer::State& st, WorkerGroup& actor, FitResult& result);

}  // namespace baton::trainer
