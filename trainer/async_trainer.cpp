#include "trainer/async_trainer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "dispatch/data_proto.h"
#include "engine/sampling.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "runtime/profiler.h"
#include "runtime/threads.h"
#include "trainer/metric_utils.h"
#include "trainer/progress_line.h"
#include "trainer/prompt_batch.h"
#include "trainer/step_phases.h"
#include "trainer/trainer_state.h"
#include "trainer/trajectory_queue.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/kl.h"
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
  sent.get();
  const Value versions = received.get();
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

// Generates batches until the queue closes: each train_batch_size prompts
// from the loader, n samples each, on the rollout group.
void run_rollouter(PpoTrainer::State& st, TrajectoryQueue& queue, Rollouter& r,
                   int64_t first_step) {
  const TrainerSettings& s = st.s;
  WorkerGroup& rollout = *st.rollout;
  const int64_t replicas = s.async.rollout_world / s.actor.rollout.tp;
  try {
    for (int64_t index = 0;; ++index) {
      auto t0 = Clock::now();
      if (!queue.reserve()) return;
      double idle = seconds_since(t0);
      // The step that will train it, in the uid prefix as the sync trainer's.
      const int64_t step = first_step + index;
      DataProto prompts = prompt_batch_proto(st.loader->next(), std::to_string(step) + "-");
      auto [gen, pad] = prompts.select({"input_ids", "attention_mask"}).pad_to_multiple(replicas);
      const uint64_t step_seed = engine::SequenceRng::request_seed(s.rollout_seed, step);
      std::vector<int64_t> seeds;
      for (int64_t i = 0; i < gen.size(); ++i)
        seeds.push_back(static_cast<int64_t>(engine::SequenceRng::request_seed(step_seed, i)));
      gen.set_tensor("request_seed", at::tensor(seeds, at::kLong));
      gen.set_meta("n", Value(s.sampling.n));
      gen.set_meta("do_sample", Value(s.sampling.do_sample));
      gen.set_meta("temperature", Value(s.sampling.temperature));
      gen.set_meta("top_k", Value(s.sampling.top_k));
      gen.set_meta("top_p", Value(s.sampling.top_p));
      gen.set_meta("pad_token_id", Value(st.train_data->pad_id()));
      const auto g0 = Clock::now();
      DataProto out = rollout.call("generate_sequences", {gen}).get().as<DataProto>();
      TrajectoryBatch b;
      b.generate_seconds = seconds_since(g0);
      const Value* version = out.meta_value("param_version");
      if (version == nullptr)
        throw Error("rollouter: generate_sequences returned no param_version");
      b.param_version = version->as_int();
      b.index = index;
      b.batch = prompts.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                    .repeat(s.n, true)
                    .union_with(out.unpad(pad * s.n));
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
  layout.tp = static_cast<int>(s.actor.rollout.tp);
  layout.dp = static_cast<int>(s.async.rollout_world / s.actor.rollout.tp);
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
  TrainerSettings& s = st.s;
  const AsyncTrainingSettings& as = s.async;
  FitResult result;
  WorkerGroup& actor = *st.actor;
  WorkerGroup& rollout = *st.rollout;

  begin_run(st, result, validate);
  ProgressLine progress("training (async)", s.total_steps);

  // The rollout must answer before the first sync (which would otherwise
  // hang the actor in its collective): a short call with a deadline.
  try {
    rollout.call("param_version", {}, CallOptions().set_timeout_ms(60000)).get();
  } catch (const std::exception& e) {
    throw Error(std::string("async trainer: the rollout workers do not answer before the first "
                            "weight sync: ") +
                e.what());
  }
  // The rollout loaded the HF weights; the actor may hold a resumed checkpoint's.
  double pending_sync_s = sync_weights(actor, rollout, nullptr, st.global_step);

  TrajectoryQueue queue(TrajectoryQueueOptions()
                            .set_capacity(as.max_queue_size)
                            .set_staleness_threshold(as.staleness_threshold)
                            .set_policy(as.policy)
                            .set_first_step(st.global_step + 1)
                            .set_rollout_version(st.global_step));
  Rollouter r;
  std::thread rollouter([&] { run_rollouter(st, queue, r, st.global_step + 1); });
  // Stops the rollouter on every way out of the loop.
  struct Joiner {
    TrajectoryQueue& q;
    std::thread& t;
    ~Joiner() {
      q.close();
      if (t.joinable()) t.join();
    }
  } joiner{queue, rollouter};

  StalenessHistogram staleness;
  while (st.global_step < s.total_steps) {
    ++st.global_step;
    st.profiler->begin_step(st.global_step);
    const auto step_start = Clock::now();
    Metrics m;
    StepTimer timed{progress, st.global_step, {}};
    Metrics& timing = timed.timing;

    std::optional<TrajectoryBatch> item;
    timed("wait_batch", [&] { item = queue.pop(st.global_step); });
    if (!item) {
      std::lock_guard lock(r.mu);
      if (r.error) std::rethrow_exception(r.error);
      throw Error("async trainer: the rollouter stopped before step " +
                  std::to_string(st.global_step));
    }
    const int64_t stale = st.global_step - 1 - item->param_version;
    staleness.add(stale);
    m["async/param_version"] = static_cast<double>(item->param_version);
    m["async/queue_depth"] = static_cast<double>(queue.depth());
    m["async/trainer_idle_s"] = timing.at("wait_batch");
    timing["gen"] = item->generate_seconds;
    DataProto batch = std::move(item->batch);
    if (s.balance_batch) balance_batch(batch, actor_dp(s), m);
    batch.set_meta("temperature", Value(s.sampling.temperature));
    batch.set_meta("global_steps", Value(st.global_step));

    RewardModelScores rm = start_reward_model(st, batch, m);
    timed("reward", [&] { reward_phase(st, batch, rm, m); });
    // Always computed: the proximal policy of the update (decoupled PPO) and
    // the numerator of the IS weights.
    timed("old_log_prob", [&] { old_log_prob_pass(actor, batch, s.loss_agg_mode, m); });
    if (as.tis_cap) {
      // Truncated IS (verl's rollout_is with a token-level cap, slime's TIS):
      // w = min(exp(old − rollout), cap), data, not differentiated; zero on
      // padding. A batch without response tokens gives no metric, never a NaN.
      const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
      const at::Tensor ratio =
          (batch.tensor("old_log_probs") - batch.tensor("rollout_log_probs")).exp();
      const at::Tensor w = ratio.clamp_max(*as.tis_cap) * mask;
      batch.set_tensor("rollout_is_weights", w);
      const double tokens = mask.sum().item<double>();
      if (tokens > 0) {
        m["async/tis_weight_mean"] = w.sum().item<double>() / tokens;
        m["async/tis_clip_frac"] =
            ((ratio > *as.tis_cap).to(at::kFloat) * mask).sum().item<double>() / tokens;
      }
    }
    if (s.use_ref) timed("ref", [&] { ref_log_prob_pass(actor, batch); });
    WorkerGroup* critic = s.use_critic ? &st.critic_role() : nullptr;
    if (critic) timed("values", [&] { values_pass(*critic, batch); });
    if (rm.pending()) timed("reward_wait", [&] { rm.collect(batch); });
    timed("adv", [&] { rewards_and_advantages(batch, s, *st.kl_ctrl, m); });
    if (critic) {
      timed("update_critic", [&] {
        merge_metrics(m, critic->call("update_critic", {batch}).get().as<DataProto>());
      });
    }
    // As the synchronous loop: the actor waits trainer.critic_warmup steps.
    if (st.global_step >= s.critic_warmup) {
      timed("update_actor",
            [&] { merge_metrics(m, actor.call("update_actor", {batch}).get().as<DataProto>()); });
    }
    double sync_s = pending_sync_s;
    pending_sync_s = 0;
    if (st.global_step % as.trigger_parameter_sync_step == 0 && st.global_step < s.total_steps) {
      sync_s += sync_weights(actor, rollout, &queue, st.global_step);
    }
    timing["sync"] = sync_s;
    m["async/sync_s"] = sync_s;
    timing["step"] = seconds_since(step_start);

    validate_if_due(st, result, m, timing, validate);
    {
      std::lock_guard lock(r.mu);
      m["async/rollouter_idle_s"] = r.idle_seconds;
      r.idle_seconds = 0;
    }
    m["async/dropped_batches"] = static_cast<double>(queue.dropped());
    for (const auto& [k, v] : staleness.metrics()) m[k] = v;
    log_step(st, result, batch, m, timing, progress);
    end_profiled_step(st);
  }
  queue.close();
  rollouter.join();
  result.steps = st.global_step;
  progress.update(st.global_step);
  progress.finish();

  export_and_plot(st, actor, result);
  return result;
}

}  // namespace baton::trainer
