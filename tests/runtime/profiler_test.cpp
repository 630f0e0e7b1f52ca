// The profiler's machinery in one process: spans record nothing when off,
// nest on their thread, lanes keep overlapping spans apart, the clock offset
// estimate and the shift of another process's events, and the trace JSON.
#include "base/profiler.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <thread>

#include "tests/runtime/trace_checks.h"

namespace baton::profiler {
namespace {

using baton::testing::parse_trace;
using baton::testing::ParsedTrace;

// Leaves recording off and the buffers empty for the next test.
class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_enabled(false);
    take_events();
  }
  void TearDown() override {
    set_enabled(false);
    take_events();
  }
};

TEST_F(ProfilerTest, SpansRecordNothingWhenOff) {
  {
    Span span("off", "test");
    EXPECT_FALSE(span.active());
    span.arg("x", 1);
  }
  EXPECT_TRUE(take_events().empty());
}

TEST_F(ProfilerTest, ASpanBegunWhileOnIsRecordedAfterRecordingStops) {
  set_enabled(true);
  {
    Span span("straddles", "test");
    set_enabled(false);
    Span later("after", "test");  // begun while off: nothing
  }
  const auto events = take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "straddles");
}

TEST_F(ProfilerTest, NestedSpansNestOnTheirThreadWithTheirArgs) {
  set_enabled(true);
  {
    BATON_PROFILE_SCOPE("test", "outer");
    Span inner("inner", "test");
    inner.arg("rank", 3).arg("method", "a\"b");
  }
  std::thread([] {
    set_thread_name("helper");
    Span other("other thread", "test");
  }).join();
  const auto events = take_events();
  ASSERT_EQ(events.size(), 3u);
  std::map<std::string, Event> by_name;
  for (const Event& e : events) by_name[e.name] = e;
  const Event& outer = by_name.at("outer");
  const Event& inner = by_name.at("inner");
  EXPECT_EQ(outer.tid, thread_id());
  EXPECT_EQ(inner.tid, thread_id());
  EXPECT_NE(by_name.at("other thread").tid, thread_id());
  EXPECT_LE(outer.begin_ns, inner.begin_ns);
  EXPECT_GE(outer.end_ns, inner.end_ns);
  EXPECT_EQ(inner.args, "\"rank\":3,\"method\":\"a\\\"b\"");
  EXPECT_EQ(track_names().at(by_name.at("other thread").tid), "helper");
}

TEST_F(ProfilerTest, OverlappingSpansTakeDifferentLanesAndFreedLanesAreReused) {
  Lanes lanes("calls test");
  const int32_t a = lanes.acquire();
  const int32_t b = lanes.acquire();  // while a is held: another lane
  EXPECT_NE(a, b);
  EXPECT_FALSE(wait_for_lanes(std::chrono::milliseconds(1)));
  lanes.release(a);
  EXPECT_EQ(lanes.acquire(), a);  // the lowest free lane
  lanes.release(a);
  lanes.release(b);
  EXPECT_TRUE(wait_for_lanes(std::chrono::milliseconds(1)));
  const auto names = track_names();
  EXPECT_EQ(names.at(a), "calls test");
  EXPECT_EQ(names.at(b), "calls test #2");
}

