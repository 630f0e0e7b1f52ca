// Future<T> / Promise<T>: the result of every call. A call never blocks on its
// own; blocking is the caller's choice (get, wait, wait_all, wait_any).
//
// Thread safety: every member of Future and Promise may be called from any
// thread. A Future is a shared handle: copies observe the same result.
//
// Callbacks (on_complete, then) run exactly once: inline if the future is
// already complete, otherwise on the thread that completes it, which for
// calls is the runtime's I/O thread. Keep them short and never block in them.
//
// Example:
//   Future<Value> f = group.call("step", {batch});
//   f.on_complete([](const Future<Value>& r) { ... });
//   Value v = f.get(std::chrono::seconds(5));  // TimeoutError after 5 s
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "base/errors.h"

namespace baton {

template <class T>
class Future;

namespace detail {

template <class T>
struct FutureState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<T> value;
  std::exception_ptr error;
  std::vector<std::function<void()>> callbacks;

  // First completion wins; later ones are ignored and return false.
  template <class Fill>
  bool complete(Fill fill) {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return false;
      fill();
      done = true;
      run.swap(callbacks);
    }
    cv.notify_all();
    for (auto& cb : run) cb();
    return true;
  }
};

}  // namespace detail

template <class T>
class Promise {
 public:
  Promise() : s_(std::make_shared<detail::FutureState<T>>()) {}

  Future<T> future() const { return Future<T>(s_); }

  // Each returns false if the future was already complete.
  bool set_value(T v) const {
    return s_->complete([&] { s_->value.emplace(std::move(v)); });
  }
  bool set_error(std::exception_ptr e) const {
    return s_->complete([&] { s_->error = std::move(e); });
  }
  template <class E>
  bool fail(E error) const {
    return set_error(std::make_exception_ptr(std::move(error)));
  }

 private:
  std::shared_ptr<detail::FutureState<T>> s_;
};

template <class T>
class Future {
 public:
  Future() = default;

  // A future that is already complete.
  static Future ready_value(T v) {
    Promise<T> p;
    p.set_value(std::move(v));
    return p.future();
  }
  static Future ready_error(std::exception_ptr e) {
    Promise<T> p;
    p.set_error(std::move(e));
    return p.future();
  }

  bool valid() const { return s_ != nullptr; }

  bool ready() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->done;
  }

  void wait() const {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->done; });
  }

  // Returns false if the future is still pending after `timeout`.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock<std::mutex> lock(s_->mu);
    return s_->cv.wait_for(lock, timeout, [&] { return s_->done; });
  }

  // Blocks until complete; returns (a copy of) the value or rethrows the
  // error. A copy, so that `for (auto& x : f.get().as_list())` is safe on a
  // temporary future; copying a Value shares its tensors' storage.
  T get() const {
    wait();
    return value_or_throw();
  }

  // As get(), but throws TimeoutError if still pending after `timeout`; the
  // call itself goes on and the future can be waited on again.
  template <class Rep, class Period>
  T get(std::chrono::duration<Rep, Period> timeout) const {
    if (!wait_for(timeout)) {
      throw TimeoutError("Future::get: no result within " +
                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            timeout)
                                            .count()) +
                         " ms");
    }
    return value_or_throw();
  }

  // Null while pending or on success.
  std::exception_ptr error() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->error;
  }

  // Runs `cb(*this)` once the future completes (see the header comment).
  void on_complete(std::function<void(const Future<T>&)> cb) const {
    Future<T> self = *this;
    std::unique_lock<std::mutex> lock(s_->mu);
    if (!s_->done) {
      s_->callbacks.push_back([self, cb = std::move(cb)] { cb(self); });
      return;
    }
    lock.unlock();
    cb(self);
  }

  // A future of f(value). An error, or an exception thrown by f, fails the
  // returned future with that error.
  template <class F>
  auto then(F f) const -> Future<std::invoke_result_t<F, const T&>> {
    using U = std::invoke_result_t<F, const T&>;
    Promise<U> out;
    on_complete([out, f = std::move(f)](const Future<T>& in) mutable {
      if (auto e = in.error()) {
        out.set_error(e);
        return;
      }
      try {
        out.set_value(f(*in.s_->value));
      } catch (...) {
        out.set_error(std::current_exception());
      }
    });
    return out.future();
  }

 private:
  template <class>
  friend class Promise;
  template <class>
  friend class Future;
  explicit Future(std::shared_ptr<detail::FutureState<T>> s) : s_(std::move(s)) {}

  const T& value_or_throw() const {
    if (s_->error) std::rethrow_exception(s_->error);
    return *s_->value;
  }

  std::shared_ptr<detail::FutureState<T>> s_;
};

// Blocks until every future is complete (successfully or not).
template <class T>
void wait_all(const std::vector<Future<T>>& futures) {
  for (const auto& f : futures) f.wait();
}

// Blocks until at least one future is complete and returns the index of one
// that is; returns nullopt if none completes within `timeout`.
template <class T>
std::optional<size_t> wait_any(const std::vector<Future<T>>& futures,
                               std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) {
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<size_t> first;
  };
  auto sig = std::make_shared<Signal>();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_complete([sig, i](const Future<T>&) {
      {
        std::lock_guard<std::mutex> lock(sig->mu);
        if (!sig->first) sig->first = i;
      }
      sig->cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(sig->mu);
  sig->cv.wait_for(lock, timeout, [&] { return sig->first.has_value(); });
  return sig->first;
}

}  // namespace baton
