// Profiling a real worker group: the driver's call spans and the workers'
// spans of the same calls come back as one trace with a track per process,
// spans that nest, each worker span inside its call, and nothing recorded
// outside the profiled stretch.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include "base/profiler.h"
#include "runtime/baton.h"
#include "tests/runtime/trace_checks.h"

namespace baton {
namespace {

using baton::testing::ParsedTrace;

constexpr int kDriverPid = 1;

// The driver's events since `origin` and the group's, as one parsed trace.
ParsedTrace collect(WorkerGroup& g, int64_t origin) {
  EXPECT_TRUE(profiler::wait_for_lanes(std::chrono::seconds(5)));
  std::vector<profiler::ProcessProfile> processes = {
      profiler::collect_process(kDriverPid, "driver", origin)};
  for (auto& p : g.collect_profile(origin)) processes.push_back(std::move(p));
  return baton::testing::parse_trace(profiler::chrome_trace(processes));
}

TEST(Profiling, CallsOfAGroupTraceDriverAndWorkerSpansThatNestAndLineUp) {
  ResourcePool pool = ResourcePool::cpu(2);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool, {}, WorkerGroupOptions().set_name("prof"));
  EXPECT_EQ(g.call("add", {1, 2}).get().as_list().size(), 2u);  // before: not recorded

  const int64_t origin = profiler::now_ns();
  profiler::set_enabled(true);
  g.set_profiling(true);
  g.call("add", {3, 4}).get();
  // Two calls in flight at once: the second takes a second lane.
  Future<Value> slow = g.call("sleep_ms", {30});
  Future<Value> quick = g.call_rank(1, "my_rank");
  slow.get();
  EXPECT_EQ(quick.get().as_int(), 1);
  EXPECT_THROW(g.call("throw_error", {std::string("boom")}).get(), RemoteError);
  profiler::set_enabled(false);
  g.set_profiling(false);
  g.call("add", {5, 6}).get();  // after: not recorded

  const ParsedTrace t = collect(g, origin);
  // A track per process: the driver and both workers.
  ASSERT_EQ(t.processes.size(), 3u);
  EXPECT_EQ(t.processes.at(kDriverPid), "driver");
  std::set<std::string> workers;
  for (const auto& [pid, name] : t.processes) {
    if (pid != kDriverPid) workers.insert(name);
  }
  EXPECT_EQ(workers, (std::set<std::string>{"TestWorker:rank 0", "TestWorker:rank 1"}));
  baton::testing::expect_spans_nest(t);
  // Worker spans: add, sleep_ms and throw_error on both ranks, my_rank on one;
  // each call's parent and execute span.
  EXPECT_EQ(baton::testing::expect_calls_contain_worker_spans(t, kDriverPid), 2 * 7);

  std::map<std::string, int> driver_spans, worker_spans;
  std::set<std::string> lanes;
  for (const auto& s : t.spans) {
    (s.pid == kDriverPid ? driver_spans : worker_spans)[s.name]++;
    if (s.pid == kDriverPid && s.args.contains("call_ids"))
      lanes.insert(t.threads.at({s.pid, s.tid}));
  }
  EXPECT_EQ(driver_spans["TestWorker.add (ONE_TO_ALL)"], 1)
      << "the calls before and after are not in";
  EXPECT_EQ(driver_spans["TestWorker.my_rank (rank 1)"], 1);
  for (const char* child : {"dispatch", "encode", "send", "wait", "collect", "decode result"})
    EXPECT_GE(driver_spans[child], 1) << child;
  EXPECT_EQ(lanes, (std::set<std::string>{"calls prof", "calls prof #2"}));
  for (const char* child : {"queue", "decode", "execute", "encode result"})
    EXPECT_EQ(worker_spans[child], 7) << child;
  EXPECT_EQ(worker_spans["add"], 2);
  EXPECT_EQ(worker_spans.count("_profiler_set"), 0u) << "the profiler's own calls are not traced";
  // The failed call is there, marked.
  for (const auto& s : t.spans) {
    if (s.name == "TestWorker.throw_error (ONE_TO_ALL)") {
      EXPECT_EQ(s.args["ok"], 0);
    }
  }
  // One host: every worker shares the driver's clock, and the estimate of
  // its offset is within its uncertainty of 0.
  ASSERT_EQ(t.other["clocks"].size(), 3u);
  for (const auto& c : t.other["clocks"]) {
    EXPECT_EQ(c["same_clock_domain"], true);
    EXPECT_EQ(c["offset_us"], 0.0);
    EXPECT_LE(std::abs(c["estimated_offset_us"].get<double>()),
              c["uncertainty_us"].get<double>() + 0.001)
        << c.dump();
  }

  // Collected once: a second collection has no spans.
  EXPECT_TRUE(collect(g, origin).spans.empty());
}

}  // namespace
}  // namespace baton
