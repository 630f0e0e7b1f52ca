// runtime_bench: per-call overhead and tensor bandwidth of the actor runtime,
// next to the floors this machine allows (a raw Unix-socket ping-pong and a
// single-thread memcpy), all measured in the same run; and the per-call
// overhead again with profiling on (base/profiler.h) in the driver and the
// worker (sync_call_profiled_us; sync_call_us is with it off, the default).
//
//   ./build/bench/runtime_bench            # the last line of stdout is JSON
#include <ATen/ops/ones.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/profiler.h"
#include "bench/call_timing.h"
#include "runtime/baton.h"

namespace {

using bench::Clock;
using bench::median;
using bench::micros;
using bench::sync_call_us;

class Bench : public baton::Worker {
 public:
  void noop() {}
  double sum(const at::Tensor& t) { return t.sum().item<double>(); }
  static void register_methods(baton::MethodTable<Bench>& t) {
    t.def("noop", &Bench::noop);
    t.def("sum", &Bench::sum, baton::MethodOptions().set_execute_mode(baton::Execute::kRankZero));
  }
};
BATON_WORKER(Bench);

// 64-byte ping-pong between two processes over a Unix socket pair.
double socket_rtt_us() {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t child = fork();
  char buf[64] = {};
  if (child == 0) {
    close(sv[0]);
    while (read(sv[1], buf, sizeof(buf)) == sizeof(buf)) {
      if (write(sv[1], buf, sizeof(buf)) != sizeof(buf)) break;
    }
    _exit(0);
  }
  close(sv[1]);
  std::vector<double> rtts;
  for (int i = 0; i < 20000; ++i) {
    auto t0 = Clock::now();
    if (write(sv[0], buf, sizeof(buf)) != sizeof(buf)) break;
    if (read(sv[0], buf, sizeof(buf)) != sizeof(buf)) break;
    if (i >= 1000) rtts.push_back(micros(Clock::now() - t0));
  }
  close(sv[0]);
  waitpid(child, nullptr, 0);
  return median(rtts);
}

double memcpy_gbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> secs;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    secs.push_back(micros(Clock::now() - t0) / 1e6);
  }
  return bytes / median(secs) / 1e9;
}


}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);
  // The floors first, before the runtime starts any thread (fork is used).
  double rtt = socket_rtt_us();
  const size_t kTensorBytes = size_t{256} << 20;
  double memcpy_rate = memcpy_gbps(kTensorBytes);
  std::fprintf(stderr, "socket_rtt_us %.2f, memcpy_gbps %.2f\n", rtt, memcpy_rate);

  baton::ResourcePool one = baton::ResourcePool::cpu(1);
  baton::WorkerGroup g1 = baton::WorkerGroup::spawn("Bench", one);
  double sync_us = sync_call_us(g1, 20000);
  std::fprintf(stderr, "sync_call_us %.2f\n", sync_us);
  // Recording every span of every call, driver and worker; the events are
  // taken and dropped afterwards.
  baton::profiler::set_enabled(true);
  g1.set_profiling(true);
  double profiled_us = sync_call_us(g1, 20000);
  baton::profiler::set_enabled(false);
  g1.set_profiling(false);
  baton::profiler::take_events();
  g1.collect_profile(baton::profiler::now_ns());
  std::fprintf(stderr, "sync_call_profiled_us %.2f\n", profiled_us);
  double async_rate = bench::async_calls_per_s(g1, 9);
  std::fprintf(stderr, "async_calls_per_s %.0f\n", async_rate);

  at::Tensor t = at::ones({static_cast<int64_t>(kTensorBytes / sizeof(float))}, at::kFloat);
  // GB/s of "sum" calls on `x` (median of 5 after a warm-up); < 0: a wrong sum.
  auto sum_gbps = [&](const at::Tensor& x) {
    std::vector<double> secs;
    for (int i = 0; i < 6; ++i) {
      auto t0 = Clock::now();
      double s = g1.call("sum", {x}).get().as_float();
      if (i > 0) secs.push_back(micros(Clock::now() - t0) / 1e6);
      if (s != static_cast<double>(x.numel())) {
        std::fprintf(stderr, "wrong sum %f\n", s);
        return -1.0;
      }
    }
    return kTensorBytes / median(secs) / 1e9;
  };
  double tensor_rate = sum_gbps(t);
  std::fprintf(stderr, "tensor_gbps %.2f\n", tensor_rate);
  // The same call with the tensor in shared memory (baton::to_shared): the
  // runtime passes its memfd, copies nothing; what is left is the worker's
  // sum (and mapping the pages the first time it sees them).
  double shared_rate = sum_gbps(baton::to_shared(t));
  if (tensor_rate < 0 || shared_rate < 0) return 1;
  std::fprintf(stderr, "shared_tensor_gbps %.2f\n", shared_rate);
  g1.shutdown();

  baton::ResourcePool four = baton::ResourcePool::cpu(4);
  baton::WorkerGroup g4 = baton::WorkerGroup::spawn("Bench", four);
  double bcast_us = sync_call_us(g4, 5000);
  std::fprintf(stderr, "broadcast4_call_us %.2f\n", bcast_us);
  g4.shutdown();

  std::printf(
      "{\"socket_rtt_us\": %.2f, \"memcpy_gbps\": %.2f, \"sync_call_us\": %.2f, "
      "\"sync_call_profiled_us\": %.2f, "
      "\"async_calls_per_s\": %.0f, \"broadcast4_call_us\": %.2f, \"tensor_gbps\": %.2f, "
      "\"sync_over_rtt\": %.2f, \"tensor_over_memcpy\": %.2f, \"shared_tensor_gbps\": %.2f, "
      "\"shared_tensor_over_memcpy\": %.2f}\n",
      rtt, memcpy_rate, sync_us, profiled_us, async_rate, bcast_us, tensor_rate, sync_us / rtt,
      tensor_rate / memcpy_rate, shared_rate, shared_rate / memcpy_rate);
  return 0;
}
