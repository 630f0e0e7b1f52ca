#include "trainer/async/async_trainer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"
#include "dispatch/data_proto.h"
#include "engine/rollout/sampling.h"
#include "runtime/threads.h"
#include "trainer/async/chunked_rollout.h"
#include "trainer/async/rollout_ledger.h"
#include "trainer/async/trajectory_queue.h"
#include "trainer/metric_utils.h"
#include "trainer/progress_line.h"
#include "trainer/step_phases.h"
#include "trainer/trainer_state.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/kl.h"
#include "workers/algos/rollout_correction.h"
#include "workers/roles/prompt_batch.h"
#include "workers/roles/rollout_worker.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;

// The name of the actor → rollout sync group on the rollout group's store.
const char* kSyncGroup = "actor_to_rollout";

// Weight sync to `version`: the actor sends, the rollout receives (after its
// generate in flight); the queue learns the version once the receive is
// submitted, so that every generate submitted after it runs with it.
// Returns the seconds it took.
double sync_weights(WorkerGroup& actor, WorkerGroup& rollout, TrajectoryQueue* queue,
                    int64_t version) {
  profiler::Span span("sync_weights", "trainer");
  const auto t0 = Clock::now();
  Future<Value> sent = actor.call("send_weights", {version});
  Future<Value> received = rollout.call("receive_weights", {});
  if (queue != nullptr) queue->set_rollout_version(version);
  // A dead rollout worker fails the actor's send too (its peer is gone):
  // the rollout's error names the cause, so it goes first.
  std::exception_ptr send_error;
  try {
    sent.get();
  } catch (...) {
    send_error = std::current_exception();
  }
  const Value versions = received.get();
  if (send_error) std::rethrow_exception(send_error);
  for (const Value& v : versions.as_list()) {
    if (v.as_int() != version)
      throw Error("weight sync: a rollout worker holds version " + std::to_string(v.as_int()) +
                  " after the sync to " + std::to_string(version));
  }
  return seconds_since(t0);
}

// The rollouter thread's state, shared with the trainer loop.
struct Rollouter {
  std::mutex mu;
  double idle_seconds = 0;   // GUARDED_BY(mu): since the trainer last took it
  std::exception_ptr error;  // GUARDED_BY(mu): what stopped it
};

// The rollout side of the loop: the queue, the ledger of what is queued or
// being generated, and the rollouter thread generating into them.
struct RolloutPipeline {
  TrajectoryQueue queue;
  RolloutLedger ledger;
  Rollouter r;
  std::thread thread;

  // `entries`: a checkpoint's or a failed pipeline's ledger; `next_step`: the
  // step that trains the first batch queued; `version`: the rollout's weights.
  RolloutPipeline(PpoTrainer::State& st, std::vector<LedgerEntry> entries, int64_t next_step,
                  int64_t version);
  // Stops the rollouter on every way out of the loop.
  ~RolloutPipeline() {
    queue.close();
    if (thread.joinable()) thread.join();
  }
  // The rollouter's error, if it stopped with one.
  std::exception_ptr error() {
    std::lock_guard lock(r.mu);
    return r.error;
  }
};

int64_t generated_entries(const std::vector<LedgerEntry>& entries) {
  return std::count_if(entries.begin(), entries.end(),
                       [](const LedgerEntry& e) { return e.done.has_value(); });
}

