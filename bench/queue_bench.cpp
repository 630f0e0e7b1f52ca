// The runtime's one hand-rolled queue — the driver's dispatch thread's task
// queue (a mutex, a condition variable and a deque: runtime/internal/driver.cpp) —
// against oneTBB's concurrent_bounded_queue doing the same job, in the same
// run: one producer thread hands std::function tasks to one consumer thread
// that runs them in order.
//
//   build/bench/queue_bench [--tasks 200000] [--rounds 20000]
//
// Two figures per queue: throughput (tasks pushed back to back, ns per task
// until the consumer has run them all) and hand-off latency (a ping-pong:
// the producer pushes one task and waits until it has run, µs per round
// trip — a runtime call's dispatch is this case: one task, then wait).
// Prints one JSON line.
#include <tbb/concurrent_queue.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using Task = std::function<void()>;

// runtime/internal/driver.cpp's queue, as it is there.
class HandRolled {
 public:
  void push(Task t) {
    {
      std::lock_guard<std::mutex> l(mu_);
      tasks_.push_back(std::move(t));
    }
    cv_.notify_one();
  }
  Task pop() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !tasks_.empty(); });
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    return t;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
};

class Tbb {
 public:
  void push(Task t) { q_.push(std::move(t)); }
  Task pop() {
    Task t;
    q_.pop(t);  // blocks
    return t;
  }

 private:
  tbb::concurrent_bounded_queue<Task> q_;
};

template <typename Q>
nlohmann::json measure(int tasks, int rounds) {
  Q q;
  std::atomic<bool> stop{false};
  std::thread consumer([&] {
    while (!stop.load(std::memory_order_relaxed)) q.pop()();
  });
  // Throughput.
  std::atomic<int> done{0};
  auto t0 = Clock::now();
  for (int i = 0; i < tasks; ++i) q.push([&done] { done.fetch_add(1, std::memory_order_relaxed); });
  while (done.load() < tasks) std::this_thread::yield();
  const double per_task_ns =
      std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / tasks;
  // Ping-pong: one task, wait for it.
  std::mutex m;
  std::condition_variable cv;
  bool ran = false;
  t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    q.push([&] {
      std::lock_guard<std::mutex> l(m);
      ran = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return ran; });
    ran = false;
  }
  const double round_trip_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
  stop = true;
  q.push([] {});
  consumer.join();
  return {{"throughput_ns_per_task", per_task_ns}, {"handoff_round_trip_us", round_trip_us}};
}

}  // namespace

int main(int argc, char** argv) {
  int tasks = 200000, rounds = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--tasks") {
      tasks = std::stoi(argv[i + 1]);
    } else if (k == "--rounds") {
      rounds = std::stoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: queue_bench [--tasks N] [--rounds N]\n");
      return 2;
    }
  }
  nlohmann::json out;
  out["bench"] = "queue";
  out["tasks"] = tasks;
  out["rounds"] = rounds;
  // Each twice, interleaved, so neither gets the machine's warm-up alone.
  measure<HandRolled>(tasks / 10, rounds / 10);
  measure<Tbb>(tasks / 10, rounds / 10);
  out["hand_rolled"] = measure<HandRolled>(tasks, rounds);
  out["tbb_concurrent_bounded_queue"] = measure<Tbb>(tasks, rounds);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
