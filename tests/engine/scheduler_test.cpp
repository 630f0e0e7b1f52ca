// Scheduler: the generation engine's continuous-batching decisions on
// sequence ids and block counts, against a block counter instead of a KV
// cache (no model): admission limits, prefix sharing, preemption and requeue
// order, completion.
#include "engine/rollout/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <vector>

#include "tests/engine/expect_error.h"

namespace baton::engine {

void PrintTo(const SequenceId& id, std::ostream* os) { *os << "seq " << id.value; }

namespace {

using testing::expect_error;

// `blocks` blocks of `block_size` positions; each sequence holds a count.
// Shared prefixes are not modelled: share() takes what KvCache::share_prefix
// takes from the pool, the copied partly filled block.
class CountedBlocks final : public SequenceBlocks {
 public:
  CountedBlocks(int64_t block_size, int64_t blocks) : block_size_(block_size), free_(blocks) {}
  int64_t block_size() const override { return block_size_; }
  int64_t free_blocks() const override { return free_; }
  bool reserve(SequenceId seq, int64_t tokens) override {
    int64_t need = (tokens + block_size_ - 1) / block_size_ - held_[seq.value];
    if (need <= 0) return true;
    if (need > free_) return false;
    held_[seq.value] += need;
    free_ -= need;
    return true;
  }
  void release(SequenceId seq) override {
    free_ += held_[seq.value];
    held_[seq.value] = 0;
    released.push_back(seq);
  }
  void share(SequenceId follower, int64_t tokens) {
    if (tokens % block_size_ == 0) return;
    ++held_[follower.value];
    --free_;
  }
  int64_t held(SequenceId seq) { return held_[seq.value]; }

  std::vector<SequenceId> released;  // in the order release() was called

 private:
  int64_t block_size_, free_;
  std::map<int64_t, int64_t> held_;
};

std::vector<SequenceId> ids(std::initializer_list<int64_t> values) {
  std::vector<SequenceId> out;
  for (int64_t v : values) out.push_back(SequenceId{v});
  return out;
}

std::vector<SequenceId> queue(const Scheduler& s) {
  return {s.waiting().begin(), s.waiting().end()};
}

SchedulerOptions options(int64_t max_batch = 64, int64_t max_prefill_tokens = 4096,
                         bool share = true) {
  return {max_batch, max_prefill_tokens, share};
}

TEST(Scheduler, NumbersSequencesInTheOrderTheyAreAdded) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(), blocks);
  EXPECT_EQ(s.add(/*request=*/0, /*tokens=*/3), SequenceId{0});
  EXPECT_EQ(s.add(0, 3), SequenceId{1});
  EXPECT_EQ(s.add(1, 5), SequenceId{2});
  EXPECT_EQ(queue(s), ids({0, 1, 2}));
  EXPECT_EQ(s.tokens(SequenceId{2}), 5);
  EXPECT_FALSE(s.done());
}

TEST(Scheduler, AdmitsInQueueOrderWhileFreeBlocksLastWithoutSkippingAhead) {
  CountedBlocks blocks(4, 5);
  Scheduler s(options(), blocks);
  s.add(0, 5);  // 2 blocks
  s.add(1, 4);  // 1 block
  s.add(2, 9);  // 3 blocks: only 2 are left
  s.add(3, 1);  // would fit, but waits behind request 2
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0, 1}));
  EXPECT_TRUE(p.followers.empty());
  EXPECT_EQ(queue(s), ids({2, 3}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 2);
  EXPECT_EQ(blocks.held(SequenceId{1}), 1);
  EXPECT_EQ(blocks.free_blocks(), 2);
}

TEST(Scheduler, RunsAtMostMaxBatchSequences) {
  CountedBlocks blocks(4, 100);
  Scheduler s(options(/*max_batch=*/2), blocks);
  for (int64_t r = 0; r < 3; ++r) s.add(r, 4);
  EXPECT_EQ(s.admit().rows, ids({0, 1}));
  s.complete({});
  EXPECT_EQ(s.running(), ids({0, 1}));
  EXPECT_TRUE(s.admit().rows.empty()) << "two run already";
  EXPECT_EQ(s.decode(), ids({0, 1}));
  s.complete(ids({1}));
  EXPECT_EQ(s.admit().rows, ids({2})) << "a finished sequence makes room";
}

