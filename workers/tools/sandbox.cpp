#include "workers/tools/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "base/errors.h"

namespace baton::tools {
namespace {

namespace fs = std::filesystem;
using detail::cat;
using Clock = std::chrono::steady_clock;

constexpr const char* kSandboxPath = "/usr/local/bin:/usr/bin:/bin";
constexpr const char* kWorkDir = "/tmp";  // inside the sandbox
constexpr uint32_t kUserNamespaceId = 65534;
// After a kill, how long the run may still take to drain its pipes before it is abandoned.
constexpr double kGraceSeconds = 1.0;

// Host directories covered by an empty read-only tmpfs. /tmp gets the work dir's tmpfs.
constexpr std::array<const char*, 8> kHiddenDirs = {"/home", "/root",  "/work", "/var/tmp",
                                                    "/mnt",  "/media", "/srv",  "/run"};
// Directories that are never hidden (the interpreter and its libraries live there); the
// caller's working directory and executable's directory are hidden unless under one of them.
constexpr std::array<const char*, 13> kSystemDirs = {
    "/usr", "/bin",  "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc", "/proc", "/sys",  "/dev", "/boot",  "/tmp"};
// The sandbox's /dev: these nodes, bound from the host's, and the usual links. It is staged
// on /tmp, then moved onto /dev.
constexpr std::array<std::pair<const char*, const char*>, 5> kDevices = {{
    {"/dev/null", "/tmp/null"},
    {"/dev/zero", "/tmp/zero"},
    {"/dev/full", "/tmp/full"},
    {"/dev/random", "/tmp/random"},
    {"/dev/urandom", "/tmp/urandom"},
}};
constexpr std::array<std::pair<const char*, const char*>, 4> kDeviceLinks = {{
    {"/proc/self/fd", "/tmp/fd"},
    {"/proc/self/fd/0", "/tmp/stdin"},
    {"/proc/self/fd/1", "/tmp/stdout"},
    {"/proc/self/fd/2", "/tmp/stderr"},
}};

// A step of the set-up in the child processes, reported back on failure.
enum class Step : int32_t {
  kUserMap,
  kReadOnlyRoot,
  kHide,
  kDev,
  kProc,
  kWorkDir,
  kFork,
  kDescriptors,
  kLimits,
  kIdentity,
  kChdir,
  kExec,
};

// What a child writes to the failure pipe before it exits with 127.
struct Failure {
  Step step;
  int32_t error;  // errno
  int32_t index;  // which hidden dir, device or limit
};

struct Limit {
  __rlimit_resource_t resource;
  const char* name;
  rlimit value;
};

// Everything the child processes need, prepared before the clone: after it they may only
// make async-signal-safe calls (another thread of the caller may hold the malloc lock).
struct Plan {
  bool isolated = false;
  bool as_root = false;  // isolated with a uid of its own; otherwise in a user namespace
  bool probe = false;    // set everything up, then exit 0 instead of running the program
  std::string program;   // the resolved path
  std::vector<std::string> argv_text, env_text;
  std::vector<char*> argv, env;  // null-terminated views of the above
  std::vector<std::string> hidden;
  std::string uid_map, gid_map;  // user namespace only
  std::string work_options;      // mount options of the work dir's tmpfs
  std::string work_dir;          // the program's working directory
  std::vector<Limit> limits;
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1, failure_fd = -1, status_fd = -1;
  std::array<int, 5> keep{};  // the five descriptors above, ascending
};

// --- The child processes: async-signal-safe code only. ---

[[noreturn]] void fail(const Plan& plan, Step step, int index = 0) {
  const Failure failure{step, errno, index};
  if (write(plan.failure_fd, &failure, sizeof failure) < 0) {
  }
  _exit(127);
}

bool write_file(const char* path, std::string_view text) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

// Closes descriptors lo..hi (hi clamped to RLIMIT_NOFILE when close_range is unavailable).
void close_descriptors(unsigned lo, unsigned hi, unsigned flags) {
  if (lo > hi || close_range(lo, hi, flags) == 0) return;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY)
    nofile.rlim_cur = 1 << 16;
  for (unsigned fd = lo; fd <= hi && fd < nofile.rlim_cur; ++fd) {
    if (flags & CLOSE_RANGE_CLOEXEC)
      fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    else
      close(static_cast<int>(fd));
  }
}

// A fork that runs no pthread_atfork handler and takes no glibc lock (glibc's fork() takes
// malloc's), with namespace flags.
pid_t clone_process(unsigned long flags) {
  return static_cast<pid_t>(
      syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

// The init's pid as the host sees it, from the host's /proc (before the new one is mounted).
bool host_pid(pid_t* pid) {
  char text[32];
  const ssize_t n = readlink("/proc/self", text, sizeof text);
  if (n <= 0) return false;
  pid_t value = 0;
  for (ssize_t i = 0; i < n; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + (text[i] - '0');
  }
  *pid = value;
  return true;
}

// The new mount namespace's file system; returns the uid the program is to run as.
uid_t set_up_namespaces(const Plan& plan) {
  uid_t uid = kUserNamespaceId;
  if (plan.as_root) {
    pid_t pid = 0;
    if (!host_pid(&pid)) fail(plan, Step::kIdentity);
    uid = kSandboxUidBase + static_cast<uid_t>(pid);
  } else if (!write_file("/proc/self/setgroups", "deny") ||
             !write_file("/proc/self/uid_map", plan.uid_map) ||
             !write_file("/proc/self/gid_map", plan.gid_map)) {
    fail(plan, Step::kUserMap);
  }
  // Nothing mounted here may propagate back to the host.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    fail(plan, Step::kReadOnlyRoot);
  mount_attr read_only{};
  read_only.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
  if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &read_only, sizeof read_only) != 0)
    fail(plan, Step::kReadOnlyRoot);
  for (size_t i = 0; i < plan.hidden.size(); ++i) {
    if (mount("tmpfs", plan.hidden[i].c_str(), "tmpfs",
              MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755") != 0 &&
        errno != ENOENT && errno != ENOTDIR)
      fail(plan, Step::kHide, static_cast<int>(i));
  }
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755") != 0)
    fail(plan, Step::kDev, -1);
  for (size_t i = 0; i < kDevices.size(); ++i) {
    const int fd = open(kDevices[i].second, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) fail(plan, Step::kDev, static_cast<int>(i));
    close(fd);
    if (mount(kDevices[i].first, kDevices[i].second, nullptr, MS_BIND, nullptr) != 0)
      fail(plan, Step::kDev, static_cast<int>(i));
  }
  for (const auto& [target, link] : kDeviceLinks)
    if (symlink(target, link) != 0) fail(plan, Step::kDev, -1);
  if (mount(nullptr, "/tmp", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
            nullptr) != 0 ||
      mount("/tmp", "/dev", nullptr, MS_MOVE, nullptr) != 0)
    fail(plan, Step::kDev, -1);
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    fail(plan, Step::kProc);
  if (mount("tmpfs", kWorkDir, "tmpfs", MS_NOSUID | MS_NODEV, plan.work_options.c_str()) != 0)
    fail(plan, Step::kWorkDir);
  return uid;
}

[[noreturn]] void run_program(const Plan& plan, uid_t uid) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Dispositions the caller set to SIG_IGN would survive the exec.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &default_action, nullptr);
  if (dup2(plan.stdin_fd, 0) < 0 || dup2(plan.stdout_fd, 1) < 0 || dup2(plan.stderr_fd, 2) < 0)
    fail(plan, Step::kDescriptors);
  // Every other descriptor closes at the exec; the failure pipe stays usable until then.
  close_descriptors(3, ~0U, CLOSE_RANGE_CLOEXEC);
  for (size_t i = 0; i < plan.limits.size(); ++i)
    if (setrlimit(plan.limits[i].resource, &plan.limits[i].value) != 0)
      fail(plan, Step::kLimits, static_cast<int>(i));
  // Raw system calls: glibc's setresuid would signal threads this process does not have.
  if (plan.isolated && plan.as_root &&
      (syscall(SYS_setgroups, 0, nullptr) != 0 || syscall(SYS_setresgid, uid, uid, uid) != 0 ||
       syscall(SYS_setresuid, uid, uid, uid) != 0))
    fail(plan, Step::kIdentity);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(plan, Step::kIdentity);
  if (chdir(plan.work_dir.c_str()) != 0) fail(plan, Step::kChdir);
  if (plan.probe) _exit(0);
  execve(plan.program.c_str(), plan.argv.data(), plan.env.data());
  fail(plan, Step::kExec);
}

