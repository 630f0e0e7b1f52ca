// A process's memory as /proc shows it, and whether the kernel's OOM killer
// ended it (internal).
//
// The driver watches each worker on its machine (MemoryWatch, sampled from
// the I/O thread), so that a worker the OOM killer ends is reported as
//
//   worker ActorWorker rank 1 (pid 1234) was killed: out of memory (RSS 812 MiB
//   last seen 40 ms before, peak 900 MiB; SIGKILL from the OOM killer of memory
//   cgroup /job7) during ActorWorker.update_actor
//
// instead of "was killed by signal 9 (SIGKILL)". A worker whose own
// allocation fails (std::bad_alloc, under `ulimit -v` say) reports
// out_of_memory_text() through its error reply instead.
//
// The OOM killer leaves no mark on the process's wait status (a plain
// SIGKILL); the kernel counts its kills instead, per memory cgroup (v2
// memory.events, v1 memory.oom_control: `oom_kill`) and for the machine
// (/proc/vmstat: `oom_kill`). A SIGKILL is an OOM kill when the count of the
// process's memory cgroup rose since the process was last seen alive, or,
// for a process with no memory cgroup of its own (the root, or no memory
// controller), when the machine's count did. The cgroup's count is preferred:
// it does not take another process's OOM kill elsewhere on the machine for
// this one's (a SIGKILL sent by someone else meanwhile).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace baton {

struct MemoryUsage {
  int64_t rss_bytes = 0;      // VmRSS: resident now
  int64_t peak_bytes = 0;     // VmHWM: the largest RSS so far
  int64_t virtual_bytes = 0;  // VmSize: its address space, which RLIMIT_AS bounds
};

// The usage of process `pid` (0: this process) from /proc/<pid>/status;
// nullopt once it is being killed (a SIGKILL pending) or has exited (a
// zombie has no memory), or when unreadable.
std::optional<MemoryUsage> read_memory_usage(pid_t pid);

// "812 MiB"; "60.0 GiB" from 10 GiB up.
std::string format_bytes(int64_t bytes);

// OOM kills counted by the kernel, where a process can suffer them.
struct OomKills {
  std::optional<int64_t> cgroup;  // in its memory cgroup; nullopt when it has none of its own
  std::optional<int64_t> system;  // on the machine; read only when `cgroup` is nullopt
};

// Where the memory controller's hierarchy is mounted: a v1 hierarchy that
// has it ("/sys/fs/cgroup/memory"), else the v2 one ("/sys/fs/cgroup");
// nullopt when neither is. Read once.
struct MemoryCgroupMount {
  std::string root;
  bool v1 = false;
};
const std::optional<MemoryCgroupMount>& memory_cgroup_mount();

// The memory cgroup of process `pid` ("/job7": below memory_cgroup_mount()),
// or "" when it is in the root one, the memory controller is not mounted or
// /proc cannot be read.
std::string memory_cgroup_of(pid_t pid);

// The OOM kills counted in memory cgroup `cgroup` (as memory_cgroup_of
// gives it), or, for "" or an unreadable counter, on the machine.
OomKills read_oom_kills(const std::string& cgroup);

// What a sample found of a process that was alive.
struct MemorySample {
  std::chrono::steady_clock::time_point at;
  std::optional<MemoryUsage> usage;
  std::string cgroup;  // its memory cgroup then ("" for none)
  OomKills oom_kills;  // of `cgroup`, read before the usage showed it alive
};

// How a process that ended with `wait_status` died: describe_exit_status's
// words, unless it was an OOM kill (a SIGKILL, and `now`'s counts are above
// `last`'s, the cgroup's when `last` has it), which reads
//   "was killed: out of memory (RSS 812 MiB last seen 40 ms before, peak 900 MiB;
//    SIGKILL from the OOM killer of memory cgroup /job7)"
// `last`: the last sample that found it alive (nullopt: never sampled, then
// only describe_exit_status's words); `now`: the counts of `last->cgroup` read
// once it has exited, at time `ended`.
std::string describe_death(int wait_status, const std::optional<MemorySample>& last,
                           const OomKills& now, std::chrono::steady_clock::time_point ended);

// Watches one process on this machine: its memory and OOM-kill counts, from
// samples taken while it lives, to tell an OOM kill when it dies.
// Not thread-safe: the driver samples and describes on its I/O thread.
class MemoryWatch {
 public:
  explicit MemoryWatch(pid_t pid) : pid_(pid) {}

  // Reads the OOM counts of the process's memory cgroup, then its memory;
  // keeps both when the process was still alive (so the counts predate any
  // kill that the memory reading missed). Returns whether it was. A few
  // small /proc and cgroup files, about 30 µs. REQUIRES: the process is not
  // reaped yet (its pid cannot have been reused).
  bool sample();

  // describe_death for the process, reaped after ending with `wait_status`.
  std::string describe_death(int wait_status) const;

  const std::optional<MemorySample>& last() const { return last_; }

 private:
  pid_t pid_;
  std::optional<MemorySample> last_;
};

// The error text of a failed allocation in this process, `what` being the
// exception's message: "out of memory (RSS 180 MiB, peak 190 MiB; address
// space 2301 MiB of its 2364 MiB limit): std::bad_alloc" (the address-space
// part only under an RLIMIT_AS).
std::string out_of_memory_text(const std::string& what);

}  // namespace baton
