#include "base/profiler.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "base/errors.h"

namespace baton::profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

// One thread's events. Its own mutex: the recording thread is the only other
// user, so the lock is uncontended except while take_events() drains it.
struct ThreadBuffer {
  std::mutex mu;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;  // outlive their threads
  std::map<int32_t, std::string> names;
};

// Leaked: threads may still record while static objects are destroyed.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

thread_local std::shared_ptr<ThreadBuffer> t_buffer;
thread_local int32_t t_tid = 0;

ThreadBuffer& thread_buffer() {
  if (!t_buffer) {
    t_buffer = std::make_shared<ThreadBuffer>();
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(t_buffer);
  }
  return *t_buffer;
}

// Lane tids: above any kernel thread id (pid_max is at most 2^22).
constexpr int32_t kFirstLaneTid = 1 << 24;
std::atomic<int32_t> next_lane_tid{kFirstLaneTid};

std::mutex lanes_mu;
std::condition_variable lanes_cv;
int64_t lanes_held = 0;  // guarded by lanes_mu

// Integer nanoseconds as microseconds with three decimals, exactly.
void append_us(std::string& out, int64_t ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  out += buf;
}

std::string us_text(int64_t ns) {
  std::string s;
  append_us(s, ns);
  return s;
}

}  // namespace

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int32_t thread_id() {
  if (t_tid == 0) t_tid = static_cast<int32_t>(syscall(SYS_gettid));
  return t_tid;
}

void set_thread_name(std::string name) { set_track_name(thread_id(), std::move(name)); }

void set_track_name(int32_t tid, std::string name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.names[tid] = std::move(name);
}

std::map<int32_t, std::string> track_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.names;
}

void record(Event event) {
  if (event.tid == 0) event.tid = thread_id();
  ThreadBuffer& b = thread_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  b.events.push_back(std::move(event));
}

std::vector<Event> take_events() {
  Registry& r = registry();
  std::vector<Event> out;
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& b : r.buffers) {
    std::lock_guard<std::mutex> block(b->mu);
    std::move(b->events.begin(), b->events.end(), std::back_inserter(out));
    b->events.clear();
  }
  // The buffers of threads that have exited (nobody else holds them) go.
  r.buffers.erase(std::remove_if(r.buffers.begin(), r.buffers.end(),
                                 [](const auto& b) { return b.use_count() == 1; }),
                  r.buffers.end());
  return out;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

Args& Args::add(std::string_view key, int64_t value) {
  return add_json(key, std::to_string(value));
}

Args& Args::add(std::string_view key, std::string_view value) {
  return add_json(key, json_string(value));
}

Args& Args::add_json(std::string_view key, std::string_view json) {
  if (!text_.empty()) text_ += ',';
  text_ += json_string(key);
  text_ += ':';
  text_ += json;
  return *this;
}

void Span::begin(std::string_view name, const char* category) {
  active_ = true;
  event_.name.assign(name.data(), name.size());
  event_.category = category;
  event_.begin_ns = now_ns();
}

void Span::end() {
  event_.end_ns = now_ns();
  record(std::move(event_));
}

Span& Span::arg(std::string_view key, int64_t value) {
  if (active_) {
    Args a;
    a.add(key, value);
    event_.args += (event_.args.empty() ? "" : ",") + a.str();
  }
  return *this;
}

Span& Span::arg(std::string_view key, std::string_view value) {
  if (active_) {
    Args a;
    a.add(key, value);
    event_.args += (event_.args.empty() ? "" : ",") + a.str();
  }
  return *this;
}

int32_t Lanes::acquire() {
  int32_t tid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t i = 0;
    while (i < busy_.size() && busy_[i]) ++i;
    if (i == busy_.size()) {
      tids_.push_back(next_lane_tid.fetch_add(1));
      busy_.push_back(false);
      set_track_name(tids_[i], i == 0 ? name_ : name_ + " #" + std::to_string(i + 1));
    }
    busy_[i] = true;
    tid = tids_[i];
  }
  std::lock_guard<std::mutex> lock(lanes_mu);
  ++lanes_held;
  return tid;
}

void Lanes::release(int32_t tid) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < tids_.size(); ++i) {
      if (tids_[i] == tid) busy_[i] = false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(lanes_mu);
    --lanes_held;
  }
  lanes_cv.notify_all();
}

