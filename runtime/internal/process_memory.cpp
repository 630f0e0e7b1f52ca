#include "runtime/internal/process_memory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "base/errors.h"

namespace baton {

namespace {

// Whole small files (/proc and cgroup files are read in one go; their size
// is not known beforehand).
std::optional<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fd);
      if (n < 0) return std::nullopt;
      return text;
    }
  }
}

// The first line of `text` for which `pick` gives a value, that value.
template <class T, class Pick>
std::optional<T> first_line(std::string_view text, Pick pick) {
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    if (std::optional<T> found = pick(text.substr(at, end - at))) return found;
    at = end + 1;
  }
  return std::nullopt;
}

// The text after `key` on the line that starts with it, blanks skipped.
std::optional<std::string_view> field(std::string_view text, std::string_view key) {
  return first_line<std::string_view>(
      text, [&](std::string_view line) -> std::optional<std::string_view> {
        if (line.substr(0, key.size()) != key) return std::nullopt;
        line.remove_prefix(key.size());
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
          line.remove_prefix(1);
        return line;
      });
}

std::optional<int64_t> number(std::string_view text, std::string_view key, int base = 10) {
  std::optional<std::string_view> v = field(text, key);
  if (!v || v->empty()) return std::nullopt;
  const std::string digits(*v);
  char* end = nullptr;
  const unsigned long long n = std::strtoull(digits.c_str(), &end, base);
  if (end == digits.c_str()) return std::nullopt;
  return static_cast<int64_t>(n);
}

std::string ms_text(std::chrono::steady_clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

}  // namespace

const std::optional<MemoryCgroupMount>& memory_cgroup_mount() {
  static const std::optional<MemoryCgroupMount> fs = []() -> std::optional<MemoryCgroupMount> {
    const std::optional<std::string> mounts = read_file("/proc/self/mounts");
    if (!mounts) return std::nullopt;
    // "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0"
    auto mount_of = [](bool v1) {
      return [v1](std::string_view line) -> std::optional<MemoryCgroupMount> {
        char dir[512], type[64], options[512];
        if (std::sscanf(std::string(line).c_str(), "%*s %511s %63s %511s", dir, type, options) != 3)
          return std::nullopt;
        const bool match =
            v1 ? std::string_view(type) == "cgroup" &&
                     (std::string(",") + options + ",").find(",memory,") != std::string::npos
               : std::string_view(type) == "cgroup2";
        if (!match) return std::nullopt;
        return MemoryCgroupMount{dir, v1};
      };
    };
    if (auto v1 = first_line<MemoryCgroupMount>(*mounts, mount_of(true))) return v1;
    return first_line<MemoryCgroupMount>(*mounts, mount_of(false));
  }();
  return fs;
}

std::optional<MemoryUsage> read_memory_usage(pid_t pid) {
  const std::optional<std::string> status =
      read_file(pid == 0 ? "/proc/self/status" : "/proc/" + std::to_string(pid) + "/status");
  if (!status) return std::nullopt;
  // The OOM killer sends its SIGKILL before it counts the kill: a process
  // with one pending is no longer "alive" for MemoryWatch's purposes.
  constexpr int64_t kKillBit = int64_t{1} << (SIGKILL - 1);
  for (std::string_view mask : {"SigPnd:", "ShdPnd:"}) {
    std::optional<int64_t> pending = number(*status, mask, 16);
    if (pending && (*pending & kKillBit) != 0) return std::nullopt;
  }
  std::optional<int64_t> rss = number(*status, "VmRSS:");
  std::optional<int64_t> peak = number(*status, "VmHWM:");
  std::optional<int64_t> size = number(*status, "VmSize:");
  if (!rss || !peak || !size) return std::nullopt;  // exited: a zombie's status has no Vm lines
  return MemoryUsage{*rss * 1024, *peak * 1024, *size * 1024};
}

std::string format_bytes(int64_t bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  if (bytes < 10240 * kMiB) return std::to_string((bytes + kMiB / 2) / kMiB) + " MiB";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * kMiB));
  return text;
}

