// Runs an untrusted program (a model's code) isolated from the host, under resource limits:
// the code runner tool's sandbox (workers/tools/code_runner_tool.cpp).
//
// What run_sandboxed isolates, when the namespaces are available (root, or unprivileged user
// namespaces):
//   network     a new network namespace: only a loopback that is down; no host, no internet
//   files       a new mount namespace: / read-only and nosuid (every mount below it too); empty
//               read-only tmpfs over /home, /root, /work, /var/tmp, /mnt, /media, /srv, /run
//               and over the caller's working directory and executable's directory; a minimal
//               /dev (null, zero, full, random, urandom: no GPU, no disks); a fresh /proc
//   work dir    /tmp is a fresh tmpfs of at most disk_bytes, the program's working directory
//               and HOME, and the only writable place; it disappears with the namespace
//   processes   a new PID namespace whose init is the sandbox's own: when the program exits
//               or is killed, every process it started is killed too; IPC, UTS and cgroup
//               namespaces of its own
//   identity    as root: a uid/gid of its own per run (kSandboxUidBase + the init's host pid),
//               no supplementary groups, no capabilities, no_new_privs; otherwise a user
//               namespace mapping uid/gid 65534 to the caller's
//   environment PATH=/usr/local/bin:/usr/bin:/bin, HOME=TMPDIR=/tmp, LANG=C.UTF-8, one thread
//               for OpenMP/OpenBLAS/MKL: never the caller's (tokens, keys)
//   descriptors none of the caller's: stdin is the given text, stdout and stderr pipes
// and the limits of SandboxLimits (setrlimit, and the wall clock in the caller).
//
// Example:
//   SandboxResult r = run_sandboxed({"python3", "-I", "-"}, "print(6 * 7)\n", SandboxLimits{});
//   // r.exit_code 0, r.stdout_text "42\n"
//   SandboxLimits quick;
//   quick.wall_seconds = 1;
//   r = run_sandboxed({"python3", "-I", "-"}, "while True: pass\n", quick);
//   // r.timed_out or r.signal == SIGXCPU, and no process of it is left
//
// Not covered: system calls themselves (no seccomp filter), the kernel's attack surface, and
// what / exposes read-only to any unprivileged user (e.g. /etc, /usr, /sys).
//
// Thread safety: run_sandboxed may be called from any number of threads at once; it forks
// with a raw clone and runs only async-signal-safe code in the child, so it is safe in
// multi-threaded processes (LibTorch workers). Each run costs a process copy of the caller
// (copy-on-write; its page tables) and a few milliseconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace baton::tools {

// The sandbox could not be set up (a namespace, a mount, the interpreter's exec), or its
// isolation is unavailable and SandboxLimits::allow_unisolated is false. what() names the step
// and the system's reason.
class SandboxError : public Error {
 public:
  using Error::Error;
};

// The limits of one run. Every size is in bytes, every time in seconds.
//
// Example:
//   SandboxLimits limits;
//   limits.wall_seconds = 30;
//   limits.memory_bytes = int64_t{1} << 30;
struct SandboxLimits {
  double cpu_seconds = 5;  // CPU time of each process (RLIMIT_CPU: SIGXCPU, then SIGKILL 1 s later)
  double wall_seconds = 10;  // wall clock of the whole run; then every process is killed
  int64_t memory_bytes = int64_t{512} << 20;  // address space of each process (RLIMIT_AS)
  int64_t file_bytes = int64_t{16} << 20;     // largest file a process may write (RLIMIT_FSIZE)
  int64_t disk_bytes = int64_t{64} << 20;     // size of the work dir (its tmpfs), all files
  int64_t processes = 64;                     // processes and threads of the run (RLIMIT_NPROC)
  // stdout and stderr kept together; the rest is dropped and a marker says how much. When both
  // overflow, each keeps half.
  int64_t output_bytes = int64_t{16} << 10;
  // Run with the rlimits only (no namespaces, no uid change, a host temp dir as work dir) when
  // the isolation is unavailable, instead of throwing SandboxError. Only for trusted code.
  bool allow_unisolated = false;
};

struct SandboxResult {
  int exit_code = -1;             // the program's exit status; -1 when killed by a signal
  int signal = 0;                 // the signal that killed it (SIGKILL after a timeout); 0 if none
  bool timed_out = false;         // wall_seconds ran out and the run was killed
  bool output_truncated = false;  // output_bytes ran out; the texts end with a marker
  std::string stdout_text;        // the program's bytes as written (not necessarily UTF-8),
  std::string stderr_text;        // cut on a UTF-8 character boundary when truncated
  double wall_seconds = 0;        // from the start of the run to its end, cleanup included
  // What applied, e.g. "user+net+mount+pid+ipc+uts+cgroup namespaces, read-only /, uid
  // 1073741937, rlimits", or "rlimits only (unisolated: <why>)".
  std::string isolation;
};

// Sandbox uids, as root, are kSandboxUidBase + the host pid of the run's init: unique among
// the runs alive, so that RLIMIT_NPROC (counted per uid) counts one run's processes only.
inline constexpr uint32_t kSandboxUidBase = uint32_t{1} << 30;

// Runs `argv` with `stdin_text` as its standard input in the sandbox described above, under
// `limits`, and returns how it ended with its output. argv[0] is an absolute path or a name
// looked up on the sandbox's PATH (/usr/local/bin:/usr/bin:/bin); it must not be under a
// hidden directory. Blocks until every process of the run has exited: at most
// limits.wall_seconds plus about a second of grace (a process stuck in the kernel
// uninterruptibly excepted). Leaves no process, file or directory behind, whatever happens.
// Throws InvalidArgument for an empty argv, a program not found or limits that are not
// positive, and SandboxError when the sandbox cannot be set up or the isolation is
// unavailable without limits.allow_unisolated.
SandboxResult run_sandboxed(const std::vector<std::string>& argv, std::string_view stdin_text,
                            const SandboxLimits& limits);

// "" when run_sandboxed can isolate in this process; otherwise why not, and what would make it
// possible. Found out once per process by setting up a sandbox (a few milliseconds); thread-safe.
const std::string& sandbox_unavailable_reason();

}  // namespace baton::tools
