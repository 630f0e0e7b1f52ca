#include "trainer/progress_line.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace baton::trainer {

using Clock = std::chrono::steady_clock;

ProgressLine::ProgressLine(std::string label, int64_t total, ProgressLineOptions options)
    : label_(std::move(label)), total_(total), options_(options), start_(Clock::now()) {
  tty_ = options_.tty.value_or(::isatty(STDERR_FILENO) == 1);
  last_line_ = start_;
}

ProgressLine::~ProgressLine() {
  try {
    finish();
  } catch (...) {
  }
}

std::string ProgressLine::text(int64_t done, const std::string& note) const {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  char elapsed[32];
  std::snprintf(elapsed, sizeof(elapsed), "%.1fs", seconds);
  std::string s = label_ + " " + std::to_string(done);
  if (total_ > 0) s += "/" + std::to_string(total_);
  s += " ";
  s += elapsed;
  if (!note.empty()) s += " " + note;
  return s;
}

void ProgressLine::update(int64_t done, const std::string& note) {
  if (finished_) return;
  done_ = done;
  const auto now = Clock::now();
  if (!tty_ && written_ &&
      std::chrono::duration<double>(now - last_line_).count() < options_.min_interval_s) {
    return;
  }
  last_line_ = now;
  write(text(done, note), false);
}

void ProgressLine::finish(const std::string& note) {
  if (finished_) return;
  finished_ = true;
  write(text(done_, note), true);
}

void ProgressLine::clear() {
  if (!tty_ || finished_ || last_width_ == 0) return;
  std::ostream& out = options_.out != nullptr ? *options_.out : std::cerr;
  out << '\r' << std::string(last_width_, ' ') << '\r';
  out.flush();
  last_width_ = 0;
}

void ProgressLine::write(const std::string& line, bool final_line) {
  std::ostream& out = options_.out != nullptr ? *options_.out : std::cerr;
  if (tty_) {
    // Blank out what a longer previous line left behind.
    const size_t pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
    out << '\r' << line << std::string(pad, ' ');
    if (final_line) out << '\n';
    last_width_ = line.size();
  } else {
    out << line << '\n';
  }
  out.flush();
  written_ = true;
}

}  // namespace baton::trainer
