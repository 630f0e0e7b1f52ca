#include "base/log.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "base/errors.h"

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

spdlog::level::level_enum spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

// The open log file. Loggers are shared_ptrs: a line being written while the
// file is replaced finishes on the old one.
struct LogFile {
  std::mutex mu;
  std::shared_ptr<spdlog::logger> logger;
  std::string path;
};

LogFile& log_file() {
  static LogFile* f = new LogFile;  // never destroyed: lines may come at exit
  return *f;
}

std::shared_ptr<spdlog::logger> current_logger() {
  LogFile& f = log_file();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.logger;
}

void write_stderr(const std::string& line) {
  // One write(2): a line is never interleaved with another thread's.
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(STDERR_FILENO, line.data() + off, line.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
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
  if (auto logger = current_logger()) {
    logger->log(spdlog_level(level), spdlog::string_view_t(line.data(), line.size()));
  }
  line.push_back('\n');
  write_stderr(line);
}

void set_log_file(const std::string& path, int64_t max_bytes, int max_files) {
  if (max_bytes < 1 || max_files < 0) {
    throw Error("set_log_file(" + path + "): max_bytes " + std::to_string(max_bytes) +
                " and max_files " + std::to_string(max_files) + " must be >= 1 and >= 0");
  }
  std::shared_ptr<spdlog::logger> logger;
  try {
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    auto sink = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
        path, static_cast<size_t>(max_bytes), static_cast<size_t>(max_files));
    logger = std::make_shared<spdlog::logger>("baton", std::move(sink));
  } catch (const std::exception& e) {
    throw Error("set_log_file: cannot open the log file " + path + ": " + e.what());
  }
  // "2026-11-27 03:12:45.123 [baton] [info] ...", "... [Worker:1] ...".
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %v");
  logger->set_level(spdlog::level::trace);
  // Every line reaches the file at once: a run that dies keeps its last lines.
  logger->flush_on(spdlog::level::trace);
  LogFile& f = log_file();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.logger) f.logger->flush();
  f.logger = std::move(logger);
  f.path = path;
}

void close_log_file() {
  LogFile& f = log_file();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.logger) f.logger->flush();
  f.logger.reset();
  f.path.clear();
}

std::string log_file_path() {
  LogFile& f = log_file();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.path;
}

void log_output_line(std::string_view line) {
  auto logger = current_logger();
  if (!logger) return;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  logger->log(spdlog::level::info, spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace baton
