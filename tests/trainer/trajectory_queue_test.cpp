// The fully-async trainer's queue and staleness control (trajectory_queue.h)
// and its config checks (async_training.*), without workers.
#include "trainer/async/trajectory_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include "trainer/config/config.h"
#include "trainer/config/settings.h"

namespace baton::trainer {
namespace {

using namespace std::chrono_literals;

TrajectoryBatch made_with(int64_t version, int64_t index = 0) {
  TrajectoryBatch b;
  b.param_version = version;
  b.index = index;
  return b;
}

TEST(TrajectoryQueue, WaitPolicyHoldsTheRollouterUntilASyncKeepsTheBatchWithinTheThreshold) {
  // Threshold 1 from version 0: the batches for steps 1 (0 stale) and 2
  // (1 stale) may start; step 3's would be 2 stale until the sync to 1.
  TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(4).set_staleness_threshold(1));
  EXPECT_TRUE(q.reserve());
  EXPECT_TRUE(q.reserve());
  std::future<bool> third = std::async(std::launch::async, [&] { return q.reserve(); });
  EXPECT_EQ(third.wait_for(100ms), std::future_status::timeout);
  q.set_rollout_version(1);
  EXPECT_TRUE(third.get());
  // An older version never moves the gate back.
  q.set_rollout_version(0);
  std::future<bool> fourth = std::async(std::launch::async, [&] { return q.reserve(); });
  EXPECT_EQ(fourth.wait_for(100ms), std::future_status::timeout);
  q.close();
  EXPECT_FALSE(fourth.get());
}

TEST(TrajectoryQueue, WaitPolicyNeverDropsAndKeepsOrder) {
  TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(3).set_staleness_threshold(0));
  for (int64_t i = 0; i < 3; ++i) ASSERT_TRUE(q.push(made_with(0, i)));
  EXPECT_EQ(q.depth(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    std::optional<TrajectoryBatch> b = q.pop(/*step=*/5);  // 4 stale: kept under kWait
    ASSERT_TRUE(b);
    EXPECT_EQ(b->index, i);
  }
  EXPECT_EQ(q.dropped(), 0);
}

TEST(TrajectoryQueue, DropPolicyDropsBatchesStalerThanTheThresholdAndCountsThem) {
  TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(4).set_staleness_threshold(1).set_policy(
      StalenessPolicy::kDrop));
  // The rollouter never waits under kDrop.
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(q.reserve());
  ASSERT_TRUE(q.push(made_with(0, 0)));
  ASSERT_TRUE(q.push(made_with(1, 1)));
  ASSERT_TRUE(q.push(made_with(2, 2)));
  // Step 4 trains version 3: version 0 is 3 stale, 1 is 2 stale, 2 is 1 stale.
  std::optional<TrajectoryBatch> b = q.pop(4);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->param_version, 2);
  EXPECT_EQ(q.dropped(), 2);
  EXPECT_EQ(q.depth(), 0);
}

TEST(TrajectoryQueue, AFullQueueBlocksThePushAndCloseFailsEveryWaiter) {
  TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(1));
  ASSERT_TRUE(q.push(made_with(0, 0)));
  std::future<bool> blocked =
      std::async(std::launch::async, [&] { return q.push(made_with(0, 1)); });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  ASSERT_TRUE(q.pop(1));  // makes room
  EXPECT_TRUE(blocked.get());
  ASSERT_TRUE(q.pop(1));
  // An empty queue blocks the trainer until close.
  std::future<bool> popped = std::async(std::launch::async, [&] { return q.pop(2).has_value(); });
  EXPECT_EQ(popped.wait_for(100ms), std::future_status::timeout);
  q.close();
  EXPECT_FALSE(popped.get());
  EXPECT_FALSE(q.push(made_with(0, 2)));
  EXPECT_FALSE(q.pop(2));
  EXPECT_FALSE(q.reserve());
  q.close();  // idempotent
}

