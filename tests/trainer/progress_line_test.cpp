// ProgressLine on a terminal (rewritten in place) and off one (sparse lines).
#include "trainer/progress_line.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace baton::trainer {
namespace {

ProgressLineOptions to(std::ostringstream& out, bool tty, double min_interval_s) {
  ProgressLineOptions o;
  o.out = &out;
  o.tty = tty;
  o.min_interval_s = min_interval_s;
  return o;
}

TEST(ProgressLine, OffATerminalWritesOneLinePerUpdateWhenTheIntervalAllows) {
  std::ostringstream out;
  {
    ProgressLine p("gen", 4, to(out, false, 0));
    p.update(1);
    p.update(2, "note");
    p.finish();
    p.finish();  // once only
  }
  const std::string s = out.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 3) << s;
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(s.rfind("gen 1/4 ", 0), 0u) << s;
  EXPECT_NE(s.find("gen 2/4 "), std::string::npos) << s;
  EXPECT_NE(s.find(" note\n"), std::string::npos) << s;
}

TEST(ProgressLine, OffATerminalSkipsUpdatesWithinTheIntervalButNotTheEnd) {
  std::ostringstream out;
  {
    ProgressLine p("gen", 64, to(out, false, 3600));
    for (int i = 1; i <= 64; ++i) p.update(i);
  }  // the destructor finishes
  const std::string s = out.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 2) << s;
  EXPECT_NE(s.find("gen 1/64 "), std::string::npos) << s;
  EXPECT_NE(s.find("gen 64/64 "), std::string::npos) << s;
}

TEST(ProgressLine, OnATerminalRewritesOneLine) {
  std::ostringstream out;
  ProgressLine p("update", 0, to(out, true, 3600));
  p.update(10, "a long note");
  p.update(11);
  EXPECT_EQ(out.str().find('\n'), std::string::npos);
  p.finish();
  const std::string s = out.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\r'), 3) << s;
  EXPECT_EQ(s.back(), '\n');
  EXPECT_NE(s.find("\rupdate 11 "), std::string::npos) << s;  // no total shown
}

}  // namespace
}  // namespace baton::trainer

namespace baton::trainer {
namespace {

TEST(ProgressLine, ClearErasesTheLineOnATerminalAndNothingElsewhere) {
  std::ostringstream tty_out;
  ProgressLineOptions o;
  o.out = &tty_out;
  o.tty = true;
  ProgressLine p("gen", 4, o);
  p.update(1, "x");
  const std::string shown = tty_out.str();
  const size_t width = shown.size() - 1;  // after the leading '\r'
  p.clear();
  EXPECT_EQ(tty_out.str(), shown + "\r" + std::string(width, ' ') + "\r");
  p.clear();  // nothing more to erase
  EXPECT_EQ(tty_out.str(), shown + "\r" + std::string(width, ' ') + "\r");

  std::ostringstream file_out;
  o.out = &file_out;
  o.tty = false;
  ProgressLine q("gen", 4, o);
  q.update(1, "x");
  const std::string written = file_out.str();
  q.clear();
  EXPECT_EQ(file_out.str(), written);
}

}  // namespace
}  // namespace baton::trainer
