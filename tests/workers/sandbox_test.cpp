// The code runner's sandbox (workers/tools/sandbox.h) against programs that misbehave, and the
// "code_interpreter" tool on it (workers/tools/code_runner_tool.cpp). Every test skips, naming
// why, where python3 or the sandbox's isolation (root or user namespaces) is missing.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "workers/tools/code_runner_tool.h"
#include "workers/tools/sandbox.h"
#include "workers/tools/tool_registry.h"

namespace baton::tools {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)
#define EXPECT_NOT_CONTAINS(text, part) \
  EXPECT_EQ(std::string(text).find(part), std::string::npos) << "in: " << (text)

// How long a run may take past its limit: the grace after a kill, and start-up.
constexpr double kSlackSeconds = 1.5;

const std::vector<std::string> kPython = {"python3", "-I", "-u", "-"};

// The processes whose parent is this one. The test process is a child subreaper, so a
// process the sandbox failed to contain would end up here too.
std::vector<int> child_processes() {
  std::vector<int> children;
  const std::string self = std::to_string(getpid());
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 1));
    std::string state, ppid;
    fields >> state >> ppid;
    if (ppid == self) children.push_back(std::stoi(name));
  }
  return children;
}

// The test process's peak resident memory in kB (VmHWM).
int64_t peak_rss_kb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// Entries of the host's temp directory a sandbox would create.
std::set<std::string> sandbox_temp_dirs() {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path())) {
    const std::string name = entry.path().filename();
    if (name.rfind("baton-sandbox-", 0) == 0) names.insert(name);
  }
  return names;
}

bool python_available() {
  for (const char* dir : {"/usr/local/bin", "/usr/bin", "/bin"})
    if (access((std::string(dir) + "/python3").c_str(), X_OK) == 0) return true;
  return false;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!python_available())
      GTEST_SKIP() << "python3 is not on the sandbox's PATH /usr/local/bin:/usr/bin:/bin";
    const std::string& why = sandbox_unavailable_reason();
    if (!why.empty()) GTEST_SKIP() << "the sandbox's isolation is unavailable: " << why;
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }

  void TearDown() override {
    if (!IsSkipped()) {
      EXPECT_EQ(child_processes(), std::vector<int>{}) << "processes were left";
    }
  }

  static SandboxResult python(const std::string& code, const SandboxLimits& limits = {}) {
    return run_sandboxed(kPython, code, limits);
  }
};

TEST_F(SandboxTest, RunsPythonAndCapturesItsOutput) {
  const SandboxResult r = python("import sys\nprint('hi')\nprint('warn', file=sys.stderr)\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.output_truncated);
  EXPECT_EQ(r.stdout_text, "hi\n");
  EXPECT_EQ(r.stderr_text, "warn\n");
  EXPECT_GT(r.wall_seconds, 0);
  EXPECT_CONTAINS(r.isolation, "net+mount+pid");
}

TEST_F(SandboxTest, StdinCarriesTextLargerThanAPipe) {
  const std::string text(300000, 'a');
  SandboxLimits limits;
  limits.output_bytes = 1 << 20;
  const SandboxResult r = run_sandboxed({"cat"}, text, limits);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_text, text);
}

TEST_F(SandboxTest, SyntaxErrorExitsNonzeroWithTheTraceback) {
  const SandboxResult r = python("print('unclosed'\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_CONTAINS(r.stderr_text, "SyntaxError");
}

TEST_F(SandboxTest, InfiniteLoopIsKilledAtTheCpuLimit) {
  SandboxLimits limits;
  limits.cpu_seconds = 1;
  limits.wall_seconds = 10;
  const SandboxResult r = python("while True:\n    pass\n", limits);
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(r.signal == SIGXCPU || r.signal == SIGKILL) << "signal " << r.signal;
  EXPECT_LT(r.wall_seconds, limits.wall_seconds);
}

TEST_F(SandboxTest, SleepIsKilledAtTheWallLimit) {
  SandboxLimits limits;
  limits.wall_seconds = 1;
  const SandboxResult r = python("import time\nprint('started')\ntime.sleep(60)\n", limits);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.stdout_text, "started\n");
  EXPECT_GE(r.wall_seconds, limits.wall_seconds);
  EXPECT_LT(r.wall_seconds, limits.wall_seconds + kSlackSeconds);
}

TEST_F(SandboxTest, ForkBombEndsAndLeavesNoProcess) {
  SandboxLimits limits;
  limits.wall_seconds = 2;
  const SandboxResult r = python(
      "import os\n"
      "while True:\n"
      "    try:\n"
      "        os.fork()\n"
      "    except OSError:\n"
      "        pass\n",
      limits);
  EXPECT_NE(r.signal, 0);
  EXPECT_LT(r.wall_seconds, limits.wall_seconds + kSlackSeconds);
  // TearDown checks that nothing is left.
}