// The run's first process: pid 1 of the new PID namespace when isolated. Sets the sandbox up,
// starts the program, reaps whatever ends up its child, and when the program exits reports
// its wait status and exits, which kills every process left in the namespace.
[[noreturn]] void run_init(const Plan& plan) {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &default_action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  setsid();
  // Other threads' descriptors (another run's pipes) would keep their readers waiting.
  unsigned next = 0;
  for (const int fd : plan.keep) {
    if (static_cast<unsigned>(fd) > next) close_descriptors(next, fd - 1, 0);
    next = fd + 1;
  }
  close_descriptors(next, ~0U, 0);
  const uid_t uid = plan.isolated ? set_up_namespaces(plan) : getuid();
  const pid_t program = clone_process(0);
  if (program < 0) fail(plan, Step::kFork);
  if (program == 0) run_program(plan, uid);
  close(plan.failure_fd);
  int status = 0;
  for (;;) {
    int s = 0;
    const pid_t pid = waitpid(-1, &s, 0);
    if (pid == program) {
      status = s;
      break;
    }
    if (pid < 0 && errno != EINTR) _exit(126);
  }
  if (write(plan.status_fd, &status, sizeof status) < 0) {
  }
  // Unisolated, the program's process group is all there is to kill (this process too).
  if (!plan.isolated) kill(0, SIGKILL);
  _exit(0);
}

