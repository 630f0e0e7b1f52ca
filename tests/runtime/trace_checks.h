// Checks of a Chrome trace written by the profiler (base/profiler.h), for
// the runtime's and the trainer's profiling tests: the file parses as
// trace-event JSON, spans on one track nest, and each worker-side span of a
// call lies inside the driver-side span of that call.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace baton::testing {

struct TraceSpan {
  std::string name, cat;
  int64_t pid = 0, tid = 0;
  int64_t begin_ns = 0, end_ns = 0;  // since the trace's origin
  nlohmann::json args;
};

struct ParsedTrace {
  std::map<int64_t, std::string> processes;                    // pid -> process_name
  std::map<std::pair<int64_t, int64_t>, std::string> threads;  // (pid, tid) -> thread_name
  std::vector<TraceSpan> spans;                                // the "X" events
  nlohmann::json other;                                        // otherData
};

inline int64_t micros_to_ns(const nlohmann::json& us) {
  return static_cast<int64_t>(std::llround(us.get<double>() * 1000.0));
}

// Parses `text`; a malformed file or event fails the test (and leaves what
// was read so far).
inline ParsedTrace parse_trace(const std::string& text) {
  ParsedTrace t;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the trace is not JSON: " << e.what();
    return t;
  }
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
    ADD_FAILURE() << "no traceEvents array";
    return t;
  }
  t.other = j.value("otherData", nlohmann::json::object());
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    if (!e.contains("name") || !e.contains("pid") || !e.contains("tid")) {
      ADD_FAILURE() << "an event without name, pid or tid: " << e.dump();
      continue;
    }
    if (ph == "M") {
      const std::string kind = e["name"];
      if (kind == "process_name") t.processes[e["pid"]] = e["args"]["name"];
      if (kind == "thread_name") t.threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    } else if (ph == "X") {
      if (!e.contains("ts") || !e.contains("dur") || !e["ts"].is_number() ||
          !e["dur"].is_number()) {
        ADD_FAILURE() << "a complete event without numeric ts and dur: " << e.dump();
        continue;
      }
      TraceSpan s;
      s.name = e["name"];
      s.cat = e.value("cat", "");
      s.pid = e["pid"];
      s.tid = e["tid"];
      s.begin_ns = micros_to_ns(e["ts"]);
      s.end_ns = s.begin_ns + micros_to_ns(e["dur"]);
      EXPECT_GE(s.end_ns, s.begin_ns) << e.dump();
      s.args = e.value("args", nlohmann::json::object());
      t.spans.push_back(std::move(s));
    } else {
      ADD_FAILURE() << "an event of phase '" << ph << "': " << e.dump();
    }
  }
  return t;
}

inline std::string describe(const TraceSpan& s) {
  return "'" + s.name + "' [" + std::to_string(s.begin_ns) + ", " + std::to_string(s.end_ns) +
         "] ns on pid " + std::to_string(s.pid) + " tid " + std::to_string(s.tid);
}

// Spans on one track (pid, tid) either nest or do not overlap; each track has
// a thread_name.
inline void expect_spans_nest(const ParsedTrace& t) {
  std::map<std::pair<int64_t, int64_t>, std::vector<const TraceSpan*>> tracks;
  for (const TraceSpan& s : t.spans) tracks[{s.pid, s.tid}].push_back(&s);
  for (auto& [track, spans] : tracks) {
    EXPECT_TRUE(t.threads.count(track))
        << "track pid " << track.first << " tid " << track.second << " has no thread_name";
    std::sort(spans.begin(), spans.end(), [](const TraceSpan* a, const TraceSpan* b) {
      return a->begin_ns != b->begin_ns ? a->begin_ns < b->begin_ns : a->end_ns > b->end_ns;
    });
    std::vector<const TraceSpan*> open;
    for (const TraceSpan* s : spans) {
      while (!open.empty() && open.back()->end_ns <= s->begin_ns) open.pop_back();
      if (!open.empty() && s->end_ns > open.back()->end_ns) {
        ADD_FAILURE() << describe(*s) << " overlaps " << describe(*open.back())
                      << " without nesting in it";
      }
      open.push_back(s);
    }
  }
}

// Every worker-side span of a call (cat "worker", args.call_id) lies inside
// the driver's span of the call that sent it (cat "runtime", args.call_ids
// holding that id). Returns how many worker spans were checked.
inline int expect_calls_contain_worker_spans(const ParsedTrace& t, int64_t driver_pid) {
  std::map<int64_t, const TraceSpan*> call_of_id;
  for (const TraceSpan& s : t.spans) {
    if (s.pid != driver_pid || !s.args.contains("call_ids")) continue;
    for (const auto& id : s.args["call_ids"]) call_of_id[id.get<int64_t>()] = &s;
  }
  int checked = 0;
  for (const TraceSpan& s : t.spans) {
    if (s.cat != "worker" || !s.args.contains("call_id")) continue;
    auto it = call_of_id.find(s.args["call_id"].get<int64_t>());
    if (it == call_of_id.end()) {
      ADD_FAILURE() << "worker span " << describe(s) << " of call " << s.args["call_id"]
                    << " has no driver-side call span";
      continue;
    }
    const TraceSpan& call = *it->second;
    EXPECT_LE(call.begin_ns, s.begin_ns)
        << describe(s) << " begins before its call " << describe(call);
    EXPECT_GE(call.end_ns, s.end_ns) << describe(s) << " ends after its call " << describe(call);
    ++checked;
  }
  return checked;
}

}  // namespace baton::testing
