// Scheduler: the continuous-batching decisions of GenerationEngine
// (engine/rollout/generation.h) on sequence ids and block counts, without
// tensors, so that a test drives it without a model:
//   - add() queues a sequence of `tokens` tokens (its prompt) at the tail;
//   - admit() takes waiting sequences, in queue order, into the next prefill
//     batch while the free blocks, `max_batch` running sequences and
//     `max_prefill_tokens` padded tokens allow, and reserves their blocks
//     (one sequence is always admitted when blocks allow);
//   - prefix sharing: a fresh sample (never admitted before) of a request
//     whose fresh sample is already a row of this batch follows that row: it
//     takes the row's prefill instead of a row of its own, and costs only the
//     block its prompt's partly filled last block is copied into (none when
//     the prompt ends at a block's end). admit() sets that block aside; the
//     caller takes it with KvCache::share_prefix after the prefill step;
//   - decode(k) makes room for each running sequence's next k positions
//     (k > 1: the device decode loop's k steps between host checks; never
//     past the most positions the sequence can need, given at add()), in
//     admission order; when no block is free it preempts the most recently
//     admitted running sequence (its blocks go back; it returns to the head
//     of the queue, to be recomputed from its tokens when readmitted), down
//     to the sequence that needs the block itself;
//   - complete() after each step: every sequence of the step has one more
//     token (k more after decode(k)); the finished ones give their blocks
//     back and leave, the others of a prefill join the running sequences
//     (rows first, then followers);
//   - multi-turn (an agent loop's tool calls): complete()'s `paused`
//     sequences leave the step without finishing and keep their blocks;
//     resume() queues one again at the head with the tokens appended to it
//     (a tool's result), and admit() prefills only those on top of the kept
//     cache; finish_paused() ends one that will not continue. When nothing
//     runs and the first waiting sequence does not fit, the paused
//     sequences' blocks are released first, then those the other resumed,
//     waiting sequences kept (each then recomputes its tokens when it is
//     admitted: counted as a preemption);
//   - done() once nothing waits, runs or is paused.
//
// Example (GenerationEngine::generate):
//   Scheduler scheduler(options, blocks);
//   for (...) scheduler.add(request, prompt_tokens);   // ids 0, 1, 2, ...
//   while (!scheduler.done()) {
//     Scheduler::Prefill prefill = scheduler.admit();
//     if (!prefill.rows.empty()) scheduler.complete(prefill_step(prefill));
//     std::vector<SequenceId> batch = scheduler.decode();
//     if (!batch.empty()) scheduler.complete(decode_step(batch));
//   }
//
// Thread safety: none; one generation engine drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

namespace baton::engine {

// A scheduled sequence: 0, 1, 2, ... in the order Scheduler::add queued them.
struct SequenceId {
  int64_t value = 0;
  friend bool operator==(SequenceId, SequenceId) = default;
};

// The KV cache blocks of the scheduled sequences, by id: GenerationEngine's
// KvCache and block tables; a counter in tests.
class SequenceBlocks {
 public:
  virtual ~SequenceBlocks() = default;
  virtual int64_t block_size() const = 0;  // token positions per block
  virtual int64_t free_blocks() const = 0;
  // Grows `seq`'s blocks to cover `tokens` positions. False (nothing taken)
  // when too few blocks are free.
  virtual bool reserve(SequenceId seq, int64_t tokens) = 0;
  // Drops `seq`'s hold on its blocks (a block shared by prefix sharing goes
  // back with its last holder); nothing of `seq` stays cached.
  virtual void release(SequenceId seq) = 0;
};

struct SchedulerOptions {
  int64_t max_batch = 64;             // running sequences at most (followers included)
  int64_t max_prefill_tokens = 4096;  // rows × the longest row's tokens per prefill
  bool share_prompt_prefill = true;   // fresh samples of a prompt follow its first
};

class Scheduler {
 public:
  // A sequence that takes the prefill of row `leader` of its batch.
  struct Follower {
    SequenceId seq;
    size_t leader = 0;
  };
  // One prefill step: `rows` are prefilled together (their blocks reserved),
  // each follower samples from its leader's logits.
  struct Prefill {
    std::vector<SequenceId> rows;
    std::vector<Follower> followers;
  };

