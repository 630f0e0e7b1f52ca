// The worker side of the runtime (internal): the loop a worker process runs
// instead of the driver's main(). It reads messages from the driver, runs one
// method at a time in arrival order, and sends each result back.
#pragma once

namespace baton {

// Runs the worker whose channel is inherited as file descriptor `fd`; exits
// the process when the driver says so or goes away. Never returns.
[[noreturn]] void run_worker_host(int fd);

}  // namespace baton
