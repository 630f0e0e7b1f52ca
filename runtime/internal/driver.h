// The driver side of the runtime (internal): the I/O thread with its Asio
// event loop, the dispatch thread, the driver's shared-memory pool, and the
// registry of live groups that shutdown() stops.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/internal/shm_pool.h"

namespace baton {

class Driver {
 public:
  // The process's driver; starts the I/O thread on first use.
  static Driver& get();

  boost::asio::io_context& io() { return io_; }
  ShmPool& pool() { return pool_; }

  // Runs `f` on the I/O thread and waits for it. Worker processes are spawned
  // there: their parent-death signal follows the thread that spawned them,
  // and this thread lives as long as the runtime.
  template <class F>
  auto run_on_io(F f) -> decltype(f()) {
    if (std::this_thread::get_id() == io_thread_.get_id()) return f();
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    boost::asio::post(io_, [&task] { task(); });
    return result.get();
  }

  // Runs `task` on the dispatch thread (started on first use), after the
  // tasks posted before it. Calls whose arguments were futures are planned and
  // sent there: off the user's thread, and off the I/O thread, which must stay
  // free to read results and write the workers' outgoing queues (planning
  // splits and copies data). Sending never blocks on a worker, so one busy or
  // hung worker cannot stall the calls of other groups queued here. A task
  // that throws is logged and dropped.
  void post_dispatch(std::function<void()> task);

  PeerId next_peer_id() { return next_peer_.fetch_add(1); }
  uint64_t next_call_id() { return next_call_.fetch_add(1); }

  // The executable and arguments workers are started with.
  const std::string& exe() const { return exe_; }
  const std::vector<std::string>& args() const { return args_; }
  void set_command_line(int argc, char** argv);

  // Groups register a shutdown hook; shutdown_all() runs every live one.
  using GroupHook = std::weak_ptr<std::function<void()>>;
  void add_group_hook(GroupHook hook);
  void shutdown_all();

  // Stops the I/O and dispatch threads for good (at process exit, after shutdown_all), so
  // that nothing runs on it while static objects are destroyed.
  void stop();

 private:
  Driver();

  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread io_thread_;
  ShmPool pool_;
  std::atomic<PeerId> next_peer_{2};  // 1 is a worker's name for its driver
  std::atomic<uint64_t> next_call_{1};
  std::string exe_;
  std::vector<std::string> args_;
  std::mutex dispatch_mu_;
  std::condition_variable dispatch_cv_;
  std::deque<std::function<void()>> dispatch_tasks_;
  bool dispatch_stopped_ = false;
  std::thread dispatch_thread_;
  std::mutex hooks_mu_;
  std::vector<GroupHook> hooks_;
};

// What a worker calls its driver in its own ShmPool.
inline constexpr PeerId kDriverPeer = 1;

}  // namespace baton
