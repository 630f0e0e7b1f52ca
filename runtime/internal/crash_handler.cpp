#include "runtime/internal/crash_handler.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace baton {
namespace {

constexpr int kMaxFrames = 64;
constexpr size_t kAltStackBytes = 256 * 1024;
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

char g_label[128];
int g_timeout_ms = 1500;
std::atomic<bool> g_in_handler{false};

// Everything below runs in the handler: plain buffers, write(2).
void put(const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// The base address of the module holding this code (the executable, for a
// driver linked against baton's static libraries).
const void* own_module_base() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&own_module_base), &info) == 0) return nullptr;
  return info.dli_fbase;
}

// Runs `addr2line -f -C -e <own module>` on `offsets`, reading its answer
// into `out` (two lines per address: function, then file:line). Returns the
// bytes read, or -1 when addr2line is missing, fails or is slower than the
// timeout.
ssize_t run_addr2line(const char* module, char (*offsets)[24], int count, char* out,
                      size_t out_size) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const char* argv[kMaxFrames + 6];
  int a = 0;
  argv[a++] = "addr2line";
  argv[a++] = "-f";
  argv[a++] = "-C";
  argv[a++] = "-e";
  argv[a++] = module;
  for (int i = 0; i < count; ++i) argv[a++] = offsets[i];
  argv[a] = nullptr;
  pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDERR_FILENO);
    close(fds[0]);
    execvp("addr2line", const_cast<char* const*>(argv));
    _exit(127);
  }
  close(fds[1]);
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  size_t got = 0;
  bool ok = true;
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long elapsed = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (elapsed >= g_timeout_ms) {
      ok = false;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(g_timeout_ms - elapsed)) <= 0) continue;
    if (got + 1 >= out_size) break;
    ssize_t r = read(fds[0], out + got, out_size - 1 - got);
    if (r <= 0) break;  // addr2line finished
    got += static_cast<size_t>(r);
  }
  close(fds[0]);
  if (!ok) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  out[got] = '\0';
  return static_cast<ssize_t>(got);
}

// The next line of `text` (modified in place); nullptr at the end.
char* next_line(char*& text) {
  if (text == nullptr || *text == '\0') return nullptr;
  char* line = text;
  char* nl = strchr(text, '\n');
  if (nl != nullptr) {
    *nl = '\0';
    text = nl + 1;
  } else {
    text = nullptr;
  }
  return line;
}

// The faulting instruction and stack pointer of the interrupted thread.
// False where the platform's context is not read (only x86-64 is).
bool interrupted_at(const void* context, const void*& pc, const void* const*& sp) {
  pc = nullptr;
  sp = nullptr;
#if defined(__x86_64__)
  if (context == nullptr) return false;
  const auto* uc = static_cast<const ucontext_t*>(context);
  pc = reinterpret_cast<const void*>(uc->uc_mcontext.gregs[REG_RIP]);
  sp = reinterpret_cast<const void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
  return true;
#else
  (void)context;
  return false;
#endif
}

// When the unwinder stops at the signal frame (a call through a null or
// corrupted pointer leaves it no unwind table to follow), the faulting
// instruction and the words on the stack that point into loaded code are the
// only leads: appends the faulting pc, then up to `room` such words, nearest
// first. A scanned word may be a stale return address; the output says so.
// The executable segments of every loaded module, read in the handler.
struct CodeRange {
  uintptr_t begin, end;
};
constexpr int kMaxRanges = 512;
CodeRange g_code[kMaxRanges];
int g_code_count = 0;

int add_code_ranges(dl_phdr_info* info, size_t, void*) {
  for (int i = 0; i < info->dlpi_phnum && g_code_count < kMaxRanges; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    g_code[g_code_count++] = {begin, begin + ph.p_memsz};
  }
  return 0;
}

bool is_code(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (int i = 0; i < g_code_count; ++i)
    if (a > g_code[i].begin && a <= g_code[i].end) return true;
  return false;
}

