// TrajectoryQueue: the bounded queue between the fully-async trainer's
// rollouter thread and its training loop (trainer/async/async_trainer.h), with the
// staleness control of async_training.staleness_threshold. The queue itself
// is oneTBB's concurrent_bounded_queue (blocking push and pop, abort wakes
// every waiter).
//
// Versions. The actor's parameter version is the number of optimizer steps
// taken: version v = the weights after global step v (0 = the initial ones).
// Training step t trains on version t - 1, so a batch generated with version
// v and trained at step t is t - 1 - v steps stale.
//
// Policies:
//   kWait  the rollouter may start a batch only when the step that will train
//          it (batches are trained in order, one per step) is at most
//          `staleness_threshold` steps past the rollout's version:
//          reserve() blocks until a weight sync (set_rollout_version) allows
//          it. No batch is ever dropped, and none is staler than the threshold.
//   kDrop  the rollouter never waits for staleness; pop() drops (and counts)
//          batches staler than the threshold and takes the next.
// Either way the threshold must be at least trigger_parameter_sync_step - 1,
// or the freshest batch between two syncs could not be trained
// (read_trainer_settings checks this).
//
// Example:
//   TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(2).set_first_step(1));
//   // rollouter thread:
//   while (q.reserve()) { TrajectoryBatch b = ...generate...; if (!q.push(std::move(b))) break; }
//   // trainer thread, step t:
//   std::optional<TrajectoryBatch> b = q.pop(t);  // nullopt once closed
//   ... after a sync to version t:  q.set_rollout_version(t);
//   q.close();
//
// Thread safety: every method may be called from any thread; one rollouter
// and one trainer thread is the intended use.
#pragma once

#include <tbb/concurrent_queue.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "dispatch/data_proto.h"
#include "trainer/async/staleness_policy.h"

namespace baton::trainer {

// A finished batch of trajectory groups (a step's prompts × n responses).
struct TrajectoryBatch {
  DataProto batch;
  int64_t param_version = 0;    // the weights that generated it
  int64_t index = 0;            // generation order: 0, 1, ...
  double generate_seconds = 0;  // the rollout's time for it
  int64_t resumed_samples = 0;  // partial rollout: samples drawn by more than one version
};

struct TrajectoryQueueOptions {
  int64_t capacity = 2;             // batches queued at most (push blocks beyond)
  int64_t staleness_threshold = 1;  // steps a trained batch may lag its weights
  StalenessPolicy policy = StalenessPolicy::kWait;
  int64_t first_step = 1;       // the step that trains the first batch
  int64_t rollout_version = 0;  // the rollout's weights at the start

  TrajectoryQueueOptions& set_capacity(int64_t n) {
    capacity = n;
    return *this;
  }
  TrajectoryQueueOptions& set_staleness_threshold(int64_t n) {
    staleness_threshold = n;
    return *this;
  }
  TrajectoryQueueOptions& set_policy(StalenessPolicy p) {
    policy = p;
    return *this;
  }
  TrajectoryQueueOptions& set_first_step(int64_t step) {
    first_step = step;
    return *this;
  }
  TrajectoryQueueOptions& set_rollout_version(int64_t v) {
    rollout_version = v;
    return *this;
  }
};

class TrajectoryQueue {
 public:
  // baton::Error for a capacity below 1 or a negative threshold.
  explicit TrajectoryQueue(TrajectoryQueueOptions options);

  // Rollouter, before it starts a batch: kWait blocks until the batch would
  // be fresh enough (see above), then counts it as started; kDrop returns at
  // once. False once closed.
  bool reserve();
  // Blocks while the queue is full. False once closed (the batch is dropped).
  bool push(TrajectoryBatch batch);
  // Trainer: the next batch to train at `step` (kDrop: staler ones are
  // dropped first). Blocks while empty; nullopt once closed.
  std::optional<TrajectoryBatch> pop(int64_t step);
  // The rollout group's version: call it once the weight sync to `version`
  // is submitted to the rollout group (before any later generate call), so
  // that every batch started after it runs with it.
  void set_rollout_version(int64_t version);
  // Wakes and fails every waiter, now and later; returns once none is left
  // blocked in the queue. Idempotent.
  void close();

  bool closed() const;
  int64_t depth() const;  // batches queued now
  int64_t dropped() const;

 private:
  TrajectoryQueueOptions options_;
  tbb::concurrent_bounded_queue<TrajectoryBatch> queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;               // GUARDED_BY(mu_)
  std::atomic<bool> closing_{false};  // closed_, for the TBB operations
  std::atomic<int> blocking_{0};      // TBB push/pop calls under way
  int64_t next_step_ = 1;             // GUARDED_BY(mu_): the step of the next reserved batch
  int64_t rollout_version_ = 0;       // GUARDED_BY(mu_)
  int64_t dropped_ = 0;               // GUARDED_BY(mu_)
};

// What the trained batches' staleness was, for the metrics: per step
// async/staleness (the batch's), and over the run async/staleness_mean,
// async/staleness_max and the histogram async/staleness_count/<k> (batches
// trained k steps stale). Not thread-safe (the trainer thread's).
class StalenessHistogram {
 public:
  void add(int64_t staleness);
  std::map<std::string, double> metrics() const;

 private:
  std::map<int64_t, int64_t> counts_;
  int64_t last_ = 0, total_ = 0, n_ = 0;
};

}  // namespace baton::trainer
