// RolloutLedger: every batch the fully-async rollouter (trainer/async/async_trainer.h)
// has started and the trainer has not taken yet: its prompts, drawn from the
// data loader, and once generated its trajectories. It is what makes the async
// trainer lose no sample when a checkpoint is written while batches are queued
// or being generated (verl's fully-async trainer loses them: its PR #4199), and
// when a failed rollout group is restarted.
//
//   rollouter  reserve → e = ledger.start(draw) → generate → ledger.finish(e.index, b) → push
//   trainer    b = queue.pop → ledger.taken(b.index)  (batches the queue dropped go with it)
//   save       ledger.snapshot(loader_state): the entries and the loader's
//              position taken together under the ledger's lock, so that the
//              position is exactly past every entry's prompts
//   resume / restart
//              RolloutLedger(entries, next_step): the generated entries are
//              queued again first (requeue()), the others are generated again
//              (start() returns them before it draws new prompts)
//
// On disk (save_ledger / load_ledger): <dir>/rollout_ledger.json, with
// prompts_<index>.bin and trajectories_<index>.bin (DataProto files).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "trainer/async/trajectory_queue.h"

namespace baton::trainer {

struct LedgerEntry {
  int64_t index = 0;    // generation order
  int64_t step = 0;     // the training step it was drawn for (its uids' prefix)
  DataProto prompts;    // the loader's batch (prompt_batch_proto)
  std::optional<TrajectoryBatch> done;  // its trajectories, once generated
};

struct LedgerSnapshot {
  std::string loader_state;  // data::LoaderState::to_json() past every entry
  std::vector<LedgerEntry> entries;  // by index
};

class RolloutLedger {
 public:
  // `restored`: a checkpoint's or a failed rollouter's entries (any order);
  // new prompts are drawn for `next_step` onwards (at least past the restored
  // entries' steps) and numbered after the restored entries' indices.
  explicit RolloutLedger(std::vector<LedgerEntry> restored = {}, int64_t next_step = 1);

  // The restored entries that were generated, by index: the rollouter queues
  // them before it starts anything. Returns them once.
  std::vector<TrajectoryBatch> requeue();
  // The next batch to generate: a restored entry that was not generated
  // (by index), else new prompts from draw(step) — called under the ledger's
  // lock, so that no snapshot sees the loader past prompts it does not hold.
  LedgerEntry start(const std::function<DataProto(int64_t step)>& draw);
  // The batch of entry `index` is generated (b.index must be `index`).
  void finish(int64_t index, const TrajectoryBatch& b);
  // The trainer took the batch `index` from the queue: it and every earlier
  // entry (the queue drops batches only in order) leave the ledger.
  void taken(int64_t index);

  // The entries now, with `loader_state()` read under the same lock.
  LedgerSnapshot snapshot(const std::function<std::string()>& loader_state) const;
  // Every entry now, by index (what a restarted rollouter starts from).
  std::vector<LedgerEntry> entries() const;

 private:
  mutable std::mutex mu_;
  std::map<int64_t, LedgerEntry> entries_;  // GUARDED_BY(mu_)
  std::deque<int64_t> to_generate_;         // GUARDED_BY(mu_): restored, not generated
  std::vector<TrajectoryBatch> to_requeue_;  // GUARDED_BY(mu_)
  int64_t next_index_ = 0;                  // GUARDED_BY(mu_)
  int64_t next_step_ = 1;                   // GUARDED_BY(mu_)
};

// What the entries hold, for a log line: "2 generated batches (16
// trajectories), 1 batch of 4 prompts to generate again" (parts with no
// batch left out; "no batch" for none).
std::string describe_ledger(const std::vector<LedgerEntry>& entries);
// Trajectories (generated rows) plus prompts × `n` (rows to generate).
int64_t ledger_samples(const std::vector<LedgerEntry>& entries, int64_t n);

// Writes the entries under `dir` (created), each file atomically.
void save_ledger(const std::vector<LedgerEntry>& entries, const std::filesystem::path& dir);
// The entries save_ledger wrote; none when `dir` has no ledger. baton::Error
// naming the file for a malformed or missing one.
std::vector<LedgerEntry> load_ledger(const std::filesystem::path& dir);

}  // namespace baton::trainer