TEST(Scheduler, CapsAPrefillAtMaxPrefillTokensButAlwaysAdmitsOne) {
  CountedBlocks blocks(4, 100);
  Scheduler s(options(/*max_batch=*/64, /*max_prefill_tokens=*/10), blocks);
  s.add(0, 12);  // alone over the cap
  s.add(1, 5);
  s.add(2, 4);
  s.add(3, 5);
  EXPECT_EQ(s.admit().rows, ids({0}));
  s.complete({});
  // Rows padded to the longest: 2 × 5 = 10 tokens fit, 3 × 5 do not.
  EXPECT_EQ(s.admit().rows, ids({1, 2}));
  EXPECT_EQ(queue(s), ids({3}));
}

TEST(Scheduler, FreshSamplesOfAPromptFollowItsFirstSample) {
  CountedBlocks blocks(4, 100);
  Scheduler s(options(), blocks);
  for (int64_t j = 0; j < 3; ++j) s.add(/*request=*/0, 6);
  for (int64_t j = 0; j < 2; ++j) s.add(/*request=*/1, 8);
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0, 3}));
  ASSERT_EQ(p.followers.size(), 3u);
  EXPECT_EQ(p.followers[0].seq, SequenceId{1});
  EXPECT_EQ(p.followers[0].leader, 0u);
  EXPECT_EQ(p.followers[1].seq, SequenceId{2});
  EXPECT_EQ(p.followers[1].leader, 0u);
  EXPECT_EQ(p.followers[2].seq, SequenceId{4});
  EXPECT_EQ(p.followers[2].leader, 1u);
  EXPECT_EQ(blocks.held(SequenceId{1}), 0) << "a follower's blocks come from its leader";
  s.complete({});
  EXPECT_EQ(s.running(), ids({0, 3, 1, 2, 4})) << "rows first, then followers";
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(s.tokens(SequenceId{i}), i < 3 ? 7 : 9);
}

TEST(Scheduler, WithoutSharingEverySampleIsARow) {
  CountedBlocks blocks(4, 100);
  Scheduler s(options(64, 4096, /*share=*/false), blocks);
  for (int64_t j = 0; j < 3; ++j) s.add(0, 6);
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0, 1, 2}));
  EXPECT_TRUE(p.followers.empty());
}

TEST(Scheduler, SetsAsideTheBlockAFollowerCopiesItsPartlyFilledBlockInto) {
  CountedBlocks blocks(4, 4);
  Scheduler s(options(), blocks);
  s.add(0, 6);  // 2 blocks, the second partly filled
  s.add(0, 6);  // follows: 1 block for the copy
  s.add(1, 4);  // 1 block
  s.add(2, 1);  // 1 block, but the copy's is set aside
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0, 2}));
  ASSERT_EQ(p.followers.size(), 1u);
  EXPECT_EQ(blocks.free_blocks(), 1);
  EXPECT_EQ(queue(s), ids({3}));
  blocks.share(SequenceId{1}, 6);
  EXPECT_EQ(blocks.free_blocks(), 0);
}

TEST(Scheduler, AFollowerOfAPromptEndingAtABlockEndNeedsNoBlock) {
  CountedBlocks blocks(4, 2);
  Scheduler s(options(), blocks);
  s.add(0, 8);
  s.add(0, 8);
  s.add(0, 8);
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0}));
  EXPECT_EQ(p.followers.size(), 2u);
  EXPECT_TRUE(s.waiting().empty());
}