// --- The caller's side. ---

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string error_text(int error) { return std::system_category().message(error); }

// `fd`, moved to 3 or above if below, so that dup2 onto 0-2 in the child cannot clobber
// another of ours (a caller whose standard descriptors are closed).
UniqueFd above_stdio(UniqueFd fd, const char* what) {
  if (fd.get() < 0)
    throw SandboxError(cat("run_sandboxed: cannot create ", what, ": ", error_text(errno)));
  if (fd.get() > 2) return fd;
  UniqueFd moved(fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));
  if (moved.get() < 0)
    throw SandboxError(cat("run_sandboxed: cannot move ", what, ": ", error_text(errno)));
  return moved;
}

struct Pipe {
  UniqueFd read, write;
};

Pipe make_pipe() {
  int fds[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw SandboxError(cat("run_sandboxed: cannot create a pipe: ", error_text(errno)));
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  return {above_stdio(std::move(read_end), "a pipe"), above_stdio(std::move(write_end), "a pipe")};
}

// The program's stdin: a sealed memfd holding the text (no pipe to feed, no SIGPIPE).
UniqueFd make_stdin(std::string_view text) {
  UniqueFd fd = above_stdio(
      UniqueFd(memfd_create("baton-sandbox-stdin", MFD_CLOEXEC | MFD_ALLOW_SEALING)), "stdin");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw SandboxError(cat("run_sandboxed: cannot write stdin: ", error_text(errno)));
    done += static_cast<size_t>(n);
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0 ||
      lseek(fd.get(), 0, SEEK_SET) != 0)
    throw SandboxError(cat("run_sandboxed: cannot seal stdin: ", error_text(errno)));
  return fd;
}

// A host directory for an unisolated run, removed with everything in it on destruction.
class HostTempDir {
 public:
  HostTempDir() {
    std::string pattern = (fs::temp_directory_path() / "baton-sandbox-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr)
      throw SandboxError(
          cat("run_sandboxed: cannot create a directory like ", pattern, ": ", error_text(errno)));
    path_ = pattern;
  }
  HostTempDir(const HostTempDir&) = delete;
  HostTempDir& operator=(const HostTempDir&) = delete;
  ~HostTempDir() { remove(); }
  const fs::path& path() const { return path_; }

  void remove() {
    if (path_.empty()) return;
    std::error_code error;
    fs::remove_all(path_, error);
    if (error) {
      // The program may have taken the rights to list or change a directory away.
      make_removable(path_);
      fs::remove_all(path_, error);
    }
    path_.clear();
  }

 private:
  static void make_removable(const fs::path& dir) {
    std::error_code error;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, error);
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
      if (it->symlink_status(error).type() == fs::file_type::directory) make_removable(it->path());
  }

  fs::path path_;
};

// The run's init process: killed and reaped on destruction unless reaped before.
class InitProcess {
 public:
  explicit InitProcess(pid_t pid) : pid_(pid) {}
  InitProcess(const InitProcess&) = delete;
  InitProcess& operator=(const InitProcess&) = delete;
  ~InitProcess() {
    if (pid_ <= 0) return;
    kill_all();
    reap();
  }
  // The init (whose death ends the PID namespace) and its process group.
  void kill_all() const {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
  }