TEST_F(ProfilerTest, TheClockOffsetComesFromTheShortestRoundTrip) {
  // The remote clock runs 5 s ahead. The slow round trips read it late (the
  // answer waited in a queue); the 40 us one read it 10 us after its midpoint.
  const int64_t ahead = 5'000'000'000;
  std::vector<ClockSample> samples = {
      {1'000'000, 1'000'000 + ahead + 900'000, 2'000'000},  // 1 ms round trip
      {3'000'000, 3'000'000 + ahead + 30'000, 3'040'000},   // 40 us
      {4'000'000, 4'000'000 + ahead + 250'000, 4'300'000},  // 300 us
  };
  const ClockOffset o = estimate_clock_offset(samples, false);
  EXPECT_EQ(o.uncertainty_ns, 20'000);
  EXPECT_EQ(o.estimated_ns, ahead + 10'000);
  EXPECT_LE(std::llabs(o.estimated_ns - ahead), o.uncertainty_ns);
  EXPECT_EQ(o.applied_ns(), o.estimated_ns);
  // One clock domain: the offset is known to be 0, whatever the estimate.
  EXPECT_EQ(estimate_clock_offset(samples, true).applied_ns(), 0);
  EXPECT_THROW(estimate_clock_offset({}, false), baton::InvalidArgument);
  EXPECT_THROW(estimate_clock_offset({{10, 0, 5}}, false), baton::InvalidArgument);
}

TEST_F(ProfilerTest, AnotherClocksEventsAreShiftedOntoTheDriversTimeline) {
  // The driver's call ran [1000, 9000] us after the origin; the worker, whose
  // clock is 5 s ahead, executed it at [2000, 8000] us of the driver's time.
  const int64_t origin = 100'000'000'000, ahead = 5'000'000'000;
  const std::vector<Event> driver = {
      {"call", "runtime", origin + 1'000'000, origin + 9'000'000, 7, "\"call_ids\":[42]"}};
  const std::vector<Event> worker = {
      {"execute", "worker", origin + ahead + 2'000'000, origin + ahead + 8'000'000, 11,
       "\"call_id\":42"},
      // From before the origin (an earlier profiling session): left out.
      {"execute", "worker", origin + ahead - 5, origin + ahead + 1'000, 11, "\"call_id\":41"}};
  std::vector<ProcessProfile> processes(2);
  processes[0] = {1, "driver", {}, chrome_events(1, "driver", driver, {{7, "calls g"}}, origin)};
  processes[1].pid = 2;
  processes[1].name = "W:rank 0";
  processes[1].clock = estimate_clock_offset({{0, ahead + 50, 100}}, false);
  processes[1].events_json = chrome_events(2, "W:rank 0", worker, {{11, "main"}},
                                           origin + processes[1].clock.applied_ns());
  const ParsedTrace t = parse_trace(chrome_trace(processes, "\"step\":2"));
  EXPECT_EQ(t.processes, (std::map<int64_t, std::string>{{1, "driver"}, {2, "W:rank 0"}}));
  ASSERT_EQ(t.spans.size(), 2u);
  for (const auto& s : t.spans) {
    if (s.pid == 2) {
      EXPECT_EQ(s.begin_ns, 2'000'000);
      EXPECT_EQ(s.end_ns, 8'000'000);
      EXPECT_EQ(t.threads.at({2, 11}), "main");
    }
  }
  EXPECT_EQ(baton::testing::expect_calls_contain_worker_spans(t, 1), 1);
  baton::testing::expect_spans_nest(t);
  EXPECT_EQ(t.other["step"], 2);
  ASSERT_EQ(t.other["clocks"].size(), 2u);
  EXPECT_EQ(t.other["clocks"][1]["offset_us"], 5'000'000.0);
  EXPECT_EQ(t.other["clocks"][1]["uncertainty_us"], 0.05);
  EXPECT_EQ(t.other["clocks"][1]["same_clock_domain"], false);
}

TEST_F(ProfilerTest, TheNestingCheckFailsOnAPartialOverlap) {
  // The check itself: two spans on one track that overlap without nesting.
  const std::vector<Event> events = {{"a", "t", 1000, 3000, 5, ""}, {"b", "t", 2000, 4000, 5, ""}};
  const ParsedTrace t =
      parse_trace(chrome_trace({{1, "p", {}, chrome_events(1, "p", events, {{5, "main"}}, 0)}}));
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    baton::testing::expect_spans_nest(t);
  }
  ASSERT_EQ(failures.size(), 1);
  EXPECT_NE(std::string(failures.GetTestPartResult(0).message()).find("without nesting"),
            std::string::npos);
}

TEST_F(ProfilerTest, JsonStringsAreEscaped) {
  EXPECT_EQ(json_string("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  EXPECT_FALSE(clock_domain().empty());
}

}  // namespace
}  // namespace baton::profiler