TEST(Scheduler, PreemptsTheMostRecentlyAdmittedRunningSequenceWhenBlocksRunOut) {
  CountedBlocks blocks(4, 4);
  Scheduler s(options(), blocks);
  for (int64_t r = 0; r < 3; ++r) s.add(r, 4);  // a block each
  s.admit();
  s.complete({});  // 5 tokens each: a second block each, one is free
  EXPECT_EQ(s.decode(), ids({0, 1}));
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(blocks.released, ids({2}));
  EXPECT_EQ(queue(s), ids({2}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 2);
  EXPECT_EQ(blocks.held(SequenceId{1}), 2);
}

// decode(k) (the device loop's k steps) reserves each sequence's next k
// positions, never past the most it can hold; complete() then counts k
// tokens for each.
TEST(Scheduler, DecodeOfKStepsReservesKPositionsUpToEachSequencesMost) {
  CountedBlocks blocks(4, 16);
  Scheduler s(options(), blocks);
  s.add(0, 3, /*max_positions=*/20);
  s.add(1, 3, /*max_positions=*/6);
  s.admit();
  s.complete({});  // 4 tokens each
  EXPECT_EQ(s.decode(8), ids({0, 1}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 3);  // 4 + 8 - 1 = 11 positions
  EXPECT_EQ(blocks.held(SequenceId{1}), 2);  // capped at 6 positions
  s.complete({SequenceId{1}});
  EXPECT_EQ(s.tokens(SequenceId{0}), 12);
  EXPECT_EQ(s.running(), ids({0}));
  expect_error([&] { s.decode(0); }, {"steps must be >= 1, got 0"});
  expect_error([&] { s.add(2, 5, 4); }, {"max_positions 4", "5 tokens"});
}

TEST(Scheduler, RequeuesPreemptedSequencesAtTheHeadInAdmissionOrder) {
  CountedBlocks blocks(2, 4);
  Scheduler s(options(), blocks);
  for (int64_t r = 0; r < 4; ++r) s.add(r, 2);  // a block each
  s.add(4, 1);                                  // never admitted
  s.admit();
  s.complete({});  // 3 tokens each: every one needs a second block, none free
  // 0 takes 3's block, 1 takes 2's.
  EXPECT_EQ(s.decode(), ids({0, 1}));
  EXPECT_EQ(s.preemptions(), 2);
  EXPECT_EQ(blocks.released, ids({3, 2}));
  EXPECT_EQ(queue(s), ids({2, 3, 4}));
}

TEST(Scheduler, PreemptsTheSequenceThatNeedsABlockWhenItIsTheNewest) {
  CountedBlocks blocks(4, 3);
  Scheduler s(options(), blocks);
  s.add(0, 5);  // 2 blocks, room for its next position
  s.add(1, 4);  // 1 block, full
  s.admit();
  s.complete({});
  EXPECT_EQ(s.decode(), ids({0}));
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(queue(s), ids({1}));
}

TEST(Scheduler, ReadmitsAPreemptedSequenceWithAllItsTokensAndARowOfItsOwn) {
  CountedBlocks blocks(4, 4);
  Scheduler s(options(), blocks);
  s.add(0, 4);
  s.add(1, 4);
  s.add(1, 4);  // follows sequence 1
  s.admit();
  s.complete({});
  EXPECT_EQ(s.running(), ids({0, 1, 2}));
  blocks.share(SequenceId{2}, 4);  // ends at a block's end: takes nothing
  // 5 tokens each: 0 and 1 take the free blocks, 2 finds none and preempts itself.
  EXPECT_EQ(s.decode(), ids({0, 1}));
  EXPECT_EQ(queue(s), ids({2}));
  s.complete(ids({0, 1}));
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({2})) << "no longer fresh: it is recomputed, not shared";
  EXPECT_EQ(s.tokens(SequenceId{2}), 5);
  EXPECT_EQ(blocks.held(SequenceId{2}), 2);
}

TEST(Scheduler, FinishedSequencesGiveTheirBlocksBackAndLeave) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(), blocks);
  for (int64_t r = 0; r < 3; ++r) s.add(r, 4);
  s.admit();
  s.complete(ids({1}));  // finished by its first token
  EXPECT_EQ(s.running(), ids({0, 2}));
  EXPECT_EQ(blocks.released, ids({1}));
  s.decode();
  s.complete(ids({2, 0}));
  EXPECT_EQ(blocks.released, ids({1, 0, 2})) << "released in running order";
  EXPECT_TRUE(s.running().empty());
  EXPECT_TRUE(s.done());
  EXPECT_EQ(blocks.free_blocks(), 10);
}

