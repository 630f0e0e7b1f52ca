// The runtime's entry point. Call baton::init(argc, argv) first thing in
// main(): in the driver it returns at once; in a worker process (the runtime
// starts workers by re-executing the driver's own executable) it runs the
// worker and never returns, so the user's worker classes need no extra build.
//
// Without it, WorkerGroup::spawn throws baton::Error saying to call it, and
// starts nothing. A worker process (one the runtime started: it finds
// BATON_WORKER_FD in its environment) never starts workers itself: spawning
// there throws baton::Error too, whether its main() skipped init() or a
// worker method tried to spawn a group.
//
// Example:
//   int main(int argc, char** argv) {
//     baton::init(argc, argv);
//     baton::ResourcePool pool = baton::ResourcePool::cpu(4);
//     auto group = baton::WorkerGroup::spawn("Adder", pool);
//     ...
//   }
#pragma once

#include <string>

namespace baton {

void init(int argc, char** argv);

// True in a worker process (inside worker constructors and methods).
bool is_worker_process();

// True once init() has returned in this (driver) process. Anything that
// worker processes must also have (worker classes, functions for
// DP_COMPUTE_PROTO_WITH_FUNC) has to be registered before: a worker runs the
// driver's main() only up to init().
bool is_initialized();

// Shuts down every live worker group. Runs by itself at exit.
void shutdown();

namespace detail {
// Throws baton::Error, saying what to do, unless this process may start
// worker processes: it must be a driver (not a worker process) whose main()
// called init(). `what` names what was to be spawned ("WorkerGroup of Hello").
void check_can_spawn_workers(const std::string& what);
}  // namespace detail

}  // namespace baton