// Generates batches until the queue closes: each train_batch_size prompts
// from the loader (or the ledger's restored ones first), n samples each, on
// the rollout group.
void run_rollouter(PpoTrainer::State& st, RolloutPipeline& p) {
  const TrainerSettings& s = st.s;
  WorkerGroup& rollout = *st.rollout;
  TrajectoryQueue& queue = p.queue;
  Rollouter& r = p.r;
  const int64_t replicas = s.async.rollout_world / s.actor.rollout.tp;
  try {
    for (TrajectoryBatch& b : p.ledger.requeue())
      if (!queue.push(std::move(b))) return;
    while (true) {
      auto t0 = Clock::now();
      if (!queue.reserve()) return;
      double idle = seconds_since(t0);
      // Its step (the one that trains it in the wait policy) prefixes its
      // uids, as the sync trainer's, and seeds its requests.
      const LedgerEntry e = p.ledger.start([&](int64_t step) {
        return workers::prompt_batch_proto(st.loader->next(), std::to_string(step) + "-");
      });
      // extra_info: a multi-turn rollout's per-row tools_kwargs and
      // interaction_kwargs.
      DataProto gen = e.prompts.select({"input_ids", "attention_mask"},
                                       e.prompts.has_column("extra_info")
                                           ? std::vector<std::string>{"extra_info"}
                                           : std::vector<std::string>{});
      const uint64_t step_seed = engine::SequenceRng::request_seed(s.rollout_seed, e.step);
      std::vector<int64_t> seeds;
      for (int64_t i = 0; i < gen.size(); ++i)
        seeds.push_back(static_cast<int64_t>(engine::SequenceRng::request_seed(step_seed, i)));
      gen.set_tensor("request_seed", at::tensor(seeds, at::kLong));
      gen.set_meta("n", Value(s.sampling.n));
      gen.set_meta("temperature", Value(s.sampling.temperature));
      gen.set_meta("top_k", Value(s.sampling.top_k));
      gen.set_meta("top_p", Value(s.sampling.top_p));
      gen.set_meta("pad_token_id", Value(st.train_data->pad_id()));
      // One call, or (partial_rollout) calls of `chunk` tokens between which
      // a weight sync can run.
      const int64_t response_length = s.actor.rollout.response_length;
      ChunkedRollout generation(
          gen, response_length,
          s.async.partial_rollout ? s.async.partial_rollout_chunk : response_length, replicas);
      const auto g0 = Clock::now();
      while (!generation.done()) {
        if (queue.closed()) return;
        generation.step(rollout);
      }
      const DataProto out = generation.result();
      TrajectoryBatch b;
      b.generate_seconds = seconds_since(g0);
      b.param_version = out.meta_value("param_version")->as_int();
      b.resumed_samples = generation.resumed_samples();
      b.index = e.index;
      b.batch = e.prompts.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                    .repeat(s.n, true)
                    .union_with(out);
      p.ledger.finish(e.index, b);
      t0 = Clock::now();
      const bool pushed = queue.push(std::move(b));
      idle += seconds_since(t0);
      {
        std::lock_guard lock(r.mu);
        r.idle_seconds += idle;
      }
      if (!pushed) return;
    }
  } catch (...) {
    {
      std::lock_guard lock(r.mu);
      r.error = std::current_exception();
    }
    queue.close();
  }
}

RolloutPipeline::RolloutPipeline(PpoTrainer::State& st, std::vector<LedgerEntry> entries,
                                 int64_t next_step, int64_t version)
    : queue(TrajectoryQueueOptions()
                .set_capacity(st.s.async.max_queue_size)
                .set_staleness_threshold(st.s.async.staleness_threshold)
                .set_policy(st.s.async.policy)
                // The generated entries are queued first: they were reserved.
                .set_first_step(next_step + generated_entries(entries))
                .set_rollout_version(version)),
      ledger(std::move(entries), next_step) {
  thread = std::thread([this, &st] { run_rollouter(st, *this); });
}

// A short call with a deadline: the rollout must answer before a weight sync
// (which would otherwise hang the actor in its collective).
void check_rollout_answers(WorkerGroup& rollout, const char* when) {
  try {
    rollout.call("param_version", {}, CallOptions().set_timeout_ms(60000)).get();
  } catch (const std::exception& e) {
    throw Error(std::string("async trainer: the rollout workers do not answer ") + when + ": " +
                e.what());
  }
}

