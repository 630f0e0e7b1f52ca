// async_training.staleness_policy: what the fully-async trainer does with a
// batch staler than async_training.staleness_threshold (trajectory_queue.h).
#pragma once

#include <string>

#include "trainer/config/config.h"

namespace baton::trainer {

enum class StalenessPolicy {
  kWait,  // the rollouter waits for a weight sync instead of generating one
  kDrop,  // the trainer drops it and takes the next
};

// "wait" or "drop"; ConfigError naming `key` otherwise.
inline StalenessPolicy parse_staleness_policy(const std::string& name, const std::string& key) {
  if (name == "wait") return StalenessPolicy::kWait;
  if (name == "drop") return StalenessPolicy::kDrop;
  throw ConfigError(key + " = '" + name + "': expected wait or drop");
}

}  // namespace baton::trainer
