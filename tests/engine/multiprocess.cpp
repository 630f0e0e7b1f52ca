#include "tests/engine/multiprocess.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "net/auth.h"
#include "net/store_server.h"
#include "runtime/internal/auth_store.h"

extern char** environ;

namespace baton::engine::test {
namespace {

// Environment of a rank process.
constexpr const char* kRankEnv = "BATON_TEST_RANK";
constexpr const char* kWorldEnv = "BATON_TEST_WORLD";
constexpr const char* kPortEnv = "BATON_TEST_STORE_PORT";
constexpr const char* kCallEnv = "BATON_TEST_CALL";
constexpr const char* kTimeoutEnv = "BATON_TEST_TIMEOUT_S";
constexpr const char* kParentEnv = "BATON_TEST_PARENT";
// Set by the user (scripts/test_kernels.sh), passed on to the ranks.
constexpr const char* kThreadsEnv = "BATON_TEST_THREADS";

// After one rank fails, the others get this long to finish (and report their
// own failures) before they are killed: a peer of a dead rank may be blocked
// in a collective until its timeout.
constexpr auto kGrace = std::chrono::seconds(3);

std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::strtoll(v, nullptr, 10);
}

std::string current_test_name() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}

// Index of this run_world call within the current test, in the parent and in
// a child alike (both run the same test code up to the call).
int64_t next_call_index() {
  static std::string test;
  static int64_t calls = 0;
  const std::string name = current_test_name();
  if (name != test) {
    test = name;
    calls = 0;
  }
  return calls++;
}

bool inherited(const char* entry) {
  // Variables that would make a child shard, filter or write reports the way
  // the parent does, and our own.
  static const char* const kDrop[] = {"GTEST_FILTER=",
                                      "GTEST_OUTPUT=",
                                      "GTEST_SHARD_INDEX=",
                                      "GTEST_TOTAL_SHARDS=",
                                      "GTEST_SHARD_STATUS_FILE=",
                                      "GTEST_REPEAT=",
                                      "BATON_TEST_"};
  // Except the thread count: the user sets it for every rank.
  if (std::string_view(entry).starts_with(std::string(kThreadsEnv) + "=")) return true;
  for (const char* prefix : kDrop)
    if (std::strncmp(entry, prefix, std::strlen(prefix)) == 0) return false;
  return true;
}

std::string describe_status(int status) {
  std::ostringstream out;
  if (WIFEXITED(status)) {
    out << "exited with status " << WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    out << "killed by signal " << WTERMSIG(status) << " (" << strsignal(WTERMSIG(status)) << ")";
  } else {
    out << "ended with wait status " << status;
  }
  return out.str();
}

[[noreturn]] void run_rank(int64_t rank, int64_t world_size, const RankBody& body) {
  // Die with the parent (e.g. when ctest kills it on a timeout).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (auto parent = env_int(kParentEnv); parent && getppid() != *parent) std::_Exit(3);
  at::set_num_threads(rank_threads());
  bool threw = true;
  try {
    auto store = c10::make_intrusive<AuthStore>(
        "127.0.0.1", static_cast<uint16_t>(env_int(kPortEnv).value_or(0)), std::string(),
        std::chrono::seconds(env_int(kTimeoutEnv).value_or(120)));
    body(rank, store);
    threw = false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << " of " << world_size << " threw: " << e.what();
  } catch (...) {
    ADD_FAILURE() << "rank " << rank << " of " << world_size << " threw a non-std exception";
  }
  // An exception counts even where a test intercepts failures
  // (EXPECT_NONFATAL_FAILURE around run_world).
  const bool failed = threw || ::testing::Test::HasFailure();
  std::fflush(stdout);
  std::fflush(stderr);
  // Skip static destructors and gtest's own reporting: the parent reports.
  std::_Exit(failed ? 1 : 0);
}

struct Child {
  int64_t rank = 0;
  pid_t pid = -1;
  bool done = false;
  int status = 0;
  std::string killed_because;  // empty unless the parent killed it
};

}  // namespace

bool in_rank_process() { return env_int(kRankEnv).has_value(); }

int rank_threads() {
  return static_cast<int>(std::clamp<int64_t>(env_int(kThreadsEnv).value_or(1), 1, 256));
}

