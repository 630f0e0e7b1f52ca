#include "runtime/internal/driver.h"

#include <unistd.h>

#include <climits>
#include <string>

#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"

namespace baton {

Driver& Driver::get() {
  // Never destroyed: worker handles may outlive static destruction order.
  static Driver* driver = new Driver();
  return *driver;
}

Driver::Driver()
    : work_(std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
          io_.get_executor())) {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) exe_.assign(path, static_cast<size_t>(n));
  args_ = {exe_};
  io_thread_ = std::thread([this] {
    profiler::set_thread_name("io");
    io_.run();
  });
}

void Driver::set_command_line(int argc, char** argv) {
  args_.clear();
  for (int i = 0; i < argc; ++i) args_.emplace_back(argv[i]);
  if (args_.empty()) args_ = {exe_};
}

void Driver::add_group_hook(GroupHook hook) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  hooks_.push_back(std::move(hook));
}

void Driver::shutdown_all() {
  std::vector<GroupHook> hooks;
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    hooks.swap(hooks_);
  }
  for (auto& weak : hooks) {
    if (auto hook = weak.lock()) (*hook)();
  }
}

void Driver::post_dispatch(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(dispatch_mu_);
  if (dispatch_stopped_) return;
  dispatch_tasks_.push_back(std::move(task));
  if (!dispatch_thread_.joinable()) {
    dispatch_thread_ = std::thread([this] {
      profiler::set_thread_name("dispatch");
      for (;;) {
        std::function<void()> next;
        {
          std::unique_lock<std::mutex> l(dispatch_mu_);
          dispatch_cv_.wait(l, [&] { return dispatch_stopped_ || !dispatch_tasks_.empty(); });
          if (dispatch_stopped_) return;
          next = std::move(dispatch_tasks_.front());
          dispatch_tasks_.pop_front();
        }
        try {
          next();
        } catch (const std::exception& e) {
          log(LogLevel::kError, std::string("baton: a dispatch task failed: ") + e.what());
        }
      }
    });
  }
  dispatch_cv_.notify_one();
}

void Driver::stop() {
  std::deque<std::function<void()>> dropped;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    dispatch_stopped_ = true;
    dropped.swap(dispatch_tasks_);
  }
  dispatch_cv_.notify_all();
  if (dispatch_thread_.joinable()) {
    if (std::this_thread::get_id() == dispatch_thread_.get_id()) {
      dispatch_thread_.detach();
    } else {
      dispatch_thread_.join();
    }
  }
  work_.reset();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
}

}  // namespace baton
