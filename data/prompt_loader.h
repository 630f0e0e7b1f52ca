// Batches of a PromptDataset, epoch after epoch, in a seeded shuffled order, with a state that
// a checkpoint saves and resume restores (the restored loader gives the same next batch).
//
// Example:
//   baton::data::PromptLoader loader(dataset,
//       baton::data::PromptLoaderOptions().set_batch_size(8).set_seed(1));
//   baton::data::PromptBatch batch = loader.next();
//   std::string saved = loader.state().to_json();      // into the checkpoint
//   ...
//   loader.restore(baton::data::LoaderState::from_json(saved, "global_step_10/data.json"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/errors.h"
#include "data/prompt_dataset.h"

namespace baton::data {

struct PromptLoaderOptions {
  int64_t batch_size = 1;  // data.train_batch_size (prompts per batch)
  bool shuffle = true;     // data.shuffle
  uint64_t seed = 1;       // data.seed
  // Drop the last incomplete batch of an epoch (verl's train loader does).
  bool drop_last = true;

  PromptLoaderOptions& set_batch_size(int64_t v) {
    batch_size = v;
    return *this;
  }
  PromptLoaderOptions& set_shuffle(bool v) {
    shuffle = v;
    return *this;
  }
  PromptLoaderOptions& set_seed(uint64_t v) {
    seed = v;
    return *this;
  }
  PromptLoaderOptions& set_drop_last(bool v) {
    drop_last = v;
    return *this;
  }
};

// Where a loader is: the next batch is batch `batch` of epoch `epoch`. The other fields make
// restoring into a loader over another dataset or with other options fail.
struct LoaderState {
  int64_t epoch = 0;
  int64_t batch = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t batch_size = 0;
  int64_t dataset_size = 0;

  std::string to_json() const;
  // Throws std::runtime_error naming `source` for malformed or incomplete JSON.
  static LoaderState from_json(const std::string& json, const std::string& source);
};

// Not thread-safe: one thread drives a loader.
class PromptLoader {
 public:
  // `dataset` must outlive the loader. Throws baton::InvalidArgument when batch_size < 1, or
  // when drop_last leaves no batch (fewer rows than batch_size).
  PromptLoader(const PromptDataset& dataset, PromptLoaderOptions options);

  int64_t batches_per_epoch() const;
  // The next batch; after the last batch of an epoch, the first of the next epoch (the order
  // of epoch e is a permutation drawn from seed and e alone: the same on every machine).
  PromptBatch next();
  // The rows of batch `batch` of epoch `epoch`, without moving the loader.
  std::vector<std::size_t> batch_indices(int64_t epoch, int64_t batch) const;

  int64_t epoch() const { return epoch_; }
  LoaderState state() const;
  // Throws baton::InvalidArgument naming the field when `state` was saved by a loader with
  // another seed, shuffle, batch size or dataset size.
  void restore(const LoaderState& state);

 private:
  std::vector<std::size_t> order(int64_t epoch) const;

  const PromptDataset* dataset_;
  PromptLoaderOptions options_;
  int64_t epoch_ = 0;
  int64_t batch_ = 0;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<std::size_t> cached_order_;
};

}  // namespace baton::data
