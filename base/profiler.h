// Profiler: spans of the driver and of every worker process, written as one
// Chrome trace-event file (the JSON that ui.perfetto.dev and chrome://tracing
// open). Plain C++ with no dependency (baton::base), so that the runtime, the
// engine and the trainer can all record into it.
//
// Recording costs nothing when profiling is off: a Span checks one global
// flag with a relaxed atomic load and does nothing else. When it is on, a
// Span reads the clock when it is made and, when it is destroyed, appends one
// complete event to its thread's buffer (a vector behind a mutex that only
// take_events() contends for).
//
// Clocks: every process stamps events with CLOCK_MONOTONIC (now_ns), which is
// one clock for every process of a host. Across hosts it is not, so the
// driver estimates each worker's offset with round trips (Cristian's method,
// estimate_clock_offset) and shifts the worker's events by it; processes
// whose clock_domain() (the kernel's boot id) is the driver's share its clock,
// and their offset is exactly 0 (the estimate is still recorded in the file).
//
// Example:
//   void Optimizer::step() {
//     BATON_PROFILE_SCOPE("engine", "optimizer step");
//     ...
//   }
//   {
//     baton::profiler::Span span("rollout", "trainer");
//     span.arg("step", 3);
//     ...
//   }  // recorded here, if profiling was on when the span began
//
// Thread safety: everything here may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace baton::profiler {

namespace detail {
extern std::atomic<bool> g_enabled;
}  // namespace detail

// Whether spans are recorded now (this process only).
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
// Turns recording on or off in this process. Events stay buffered until
// take_events() (or collect_process) takes them.
void set_enabled(bool on);

// CLOCK_MONOTONIC in nanoseconds: shared by every process of a host.
int64_t now_ns();

// The kernel's id of the calling thread: its track in this process.
int32_t thread_id();
// Names the calling thread's track ("main", "io", "dispatch").
void set_thread_name(std::string name);
// Names a track that is not a thread (a lane of calls, see Lanes).
void set_track_name(int32_t tid, std::string name);
// Every named track of this process, by tid.
std::map<int32_t, std::string> track_names();

// One complete span. Times are this process's now_ns().
struct Event {
  std::string name;
  const char* category = "";  // a string literal: "runtime", "worker", "trainer", "engine"
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int32_t tid = 0;
  // The members of the span's JSON "args" object, without braces
  // ("\"rank\":1,\"method\":\"add\""), or empty. See Args.
  std::string args;
};

// Records `event` (its track need not be the calling thread's). Recorded even
// when profiling has been turned off since the span began.
void record(Event event);

// Takes every event recorded so far by this process's threads out of their
// buffers, in no particular order.
std::vector<Event> take_events();

// Builds the "args" members of an event: Args().add("rank", 1).add("method", "x").
class Args {
 public:
  Args& add(std::string_view key, int64_t value);
  Args& add(std::string_view key, std::string_view value);
  Args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  // A JSON value written as is (an array, a number with a fraction).
  Args& add_json(std::string_view key, std::string_view json);
  const std::string& str() const { return text_; }
  std::string take() { return std::move(text_); }

 private:
  std::string text_;
};