  // `blocks` must outlive the scheduler. REQUIRES: options.max_batch >= 1.
  Scheduler(SchedulerOptions options, SequenceBlocks& blocks);

  // Queues a sequence of `tokens` tokens (>= 1) of request `request` at the
  // tail; its id is the number of sequences added before it. `max_positions`:
  // the most positions it can ever hold in the cache (prompt + new tokens - 1);
  // decode(k) reserves no further.
  SequenceId add(int64_t request, int64_t tokens,
                 int64_t max_positions = std::numeric_limits<int64_t>::max());

  // The next prefill batch (see the header comment), taken out of the
  // queue; empty when none is admitted. Throws EngineError when nothing runs
  // and the first waiting sequence does not fit in the free blocks.
  // REQUIRES: no step in flight (complete() called after the last one).
  Prefill admit();
  // The running sequences, each with blocks for its next `steps` positions
  // (capped at its max_positions), after the preemptions that needed (see
  // the header comment); empty when none runs. REQUIRES: no step in flight,
  // steps >= 1.
  std::vector<SequenceId> decode(int64_t steps = 1);
  // After the step of the last admit() or decode(steps): each of its
  // sequences has one more token (`steps` more after decode(steps));
  // `finished` (sequences of that step) are done: their blocks go back and
  // they leave. REQUIRES: a non-empty step in flight.
  // `paused` (sequences of that step, none finished) leave the step without
  // finishing: they keep their blocks until resume() or finish_paused().
  void complete(const std::vector<SequenceId>& finished,
                const std::vector<SequenceId>& paused = {});
  // A paused sequence continues with `added` (>= 1) tokens appended to its
  // own: queued at the head of the waiting sequences; its next prefill covers
  // what its kept cache lacks. `max_positions` as at add(). Throws
  // EngineError for a sequence that is not paused.
  void resume(SequenceId seq, int64_t added);
  // A paused sequence ends: its blocks go back.
  void finish_paused(SequenceId seq);

  // True when nothing waits, runs, is paused or is being stepped.
  bool done() const {
    return waiting_.empty() && running_.empty() && stepping_.empty() && paused_.empty();
  }
  const std::vector<SequenceId>& paused() const { return paused_; }

  const std::deque<SequenceId>& waiting() const { return waiting_; }
  const std::vector<SequenceId>& running() const { return running_; }  // in admission order
  int64_t tokens(SequenceId seq) const { return entries_[seq.value].tokens; }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Entry {
    int64_t request = 0;
    int64_t tokens = 0;
    int64_t max_positions = 0;
    bool admitted_before = false;
    bool holds_cache = false;     // resumed with its cache kept: reserve() only grows it
    bool cache_released = false;  // paused, its blocks released to make room
  };
  int64_t blocks_for(int64_t tokens) const;
  // Releases every paused sequence's blocks (they recompute on resume).
  // False when none held any.
  bool release_paused();
  // Releases the kept caches of the waiting sequences but `except` (resumed
  // ones that were not admitted yet; they recompute). False when none held any.
  bool release_waiting(SequenceId except);

  SchedulerOptions options_;
  SequenceBlocks& blocks_;
  std::vector<Entry> entries_;  // by id
  std::deque<SequenceId> waiting_;
  std::vector<SequenceId> running_;   // in admission order
  std::vector<SequenceId> stepping_;  // the step in flight: a prefill's rows, then followers
  std::vector<SequenceId> paused_;    // waiting on their turn's appended tokens, blocks kept
  bool prefilling_ = false;
  int64_t step_tokens_ = 1;  // tokens each sequence of the step in flight gains
  int64_t preemptions_ = 0;
};

}  // namespace baton::engine
