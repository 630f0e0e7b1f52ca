// The fully-async mode of PpoTrainer (async_training.enable; verl's
// fully_async_policy, AReaL's and slime's asynchronous RL): generation and
// training as two loops on two worker groups, joined by a bounded queue.
//
//   rollouter thread (driver)            trainer loop (driver)
//   ────────────────────────             ─────────────────────
//   reserve a step (staleness gate)      pop a batch (wait: trainer idle)
//   prompts ← the data loader (through   reward → old log-probs → ref →
//     the rollout ledger)
//   generate on the RolloutWorker group    advantages → truncated IS weights
//     (its weights' version in the         (π_old / π_rollout, capped) →
//     result)                               update_actor
//   push into TrajectoryQueue            every trigger_parameter_sync_step
//     (blocks while full: rollouter idle)  steps: send_weights(step) on the
//                                          actor ∥ receive_weights on the rollout
//
// The rollout group (RolloutWorker, workers/roles/rollout_worker.h) has
// async_training.rollout_n_gpus_per_node processes of its own; the actor's
// weights reach it through engine::WeightSender / WeightReceiver, once before
// the first step (a resumed actor differs from the HF weights the rollout
// loaded; the call also checks that the rollout answers) and then every
// trigger_parameter_sync_step steps. A sync waits for the rollout's generate
// in flight, which then finishes with the old weights (no partial rollout).
//
// What is queued or being generated is in a RolloutLedger (rollout_ledger.h)
// until the trainer takes it: checkpoints (trainer.save_freq) save it with the
// loader's position, and a resume trains those batches first (generating the
// in-flight ones again), so no sample is lost; it logs how many it restored
// (metric async/restored_samples at the first step). A failed rollout (a dead
// worker, a generate or weight sync that threw) is logged and, up to
// async_training.max_rollout_restarts times, replaced by a new group that
// takes the actor's weights and the ledger's unfinished batches
// (async/rollout_restarts counts them).
//
// Metrics per step, besides the synchronous trainer's: async/staleness (this
// batch's), async/staleness_mean, async/staleness_max and
// async/staleness_count/<k> over the run, async/param_version (the batch's),
// async/queue_depth (when popped), async/dropped_batches,
// async/trainer_idle_s (waiting for a batch), async/rollouter_idle_s (waiting
// for the staleness gate or queue room since the last step), async/sync_s
// (also timing_s/sync; 0 without a sync), async/tis_weight_mean and
// async/tis_clip_frac (with tis_cap), timing_s/gen (the rollout's time for
// the batch, overlapped with training).
//
// Internal to baton::trainer: PpoTrainer calls these (trainer_state.h).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "trainer/config/settings.h"
#include "trainer/ppo_trainer.h"

namespace baton::trainer {

// Intra-op threads of each worker when the actor's and the rollout's
// processes share the node's usable cores.
int async_worker_threads(const TrainerSettings& s);

// Spawns st.rollout (RolloutWorker on its own pool), loads its model and
// joins it to the actor's group for weight sync. REQUIRES: st.actor inited.
void spawn_async_rollout(PpoTrainer::State& st);

// The async fit loop: resume, validation, training as above, checkpoints, the
// HF export and the plot, as PpoTrainer::fit. A rollout failure beyond
// max_rollout_restarts stops the run with its error.
FitResult fit_async(PpoTrainer::State& st,
                    const std::function<std::map<std::string, double>()>& validate);

}  // namespace baton::trainer