TEST_F(SandboxTest, ProcessLimitHoldsAndChildrenDieWithTheProgram) {
  SandboxLimits limits;
  limits.processes = 8;
  const SandboxResult r = python(
      "import os, time\n"
      "started = failed = 0\n"
      "for _ in range(20):\n"
      "    try:\n"
      "        if os.fork() == 0:\n"
      "            time.sleep(30)\n"
      "            os._exit(0)\n"
      "        started += 1\n"
      "    except OSError:\n"
      "        failed += 1\n"
      "print(started, failed)\n",
      limits);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  int started = 0, failed = 0;
  std::istringstream(r.stdout_text) >> started >> failed;
  EXPECT_LT(started, 8);
  EXPECT_GT(failed, 0);
  // The sleeping children were killed when the program exited, not waited for.
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(r.wall_seconds, 5);
}

TEST_F(SandboxTest, HugeOutputIsTruncatedInBoundedMemory) {
  const int64_t rss_before = peak_rss_kb();
  const SandboxResult r = python("print('x' * 10**8)\n");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(r.output_truncated);
  EXPECT_LE(r.stdout_text.size(), size_t{16 << 10} + 100);
  EXPECT_EQ(r.stdout_text.substr(0, 100), std::string(100, 'x'));
  EXPECT_CONTAINS(r.stdout_text, "[output truncated: ");
  EXPECT_LT(peak_rss_kb() - rss_before, 32 << 10) << "kB more at the peak";
}

TEST_F(SandboxTest, TruncationSharesTheBudgetOnCharacterBoundaries) {
  SandboxLimits limits;
  limits.output_bytes = 1001;
  const SandboxResult r = python(
      "import sys\nsys.stdout.write('\\u00e9' * 5000)\nsys.stderr.write('e' * 5000)\n", limits);
  EXPECT_TRUE(r.output_truncated);
  // Each stream keeps half of 1001 bytes: stdout 250 two-byte characters (not 250.5), stderr 500.
  std::string accents;
  for (int i = 0; i < 250; ++i) accents += "\xc3\xa9";
  EXPECT_EQ(r.stdout_text.substr(0, r.stdout_text.find('\n')), accents);
  EXPECT_EQ(r.stderr_text.substr(0, r.stderr_text.find('\n')), std::string(500, 'e'));
}

