// ChildProcess (base/child_process.h): lines both ways, a read that times
// out, a death seen even while a grandchild holds the socket, EOF on close,
// and a program that cannot start named.
#include "base/child_process.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>

#include "base/errors.h"

namespace baton {
namespace {

using Read = ChildProcess::Read;

TEST(ChildProcess, LinesGoBothWays) {
  ChildProcess cat({"cat"});
  ASSERT_TRUE(cat.send("one\ntwo\n"));
  std::string line;
  ASSERT_EQ(cat.read_line(60, line), Read::kLine);
  EXPECT_EQ(line, "one");
  ASSERT_EQ(cat.read_line(60, line), Read::kLine);
  EXPECT_EQ(line, "two");
  EXPECT_EQ(cat.exit_reason(), "is running");
}

TEST(ChildProcess, AReadWithoutALineTimesOut) {
  ChildProcess cat({"cat"});
  std::string line;
  EXPECT_EQ(cat.read_line(0.2, line), Read::kTimeout);
  // The child is untouched: it still answers.
  ASSERT_TRUE(cat.send("late\n"));
  ASSERT_EQ(cat.read_line(60, line), Read::kLine);
  EXPECT_EQ(line, "late");
}

// The child exits while a grandchild keeps the socket open (as wandb's
// service does): the read reports the exit, not a timeout.
TEST(ChildProcess, ADeathIsSeenWhileAGrandchildHoldsTheSocket) {
  ChildProcess sh({"sh", "-c", "sleep 600 & echo $!; exit 3"});
  std::string line;
  ASSERT_EQ(sh.read_line(60, line), Read::kLine);
  const pid_t grandchild = static_cast<pid_t>(std::stol(line));
  EXPECT_EQ(sh.read_line(60, line), Read::kExited);
  EXPECT_EQ(sh.exit_reason(), "exited with status 3");
  ::kill(grandchild, SIGKILL);
}

TEST(ChildProcess, CloseGivesTheChildEofAndWaitsForItsExit) {
  ChildProcess cat({"cat"});
  EXPECT_TRUE(cat.close_and_wait(60));
  EXPECT_EQ(cat.exit_reason(), "exited with status 0");
  ChildProcess stubborn({"sh", "-c", "exec sleep 600"});  // never reads stdin
  EXPECT_FALSE(stubborn.close_and_wait(0.1)) << "killed after the wait, not exited by itself";
  EXPECT_EQ(stubborn.exit_reason(), "was killed by signal 9");
}

TEST(ChildProcess, AProgramThatCannotStartIsNamed) {
  try {
    ChildProcess missing({"/no/such/baton_program"});
    ADD_FAILURE() << "started a missing program";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start /no/such/baton_program"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace baton
