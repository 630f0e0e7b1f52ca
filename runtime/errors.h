// Exceptions thrown at baton's user API. Inside the runtime, failures travel as
// these same types wrapped in std::exception_ptr inside futures.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace baton {

// Base of every baton error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A Value accessed as the wrong kind.
class TypeError : public Error {
 public:
  using Error::Error;
};

// The call was rejected before anything ran: unknown method, wrong number or
// types of arguments, per-rank arguments of the wrong length.
class CallError : public Error {
 public:
  using Error::Error;
};

// The method ran and threw; what() names class, rank, method and the message.
// The worker is still usable.
class RemoteError : public Error {
 public:
  RemoteError(std::string worker_class, int rank, std::string method, std::string message);
  // The method raised on several ranks of one call: what() is `summary`
  // (every rank that raised, each distinct message); rank() and
  // remote_message() are those of the lowest rank that raised.
  RemoteError(std::string worker_class, int rank, std::string method, std::string message,
              const std::string& summary);
  const std::string& worker_class() const { return worker_class_; }
  int rank() const { return rank_; }
  const std::string& method() const { return method_; }
  const std::string& remote_message() const { return message_; }

 private:
  std::string worker_class_;
  int rank_;
  std::string method_;
  std::string message_;
};

// A worker process died (or its group was shut down because a peer died).
class WorkerDiedError : public Error {
 public:
  using Error::Error;
};

// A call exceeded its per-call timeout, or Future::get(timeout) ran out.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A call took the Future of an earlier call as an argument, and that call
// failed: this call never ran. what() names this call and carries the
// earlier call's message (which names its method); the earlier error itself
// is nested: std::rethrow_if_nested(e) rethrows it.
class UpstreamError : public Error, public std::nested_exception {
 public:
  // REQUIRES: called while handling the upstream exception (in a catch block),
  // which std::nested_exception captures.
  using Error::Error;
};

// Describes a wait(2) status: "exited with status 3", "killed by signal 9 (SIGKILL)".
std::string describe_exit_status(int wait_status);

}  // namespace baton