TEST_F(SandboxTest, AllocatingTwoGigabytesFails) {
  const SandboxResult r = python("b = bytearray(2 << 30)\nprint('allocated')\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NOT_CONTAINS(r.stdout_text, "allocated");
  EXPECT_TRUE(r.signal != 0 || r.stderr_text.find("MemoryError") != std::string::npos)
      << r.stderr_text;
}

TEST_F(SandboxTest, WritingAFileOverTheSizeLimitFails) {
  const SandboxResult r =
      python("with open('big', 'wb') as f:\n    f.write(b'x' * (100 << 20))\nprint('written')\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NOT_CONTAINS(r.stdout_text, "written");
  EXPECT_TRUE(r.signal == SIGXFSZ || r.stderr_text.find("File too large") != std::string::npos)
      << r.stderr_text;
}

TEST_F(SandboxTest, WorkDirHoldsAtMostDiskBytes) {
  SandboxLimits limits;
  limits.disk_bytes = 8 << 20;
  const SandboxResult r = python(
      "for i in range(4):\n"
      "    with open(f'f{i}', 'wb') as f:\n"
      "        f.write(b'x' * (4 << 20))\n"
      "print('written')\n",
      limits);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NOT_CONTAINS(r.stdout_text, "written");
  EXPECT_CONTAINS(r.stderr_text, "No space left on device");
}

TEST_F(SandboxTest, NetworkIsUnreachable) {
  // A listener the test itself can reach, on the host's loopback.
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);

  const SandboxResult r = python(
      "import socket\n"
      "for host, port in [('127.0.0.1', " +
      std::to_string(port) +
      "), ('8.8.8.8', 53)]:\n"
      "    try:\n"
      "        socket.create_connection((host, port), timeout=2)\n"
      "        print('connected', host)\n"
      "    except OSError as e:\n"
      "        print('blocked', host, e)\n");
  close(listener);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_CONTAINS(r.stdout_text, "blocked 127.0.0.1");
  EXPECT_CONTAINS(r.stdout_text, "blocked 8.8.8.8");
  EXPECT_NOT_CONTAINS(r.stdout_text, "connected");
}

TEST_F(SandboxTest, HostFilesAreHidden) {
  const std::string name = "baton_sandbox_secret_" + std::to_string(getpid());
  std::vector<fs::path> secrets = {fs::temp_directory_path() / name, fs::current_path() / name};
  std::vector<fs::path> written;
  for (const fs::path& path : secrets) {
    std::ofstream(path) << "secret\n";
    if (fs::exists(path)) written.push_back(path);
  }
  ASSERT_FALSE(written.empty());
  std::string code = "for p in [";
  for (const fs::path& path : written) code += "'" + path.string() + "', ";
  code +=
      "]:\n"
      "    try:\n"
      "        print('read', p, open(p).read())\n"
      "    except OSError as e:\n"
      "        print('hidden', p, e)\n";
  const SandboxResult r = python(code);
  for (const fs::path& path : written) fs::remove(path);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NOT_CONTAINS(r.stdout_text, "read ");
  for (const fs::path& path : written) EXPECT_CONTAINS(r.stdout_text, "hidden " + path.string());
}

TEST_F(SandboxTest, OnlyTheWorkDirIsWritable) {
  std::string code = "import os\nfor d in [";
  for (const char* dir : {"/", "/etc", "/usr", "/var/tmp", "/home", "/root", "/dev", "/dev/shm",
                          "/run", "/proc", "/sys"})
    code += std::string("'") + dir + "', ";
  // The test's own directory too, unless it is under /tmp (the sandbox's work dir).
  const std::string cwd = fs::current_path().string();
  if (cwd != "/tmp" && cwd.rfind("/tmp/", 0) != 0) code += "'" + cwd + "'";
  code +=
      "]:\n"
      "    try:\n"
      "        open(os.path.join(d, 'baton_sandbox_probe'), 'w').write('x')\n"
      "        print('wrote', d)\n"
      "    except OSError as e:\n"
      "        print('denied', d, e)\n"
      "open('here', 'w').write('x')\n"
      "print('wrote the work dir', os.getcwd())\n";
  const SandboxResult r = python(code);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NOT_CONTAINS(r.stdout_text, "wrote /");
  EXPECT_CONTAINS(r.stdout_text, "wrote the work dir /tmp");
  EXPECT_FALSE(fs::exists(fs::current_path() / "baton_sandbox_probe"));
}

TEST_F(SandboxTest, WorkDirIsFreshAndNothingIsLeftBehind) {
  const std::set<std::string> before = sandbox_temp_dirs();
  const SandboxResult first =
      python("open('marker', 'w').write('x')\nimport os\nprint(os.listdir('.'))\n");
  EXPECT_EQ(first.stdout_text, "['marker']\n") << first.stderr_text;
  const SandboxResult second = python("import os\nprint(os.listdir('.'))\n");
  EXPECT_EQ(second.stdout_text, "[]\n") << second.stderr_text;
  EXPECT_EQ(sandbox_temp_dirs(), before);
}

TEST_F(SandboxTest, CallersEnvironmentIsNotVisible) {
  ASSERT_EQ(setenv("BATON_SECRET", "hunter2", 1), 0);
  const SandboxResult r = python("import os\nprint(sorted(os.environ.items()))\n");
  unsetenv("BATON_SECRET");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NOT_CONTAINS(r.stdout_text, "BATON_SECRET");
  EXPECT_NOT_CONTAINS(r.stdout_text, "hunter2");
  EXPECT_CONTAINS(r.stdout_text, "('HOME', '/tmp')");
  EXPECT_CONTAINS(r.stdout_text, "('PATH', '/usr/local/bin:/usr/bin:/bin')");
}

TEST_F(SandboxTest, ProgramRunsUnprivilegedInItsOwnPidNamespace) {
  const SandboxResult r = python(
      "import os\nprint(os.getuid(), os.getgid(), os.getgroups(), os.getpid(), "
      "os.listdir('/proc').count('1'))\n");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  uint64_t uid = 0, gid = 0;
  std::istringstream(r.stdout_text) >> uid >> gid;
  if (geteuid() == 0) {
    EXPECT_GE(uid, kSandboxUidBase);
    EXPECT_EQ(gid, uid);
    EXPECT_CONTAINS(r.stdout_text, " [] ");  // no supplementary groups
  } else {
    EXPECT_EQ(uid, 65534u);
  }
  // The program is pid 2, its init pid 1.
  EXPECT_CONTAINS(r.stdout_text, "] 2 1\n");
}

TEST_F(SandboxTest, ProgramUnderAHiddenDirectoryCannotRun) {
  // /var/tmp is always hidden: a copy of a system program placed there is not visible inside.
  char pattern[] = "/var/tmp/baton-sandbox-test-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr) << std::strerror(errno);
  const fs::path dir = pattern;
  const fs::path program = dir / "true";
  fs::copy_file("/bin/true", program);
  try {
    run_sandboxed({program.string()}, "", SandboxLimits{});
    ADD_FAILURE() << "ran " << program;
  } catch (const SandboxError& e) {
    EXPECT_CONTAINS(e.what(), "No such file or directory");
    EXPECT_CONTAINS(e.what(), "hidden in the sandbox");
    EXPECT_CONTAINS(e.what(), "/var/tmp");
  }
  fs::remove_all(dir);
}

TEST_F(SandboxTest, RejectsBadArguments) {
  EXPECT_THROW(run_sandboxed({}, "", SandboxLimits{}), InvalidArgument);
  EXPECT_THROW(run_sandboxed({"baton-no-such-program"}, "", SandboxLimits{}), InvalidArgument);
  EXPECT_THROW(run_sandboxed({"bin/true"}, "", SandboxLimits{}), InvalidArgument);
  SandboxLimits limits;
  limits.wall_seconds = 0;
  EXPECT_THROW(run_sandboxed({"true"}, "", limits), InvalidArgument);
}

TEST_F(SandboxTest, StartsInMilliseconds) {
  constexpr int kRuns = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i)
    ASSERT_EQ(run_sandboxed({"true"}, "", SandboxLimits{}).exit_code, 0);
  const double each =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRuns;
  RecordProperty("seconds_per_run", std::to_string(each));
  std::printf("sandboxed `true`: %.2f ms per run\n", each * 1e3);
  EXPECT_LT(each, 0.25);
}