// A prefill whose every sequence finishes at its first token (a stop token,
// or the last token of a readmitted sequence) leaves nothing running while
// others wait: they are admitted next.
TEST(Scheduler, AdmitsTheNextWaitingSequenceWhenAWholePrefillFinishes) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(/*max_batch=*/1), blocks);
  s.add(0, 4);
  s.add(1, 4);
  EXPECT_EQ(s.admit().rows, ids({0}));
  s.complete(ids({0}));
  EXPECT_TRUE(s.running().empty());
  EXPECT_TRUE(s.decode().empty());
  EXPECT_EQ(s.admit().rows, ids({1}));
}

TEST(Scheduler, RunsEverySequenceToItsEndUnderATightBudget) {
  // 9 sequences of 1..9 tokens, each finishing after 6 new ones, in 8
  // blocks of 2: admissions wait for blocks and preemptions recompute.
  CountedBlocks blocks(2, 8);
  Scheduler s(options(/*max_batch=*/4), blocks);
  std::vector<int64_t> generated(9, 0);
  for (int64_t r = 0; r < 9; ++r) s.add(r, 1 + r);
  auto step = [&](const std::vector<SequenceId>& batch) {
    std::vector<SequenceId> finished;
    for (SequenceId id : batch)
      if (++generated[id.value] == 6) finished.push_back(id);
    return finished;
  };
  int64_t steps = 0;
  while (!s.done()) {
    ASSERT_LT(++steps, 1000);
    Scheduler::Prefill p = s.admit();
    if (!p.rows.empty()) s.complete(step(p.rows));
    std::vector<SequenceId> batch = s.decode();
    if (!batch.empty()) s.complete(step(batch));
  }
  for (int64_t r = 0; r < 9; ++r) EXPECT_EQ(s.tokens(SequenceId{r}), 1 + r + 6);
  EXPECT_GT(s.preemptions(), 0) << "the blocks were meant to run out";
  EXPECT_EQ(blocks.free_blocks(), 8);
}

TEST(Scheduler, ThrowsWhenNothingRunsAndTheFirstWaitingSequenceCannotFit) {
  CountedBlocks blocks(4, 2);
  Scheduler s(options(), blocks);
  s.add(0, 9);  // 3 blocks
  expect_error([&] { s.admit(); }, {"no sequence fits"});
}

// Multi-turn: a paused sequence leaves the batch holding its blocks; resumed,
// it waits at the head and its admission reserves only what the appended
// tokens add.
TEST(Scheduler, APausedSequenceKeepsItsBlocksAndResumesAtTheHeadReservingOnlyTheRest) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(), blocks);
  s.add(0, 3);  // 1 block
  s.add(1, 3);
  s.add(2, 3, /*max_positions=*/6);
  s.admit();
  s.complete({}, ids({0}));  // sequence 0 stops at its first token and pauses
  EXPECT_EQ(s.running(), ids({1, 2}));
  EXPECT_EQ(s.paused(), ids({0}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 1);
  EXPECT_TRUE(blocks.released.empty());
  EXPECT_FALSE(s.done());
  // The others decode meanwhile; sequence 0 is in no step.
  EXPECT_EQ(s.decode(), ids({1, 2}));
  s.complete({});
  // Its tool's 6 tokens arrive: 4 + 6 = 10 tokens, 3 blocks, 2 more.
  s.resume(SequenceId{0}, 6);
  EXPECT_TRUE(s.paused().empty());
  EXPECT_EQ(queue(s), ids({0}));
  EXPECT_EQ(s.tokens(SequenceId{0}), 10);
  const int64_t free_before = blocks.free_blocks();
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({0}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 3);
  EXPECT_EQ(blocks.free_blocks(), free_before - 2);
  s.complete({});
  EXPECT_EQ(s.running(), ids({1, 2, 0}));
  // Its max_positions grew with it: decode reserves its next position.
  EXPECT_EQ(s.decode(), ids({1, 2, 0}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 3);
  s.complete(ids({1, 2, 0}));
  EXPECT_TRUE(s.done());
}

TEST(Scheduler, AFinishedPauseGivesItsBlocksBackAndOnlyPausedSequencesCanResume) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(), blocks);
  s.add(0, 5);  // 2 blocks
  s.admit();
  s.complete({}, ids({0}));
  EXPECT_FALSE(s.done()) << "a paused sequence is not done";
  EXPECT_TRUE(s.admit().rows.empty());
  s.finish_paused(SequenceId{0});
  EXPECT_EQ(blocks.released, ids({0}));
  EXPECT_EQ(blocks.free_blocks(), 10);
  EXPECT_TRUE(s.done());
  expect_error([&] { s.resume(SequenceId{0}, 2); }, {"sequence 0 is not paused"});
  expect_error([&] { s.finish_paused(SequenceId{0}); }, {"sequence 0 is not paused"});
}