// What a stored exception says.
std::string error_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Truncated IS (verl's rollout_is = token with a cap, slime's TIS; the
// kernel of algorithm.rollout_correction): w = min(exp(old − rollout), cap),
// data, not differentiated; zero on padding. A batch without response
// tokens gets zero weights and no metric, never a NaN.
void set_tis_weights(DataProto& batch, double cap, Metrics& m) {
  const at::Tensor mask = batch.tensor("response_mask");
  const at::Tensor log_ratio = batch.tensor("old_log_probs") - batch.tensor("rollout_log_probs");
  if (!mask.ne(0).any().item<bool>()) {
    batch.set_tensor("rollout_is_weights", at::zeros_like(log_ratio));
    return;
  }
  algos::RolloutIsWeights w =
      algos::compute_rollout_is_weights(log_ratio, mask, algos::RolloutIsLevel::Token, {cap, {}});
  batch.set_tensor("rollout_is_weights", w.weights);
  m["async/tis_weight_mean"] = w.metrics.at("rollout_is_mean");
  m["async/tis_clip_frac"] = w.metrics.at("rollout_is_ratio_fraction_high");
}

// The trainer loop of fit_async, one step() per training step, with the
// rollout pipeline feeding it.
class AsyncFitLoop {
 public:
  // After begin_run: the first weight sync (the rollout loaded the HF weights;
  // the actor may hold a resumed checkpoint's), then the rollouter starts,
  // with a resumed checkpoint's queued and in-flight batches first.
  AsyncFitLoop(PpoTrainer::State& st, FitResult& result, const std::function<Metrics()>& validate);

  // Trains step st.global_step + 1 on the next batch of the queue.
  void step();
  // Stops the rollouter, then the HF export and the plot.
  void finish();

 private:
  // The step's batch off the queue (restarting a failed rollout while it
  // waits), with its staleness metrics; ready for the reward.
  DataProto take_batch(StepTimer& timed, Metrics& m);
  // Reward, log-probs, values, advantages and the updates.
  void train(DataProto& batch, StepTimer& timed, Metrics& m);
  // Every trigger_parameter_sync_step steps (not after the last): the weight
  // sync, restarting the rollout if it fails. Returns the seconds spent on
  // syncs since the last step, a restart's included.
  double sync_if_due();
  // A failed rollout (a dead worker, a generate or sync that threw): up to
  // async_training.max_rollout_restarts times, a new rollout group takes the
  // actor's weights `version` and the ledger's unfinished batches, the next
  // batch trains at `next_step`; beyond that the run stops with the error.
  void restart_rollout(const std::string& why, int64_t next_step, int64_t version);
  // The rollout side's metrics of the step: idle time, drops, restarts,
  // restored samples, staleness.
  void add_rollout_metrics(Metrics& m);
  // trainer.save_freq and the last step: the checkpoint, with the ledger.
  void save_checkpoint_if_due();

  PpoTrainer::State& st_;
  TrainerSettings& s_;
  const AsyncTrainingSettings& as_;
  FitResult& result_;
  const std::function<Metrics()>& validate_;
  WorkerGroup& actor_;
  ProgressLine progress_;
  double pending_sync_s_ = 0;     // syncs not yet reported in a step's metrics
  int64_t restored_samples_ = 0;  // reported at the first step
  std::unique_ptr<RolloutPipeline> pipe_;
  int64_t restarts_ = 0;
  StalenessHistogram staleness_;
};

AsyncFitLoop::AsyncFitLoop(PpoTrainer::State& st, FitResult& result,
                           const std::function<Metrics()>& validate)
    : st_(st),
      s_(st.s),
      as_(st.s.async),
      result_(result),
      validate_(validate),
      actor_(*st.actor),
      progress_("training (async)", st.s.total_steps) {
  check_rollout_answers(*st_.rollout, "before the first weight sync");
  pending_sync_s_ = sync_weights(actor_, *st_.rollout, nullptr, st_.global_step);
  std::vector<LedgerEntry> restored = std::exchange(st_.restored_ledger, {});
  restored_samples_ = ledger_samples(restored, s_.n);
  if (!restored.empty()) {
    log(LogLevel::kInfo, "resume: restored " + std::to_string(restored_samples_) +
                             " samples of the rollout queue: " + describe_ledger(restored));
  }
  pipe_ = std::make_unique<RolloutPipeline>(st_, std::move(restored), st_.global_step + 1,
                                            st_.global_step);
}

void AsyncFitLoop::step() {
  ++st_.global_step;
  st_.profiler->begin_step(st_.global_step);
  const auto step_start = Clock::now();
  Metrics m;
  StepTimer timed{progress_, st_.global_step, {}};
  Metrics& timing = timed.timing;
  DataProto batch = take_batch(timed, m);
  train(batch, timed, m);
  const double sync_s = sync_if_due();
  timing["sync"] = sync_s;
  m["async/sync_s"] = sync_s;
  timing["step"] = seconds_since(step_start);
  validate_if_due(st_, result_, m, timing, validate_);
  add_rollout_metrics(m);
  log_step(st_, result_, batch, m, timing, progress_);
  save_checkpoint_if_due();
  end_profiled_step(st_);
}

DataProto AsyncFitLoop::take_batch(StepTimer& timed, Metrics& m) {
  std::optional<TrajectoryBatch> item;
  timed("wait_batch", [&] {
    while (!(item = pipe_->queue.pop(st_.global_step))) {
      const std::exception_ptr error = pipe_->error();
      if (!error) {
        throw Error("async trainer: the rollouter stopped before step " +
                    std::to_string(st_.global_step));
      }
      restart_rollout(error_text(error), st_.global_step, st_.global_step - 1);
    }
  });
  pipe_->ledger.taken(item->index);
  const int64_t stale = st_.global_step - 1 - item->param_version;
  staleness_.add(stale);
  m["async/param_version"] = static_cast<double>(item->param_version);
  m["async/queue_depth"] = static_cast<double>(pipe_->queue.depth());
  m["async/trainer_idle_s"] = timed.timing.at("wait_batch");
  timed.timing["gen"] = item->generate_seconds;
  if (as_.partial_rollout)
    m["async/partial_resumed_samples"] = static_cast<double>(item->resumed_samples);
  DataProto batch = std::move(item->batch);
  if (s_.balance_batch) balance_batch(batch, actor_dp(s_), m);
  batch.set_meta("temperature", Value(s_.logprob_temperature));
  batch.set_meta("global_steps", Value(st_.global_step));
  return batch;
}

void AsyncFitLoop::train(DataProto& batch, StepTimer& timed, Metrics& m) {
  RewardModelScores rm = start_reward_model(st_, batch, m);
  timed("reward", [&] { reward_phase(st_, batch, rm, m); });
  // Always computed: the proximal policy of the update (decoupled PPO) and
  // the numerator of the IS weights.
  timed("old_log_prob", [&] {
    old_log_prob_pass(actor_, batch, s_.loss_agg_mode, m, s_.calculate_sum_pi_squared);
  });
  if (as_.tis_cap) set_tis_weights(batch, *as_.tis_cap, m);
  if (s_.use_ref) timed("ref", [&] { ref_log_prob_pass(actor_, batch); });
  WorkerGroup* critic = s_.use_critic ? &st_.critic_role() : nullptr;
  if (critic) timed("values", [&] { values_pass(*critic, batch); });
  if (rm.pending()) timed("reward_wait", [&] { rm.collect(batch); });
  timed("adv", [&] { rewards_and_advantages(batch, s_, *st_.kl_ctrl, m); });
  if (critic) {
    timed("update_critic",
          [&] { merge_metrics(m, critic->call("update_critic", {batch}).get().as<DataProto>()); });
  }
  // As the synchronous loop: the actor waits trainer.critic_warmup steps.
  if (st_.global_step >= s_.critic_warmup) {
    timed("update_actor",
          [&] { merge_metrics(m, actor_.call("update_actor", {batch}).get().as<DataProto>()); });
  }
}

double AsyncFitLoop::sync_if_due() {
  double sync_s = std::exchange(pending_sync_s_, 0.0);
  if (st_.global_step % as_.trigger_parameter_sync_step == 0 && st_.global_step < s_.total_steps) {
    try {
      sync_s += sync_weights(actor_, *st_.rollout, &pipe_->queue, st_.global_step);
    } catch (const std::exception& e) {
      restart_rollout(std::string("weight sync: ") + e.what(), st_.global_step + 1,
                      st_.global_step);
    }
    sync_s += std::exchange(pending_sync_s_, 0.0);
  }
  return sync_s;
}

void AsyncFitLoop::restart_rollout(const std::string& why, int64_t next_step, int64_t version) {
  if (restarts_ >= as_.max_rollout_restarts) {
    throw Error(
        "async trainer: the rollout failed at step " + std::to_string(st_.global_step) + " (" +
        why + ")" +
        (restarts_ > 0 ? "; restarted " + std::to_string(restarts_) + " time(s) already"
                       : std::string()) +
        "; async_training.max_rollout_restarts = " + std::to_string(as_.max_rollout_restarts));
  }
  ++restarts_;
  std::vector<LedgerEntry> unfinished = pipe_->ledger.entries();
  log(LogLevel::kWarn,
      "async trainer: the rollout failed at step " + std::to_string(st_.global_step) + " (" + why +
          "); restarting it (" + std::to_string(restarts_) + " of " +
          std::to_string(as_.max_rollout_restarts) + ") with " + describe_ledger(unfinished));
  pipe_.reset();
  st_.rollout.reset();
  st_.rollout_pool.reset();
  spawn_async_rollout(st_);
  check_rollout_answers(*st_.rollout, "after a restart");
  pending_sync_s_ += sync_weights(actor_, *st_.rollout, nullptr, version);
  pipe_ = std::make_unique<RolloutPipeline>(st_, std::move(unfinished), next_step, version);
}

void AsyncFitLoop::add_rollout_metrics(Metrics& m) {
  {
    std::lock_guard lock(pipe_->r.mu);
    m["async/rollouter_idle_s"] = pipe_->r.idle_seconds;
    pipe_->r.idle_seconds = 0;
  }
  m["async/dropped_batches"] = static_cast<double>(pipe_->queue.dropped());
  m["async/rollout_restarts"] = static_cast<double>(restarts_);
  if (restored_samples_ > 0)
    m["async/restored_samples"] = static_cast<double>(std::exchange(restored_samples_, 0));
  for (const auto& [k, v] : staleness_.metrics()) m[k] = v;
}

void AsyncFitLoop::save_checkpoint_if_due() {
  if (s_.save_freq <= 0 ||
      (st_.global_step % s_.save_freq != 0 && st_.global_step != s_.total_steps))
    return;
  profiler::Span span("save_checkpoint", "trainer");
  // The ledger is read after the workers saved, with the loader's position.
  save_trainer_checkpoint(
      st_, [&] { return pipe_->ledger.snapshot([&] { return st_.loader->state().to_json(); }); });
}

void AsyncFitLoop::finish() {
  pipe_.reset();
  result_.steps = st_.global_step;
  progress_.update(st_.global_step);
  progress_.finish();
  export_and_plot(st_, actor_, result_);
}

}  // namespace