  // Waits for the init; its wait status, or nullopt when another thread of the caller reaped it.
  std::optional<int> reap() {
    int status = 0;
    pid_t r;
    do r = waitpid(pid_, &status, 0);
    while (r < 0 && errno == EINTR);
    pid_ = -1;
    if (r < 0) return std::nullopt;
    return status;
  }

 private:
  pid_t pid_;
};

// The longest prefix of text[0, size) that does not end inside a UTF-8 sequence.
size_t utf8_prefix(std::string_view text, size_t size) {
  size_t lead = size;  // back over continuation bytes to the last sequence's lead byte
  while (lead > 0 && size - lead < 3 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80)
    --lead;
  if (lead == 0) return size;
  const auto c = static_cast<unsigned char>(text[lead - 1]);
  const size_t length = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  return size - (lead - 1) < length ? lead - 1 : size;
}

// One output stream, of which at most `cap` bytes are kept.
struct Output {
  std::string kept;
  uint64_t dropped = 0;

  void append(const char* data, size_t n, size_t cap) {
    const size_t take = std::min(n, cap - std::min(cap, kept.size()));
    kept.append(data, take);
    dropped += n - take;
  }

  // Keeps at most the first `size` bytes, and when anything is dropped, cuts on a UTF-8
  // character boundary and appends a marker saying how much.
  std::string finish(size_t size) {
    if (size < kept.size()) {
      dropped += kept.size() - size;
      kept.resize(size);
    }
    if (dropped == 0) return std::move(kept);
    const size_t prefix = utf8_prefix(kept, kept.size());
    dropped += kept.size() - prefix;
    kept.resize(prefix);
    kept += cat("\n[output truncated: ", dropped, " more bytes]\n");
    return std::move(kept);
  }
};

std::string resolve_program(const std::string& name) {
  if (name.empty()) throw InvalidArgument("run_sandboxed: argv[0] is empty");
  if (name.find('/') != std::string::npos) {
    if (name.front() != '/')
      throw InvalidArgument(cat("run_sandboxed: argv[0] '", name,
                                "' must be an absolute path or a name looked up on PATH"));
    if (access(name.c_str(), X_OK) != 0)
      throw InvalidArgument(cat("run_sandboxed: cannot run ", name, ": ", error_text(errno)));
    return name;
  }
  std::string_view dirs = kSandboxPath;
  while (!dirs.empty()) {
    const size_t colon = std::min(dirs.find(':'), dirs.size());
    std::string candidate = cat(dirs.substr(0, colon), "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    dirs.remove_prefix(std::min(colon + 1, dirs.size()));
  }
  throw InvalidArgument(cat("run_sandboxed: program '", name, "' is not on the sandbox's PATH ",
                            kSandboxPath, " (give an absolute path)"));
}

bool is_under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         (dir == "/" || path[dir.size()] == '/'));
}

// kHiddenDirs, and the caller's working directory and executable's directory (a project's
// source and build trees) unless they hold system files or the program.
std::vector<std::string> hidden_dirs(const std::string& program) {
  std::vector<std::string> hidden(kHiddenDirs.begin(), kHiddenDirs.end());
  std::error_code error;
  for (fs::path dir :
       {fs::current_path(error), fs::read_symlink("/proc/self/exe", error).parent_path()}) {
    const std::string text = dir.lexically_normal().string();
    if (text.empty() || text == "/" || is_under(program, text)) continue;
    if (std::any_of(kSystemDirs.begin(), kSystemDirs.end(),
                    [&](const char* system) { return is_under(text, system); }))
      continue;
    if (std::find(hidden.begin(), hidden.end(), text) == hidden.end()) hidden.push_back(text);
  }
  return hidden;
}

void check_positive(const char* name, double value) {
  if (!(value > 0))
    throw InvalidArgument(
        cat("run_sandboxed: SandboxLimits::", name, " must be positive, not ", value));
}

rlim_t clamp_to_hard(__rlimit_resource_t resource, rlim_t value) {
  rlimit current{};
  if (getrlimit(resource, &current) != 0 || current.rlim_max == RLIM_INFINITY) return value;
  return std::min(value, current.rlim_max);
}

