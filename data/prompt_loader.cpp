#include "data/prompt_loader.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

#include "base/errors.h"

namespace baton::data {
namespace {

// A uniform integer in [0, n) from the raw engine output by rejection:
// std::uniform_int_distribution differs between standard libraries, mt19937_64 itself does not.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % n;
}

}  // namespace

PromptLoader::PromptLoader(const PromptDataset& dataset, PromptLoaderOptions options)
    : dataset_(&dataset), options_(options) {
  if (options_.batch_size < 1) {
    throw baton::InvalidArgument("data.train_batch_size must be >= 1 (got " +
                                std::to_string(options_.batch_size) + ")");
  }
  if (batches_per_epoch() == 0) {
    throw baton::InvalidArgument("the dataset has " + std::to_string(dataset.size()) +
                                " prompts, fewer than data.train_batch_size = " +
                                std::to_string(options_.batch_size) + ": not one batch per epoch");
  }
}

int64_t PromptLoader::batches_per_epoch() const {
  const auto n = static_cast<int64_t>(dataset_->size());
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<std::size_t> PromptLoader::order(int64_t epoch) const {
  if (cached_epoch_ == epoch) return cached_order_;
  std::vector<std::size_t> order(dataset_->size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (options_.shuffle) {
    // One seed per epoch: resuming needs no replay of earlier epochs.
    std::seed_seq seq{static_cast<uint32_t>(options_.seed),
                      static_cast<uint32_t>(options_.seed >> 32), static_cast<uint32_t>(epoch),
                      static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)};
    std::mt19937_64 rng(seq);
    for (std::size_t i = order.size(); i > 1; --i) {
      std::swap(order[i - 1], order[uniform_below(rng, i)]);
    }
  }
  cached_epoch_ = epoch;
  cached_order_ = order;
  return order;
}

std::vector<std::size_t> PromptLoader::batch_indices(int64_t epoch, int64_t batch) const {
  const std::vector<std::size_t> all = order(epoch);
  const auto begin = static_cast<std::size_t>(batch * options_.batch_size);
  const std::size_t end =
      std::min(all.size(), begin + static_cast<std::size_t>(options_.batch_size));
  return {all.begin() + static_cast<std::ptrdiff_t>(begin),
          all.begin() + static_cast<std::ptrdiff_t>(end)};
}

PromptBatch PromptLoader::next() {
  if (batch_ >= batches_per_epoch()) {
    ++epoch_;
    batch_ = 0;
  }
  PromptBatch b = dataset_->batch(batch_indices(epoch_, batch_));
  ++batch_;
  return b;
}

LoaderState PromptLoader::state() const {
  LoaderState s;
  s.epoch = epoch_;
  s.batch = batch_;
  s.seed = options_.seed;
  s.shuffle = options_.shuffle;
  s.batch_size = options_.batch_size;
  s.dataset_size = static_cast<int64_t>(dataset_->size());
  return s;
}

void PromptLoader::restore(const LoaderState& s) {
  const auto mismatch = [](const std::string& field, const std::string& saved,
                           const std::string& now) {
    return baton::InvalidArgument("dataloader state: " + field + " was " + saved +
                                 " when it was saved, " + now + " now");
  };
  if (s.seed != options_.seed)
    throw mismatch("data.seed", std::to_string(s.seed), std::to_string(options_.seed));
  if (s.shuffle != options_.shuffle)
    throw mismatch("data.shuffle", s.shuffle ? "true" : "false",
                   options_.shuffle ? "true" : "false");
  if (s.batch_size != options_.batch_size)
    throw mismatch("data.train_batch_size", std::to_string(s.batch_size),
                   std::to_string(options_.batch_size));
  if (s.dataset_size != static_cast<int64_t>(dataset_->size())) {
    throw mismatch("the dataset size", std::to_string(s.dataset_size),
                   std::to_string(dataset_->size()));
  }
  if (s.epoch < 0 || s.batch < 0 || s.batch > batches_per_epoch()) {
    throw baton::InvalidArgument("dataloader state: epoch " + std::to_string(s.epoch) + ", batch " +
                                std::to_string(s.batch) + " is out of range");
  }
  epoch_ = s.epoch;
  batch_ = s.batch;
}

}  // namespace baton::data