int scan_stack(const void* pc, const void* const* sp, void** frames, int room) {
  int n = 0;
  if (room <= 0) return 0;
  frames[n++] = const_cast<void*>(pc);
  if (sp == nullptr) return n;
  // Copied with process_vm_readv, which fails instead of faulting where the
  // stack ends.
  constexpr size_t kWords = 2048;
  static const void* words[kWords];
  size_t got_words = 0;
  while (got_words < kWords) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(sp + got_words);
    const size_t to_page_end = 4096 - at % 4096;
    const size_t bytes = std::min(to_page_end, (kWords - got_words) * sizeof(void*));
    iovec local{words + got_words, bytes};
    iovec remote{reinterpret_cast<void*>(at), bytes};
    if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) break;
    got_words += bytes / sizeof(void*);
  }
  g_code_count = 0;
  dl_iterate_phdr(add_code_ranges, nullptr);
  for (size_t i = 0; i < got_words && n < room; ++i)
    if (is_code(words[i])) frames[n++] = const_cast<void*>(words[i]);
  return n;
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  if (g_in_handler.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  static char line[4096];
  const char* abbrev = sigabbrev_np(sig);
  snprintf(line, sizeof line, "baton: fatal signal %d (SIG%s), fault address %p, pid %d%s%s%s; backtrace:\n",
           sig, abbrev != nullptr ? abbrev : "?", info != nullptr ? info->si_addr : nullptr,
           static_cast<int>(getpid()), g_label[0] != '\0' ? " (" : "", g_label,
           g_label[0] != '\0' ? ")" : "");
  put(line);

  static void* frames[kMaxFrames];
  int n = backtrace(frames, kMaxFrames);
  const void* fault_pc = nullptr;
  const void* const* fault_sp = nullptr;
  bool unwound_past_fault = !interrupted_at(context, fault_pc, fault_sp);
  for (int i = 0; i < n && !unwound_past_fault; ++i) unwound_past_fault = frames[i] == fault_pc;
  if (!unwound_past_fault) {
    snprintf(line, sizeof line,
             "  (the unwinder stopped at the signal frame; faulting pc %p, sp %p: "
             "frames from #%d on are words of the stack that point into code, "
             "nearest first, and may include stale ones)\n",
             fault_pc, static_cast<const void*>(fault_sp), n);
    put(line);
    n += scan_stack(fault_pc, fault_sp, frames + n, kMaxFrames - n);
  }
  // A return address points past its call: look up the byte before it.
  static Dl_info infos[kMaxFrames];
  static bool known[kMaxFrames];
  const void* own_base = own_module_base();
  static char own_path[PATH_MAX];
  static char offsets[kMaxFrames][24];
  static int own_index[kMaxFrames];
  int own_count = 0;
  for (int i = 0; i < n; ++i) {
    // As integers: a frame may be a null pc (a call through a null pointer),
    // and stepping back from null is not pointer arithmetic.
    const uintptr_t pc = reinterpret_cast<uintptr_t>(frames[i]) - 1;
    known[i] = frames[i] != nullptr && dladdr(reinterpret_cast<const void*>(pc), &infos[i]) != 0;
    own_index[i] = -1;
    if (known[i] && own_base != nullptr && infos[i].dli_fbase == own_base) {
      if (own_count == 0 && infos[i].dli_fname != nullptr)
        snprintf(own_path, sizeof own_path, "%s", infos[i].dli_fname);
      snprintf(offsets[own_count], sizeof offsets[own_count], "0x%lx",
               static_cast<unsigned long>(pc - reinterpret_cast<uintptr_t>(own_base)));
      own_index[i] = own_count++;
    }
  }
  // The executable's own name when dladdr gives none (older glibc for the main program).
  if (own_count > 0 && own_path[0] == '\0') {
    ssize_t len = readlink("/proc/self/exe", own_path, sizeof own_path - 1);
    own_path[len > 0 ? len : 0] = '\0';
  }
  static char answer[64 * 1024];
  static char* functions[kMaxFrames];
  static char* places[kMaxFrames];
  bool symbolised = false;
  if (own_count > 0 && own_path[0] != '\0' &&
      run_addr2line(own_path, offsets, own_count, answer, sizeof answer) > 0) {
    char* cursor = answer;
    int k = 0;
    for (; k < own_count; ++k) {
      functions[k] = next_line(cursor);
      places[k] = next_line(cursor);
      if (functions[k] == nullptr || places[k] == nullptr) break;
    }
    symbolised = k == own_count;
  }

  for (int i = 0; i < n; ++i) {
    const char* pc = static_cast<const char*>(frames[i]);
    const int k = own_index[i];
    if (symbolised && k >= 0 && strcmp(functions[k], "??") != 0) {
      const char* place = places[k];
      if (strncmp(place, "??", 2) == 0) place = nullptr;
      snprintf(line, sizeof line, "  #%d %p in %s%s%s\n", i, static_cast<const void*>(pc),
               functions[k], place != nullptr ? " at " : "", place != nullptr ? place : "");
      put(line);
      continue;
    }
    if (!known[i]) {
      snprintf(line, sizeof line, "  #%d %p\n", i, static_cast<const void*>(pc));
      put(line);
      continue;
    }
    const Dl_info& d = infos[i];
    const char* module = d.dli_fname != nullptr ? d.dli_fname : "?";
    if (const char* slash = strrchr(module, '/')) module = slash + 1;
    const long module_offset = static_cast<long>(pc - static_cast<const char*>(d.dli_fbase));
    if (d.dli_sname != nullptr) {
      int status = -1;
      char* demangled = abi::__cxa_demangle(d.dli_sname, nullptr, nullptr, &status);
      const long symbol_offset = static_cast<long>(pc - static_cast<const char*>(d.dli_saddr));
      snprintf(line, sizeof line, "  #%d %p in %s+0x%lx (%s+0x%lx)\n", i,
               static_cast<const void*>(pc), status == 0 ? demangled : d.dli_sname, symbol_offset,
               module, module_offset);
      free(demangled);
    } else {
      snprintf(line, sizeof line, "  #%d %p (%s+0x%lx)\n", i, static_cast<const void*>(pc), module,
               module_offset);
    }
    put(line);
  }

  // Die as the signal would have killed us, so the parent sees it.
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  _exit(128 + sig);
}

}  // namespace

void install_crash_handler(const std::string& label) {
  const char* enabled = getenv("BATON_BACKTRACE");
  if (enabled != nullptr && strcmp(enabled, "0") == 0) return;
  if (const char* t = getenv("BATON_BACKTRACE_TIMEOUT_MS")) {
    const int ms = atoi(t);
    if (ms >= 0) g_timeout_ms = ms;
  }
  snprintf(g_label, sizeof g_label, "%s", label.c_str());
  // backtrace() loads libgcc's unwinder on its first call: do it now, not
  // in the handler.
  void* warm[2];
  backtrace(warm, 2);

  // An alternate stack for this (the main) thread: a stack overflow can
  // still be reported.
  void* stack = mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  if (stack != MAP_FAILED) {
    stack_t ss{};
    ss.ss_sp = stack;
    ss.ss_size = kAltStackBytes;
    sigaltstack(&ss, nullptr);
  }
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

}  // namespace baton
