// ProgressLine: progress of a long phase ("gen 12/64 3.1s") on stderr. On a
// terminal the line is rewritten in place (\r) at every update; otherwise
// (a log file) a line is written at the first update, then at most one every
// min_interval_s, and always at finish(), so that logs stay short.
//
// Not thread-safe: one thread updates.
//
// Example:
//   ProgressLine progress("gen", batches);
//   for (int64_t i = 0; i < batches; ++i) { ...; progress.update(i + 1); }
//   progress.finish();
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace baton::trainer {

struct ProgressLineOptions {
  // Where to write; nullptr: std::cerr. Not owned.
  std::ostream* out = nullptr;
  // Whether `out` is a terminal; unset: whether stderr is one (isatty).
  std::optional<bool> tty;
  // Off a terminal, the least time between two lines (seconds).
  double min_interval_s = 10.0;
};

class ProgressLine {
 public:
  // total <= 0: no total is shown ("gen 12").
  ProgressLine(std::string label, int64_t total, ProgressLineOptions options = {});
  // Calls finish() if it was not called (never throws).
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `done` units of `total` are done; `note` is appended ("loss 0.31").
  void update(int64_t done, const std::string& note = "");
  // The final state on its own line (ended with a newline). Later calls do nothing.
  void finish(const std::string& note = "");
  // On a terminal, erases the line so that other output can take its place
  // (the next update() writes it again); elsewhere nothing.
  void clear();

  // "label done/total 1.2s note": what update() shows.
  std::string text(int64_t done, const std::string& note) const;

 private:
  void write(const std::string& line, bool final_line);

  std::string label_;
  int64_t total_;
  ProgressLineOptions options_;
  bool tty_ = false;
  bool finished_ = false;
  bool written_ = false;
  int64_t done_ = 0;
  size_t last_width_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_line_;
};

}  // namespace baton::trainer
