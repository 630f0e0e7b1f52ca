// The async trainer's rollout ledger (rollout_ledger.h): what is queued or in
// flight is kept until the trainer takes it, saved and loaded with the
// loader's position, and handed back first after a resume or a restart.
#include "trainer/async/rollout_ledger.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "base/errors.h"
#include "tests/engine/temp_dir.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using engine::testing::TempDir;

// A "loader": batch k holds prompts k*10 .. k*10+1, uids "<step>-<row>".
struct FakeLoader {
  int64_t drawn = 0;
  DataProto next(int64_t step) {
    DataProto d;
    d.set_tensor("input_ids", at::arange(drawn * 10, drawn * 10 + 2, at::kLong).view({2, 1}));
    d.set_column("uid", {Value(std::to_string(step) + "-0"), Value(std::to_string(step) + "-1")});
    ++drawn;
    return d;
  }
  std::string state() const { return std::to_string(drawn); }
};

TrajectoryBatch generated(const LedgerEntry& e, int64_t version) {
  TrajectoryBatch b;
  b.index = e.index;
  b.param_version = version;
  b.generate_seconds = 0.25;
  b.batch = e.prompts.repeat(2, true);
  return b;
}

TEST(RolloutLedger, KeepsEveryBatchUntilTheTrainerTakesItAndTheLoaderPositionMatches) {
  FakeLoader loader;
  RolloutLedger ledger({}, /*next_step=*/4);
  auto draw = [&](int64_t step) { return loader.next(step); };
  const LedgerEntry a = ledger.start(draw);
  const LedgerEntry b = ledger.start(draw);
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.step, 4);
  EXPECT_EQ(b.step, 5);
  ledger.finish(a.index, generated(a, 3));
  LedgerSnapshot snap = ledger.snapshot([&] { return loader.state(); });
  EXPECT_EQ(snap.loader_state, "2");  // past both entries' prompts
  ASSERT_EQ(snap.entries.size(), 2u);
  EXPECT_TRUE(snap.entries[0].done);
  EXPECT_FALSE(snap.entries[1].done);
  EXPECT_EQ(ledger_samples(snap.entries, 2), 4 + 2 * 2);
  EXPECT_EQ(describe_ledger(snap.entries),
            "1 generated batch (4 trajectories), 1 batch of 2 prompts to generate again");
  EXPECT_EQ(describe_ledger({snap.entries[1]}), "1 batch of 2 prompts to generate again");
  EXPECT_EQ(describe_ledger({}), "no batch");
  // Taking batch 1 (the queue dropped batch 0) forgets both.
  ledger.taken(1);
  EXPECT_TRUE(ledger.entries().empty());
  EXPECT_THROW(ledger.finish(0, generated(a, 3)), Error);
}

TEST(RolloutLedger, RestoredEntriesAreRequeuedOrGeneratedAgainBeforeNewPrompts) {
  FakeLoader loader;
  RolloutLedger first({}, 1);
  auto draw = [&](int64_t step) { return loader.next(step); };
  std::vector<LedgerEntry> started;
  for (int i = 0; i < 3; ++i) started.push_back(first.start(draw));
  first.finish(0, generated(started[0], 0));
  first.finish(1, generated(started[1], 1));

  RolloutLedger again(first.entries(), /*next_step=*/1);
  const std::vector<TrajectoryBatch> queued = again.requeue();
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_EQ(queued[0].index, 0);
  EXPECT_EQ(queued[1].index, 1);
  EXPECT_EQ(queued[1].param_version, 1);
  EXPECT_TRUE(again.requeue().empty());  // once
  // The in-flight batch is generated again, with its own prompts and step.
  const LedgerEntry redo = again.start(draw);
  EXPECT_EQ(redo.index, 2);
  EXPECT_EQ(redo.step, 3);
  EXPECT_TRUE(at::equal(redo.prompts.tensor("input_ids"), started[2].prompts.tensor("input_ids")));
  EXPECT_EQ(loader.drawn, 3);
  // Then new prompts, numbered after the restored ones.
  const LedgerEntry fresh = again.start(draw);
  EXPECT_EQ(fresh.index, 3);
  EXPECT_EQ(fresh.step, 4);
  EXPECT_EQ(loader.drawn, 4);
}

TEST(RolloutLedger, SavedAndLoadedEntriesAreEqual) {
  TempDir dir;
  FakeLoader loader;
  RolloutLedger ledger({}, 7);
  auto draw = [&](int64_t step) { return loader.next(step); };
  const LedgerEntry a = ledger.start(draw);
  const LedgerEntry b = ledger.start(draw);
  ledger.finish(a.index, generated(a, 5));
  save_ledger(ledger.entries(), dir.path() / "ledger");
  const std::vector<LedgerEntry> loaded = load_ledger(dir.path() / "ledger");
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].index, a.index);
  EXPECT_EQ(loaded[0].step, 7);
  ASSERT_TRUE(loaded[0].done);
  EXPECT_EQ(loaded[0].done->param_version, 5);
  EXPECT_EQ(loaded[0].done->index, a.index);
  EXPECT_DOUBLE_EQ(loaded[0].done->generate_seconds, 0.25);
  EXPECT_TRUE(at::equal(loaded[0].done->batch.tensor("input_ids"),
                        a.prompts.repeat(2, true).tensor("input_ids")));
  EXPECT_EQ(loaded[0].done->batch.column("uid").size(), 4u);
  EXPECT_FALSE(loaded[1].done);
  EXPECT_EQ(loaded[1].step, 8);
  EXPECT_TRUE(at::equal(loaded[1].prompts.tensor("input_ids"), b.prompts.tensor("input_ids")));
  EXPECT_EQ(loaded[1].prompts.column("uid")[1].as_string(), "8-1");
  // No ledger: nothing restored.
  EXPECT_TRUE(load_ledger(dir.path() / "missing").empty());
}

TEST(RolloutLedger, ACorruptLedgerIsAnErrorNamingTheFile) {
  TempDir dir;
  fs::create_directories(dir.path() / "ledger");
  std::ofstream(dir.path() / "ledger" / "rollout_ledger.json") << R"({"entries": [{"index": 0}]})";
  try {
    load_ledger(dir.path() / "ledger");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout_ledger.json"), std::string::npos) << e.what();
  }
  // An entry whose prompts file is missing names that file.
  std::ofstream(dir.path() / "ledger" / "rollout_ledger.json")
      << R"({"entries": [{"index": 3, "step": 1}]})";
  try {
    load_ledger(dir.path() / "ledger");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompts_3.bin"), std::string::npos) << e.what();
  }
}

TEST(RolloutLedger, ASnapshotNeverSeesTheLoaderPastItsEntries) {
  // The rollouter draws while the trainer snapshots: each snapshot's loader
  // position equals the number of entries drawn so far (none is taken here).
  FakeLoader loader;
  RolloutLedger ledger({}, 1);
  std::future<void> rollouter = std::async(std::launch::async, [&] {
    for (int i = 0; i < 2000; ++i) ledger.start([&](int64_t step) { return loader.next(step); });
  });
  for (int i = 0; i < 200; ++i) {
    const LedgerSnapshot s = ledger.snapshot([&] { return loader.state(); });
    ASSERT_EQ(s.loader_state, std::to_string(s.entries.size()));
  }
  rollouter.get();
}

}  // namespace
}  // namespace baton::trainer
