// Runtime log lines on stderr: "[baton] [error] message". The level comes from
// BATON_LOG_LEVEL (debug, info, warn, error, off; default info), read once.
//
// A logging library of our own rather than spdlog: Debian's spdlog is built
// against Debian's fmt 9, while LibTorch 2.x headers carry fmt 12, and the two
// cannot meet in one translation unit.
#pragma once

#include <string_view>

namespace baton {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// The level below which lines are dropped.
LogLevel log_level();

// Writes one line (a single write, so lines of concurrent threads do not mix).
void log(LogLevel level, std::string_view message);

}  // namespace baton
