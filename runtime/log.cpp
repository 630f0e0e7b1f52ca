#include "runtime/log.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace baton {
namespace {

LogLevel parse_level(const char* s) {
  if (s == nullptr) return LogLevel::kInfo;
  std::string v(s);
  if (v == "debug" || v == "trace") return LogLevel::kDebug;
  if (v == "info") return LogLevel::kInfo;
  if (v == "warn" || v == "warning") return LogLevel::kWarn;
  if (v == "error" || v == "err" || v == "critical") return LogLevel::kError;
  if (v == "off") return LogLevel::kOff;
  return LogLevel::kInfo;
}

const char* name_of(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      break;
  }
  return "off";
}

}  // namespace

LogLevel log_level() {
  static const LogLevel level = parse_level(std::getenv("BATON_LOG_LEVEL"));
  return level;
}

void log(LogLevel level, std::string_view message) {
  if (level < log_level() || level == LogLevel::kOff) return;
  std::string line = std::string("[baton] [") + name_of(level) + "] ";
  line.append(message);
  line.push_back('\n');
  // One write(2): a line is never interleaved with another thread's.
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace baton
