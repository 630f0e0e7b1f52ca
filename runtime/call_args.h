// CallArgs: the arguments of a WorkerGroup call. Each is a Value (or anything
// a Value is made from: numbers, strings, tensors, lists, and a DataProto,
// which converts itself), any other type a method can take (value_traits.h:
// std::vector<double>, std::map<std::string, int64_t>, ...), or the Future of
// an earlier call, typically a non-blocking DataProto result of another group.
//
// A call given futures returns at once; the runtime sends it once they have
// all completed (see WorkerGroup::call for what happens to the data).
//
// Example:
//   Future<Value> rollout = rollout_group.call("generate", {prompts});
//   Future<Value> logp = actor_group.call("compute_log_prob", {rollout});  // does not block
//   group.call("mean", {std::vector<double>{1.0, 2.5}});
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
  // Anything a Value is made from, else anything with ValueTraits; any other
  // type fails to compile with a static_assert that says what to pass.
  template <class T, std::enable_if_t<!std::is_same_v<std::decay_t<T>, CallArg> &&
                                          !std::is_same_v<std::decay_t<T>, Future<Value>> &&
                                          !std::is_same_v<std::decay_t<T>, Future<List>>,
                                      int> = 0>
  CallArg(T&& v) : value_(to_value(std::forward<T>(v))) {}
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

  template <class T>
  static Value to_value(T&& v) {
    using D = std::decay_t<T>;
    // A pointer would make a Value(bool); only C strings are meant.
    constexpr bool stray_pointer =
        std::is_pointer_v<D> && !std::is_same_v<std::remove_cv_t<std::remove_pointer_t<D>>, char>;
    if constexpr (std::is_constructible_v<Value, T&&> && !stray_pointer) {
      return Value(std::forward<T>(v));
    } else if constexpr (is_value_type_v<D> && !stray_pointer) {
      return ValueTraits<D>::to_value(std::forward<T>(v));
    } else {
      static_assert(detail::dependent_false_v<T>,
                    "baton::CallArg: a call argument must be a baton::Value or what makes one "
                    "(bool, an integer, a floating-point number, const char*, std::string, "
                    "at::Tensor, baton::List, baton::Dict, baton::DataProto), a type with "
                    "baton::ValueTraits (std::vector<T>, std::map<std::string, T> of those), or "
                    "a Future<Value> / Future<List> of an earlier call (see 'with T = ...' above)");
      return Value();
    }
  }

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