class CodeRunnerTest : public SandboxTest {
 protected:
  static ToolResult call(const std::string& code,
                         const nlohmann::json& kwargs = nlohmann::json::object()) {
    return call_tool("code_interpreter", {{"code", code}}, kwargs);
  }
};

TEST_F(CodeRunnerTest, IsRegisteredWithVerlsSchema) {
  const ToolSpec& spec = find_tool("code_interpreter");
  EXPECT_EQ(spec.schema["function"]["name"], "code_interpreter");
  EXPECT_EQ(spec.schema["function"]["parameters"]["required"], nlohmann::json::array({"code"}));
  EXPECT_EQ(spec.schema["function"]["parameters"]["properties"]["code"]["type"], "string");
}

TEST_F(CodeRunnerTest, ShowsStdoutAndRecordsTheTime) {
  const ToolResult r = call("print(6 * 7)\n");
  EXPECT_FALSE(r.error) << r.text;
  EXPECT_EQ(r.text, "42\n");
  ASSERT_EQ(r.metrics.count("sandbox_seconds"), 1u);
  EXPECT_GT(r.metrics.at("sandbox_seconds"), 0);
}

TEST_F(CodeRunnerTest, SyntaxErrorIsAnErrorWithTheTraceback) {
  const ToolResult r = call("print('a')\nprint(\n");
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "SyntaxError");
  EXPECT_CONTAINS(r.text, "Error: exited with status 1");
}

TEST_F(CodeRunnerTest, TimeoutIsNamed) {
  const ToolResult r = call("import time\ntime.sleep(60)\n", {{"timeout", 1}});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "Error: timed out after 1 s");
}

TEST_F(CodeRunnerTest, CpuLimitIsNamed) {
  const ToolResult r = call("while True:\n    pass\n", {{"cpu_seconds", 1}});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "CPU time limit of 1 s");
}

TEST_F(CodeRunnerTest, MemoryErrorIsShown) {
  const ToolResult r = call("b = bytearray(1 << 30)\n", {{"memory_limit_mb", 256}});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "MemoryError");
}

TEST_F(CodeRunnerTest, TruncatedOutputIsAnError) {
  const ToolResult r = call("print('y' * 5000)\n", {{"output_bytes", 1000}});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "[output truncated: ");
}

TEST_F(CodeRunnerTest, InvalidUtf8IsReplaced) {
  const ToolResult r = call("import sys\nsys.stdout.buffer.write(b'a\\xffb')\n");
  EXPECT_FALSE(r.error) << r.text;
  EXPECT_EQ(r.text,
            "a\xEF\xBF\xBD"
            "b");
}

TEST_F(CodeRunnerTest, InterpreterCanBeChanged) {
  const ToolResult r =
      call("echo from sh\n", {{"interpreter", nlohmann::json::array({"sh", "-s"})}});
  EXPECT_FALSE(r.error) << r.text;
  EXPECT_EQ(r.text, "from sh\n");
}

TEST_F(CodeRunnerTest, BadArgumentsAreErrors) {
  EXPECT_TRUE(call("print(1)", {{"timeout", "soon"}}).error);
  EXPECT_CONTAINS(call("print(1)", {{"timeout", "soon"}}).text, "timeout");
  EXPECT_TRUE(call("print(1)", {{"interpreter", nlohmann::json::array()}}).error);
  EXPECT_TRUE(call_tool("code_interpreter", nlohmann::json::object(), {}).error);
  EXPECT_THROW(code_interpreter_tool({{"code", 42}}, {}), InvalidArgument);
}

}  // namespace
}  // namespace baton::tools