std::string memory_cgroup_of(pid_t pid) {
  const std::optional<MemoryCgroupMount>& fs = memory_cgroup_mount();
  if (!fs) return "";
  const std::optional<std::string> lines = read_file("/proc/" + std::to_string(pid) + "/cgroup");
  if (!lines) return "";
  // "4:memory:/job7" (v1: hierarchy, its controllers, path), "0::/job7" (v2).
  const std::optional<std::string_view> path = first_line<std::string_view>(
      *lines, [v1 = fs->v1](std::string_view line) -> std::optional<std::string_view> {
        const size_t c1 = line.find(':');
        const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
        if (c2 == std::string_view::npos) return std::nullopt;
        const std::string controllers = "," + std::string(line.substr(c1 + 1, c2 - c1 - 1)) + ",";
        const bool ours = v1 ? controllers.find(",memory,") != std::string::npos
                             : controllers == ",," && line.substr(0, c1) == "0";
        if (!ours) return std::nullopt;
        return line.substr(c2 + 1);
      });
  return !path || *path == "/" ? "" : std::string(*path);
}

OomKills read_oom_kills(const std::string& cgroup) {
  OomKills kills;
  const std::optional<MemoryCgroupMount>& fs = memory_cgroup_mount();
  if (!cgroup.empty() && fs) {
    const std::string file =
        fs->root + cgroup + (fs->v1 ? "/memory.oom_control" : "/memory.events");
    if (std::optional<std::string> text = read_file(file))
      kills.cgroup = number(*text, "oom_kill ");
  }
  if (!kills.cgroup) {
    if (std::optional<std::string> text = read_file("/proc/vmstat"))
      kills.system = number(*text, "oom_kill ");
  }
  return kills;
}

std::string describe_death(int wait_status, const std::optional<MemorySample>& last,
                           const OomKills& now, std::chrono::steady_clock::time_point ended) {
  const bool sigkill = WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGKILL;
  if (!sigkill || !last) return describe_exit_status(wait_status);
  const OomKills& before = last->oom_kills;
  std::string killer;
  if (before.cgroup && now.cgroup) {
    if (*now.cgroup > *before.cgroup) killer = "the OOM killer of memory cgroup " + last->cgroup;
  } else if (before.system && now.system) {
    if (*now.system > *before.system) killer = "the kernel's OOM killer";
  }
  if (killer.empty()) return describe_exit_status(wait_status);
  std::string seen = "RSS not seen";
  if (last->usage) {
    seen = "RSS " + format_bytes(last->usage->rss_bytes) + " last seen " +
           ms_text(ended - last->at) + " before, peak " + format_bytes(last->usage->peak_bytes);
  }
  return "was killed: out of memory (" + seen + "; SIGKILL from " + killer + ")";
}

bool MemoryWatch::sample() {
  MemorySample s;
  s.at = std::chrono::steady_clock::now();
  s.cgroup = memory_cgroup_of(pid_);
  s.oom_kills = read_oom_kills(s.cgroup);
  s.usage = read_memory_usage(pid_);
  if (!s.usage) return false;
  last_ = std::move(s);
  return true;
}

std::string MemoryWatch::describe_death(int wait_status) const {
  const auto ended = std::chrono::steady_clock::now();
  // The counts that the last sample had, read again: the cgroup's, or the machine's.
  const OomKills now = read_oom_kills(last_ && last_->oom_kills.cgroup ? last_->cgroup : "");
  return baton::describe_death(wait_status, last_, now, ended);
}

std::string out_of_memory_text(const std::string& what) {
  std::string text = "out of memory";
  if (std::optional<MemoryUsage> usage = read_memory_usage(0)) {
    text += " (RSS " + format_bytes(usage->rss_bytes) + ", peak " + format_bytes(usage->peak_bytes);
    rlimit as{};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
      text += "; address space " + format_bytes(usage->virtual_bytes) + " of its " +
              format_bytes(static_cast<int64_t>(as.rlim_cur)) + " limit";
    }
    text += ")";
  }
  return text + ": " + what;
}

}  // namespace baton
