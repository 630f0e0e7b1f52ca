// How a worker's death is told from its wait status and the kernel's OOM
// kill counts (runtime/internal/process_memory.h).
#include "runtime/internal/process_memory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

namespace baton {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMiB = int64_t{1} << 20;

// The wait status of a process ended by signal `sig`, and of one that exited with `code`.
int killed_by(int sig) { return sig; }
int exited_with(int code) { return code << 8; }

MemorySample sample_in_cgroup(int64_t oom_kills) {
  MemorySample s;
  s.at = Clock::now();
  s.usage = MemoryUsage{812 * kMiB, 900 * kMiB, 4096 * kMiB};
  s.cgroup = "/job7";
  s.oom_kills.cgroup = oom_kills;
  return s;
}

TEST(ProcessMemory, ASigkillAfterItsCgroupCountedAnOomKillIsOutOfMemoryWithTheLastSeenRss) {
  const MemorySample last = sample_in_cgroup(2);
  EXPECT_EQ(describe_death(killed_by(SIGKILL), last, OomKills{3, std::nullopt},
                           last.at + milliseconds(40)),
            "was killed: out of memory (RSS 812 MiB last seen 40 ms before, peak 900 MiB; "
            "SIGKILL from the OOM killer of memory cgroup /job7)");
}

TEST(ProcessMemory, ASigkillWhileItsCgroupCountedNoOomKillIsAPlainSigkill) {
  const MemorySample last = sample_in_cgroup(2);
  // The machine's count rising (another cgroup's OOM kill) does not make it one.
  EXPECT_EQ(describe_death(killed_by(SIGKILL), last, OomKills{2, 7}, last.at),
            "was killed by signal 9 (SIGKILL)");
}

TEST(ProcessMemory, WithoutACgroupOfItsOwnTheMachinesCountDecides) {
  MemorySample last;
  last.at = Clock::now();
  last.usage = MemoryUsage{100 * kMiB, 20 * 1024 * kMiB, 0};
  last.oom_kills.system = 5;
  EXPECT_EQ(describe_death(killed_by(SIGKILL), last, OomKills{std::nullopt, 6},
                           last.at + milliseconds(250)),
            "was killed: out of memory (RSS 100 MiB last seen 250 ms before, peak 20.0 GiB; "
            "SIGKILL from the kernel's OOM killer)");
  EXPECT_EQ(describe_death(killed_by(SIGKILL), last, OomKills{std::nullopt, 5}, last.at),
            "was killed by signal 9 (SIGKILL)");
  // A count that could not be read proves nothing.
  EXPECT_EQ(describe_death(killed_by(SIGKILL), last, OomKills{}, last.at),
            "was killed by signal 9 (SIGKILL)");
}

TEST(ProcessMemory, OnlyASigkillCanBeAnOomKill) {
  const MemorySample last = sample_in_cgroup(2);
  const OomKills risen{3, std::nullopt};
  EXPECT_EQ(describe_death(killed_by(SIGSEGV), last, risen, last.at),
            "was killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(describe_death(exited_with(3), last, risen, last.at), "exited with status 3");
  // Never sampled: nothing to compare with.
  EXPECT_EQ(describe_death(killed_by(SIGKILL), std::nullopt, risen, last.at),
            "was killed by signal 9 (SIGKILL)");
}

TEST(ProcessMemory, FormatsBytesInMibThenGib) {
  EXPECT_EQ(format_bytes(0), "0 MiB");
  EXPECT_EQ(format_bytes(812 * kMiB + 1), "812 MiB");
  EXPECT_EQ(format_bytes(10239 * kMiB), "10239 MiB");
  EXPECT_EQ(format_bytes(10240 * kMiB), "10.0 GiB");
}

TEST(ProcessMemory, ReadsALiveProcessesUsageAndNothingOfAnExitedOne) {
  const std::optional<MemoryUsage> self = read_memory_usage(0);
  ASSERT_TRUE(self.has_value());
  EXPECT_GT(self->rss_bytes, 0);
  EXPECT_GE(self->peak_bytes, self->rss_bytes);
  EXPECT_GE(self->virtual_bytes, self->rss_bytes);

  const pid_t child = fork();
  if (child == 0) _exit(0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  // A zombie: its pid is still ours, its memory is gone.
  EXPECT_FALSE(read_memory_usage(child).has_value());
  MemoryWatch watch(child);
  EXPECT_FALSE(watch.sample());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
}

// A SIGKILL the OOM killer did not send (the cgroup's count, or the
// machine's, did not move meanwhile) keeps its plain words.
TEST(ProcessMemory, AWatchedProcessKilledBySomeoneElseIsAPlainSigkill) {
  const pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  MemoryWatch watch(child);
  ASSERT_TRUE(watch.sample());
  ASSERT_TRUE(watch.last().has_value());
  EXPECT_GT(watch.last()->usage->rss_bytes, 0);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(watch.describe_death(status), "was killed by signal 9 (SIGKILL)");
}

TEST(ProcessMemory, AFailedAllocationSaysOutOfMemoryWithTheRssAndAnyAddressSpaceLimit) {
  const std::string plain = out_of_memory_text("std::bad_alloc");
  EXPECT_EQ(plain.rfind("out of memory (RSS ", 0), 0u) << plain;
  EXPECT_NE(plain.find(" MiB, peak "), std::string::npos) << plain;
  EXPECT_EQ(plain.find("address space"), std::string::npos) << plain;
  EXPECT_NE(plain.find("): std::bad_alloc"), std::string::npos) << plain;

  // Under an RLIMIT_AS (as `ulimit -v` sets) the text names it; a soft
  // limit far above this process's use, put back after.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  if (saved.rlim_cur != RLIM_INFINITY)
    GTEST_SKIP() << "this process already runs under an RLIMIT_AS";
  rlimit limited = saved;
  limited.rlim_cur = rlim_t{1} << 46;  // 64 TiB
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limited), 0);
  const std::string limited_text = out_of_memory_text("std::bad_alloc");
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_NE(limited_text.find("; address space "), std::string::npos) << limited_text;
  EXPECT_NE(limited_text.find(" of its 65536.0 GiB limit)"), std::string::npos) << limited_text;
}

}  // namespace
}  // namespace baton
