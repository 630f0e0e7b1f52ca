// The call timings runtime_bench and cluster_bench share: the median latency
// of synchronous calls to a group's "noop" and the rate of pipelined ones.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include "runtime/baton.h"

namespace bench {

using Clock = std::chrono::steady_clock;

inline double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

inline double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// Median µs of `n` calls of "noop" waited one by one (the first tenth warms up).
inline double sync_call_us(baton::WorkerGroup& g, int n) {
  std::vector<double> xs;
  for (int i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    g.call("noop").get();
    if (i >= n / 10) xs.push_back(micros(Clock::now() - t0));
  }
  return median(xs);
}

// Median over `rounds` of the rate of 10,000 "noop" calls to rank 0 issued
// before any is waited for.
inline double async_calls_per_s(baton::WorkerGroup& g, int rounds) {
  std::vector<double> rates;
  for (int round = 0; round < rounds; ++round) {
    std::vector<baton::Future<baton::Value>> fs;
    fs.reserve(10000);
    auto t0 = Clock::now();
    for (int i = 0; i < 10000; ++i) fs.push_back(g.call_rank(0, "noop"));
    baton::wait_all(fs);
    rates.push_back(10000 / (micros(Clock::now() - t0) / 1e6));
  }
  return median(rates);
}

}  // namespace bench