std::vector<Limit> rlimits(const SandboxLimits& limits) {
  const auto both = [](__rlimit_resource_t resource, double value) {
    const rlim_t v = clamp_to_hard(resource, static_cast<rlim_t>(value));
    return rlimit{v, v};
  };
  // SIGXCPU at the soft limit (ignored by a program that handles it), SIGKILL a second later.
  const rlim_t cpu = clamp_to_hard(RLIMIT_CPU, static_cast<rlim_t>(std::ceil(limits.cpu_seconds)));
  return {
      {RLIMIT_CPU, "RLIMIT_CPU", {cpu, clamp_to_hard(RLIMIT_CPU, cpu + 1)}},
      {RLIMIT_AS, "RLIMIT_AS", both(RLIMIT_AS, static_cast<double>(limits.memory_bytes))},
      {RLIMIT_FSIZE, "RLIMIT_FSIZE", both(RLIMIT_FSIZE, static_cast<double>(limits.file_bytes))},
      {RLIMIT_NPROC, "RLIMIT_NPROC", both(RLIMIT_NPROC, static_cast<double>(limits.processes))},
      {RLIMIT_CORE, "RLIMIT_CORE", {0, 0}},
  };
}

Plan make_plan(const std::vector<std::string>& argv, const SandboxLimits& limits, bool isolated,
               bool probe, const fs::path& host_work_dir) {
  Plan plan;
  plan.isolated = isolated;
  plan.as_root = isolated && geteuid() == 0;
  plan.probe = probe;
  if (!probe) plan.program = resolve_program(argv.at(0));
  plan.argv_text = argv;
  plan.work_dir = isolated ? kWorkDir : host_work_dir.string();
  plan.env_text = {cat("PATH=", kSandboxPath), "HOME=" + plan.work_dir,
                   "TMPDIR=" + plan.work_dir,  "LANG=C.UTF-8",
                   "OMP_NUM_THREADS=1",        "OPENBLAS_NUM_THREADS=1",
                   "MKL_NUM_THREADS=1"};
  for (std::string& s : plan.argv_text) plan.argv.push_back(s.data());
  plan.argv.push_back(nullptr);
  for (std::string& s : plan.env_text) plan.env.push_back(s.data());
  plan.env.push_back(nullptr);
  if (isolated) {
    plan.hidden = hidden_dirs(plan.program);
    plan.uid_map = cat(kUserNamespaceId, " ", geteuid(), " 1\n");
    plan.gid_map = cat(kUserNamespaceId, " ", getegid(), " 1\n");
    plan.work_options = cat("size=", limits.disk_bytes, ",nr_inodes=16384,mode=1777");
  }
  plan.limits = rlimits(limits);
  return plan;
}

std::string describe_failure(const Failure& failure, const Plan& plan) {
  const auto index = static_cast<size_t>(failure.index);
  std::string step;
  switch (failure.step) {
    case Step::kUserMap:
      step = "write the user namespace's uid and gid maps";
      break;
    case Step::kReadOnlyRoot:
      step = "make / private and read-only (mount_setattr: Linux 5.12+)";
      break;
    case Step::kHide:
      step =
          "hide " + (index < plan.hidden.size() ? plan.hidden[index] : std::string("a directory"));
      break;
    case Step::kDev:
      step = "set up /dev";
      if (index < kDevices.size()) step += cat(" (bind ", kDevices[index].first, ")");
      break;
    case Step::kProc:
      step = "mount /proc";
      break;
    case Step::kWorkDir:
      step = "mount the work dir's tmpfs on /tmp";
      break;
    case Step::kFork:
      step = "start the program's process";
      break;
    case Step::kDescriptors:
      step = "set up stdin, stdout and stderr";
      break;
    case Step::kLimits:
      step = cat("set ", index < plan.limits.size() ? plan.limits[index].name : "a limit");
      break;
    case Step::kIdentity:
      step = "drop privileges";
      break;
    case Step::kChdir:
      step = "enter the work dir " + plan.work_dir;
      break;
    case Step::kExec:
      step = "run " + plan.program;
      break;
  }
  std::string text = cat("run_sandboxed: cannot ", step, ": ", error_text(failure.error));
  if (failure.step == Step::kExec && failure.error == ENOENT && plan.isolated) {
    text += " (hidden in the sandbox: /tmp";
    for (const std::string& dir : plan.hidden) text += ", " + dir;
    text += ")";
  }
  return text;
}