// A span on the calling thread: begins when made, is recorded when destroyed.
// Does nothing (not even read the clock) when profiling is off as it is made.
class Span {
 public:
  Span(std::string_view name, const char* category) {
    if (enabled()) begin(name, category);
  }
  ~Span() {
    if (active_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool active() const { return active_; }
  // Adds to the span's args (nothing when inactive).
  Span& arg(std::string_view key, int64_t value);
  Span& arg(std::string_view key, std::string_view value);

 private:
  void begin(std::string_view name, const char* category);
  void end();

  bool active_ = false;
  Event event_;
};

#define BATON_PROFILE_CONCAT_INNER(a, b) a##b
#define BATON_PROFILE_CONCAT(a, b) BATON_PROFILE_CONCAT_INNER(a, b)
// A span over the rest of the enclosing scope: BATON_PROFILE_SCOPE("engine", "forward_backward").
#define BATON_PROFILE_SCOPE(category, name) \
  ::baton::profiler::Span BATON_PROFILE_CONCAT(baton_profile_span_, __LINE__)(name, category)

// Tracks for spans that may overlap although they belong to one stream, such
// as the calls in flight on one worker group: a span takes the lowest free
// lane and gives it back when it ends, so that the spans on one lane never
// overlap and the trace nests properly. Lanes are tracks named "<name>",
// "<name> #2", ...
class Lanes {
 public:
  explicit Lanes(std::string name) : name_(std::move(name)) {}
  // The tid of a free lane, now taken.
  int32_t acquire();
  // Gives the lane back. REQUIRES: `tid` came from acquire() and is held.
  void release(int32_t tid);

 private:
  std::mutex mu_;
  std::string name_;
  std::vector<int32_t> tids_;  // lane i's track
  std::vector<bool> busy_;
};

// Waits until no lane of any Lanes is held (every call in flight has recorded
// its span), or `timeout` passes; false on timeout.
bool wait_for_lanes(std::chrono::milliseconds timeout);

// One clock reading of another process: `remote_ns` read there between
// `sent_ns` and `received_ns` here.
struct ClockSample {
  int64_t sent_ns = 0;
  int64_t remote_ns = 0;
  int64_t received_ns = 0;
};

// How a process's clock relates to this one's.
struct ClockOffset {
  // remote - local, from the sample with the shortest round trip (the remote
  // reading taken to be at its midpoint); the true offset is within
  // uncertainty_ns of it.
  int64_t estimated_ns = 0;
  int64_t uncertainty_ns = 0;  // half that round trip
  bool same_domain = false;    // one CLOCK_MONOTONIC (same kernel boot): the offset is 0
  // What events are shifted by: 0 in the same domain, else the estimate.
  int64_t applied_ns() const { return same_domain ? 0 : estimated_ns; }
};

// Cristian's method over `samples` (at least one). Throws baton::InvalidArgument
// for none, or for a sample whose receipt precedes its sending.
ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples, bool same_domain);

// The kernel's boot id (/proc/sys/kernel/random/boot_id): processes that
// report the same one share CLOCK_MONOTONIC. "unknown" where it cannot be read.
const std::string& clock_domain();

// One process's part of a trace.
struct ProcessProfile {
  int pid = 0;              // the trace's, stable per run: 1 the driver, then per worker process
  std::string name;         // "driver", "ActorRolloutRefWorker:rank 0"
  ClockOffset clock;        // the process's clock against the driver's
  std::string events_json;  // its trace events, comma-separated (see chrome_events)
};

// Chrome trace-event JSON objects, comma-separated without brackets: the
// process_name, process_sort_index and thread_name metadata of process `pid`,
// then one complete ("X") event per span, with timestamps in microseconds
// since `origin_ns` of this process's clock. Events that began before origin
// (in an earlier profiling session) are left out.
std::string chrome_events(int pid, const std::string& process_name,
                          const std::vector<Event>& events,
                          const std::map<int32_t, std::string>& tracks, int64_t origin_ns);

// Takes this process's events (take_events) and makes its part of a trace:
// times since `origin_ns` of this process's clock (for a worker: the driver's
// origin plus the worker's clock offset).
ProcessProfile collect_process(int pid, const std::string& name, int64_t origin_ns);

// The whole trace: {"traceEvents": [every process's events], "displayTimeUnit":
// "ms", "otherData": {"clocks": [per process: pid, name, offset_us (applied),
// estimated_offset_us, uncertainty_us, same_clock_domain], plus `other`'s
// members (JSON object members without braces, or empty)}}.
std::string chrome_trace(const std::vector<ProcessProfile>& processes,
                         const std::string& other = "");

// `text` as a JSON string literal, quotes included.
std::string json_string(std::string_view text);

}  // namespace baton::profiler
