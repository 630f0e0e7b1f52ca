#include "engine/errors.h"

namespace baton::engine::detail {

void check_failed(const char* cond, const char* file, int line, const std::string& message) {
  throw InternalError(cat("engine check failed: ", cond, " at ", file, ":", line,
                             message.empty() ? "" : ": ", message));
}

}  // namespace baton::engine::detail