// The caller's ends of the run's pipes.
struct RunPipes {
  UniqueFd stdout_fd, stderr_fd, failure_fd, status_fd;
};

// What came out of the pipes.
struct Collected {
  Output stdout_out, stderr_out;
  std::string failure, status;  // a Failure, the program's wait status (as bytes)
  bool timed_out = false;       // killed at the deadline before the program's status came
};

// Reads the pipes until they all close; at `deadline` kills the run, and gives up on the pipes
// kGraceSeconds later. Keeps at most `cap` bytes of each output stream.
Collected collect(RunPipes& pipes, const InitProcess& init, Clock::time_point deadline,
                  size_t cap) {
  Collected c;
  std::array<pollfd, 4> fds{{{pipes.stdout_fd.get(), POLLIN, 0},
                             {pipes.stderr_fd.get(), POLLIN, 0},
                             {pipes.failure_fd.get(), POLLIN, 0},
                             {pipes.status_fd.get(), POLLIN, 0}}};
  std::vector<char> buffer(size_t{1} << 16);
  std::optional<Clock::time_point> give_up;
  while (std::any_of(fds.begin(), fds.end(), [](const pollfd& p) { return p.fd >= 0; })) {
    const auto now = Clock::now();
    if (!give_up && now >= deadline) {
      c.timed_out = c.status.size() < sizeof(int);
      init.kill_all();
      give_up = now + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(kGraceSeconds));
    }
    if (give_up && now >= *give_up) break;
    const auto wait =
        std::chrono::ceil<std::chrono::milliseconds>((give_up ? *give_up : deadline) - now);
    if (poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 1))) < 0) {
      if (errno == EINTR) continue;
      throw SandboxError(cat("run_sandboxed: poll: ", error_text(errno)));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer.data(), buffer.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        fds[i].fd = -1;
        continue;
      }
      const size_t size = static_cast<size_t>(n);
      if (i == 0) c.stdout_out.append(buffer.data(), size, cap);
      if (i == 1) c.stderr_out.append(buffer.data(), size, cap);
      if (i == 2) c.failure.append(buffer.data(), std::min<size_t>(size, 64));
      if (i == 3) c.status.append(buffer.data(), std::min<size_t>(size, 64));
    }
  }
  return c;
}

// The result of a run that set up: how the program ended and its output, both streams
// together cut to `cap` bytes (when both overflow, each keeps half).
SandboxResult make_result(Collected& c, std::optional<int> init_status, size_t cap) {
  SandboxResult result;
  if (c.status.size() >= sizeof(int)) {
    int wait_status;
    std::memcpy(&wait_status, c.status.data(), sizeof wait_status);
    if (WIFEXITED(wait_status)) result.exit_code = WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) result.signal = WTERMSIG(wait_status);
  } else if (c.timed_out) {
    result.signal = SIGKILL;
  } else {
    throw SandboxError(cat("run_sandboxed: the sandbox's init ended without the program's status",
                           init_status ? ": it " + describe_exit_status(*init_status) : ""));
  }
  result.timed_out = c.timed_out;
  size_t stdout_size = c.stdout_out.kept.size(), stderr_size = c.stderr_out.kept.size();
  if (stdout_size + stderr_size > cap) {
    stderr_size = std::min(stderr_size, std::max(cap - stdout_size, cap / 2));
    stdout_size = std::min(stdout_size, cap - stderr_size);
  }
  result.output_truncated = c.stdout_out.dropped + c.stderr_out.dropped > 0 ||
                            stdout_size < c.stdout_out.kept.size() ||
                            stderr_size < c.stderr_out.kept.size();
  result.stdout_text = c.stdout_out.finish(stdout_size);
  result.stderr_text = c.stderr_out.finish(stderr_size);
  return result;
}

