// CallArgs: the arguments of a WorkerGroup call. Each is a Value (or anything
// a Value is made from: numbers, strings, tensors, lists, and a DataProto,
// which converts itself) or the Future of an earlier call, typically a
// non-blocking DataProto result of another group.
//
// A call given futures returns at once; the runtime sends it once they have
// all completed (see WorkerGroup::call for what happens to the data).
//
// Example:
//   Future<Value> rollout = rollout_group.call("generate", {prompts});
//   Future<Value> logp = actor_group.call("compute_log_prob", {rollout});  // does not block
#pragma once

#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/future.h"
#include "runtime/value.h"

namespace baton {

// The constructors are implicit on purpose: {1, "x", batch, future} is a
// list of arguments.
class CallArg {
 public:
  template <class T, std::enable_if_t<std::is_constructible_v<Value, T&&>, int> = 0>
  CallArg(T&& v) : value_(std::forward<T>(v)) {}
  CallArg(Future<Value> f) : future_(std::move(f)) {}
  // A call_all result, passed on as the list of per-rank results.
  CallArg(const Future<List>& f) : future_(f.then([](const List& l) { return Value(l); })) {}

  bool is_future() const { return future_.valid(); }
  // REQUIRES: !is_future().
  const Value& value() const { return value_; }
  // REQUIRES: is_future().
  const Future<Value>& future() const { return future_; }

 private:
  friend class CallArgs;
  Value value_;
  Future<Value> future_;
};

class CallArgs {
 public:
  CallArgs() = default;
  CallArgs(std::initializer_list<CallArg> args) : args_(args) {}
  CallArgs(List values) {
    args_.reserve(values.size());
    for (Value& v : values) args_.emplace_back(std::move(v));
  }

  size_t size() const { return args_.size(); }
  const CallArg& operator[](size_t i) const { return args_[i]; }
  bool has_futures() const {
    for (const CallArg& a : args_) {
      if (a.is_future()) return true;
    }
    return false;
  }
  // Moves the values out, with none where a future stands (the futures stay).
  List take_values() {
    List out;
    out.reserve(args_.size());
    for (CallArg& a : args_) out.push_back(a.is_future() ? Value() : std::move(a.value_));
    return out;
  }

 private:
  std::vector<CallArg> args_;
};

}  // namespace baton
