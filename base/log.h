// Runtime log lines: "[baton] [error] message" on stderr, and — once a run
// names one (set_log_file) — the same lines, timestamped, in a per-run log
// file that also gets every worker's output (the driver forwards each
// worker's stdout and stderr lines, prefixed "[Class:rank] ", to
// log_output_line). The level comes from BATON_LOG_LEVEL (debug, info, warn,
// error, off; default info), read once.
//
// The file is spdlog's rotating file sink: when it reaches max_bytes it is
// renamed to <name>.1 (.1 to .2, ...; at most max_files old files are kept)
// and a new one begins. Only base/log.cpp includes spdlog, and no LibTorch
// header reaches it: Debian's spdlog is built against Debian's fmt 9, while
// LibTorch 2.x headers carry fmt 12, and the two cannot meet in one
// translation unit (tests/runtime/spdlog_isolation.sh keeps it so). This
// header exposes neither.
//
// Thread safety: every function may be called from any thread; a line is
// written whole (one write(2) to stderr, one record in the file).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace baton {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// The level below which lines are dropped.
LogLevel log_level();

// Writes one line to stderr and, when one is open, to the log file.
void log(LogLevel level, std::string_view message);

// Opens (appending) the log file `path` for this process's lines from now on,
// its directory created if needed; replaces a file opened before. Throws
// baton::Error naming the path when it cannot be opened.
void set_log_file(const std::string& path, int64_t max_bytes = int64_t{16} << 20,
                  int max_files = 3);
// Flushes and closes the log file; lines go to stderr only again.
void close_log_file();
// The open log file's path, or "" when none is open.
std::string log_file_path();

// A line of output that is already on the console (a worker's, with its
// "[Class:rank] " prefix; no trailing newline needed): into the log file
// only, when one is open, whatever the level.
void log_output_line(std::string_view line);

}  // namespace baton