SandboxResult run(const std::vector<std::string>& argv, std::string_view stdin_text,
                  const SandboxLimits& limits, bool isolated, bool probe,
                  const std::string& why_unisolated) {
  const auto start = Clock::now();
  std::optional<HostTempDir> host_dir;
  if (!isolated) host_dir.emplace();
  Plan plan = make_plan(argv, limits, isolated, probe, host_dir ? host_dir->path() : fs::path());

  UniqueFd stdin_fd = make_stdin(stdin_text);
  Pipe out = make_pipe(), err = make_pipe(), failure = make_pipe(), status = make_pipe();
  plan.stdin_fd = stdin_fd.get();
  plan.stdout_fd = out.write.get();
  plan.stderr_fd = err.write.get();
  plan.failure_fd = failure.write.get();
  plan.status_fd = status.write.get();
  plan.keep = {plan.stdin_fd, plan.stdout_fd, plan.stderr_fd, plan.failure_fd, plan.status_fd};
  std::sort(plan.keep.begin(), plan.keep.end());

  unsigned long flags = 0;
  if (isolated) {
    flags =
        CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
    if (!plan.as_root) flags |= CLONE_NEWUSER;
  }
  const pid_t pid = clone_process(flags);
  if (pid < 0)
    throw SandboxError(cat("run_sandboxed: cannot create the sandbox's process",
                           !isolated ? ""
                           : plan.as_root
                               ? " in new net, mount, PID, IPC, UTS and cgroup namespaces"
                               : " in new user, net, mount, PID, IPC, UTS and cgroup "
                                 "namespaces",
                           ": ", error_text(errno)));
  if (pid == 0) run_init(plan);
  InitProcess init(pid);
  // The children hold the write ends now: the pipes close when the run's processes are gone.
  stdin_fd.reset();
  RunPipes pipes{std::move(out.read), std::move(err.read), std::move(failure.read),
                 std::move(status.read)};
  out.write.reset();
  err.write.reset();
  failure.write.reset();
  status.write.reset();

  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(limits.wall_seconds));
  const size_t cap = static_cast<size_t>(limits.output_bytes);
  Collected collected = collect(pipes, init, deadline, cap);
  pipes = {};
  const std::optional<int> init_status = init.reap();
  if (host_dir) host_dir->remove();

  if (collected.failure.size() >= sizeof(Failure)) {
    Failure f;
    std::memcpy(&f, collected.failure.data(), sizeof f);
    throw SandboxError(describe_failure(f, plan));
  }
  SandboxResult result = make_result(collected, init_status, cap);
  if (!isolated)
    result.isolation = cat("rlimits only (unisolated: ", why_unisolated, ")");
  else if (plan.as_root)
    result.isolation =
        cat("net+mount+pid+ipc+uts+cgroup namespaces, read-only /, hidden host ",
            "dirs, minimal /dev, uid ", kSandboxUidBase + static_cast<uint32_t>(pid), ", rlimits");
  else
    result.isolation =
        cat("user+net+mount+pid+ipc+uts+cgroup namespaces, read-only /, hidden ",
            "host dirs, minimal /dev, uid ", kUserNamespaceId, " mapped to the caller's, rlimits");
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace

const std::string& sandbox_unavailable_reason() {
  static const std::string reason = [] {
    try {
      run({"probe"}, "", SandboxLimits{}, /*isolated=*/true, /*probe=*/true, "");
      return std::string();
    } catch (const std::exception& e) {
      std::string why = e.what();
      if (geteuid() != 0)
        why +=
            " (run as root, or allow unprivileged user namespaces: sysctl "
            "user.max_user_namespaces, kernel.unprivileged_userns_clone, "
            "kernel.apparmor_restrict_unprivileged_userns)";
      return why;
    }
  }();
  return reason;
}

SandboxResult run_sandboxed(const std::vector<std::string>& argv, std::string_view stdin_text,
                            const SandboxLimits& limits) {
  if (argv.empty()) throw InvalidArgument("run_sandboxed: argv is empty (argv[0] is the program)");
  check_positive("cpu_seconds", limits.cpu_seconds);
  check_positive("wall_seconds", limits.wall_seconds);
  check_positive("memory_bytes", static_cast<double>(limits.memory_bytes));
  check_positive("file_bytes", static_cast<double>(limits.file_bytes));
  check_positive("disk_bytes", static_cast<double>(limits.disk_bytes));
  check_positive("processes", static_cast<double>(limits.processes));
  check_positive("output_bytes", static_cast<double>(limits.output_bytes));
  const std::string& why = sandbox_unavailable_reason();
  if (!why.empty() && !limits.allow_unisolated)
    throw SandboxError(cat("run_sandboxed: the sandbox's isolation is unavailable: ", why,
                           ". Set SandboxLimits::allow_unisolated to run trusted code without it"));
  return run(argv, stdin_text, limits, /*isolated=*/why.empty(), /*probe=*/false, why);
}

}  // namespace baton::tools