TEST(TrajectoryQueue, CloseRacingAPushOrPopNeverLeavesItBlocked) {
  // close() aborts until no TBB operation is left: a push or pop that starts
  // just after an abort is caught by the next one.
  for (int round = 0; round < 200; ++round) {
    TrajectoryQueue q(TrajectoryQueueOptions().set_capacity(1));
    ASSERT_TRUE(q.push(made_with(0)));
    std::thread pusher([&] { q.push(made_with(0)); });
    TrajectoryQueue empty(TrajectoryQueueOptions().set_capacity(1));
    std::thread popper([&] { empty.pop(1); });
    q.close();
    empty.close();
    pusher.join();
    popper.join();
  }
}

TEST(TrajectoryQueue, RejectsAZeroCapacityAndANegativeThreshold) {
  EXPECT_THROW(TrajectoryQueue(TrajectoryQueueOptions().set_capacity(0)), std::exception);
  EXPECT_THROW(TrajectoryQueue(TrajectoryQueueOptions().set_staleness_threshold(-1)),
               std::exception);
}

TEST(StalenessHistogram, CountsEachStalenessAndReportsTheLastTheMeanAndTheMax) {
  StalenessHistogram h;
  EXPECT_TRUE(h.metrics().empty());
  for (int64_t s : {0, 1, 1, 0, 2}) h.add(s);
  const auto m = h.metrics();
  EXPECT_EQ(m.at("async/staleness"), 2);
  EXPECT_DOUBLE_EQ(m.at("async/staleness_mean"), 0.8);
  EXPECT_EQ(m.at("async/staleness_max"), 2);
  EXPECT_EQ(m.at("async/staleness_count/0"), 2);
  EXPECT_EQ(m.at("async/staleness_count/1"), 2);
  EXPECT_EQ(m.at("async/staleness_count/2"), 1);
}

// async_training.* as read_trainer_settings reads and checks it.
Config async_config(const std::vector<std::string>& overrides) {
  Config c = Config::load(std::filesystem::path(BATON_CONFIGS_DIR) / "grpo_toy_async.yaml");
  c.apply_overrides(overrides);
  return c.resolved();
}

std::string settings_error(const std::vector<std::string>& overrides) {
  try {
    read_trainer_settings(async_config(overrides));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(AsyncTrainingConfig, TheToyConfigTurnsItOnWithItsKeys) {
  const TrainerSettings s = read_trainer_settings(async_config(
      {"async_training.staleness_policy=drop", "async_training.trigger_parameter_sync_step=2",
       "async_training.tis_cap=null"}));
  EXPECT_TRUE(s.async.enable);
  EXPECT_EQ(s.async.rollout_world, 1);
  EXPECT_EQ(s.async.trigger_parameter_sync_step, 2);
  EXPECT_EQ(s.async.staleness_threshold, 1);
  EXPECT_EQ(s.async.policy, StalenessPolicy::kDrop);
  EXPECT_EQ(s.async.max_queue_size, 2);
  EXPECT_FALSE(s.async.tis_cap);
  EXPECT_EQ(s.async.max_rollout_restarts, 1);
}

TEST(AsyncTrainingConfig, ErrorsNameTheKey) {
  EXPECT_NE(settings_error({"async_training.staleness_policy=later"})
                .find("async_training.staleness_policy"),
            std::string::npos);
  // A threshold below trigger - 1 could never train the batches between syncs.
  const std::string e = settings_error(
      {"async_training.trigger_parameter_sync_step=3", "async_training.staleness_threshold=1"});
  EXPECT_NE(e.find("async_training.staleness_threshold"), std::string::npos) << e;
  EXPECT_NE(settings_error({"async_training.max_queue_size=0"}).find("max_queue_size"),
            std::string::npos);
  EXPECT_NE(settings_error({"async_training.tis_cap=0"}).find("async_training.tis_cap"),
            std::string::npos);
  EXPECT_NE(settings_error({"async_training.max_rollout_restarts=-1"})
                .find("async_training.max_rollout_restarts"),
            std::string::npos);
  // Checkpoints hold the rollout ledger: the async trainer saves.
  EXPECT_EQ(settings_error({"trainer.save_freq=5"}), "");
  EXPECT_NE(settings_error({"algorithm.adv_estimator=remax"}).find("async_training.enable"),
            std::string::npos);
  // A critic (gae) and a reward model run in the async loop too.
  EXPECT_EQ(settings_error({"algorithm.adv_estimator=gae"}), "");
  EXPECT_EQ(settings_error({}), "");
}

}  // namespace
}  // namespace baton::trainer