TEST(Scheduler, WhenNothingRunsPausedCachesGoBeforeTheHeadWouldNotFit) {
  CountedBlocks blocks(4, 4);
  Scheduler s(options(), blocks);
  s.add(0, 5);  // 2 blocks
  s.add(1, 5);  // 2 blocks
  s.admit();
  s.complete({}, ids({0, 1}));  // both pause: every block held
  EXPECT_EQ(blocks.free_blocks(), 0);
  // Sequence 1's tool answers 6 tokens: 12 tokens, 3 blocks; 1 more is
  // needed and none is free, nothing runs: sequence 0's kept cache goes
  // (it will recompute when it resumes).
  s.resume(SequenceId{1}, 6);
  Scheduler::Prefill p = s.admit();
  EXPECT_EQ(p.rows, ids({1}));
  EXPECT_EQ(blocks.released, ids({0}));
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(blocks.held(SequenceId{1}), 3);
  s.complete({});
  // Sequence 0 resumes with nothing kept: a full reservation, which waits
  // for sequence 1's blocks.
  s.resume(SequenceId{0}, 2);
  EXPECT_TRUE(s.admit().rows.empty());
  EXPECT_EQ(s.decode(), ids({1}));
  s.complete(ids({1}));
  EXPECT_EQ(s.admit().rows, ids({0}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 2);
}

// Two sequences resumed at once both wait holding their kept caches; the
// head cannot grow into the blocks the other holds, and nothing runs: the
// other's cache goes (it recomputes), not the run. (A GRPO run of the tool
// task met this: "no sequence fits ... nothing runs".)
TEST(Scheduler, WhenNothingRunsWaitingSequencesKeptCachesGoBeforeTheHeadWouldNotFit) {
  CountedBlocks blocks(4, 4);
  Scheduler s(options(), blocks);
  s.add(0, 5);  // 2 blocks
  s.add(1, 5);  // 2 blocks
  s.admit();
  s.complete({}, ids({0, 1}));  // both pause: every block held
  s.resume(SequenceId{0}, 6);   // 12 tokens: 3 blocks, 2 of them held
  s.resume(SequenceId{1}, 2);   // at the head: 8 tokens, in its 2 blocks
  EXPECT_EQ(s.admit().rows, ids({1}));
  s.complete({});  // 9 tokens: its next position needs a third block
  EXPECT_TRUE(s.decode().empty()) << "no block is free: sequence 1 is preempted";
  // Nothing runs; 1 (3 blocks) waits at the head, 0 waits holding 2 of the 4.
  EXPECT_EQ(s.admit().rows, ids({1}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 0) << "0's kept cache went: it recomputes";
  EXPECT_EQ(blocks.held(SequenceId{1}), 3);
  EXPECT_EQ(s.preemptions(), 2);
  s.complete(ids({1}));
  EXPECT_EQ(s.admit().rows, ids({0}));
  EXPECT_EQ(blocks.held(SequenceId{0}), 3) << "a full reservation: nothing of 0 was kept";
}

TEST(Scheduler, CompleteRejectsAPauseOutsideTheStepOrAlsoFinished) {
  CountedBlocks blocks(4, 10);
  Scheduler s(options(), blocks);
  s.add(0, 3);
  s.add(1, 3);
  s.admit();
  // An engine bug, not a user's error: a failed engine check.
  expect_error<std::exception>([&] { s.complete(ids({0}), ids({0})); },
                               {"both finished and paused"});
  CountedBlocks other(4, 10);
  Scheduler t(options(), other);
  t.add(0, 3);
  t.admit();
  expect_error<std::exception>([&] { t.complete({}, ids({5})); },
                               {"paused sequence 5 was not in the step"});
}

}  // namespace
}  // namespace baton::engine
