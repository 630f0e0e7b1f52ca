#include "base/errors.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

namespace baton {

RemoteError::RemoteError(std::string worker_class, int rank, std::string method,
                         std::string message)
    : Error(worker_class + "." + method + " failed on rank " + std::to_string(rank) + ": " +
            message),
      worker_class_(std::move(worker_class)),
      rank_(rank),
      method_(std::move(method)),
      message_(std::move(message)) {}

RemoteError::RemoteError(std::string worker_class, int rank, std::string method,
                         std::string message, const std::string& summary)
    : Error(summary),
      worker_class_(std::move(worker_class)),
      rank_(rank),
      method_(std::move(method)),
      message_(std::move(message)) {}

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    std::string text = "was killed by signal " + std::to_string(sig);
    if (abbrev != nullptr) text += std::string(" (SIG") + abbrev + ")";
    if (WCOREDUMP(status)) text += ", core dumped";
    return text;
  }
  return "ended with wait status " + std::to_string(status);
}

}  // namespace baton
