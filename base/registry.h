// The one name → value table behind every registry of baton: policy losses
// and advantage estimators (workers/algos/algo_registry.h), reward functions
// (workers/rewards/reward_registry.h), dispatch modes
// (runtime/dispatch_registry.h), worker functions (dispatch/worker_function.h),
// built-in methods and worker classes (runtime/method_table.h).
//
// Every registry refuses an empty or taken name with baton::InvalidArgument,
// and reports an unknown name with one message, suggesting the nearest name:
//   policy loss 'vanila' is not registered; did you mean 'vanilla'? known:
//   cispo, ..., vanilla (register your own with baton::algos::register_policy_loss)
//
// Example:
//   Registry<PolicyLossFn> losses("policy loss",
//                                 "register your own with register_policy_loss");
//   losses.add("vanilla", vanilla_policy_loss);
//   const PolicyLossFn& fn = losses.get("vanilla");  // throws InvalidArgument if unknown
//   Registry<DispatchMode, CallError> modes("dispatch mode");  // get() throws CallError
//
// Thread safety: every member may be called from any thread; a mutex guards
// the table. Entries are never removed, so the pointer find() returns and the
// reference get() returns stay valid for the registry's lifetime. replace()
// overwrites a value in place: replace an entry only while no other thread
// reads it (at start-up, before the runtime uses it).
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/did_you_mean.h"
#include "base/errors.h"

namespace baton {

// UnknownError: what get() throws for an unknown name (a baton::Error
// constructible from a message).
template <typename T, typename UnknownError = InvalidArgument>
class Registry {
 public:
  // `what` names an entry in messages ("policy loss"); `hint`, if not empty,
  // ends the unknown-name message in parentheses: how to register one.
  explicit Registry(std::string what, std::string hint = "")
      : what_(std::move(what)), hint_(std::move(hint)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Throws InvalidArgument if `name` is empty or already registered.
  void add(std::string name, T value) {
    check_name(name);
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.count(name) > 0) {
      throw InvalidArgument(what_ + " '" + name + "' is already registered; choose another name");
    }
    entries_.emplace(std::move(name), std::move(value));
  }

  // Registers `value` under `name`, replacing the value of a taken name.
  // Throws InvalidArgument if `name` is empty. REQUIRES: no other thread
  // reads the entry (see the file comment).
  void replace(std::string name, T value) {
    check_name(name);
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.insert_or_assign(std::move(name), std::move(value));
  }

  // The value registered as `name`, or nullptr.
  const T* find(std::string_view name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }

  // The value registered as `name`. Throws UnknownError naming it, the
  // nearest registered name and every registered one.
  const T& get(std::string_view name) const {
    if (const T* value = find(name)) return *value;
    throw UnknownError(not_registered_message(name));
  }

  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& entry : entries_) out.push_back(entry.first);
    return out;
  }

  // What get() throws for `name`: "<what> '<name>' is not registered; did
  // you mean '<nearest>'? known: a, b, c (<hint>)".
  std::string not_registered_message(std::string_view name) const {
    const std::vector<std::string> known = names();
    std::string message = what_ + " '" + std::string(name) + "' is not registered; ";
    // A near miss only (a typo, not another name), ignoring case:
    // "dp_comput_proto" → DP_COMPUTE_PROTO.
    const std::string nearest = closest_match(name, known, std::max<size_t>(2, name.size() / 3),
                                              /*ignore_case=*/true);
    if (!nearest.empty()) message += "did you mean '" + nearest + "'? ";
    message += "known: ";
    for (size_t i = 0; i < known.size(); ++i) message += (i > 0 ? ", " : "") + known[i];
    if (known.empty()) message += "none";
    if (!hint_.empty()) message += " (" + hint_ + ")";
    return message;
  }

 private:
  void check_name(const std::string& name) const {
    if (name.empty()) throw InvalidArgument(what_ + ": the name is empty");
  }

  const std::string what_;
  const std::string hint_;
  mutable std::mutex mutex_;
  std::map<std::string, T, std::less<>> entries_;  // GUARDED_BY(mutex_)
};

}  // namespace baton