void run_world(int64_t world_size, const RankBody& body, std::chrono::seconds timeout) {
  const int64_t call = next_call_index();
  if (in_rank_process()) {
    if (env_int(kCallEnv).value_or(0) != call) return;  // another call's child
    run_rank(*env_int(kRankEnv), env_int(kWorldEnv).value_or(world_size), body);
  }
  ASSERT_GE(world_size, 1);
  const std::string test = current_test_name();
  ASSERT_FALSE(test.empty()) << "run_world must be called inside a TEST";

  // The runtime's own rendezvous store (loopback, cluster-token handshake).
  StoreServerOptions store_options;
  store_options.name = "run_world's store";
  auto server = std::make_unique<StoreServer>(store_options);

  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0) << "readlink /proc/self/exe: " << std::strerror(errno);
  exe[n] = '\0';
  const std::string filter = "--gtest_filter=" + test;
  const std::string also_disabled = "--gtest_also_run_disabled_tests";

  std::vector<std::string> env_common;
  for (char** e = environ; *e; ++e)
    if (inherited(*e)) env_common.emplace_back(*e);
  env_common.push_back(std::string(kWorldEnv) + "=" + std::to_string(world_size));
  env_common.push_back(std::string(kPortEnv) + "=" + std::to_string(server->port()));
  env_common.push_back("BATON_CLUSTER_TOKEN=" + auth::cluster_token());
  env_common.push_back(std::string(kCallEnv) + "=" + std::to_string(call));
  env_common.push_back(std::string(kTimeoutEnv) + "=" + std::to_string(timeout.count()));
  env_common.push_back(std::string(kParentEnv) + "=" + std::to_string(getpid()));

  std::vector<Child> children;
  std::string spawn_error;
  for (int64_t rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> env = env_common;
    env.push_back(std::string(kRankEnv) + "=" + std::to_string(rank));
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv{exe, const_cast<char*>(filter.c_str()),
                            const_cast<char*>(also_disabled.c_str()), nullptr};
    Child child;
    child.rank = rank;
    const int rc = posix_spawn(&child.pid, exe, nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      spawn_error = "posix_spawn of rank " + std::to_string(rank) + ": " + std::strerror(rc);
      break;
    }
    children.push_back(child);
  }

  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_failure;
  std::string first_failed;
  auto kill_rest = [&](const std::string& why) {
    for (Child& c : children)
      if (!c.done && c.killed_because.empty()) {
        kill(c.pid, SIGKILL);
        c.killed_because = why;
      }
  };
  if (!spawn_error.empty()) kill_rest("spawning another rank failed");
  // Poll: waiting on several specific children with a deadline has no
  // blocking primitive short of signal plumbing.
  for (;;) {
    bool all_done = true;
    for (Child& c : children) {
      if (c.done) continue;
      const pid_t r = waitpid(c.pid, &c.status, c.killed_because.empty() ? WNOHANG : 0);
      if (r == c.pid || (r < 0 && errno == ECHILD)) {
        c.done = true;
        const bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
        if (!ok && !first_failure && c.killed_because.empty()) {
          first_failure = std::chrono::steady_clock::now();
          first_failed = "rank " + std::to_string(c.rank);
        }
      } else {
        all_done = false;
      }
    }
    if (all_done) break;
    const auto now = std::chrono::steady_clock::now();
    if (now - start > timeout)
      kill_rest("timed out after " + std::to_string(timeout.count()) + " s");
    else if (first_failure && now - *first_failure > kGrace)
      kill_rest("killed after " + first_failed + " failed");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  std::ostringstream failures;
  for (const Child& c : children) {
    if (!c.killed_because.empty())
      failures << "\n  rank " << c.rank << ": " << c.killed_because;
    else if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0))
      failures << "\n  rank " << c.rank << ": " << describe_status(c.status);
  }
  if (!spawn_error.empty()) failures << "\n  " << spawn_error;
  if (!failures.str().empty())
    ADD_FAILURE() << "run_world(" << world_size << ") in " << test << ":" << failures.str();
}

at::Tensor seeded_randn(at::IntArrayRef shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed), at::kFloat);
}

namespace {

// In a rank process: print only failures, each prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int64_t rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream out;
    out << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
        << result.line_number() << ": Failure\n"
        << result.message() << "\n";
    const std::string s = out.str();
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  }

 private:
  int64_t rank_;
};

}  // namespace

int multiprocess_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (auto rank = env_int(kRankEnv)) {
    at::set_num_threads(rank_threads());
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(*rank));
  }
  return RUN_ALL_TESTS();
}

}  // namespace baton::engine::test

int main(int argc, char** argv) { return baton::engine::test::multiprocess_main(argc, argv); }
