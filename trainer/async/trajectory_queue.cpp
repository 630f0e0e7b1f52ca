#include "trainer/async/trajectory_queue.h"

#include <algorithm>
#include <thread>

#include "base/errors.h"

namespace baton::trainer {

TrajectoryQueue::TrajectoryQueue(TrajectoryQueueOptions options) : options_(options) {
  if (options_.capacity < 1)
    throw Error("TrajectoryQueue: capacity " + std::to_string(options_.capacity) + " < 1");
  if (options_.staleness_threshold < 0)
    throw Error("TrajectoryQueue: staleness threshold " +
                std::to_string(options_.staleness_threshold) + " < 0");
  queue_.set_capacity(static_cast<std::ptrdiff_t>(options_.capacity));
  next_step_ = options_.first_step;
  rollout_version_ = options_.rollout_version;
}

bool TrajectoryQueue::reserve() {
  std::unique_lock lock(mu_);
  if (options_.policy == StalenessPolicy::kWait) {
    cv_.wait(lock, [&] {
      return closed_ || next_step_ - 1 - rollout_version_ <= options_.staleness_threshold;
    });
  }
  if (closed_) return false;
  ++next_step_;
  return true;
}

// A blocking operation on the TBB queue is fenced by `blocking_`: close()
// aborts until none is left, because an abort fails only the operations
// already waiting, not one that starts just after it.
bool TrajectoryQueue::push(TrajectoryBatch batch) {
  ++blocking_;
  if (closing_) {
    --blocking_;
    return false;
  }
  try {
    queue_.push(std::move(batch));
  } catch (const tbb::user_abort&) {
    --blocking_;
    return false;
  }
  --blocking_;
  return true;
}

std::optional<TrajectoryBatch> TrajectoryQueue::pop(int64_t step) {
  while (true) {
    ++blocking_;
    if (closing_) {
      --blocking_;
      return std::nullopt;
    }
    TrajectoryBatch b;
    try {
      queue_.pop(b);
    } catch (const tbb::user_abort&) {
      --blocking_;
      return std::nullopt;
    }
    --blocking_;
    if (options_.policy == StalenessPolicy::kDrop &&
        step - 1 - b.param_version > options_.staleness_threshold) {
      std::lock_guard lock(mu_);
      ++dropped_;
      continue;
    }
    return b;
  }
}

void TrajectoryQueue::set_rollout_version(int64_t version) {
  {
    std::lock_guard lock(mu_);
    rollout_version_ = std::max(rollout_version_, version);
  }
  cv_.notify_all();
}

void TrajectoryQueue::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  closing_ = true;
  cv_.notify_all();
  do {
    queue_.abort();
    std::this_thread::yield();
  } while (blocking_ > 0);
}

bool TrajectoryQueue::closed() const { return closing_; }

int64_t TrajectoryQueue::depth() const {
  return std::max<int64_t>(0, static_cast<int64_t>(queue_.size()));
}

int64_t TrajectoryQueue::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

void StalenessHistogram::add(int64_t staleness) {
  ++counts_[staleness];
  last_ = staleness;
  total_ += staleness;
  ++n_;
}

std::map<std::string, double> StalenessHistogram::metrics() const {
  std::map<std::string, double> m;
  if (n_ == 0) return m;
  m["async/staleness"] = static_cast<double>(last_);
  m["async/staleness_mean"] = static_cast<double>(total_) / static_cast<double>(n_);
  m["async/staleness_max"] = static_cast<double>(counts_.rbegin()->first);
  for (const auto& [k, c] : counts_)
    m["async/staleness_count/" + std::to_string(k)] = static_cast<double>(c);
  return m;
}

}  // namespace baton::trainer