int async_worker_threads(const TrainerSettings& s) {
  return std::max<int>(1, usable_cores() / static_cast<int>(s.world + s.async.rollout_world));
}

void spawn_async_rollout(PpoTrainer::State& st) {
  const TrainerSettings& s = st.s;
  ResourcePoolOptions popts;
  popts.processes_on_nodes = {static_cast<int>(s.async.rollout_world)};
  popts.use_gpu = s.use_gpu;
  popts.intra_op_threads = async_worker_threads(s);
  st.rollout_pool.emplace(popts);
  ParallelLayout layout;
  layout.tp = s.actor.rollout.tp;
  layout.dp = s.async.rollout_world / s.actor.rollout.tp;
  st.rollout.emplace(WorkerGroup::spawn(
      workers::rollout_worker_class(), *st.rollout_pool, {s.actor.to_json(), s.world},
      WorkerGroupOptions().set_layout(layout).set_name("rollout")));
  st.rollout->call("init_model", {}).get();
  const Value endpoints = st.rollout->call("weight_sync_endpoint", {}).get();
  const std::string endpoint = endpoints.as_list().at(0).as_string();
  Future<Value> sender = st.actor->call("init_weight_sync",
                                        {endpoint, std::string(kSyncGroup), s.async.rollout_world});
  st.rollout->call("init_weight_sync", {endpoint, std::string(kSyncGroup)}).get();
  sender.get();
}

FitResult fit_async(PpoTrainer::State& st, const std::function<Metrics()>& validate) {
  FitResult result;
  begin_run(st, result, validate);
  AsyncFitLoop loop(st, result, validate);
  while (st.global_step < st.s.total_steps) loop.step();
  loop.finish();
  return result;
}

}  // namespace baton::trainer
