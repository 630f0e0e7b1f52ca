// Errors thrown by the engine. The engine does not depend on the runtime, so
// it has its own base type; a worker method that calls the engine passes it
// back to the driver like any other exception.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace baton::engine {

// Bad input: a model file, config, checkpoint or layout that cannot be used.
// The message names the file, tensor or key and the sizes involved.
class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void check_failed(const char* cond, const char* file, int line,
                               const std::string& message);
}  // namespace detail

}  // namespace baton::engine

// An engine invariant (a bug, not bad input). Throws std::logic_error naming the
// condition, file and line: ENGINE_CHECK(a.dim() == 3, "got ", a.dim(), " dims").
#define ENGINE_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond))                                                                        \
      ::baton::engine::detail::check_failed(#cond, __FILE__, __LINE__,                  \
                                            ::baton::engine::detail::cat(__VA_ARGS__)); \
  } while (false)
