// Errors thrown by the engine: EngineError for bad input, ENGINE_CHECK for
// broken invariants; both derive from baton::Error (base/errors.h). A worker
// method that calls the engine passes them back to the driver like any other
// exception.
#pragma once

#include <string>

#include "base/errors.h"

namespace baton::engine {

// Bad input: a model file, config, checkpoint or layout that cannot be used.
// The message names the file, tensor or key and the sizes involved.
class EngineError : public Error {
 public:
  using Error::Error;
};

namespace detail {
using ::baton::detail::cat;
[[noreturn]] void check_failed(const char* cond, const char* file, int line,
                               const std::string& message);
}  // namespace detail

}  // namespace baton::engine

// An engine invariant (a bug, not bad input). Throws baton::InternalError naming the
// condition, file and line: ENGINE_CHECK(a.dim() == 3, "got ", a.dim(), " dims").
#define ENGINE_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond))                                                                        \
      ::baton::engine::detail::check_failed(#cond, __FILE__, __LINE__,                  \
                                            ::baton::engine::detail::cat(__VA_ARGS__)); \
  } while (false)
