#include "runtime/runtime.h"


#include <atomic>
#include <cstdlib>
#include <mutex>

#include "base/errors.h"
#include "base/profiler.h"
#include "runtime/internal/driver.h"
#include "runtime/internal/worker_host.h"
#include "runtime/threads.h"
#include "runtime/worker.h"

namespace baton {

namespace {

thread_local WorkerInfo pending_info;
std::atomic<bool> initialized{false};

}  // namespace

namespace detail {
void set_pending_worker_info(WorkerInfo info) { pending_info = std::move(info); }
}  // namespace detail

Worker::Worker() : info_(pending_info) {}

void Worker::register_mesh(const std::string& mesh, int dp_rank, bool is_collector) {
  if (!meshes_.emplace(mesh, std::make_pair(dp_rank, is_collector)).second) {
    throw Error("mesh '" + mesh + "' is already registered on rank " + std::to_string(rank()));
  }
}

std::vector<int64_t> Worker::mesh_entry(const std::string& mesh) {
  auto it = meshes_.find(mesh);
  if (it == meshes_.end()) {
    throw Error("mesh '" + mesh + "' was never registered (Worker::register_mesh)");
  }
  return {it->second.first, it->second.second ? 1 : 0};
}

bool is_worker_process() { return std::getenv("BATON_WORKER_FD") != nullptr; }

namespace detail {

void check_can_spawn_workers(const std::string& what) {
  if (is_worker_process()) {
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr ? v : "?");
    };
    throw Error("cannot spawn " + what + " in a worker process (worker " + env("BATON_CLASS") +
                " rank " + env("RANK") + " of group " + env("BATON_GROUP") +
                ", started by driver pid " + env("BATON_DRIVER_PID") +
                "): workers do not start workers. If this is your program's main(), call "
                "baton::init(argc, argv) first thing in main(): in a worker process it runs the "
                "worker and never returns");
  }
  if (!is_initialized()) {
    throw Error("cannot spawn " + what + ": baton::init(argc, argv) was not called. Call it "
                "first thing in main(), before spawning any group: workers are this "
                "executable started again, and init() is where they run their worker "
                "instead of your main()");
  }
}

}  // namespace detail

bool is_initialized() { return initialized.load(); }

void init(int argc, char** argv) {
  if (const char* fd = std::getenv("BATON_WORKER_FD")) run_worker_host(std::atoi(fd));
  static std::once_flag once;
  std::call_once(once, [&] {
    Driver::get().set_command_line(argc, argv);
    profiler::set_thread_name("main");
    // The driver's tensor work is small: one intra-op thread, so no OpenMP
    // team and no spinning at its barriers (runtime/threads.h).
    set_intra_op_threads(1);
    std::atexit([] {
      shutdown();
      Driver::get().stop();
    });
  });
  initialized = true;
}

void shutdown() {
  if (is_worker_process()) return;
  Driver::get().shutdown_all();
}

}  // namespace baton