bool wait_for_lanes(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(lanes_mu);
  return lanes_cv.wait_for(lock, timeout, [] { return lanes_held == 0; });
}

ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples, bool same_domain) {
  if (samples.empty()) throw baton::InvalidArgument("estimate_clock_offset: no clock samples");
  const ClockSample* best = nullptr;
  for (const ClockSample& s : samples) {
    if (s.received_ns < s.sent_ns)
      throw baton::InvalidArgument("estimate_clock_offset: a sample received at " +
                                  std::to_string(s.received_ns) + " ns before it was sent at " +
                                  std::to_string(s.sent_ns) + " ns");
    if (best == nullptr || s.received_ns - s.sent_ns < best->received_ns - best->sent_ns) best = &s;
  }
  const int64_t rtt = best->received_ns - best->sent_ns;
  ClockOffset o;
  // The remote clock was read somewhere in [sent, received]: at the midpoint
  // the error is at most half the round trip.
  o.estimated_ns = best->remote_ns - (best->sent_ns + rtt / 2);
  o.uncertainty_ns = (rtt + 1) / 2;
  o.same_domain = same_domain;
  return o;
}

const std::string& clock_domain() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    if (!(in >> s) || s.empty()) return std::string("unknown");
    return s;
  }();
  return id;
}

std::string chrome_events(int pid, const std::string& process_name,
                          const std::vector<Event>& events,
                          const std::map<int32_t, std::string>& tracks, int64_t origin_ns) {
  const std::string p = std::to_string(pid);
  std::string out = "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p +
                    ",\"tid\":0,\"args\":{\"name\":" + json_string(process_name) + "}}";
  out += ",{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p +
         ",\"tid\":0,\"args\":{\"sort_index\":" + p + "}}";
  std::vector<const Event*> kept;
  for (const Event& e : events) {
    if (e.begin_ns >= origin_ns) kept.push_back(&e);
  }
  // By track, then by start (the longer span first when two start together):
  // the order a viewer nests them in.
  std::sort(kept.begin(), kept.end(), [](const Event* a, const Event* b) {
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->begin_ns != b->begin_ns) return a->begin_ns < b->begin_ns;
    return a->end_ns > b->end_ns;
  });
  int32_t last_tid = 0;
  for (const Event* e : kept) {
    if (e->tid == last_tid) continue;
    last_tid = e->tid;
    auto it = tracks.find(e->tid);
    const std::string name = it != tracks.end() ? it->second : "thread " + std::to_string(e->tid);
    out += ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p +
           ",\"tid\":" + std::to_string(e->tid) + ",\"args\":{\"name\":" + json_string(name) + "}}";
  }
  for (const Event* e : kept) {
    out += ",{\"name\":" + json_string(e->name) + ",\"cat\":" + json_string(e->category) +
           ",\"ph\":\"X\",\"ts\":";
    append_us(out, e->begin_ns - origin_ns);
    out += ",\"dur\":";
    append_us(out, std::max<int64_t>(e->end_ns - e->begin_ns, 0));
    out += ",\"pid\":" + p + ",\"tid\":" + std::to_string(e->tid) + ",\"args\":{" + e->args + "}}";
  }
  return out;
}

ProcessProfile collect_process(int pid, const std::string& name, int64_t origin_ns) {
  ProcessProfile p;
  p.pid = pid;
  p.name = name;
  p.clock.same_domain = true;
  p.events_json = chrome_events(pid, name, take_events(), track_names(), origin_ns);
  return p;
}

std::string chrome_trace(const std::vector<ProcessProfile>& processes, const std::string& other) {
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  for (const ProcessProfile& p : processes) {
    if (p.events_json.empty()) continue;
    out += first ? "\n" : ",\n";
    out += p.events_json;
    first = false;
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clocks\":[";
  for (size_t i = 0; i < processes.size(); ++i) {
    const ProcessProfile& p = processes[i];
    out += (i ? "," : "") + std::string("{\"pid\":") + std::to_string(p.pid) +
           ",\"name\":" + json_string(p.name) + ",\"offset_us\":" + us_text(p.clock.applied_ns()) +
           ",\"estimated_offset_us\":" + us_text(p.clock.estimated_ns) +
           ",\"uncertainty_us\":" + us_text(p.clock.uncertainty_ns) +
           ",\"same_clock_domain\":" + (p.clock.same_domain ? "true" : "false") + "}";
  }
  out += "]";
  if (!other.empty()) out += "," + other;
  return out + "}}\n";
}

}  // namespace baton::profiler
