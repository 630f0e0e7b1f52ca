// The one root of every error baton throws, and the runtime's own errors.
//
// Every module's exceptions derive from baton::Error, so a driver catches
// everything baton raises with one type:
//   try { trainer.fit(); } catch (const baton::Error& e) { ... e.what() ... }
// Each module keeps its specific types as subclasses (engine::EngineError,
// data::TokenizerError, data::JinjaError, ...); the types below are those
// shared by every module and the runtime's. Inside the runtime, failures
// travel as these same types wrapped in std::exception_ptr inside futures.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace baton {

// Base of every baton error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument a caller passed is not one the function takes: an unknown
// name, a negative size, mismatched shapes. what() names the argument, the
// value and what is accepted.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An invariant broke: a bug in baton, not bad input. what() names the
// condition, the file and the line (engine/errors.h's ENGINE_CHECK).
class InternalError : public Error {
 public:
  using Error::Error;
};

// A file could not be read, written or removed (errno's reason in what()), or
// its contents are not what they must be.
class FileError : public Error {
 public:
  using Error::Error;
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

namespace detail {
// The arguments streamed into one string, for error messages:
// detail::cat(path, ": ", n, " bytes").
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

// Describes a wait(2) status: "exited with status 3", "killed by signal 9 (SIGKILL)".
std::string describe_exit_status(int wait_status);

}  // namespace baton
