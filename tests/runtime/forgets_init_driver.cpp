// A driver that gets baton::init wrong, run as a program by init_test.cpp.
//
//   forgets_init_driver no-init       never calls baton::init
//   forgets_init_driver driver-only   calls it only when it is not a worker
//                                     (so its workers run main() on, and spawn)
//
// Every process that runs this main() appends "start <pid>" to the file named
// by BATON_TEST_PROCESS_LOG (workers inherit the environment), and
// "error <pid> <message>" if spawning threw. With more than kMaxProcesses
// starts it exits at once: if the runtime ever forks without end again, the
// test sees a count, not a machine full of processes.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/baton.h"

namespace {

constexpr int kMaxProcesses = 8;

class Echo : public baton::Worker {
 public:
  baton::Value echo(const baton::Value& v) { return v; }
  static void register_methods(baton::MethodTable<Echo>& t) { t.def("echo", &Echo::echo); }
};
BATON_WORKER(Echo);

void log_line(const std::string& line) {
  const char* path = std::getenv("BATON_TEST_PROCESS_LOG");
  if (path == nullptr) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return;
  std::string text = line + "\n";  // one write: lines of several processes do not interleave
  if (write(fd, text.data(), text.size()) < 0) std::perror("forgets_init_driver: log");
  close(fd);
}

int starts_logged() {
  const char* path = std::getenv("BATON_TEST_PROCESS_LOG");
  FILE* f = path != nullptr ? std::fopen(path, "r") : nullptr;
  if (f == nullptr) return 0;
  int n = 0;
  char line[4096];
  while (std::fgets(line, sizeof(line), f) != nullptr) n += std::string(line).rfind("start ", 0) == 0;
  std::fclose(f);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  log_line("start " + std::to_string(getpid()));
  if (starts_logged() > kMaxProcesses) return 99;
  const std::string mode = argc > 1 ? argv[1] : "";
  // A user who has read that init() is "for workers" and skips it there.
  if (mode == "driver-only" && std::getenv("BATON_WORKER_FD") == nullptr) baton::init(argc, argv);
  try {
    baton::ResourcePool pool = baton::ResourcePool::cpu(2);
    baton::WorkerGroup group = baton::WorkerGroup::spawn("Echo", pool);
    std::printf("spawned %zu workers\n", group.pids().size());
    return 0;
  } catch (const std::exception& e) {
    std::string message = e.what();
    for (char& c : message) c = c == '\n' ? ' ' : c;
    log_line("error " + std::to_string(getpid()) + " " + message);
    std::fprintf(stderr, "forgets_init_driver: %s\n", e.what());
    return 3;
  }
}
