#include "runtime/worker_group.h"

#include <unistd.h>

#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <utility>

#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"
#include "net/store_server.h"
#include "runtime/dispatch_registry.h"
#include "runtime/internal/driver.h"
#include "runtime/internal/worker_process.h"
#include "runtime/runtime.h"

namespace baton {

namespace {

// A TCP socket bound to 127.0.0.1 on a free port, listening.
// A call that waits: for its future arguments, or behind an earlier such
// call of its group.
struct Deferred {
  std::string where;  // "Class.method (MODE)", for errors
  List values;        // the arguments; futures' values filled in as they complete
  size_t unresolved = 0;
  std::exception_ptr error;  // the first failed future, as UpstreamError
  std::function<Future<Value>(const List&)> send;
  Promise<Value> promise;
};

// The driver's spans of one call (base/profiler.h), on a lane of its
// group's "calls <group>" track: the call, from call() until its result is
// collected or it fails, and its children "wait for arguments" (a call with
// future arguments), "dispatch" (the dispatch mode's plan: splitting the
// DataProto), "encode" (per chunk), "send" (per rank: handing the message to
// the worker's queue), "wait" (until every rank has answered: the workers'
// queueing and execution, the results' transfer and decoding) and "collect".
// Made only while profiling is on (start() gives null otherwise), so that a
// call pays one relaxed load when it is off. The children are stamped from
// the calling, dispatch and I/O threads in turn.
class CallTrace {
 public:
  static std::shared_ptr<CallTrace> start(const std::shared_ptr<profiler::Lanes>& lanes,
                                          const std::string& name) {
    if (!profiler::enabled() || !lanes) return nullptr;
    return std::shared_ptr<CallTrace>(new CallTrace(lanes, name));
  }
  // A call dropped unfinished (its planning threw, or it never got its
  // arguments) ends here.
  ~CallTrace() { finish(false); }

  int64_t begin_ns() const { return begin_ns_; }
  void child(const char* name, int64_t begin, int64_t end, std::string args = {}) {
    profiler::record({name, "runtime", begin, end, tid_, std::move(args)});
  }
  void sent(int rank, uint64_t call_id, int64_t begin, int64_t end) {
    child("send", begin, end,
          profiler::Args().add("rank", rank).add("call_id", static_cast<int64_t>(call_id)).take());
    std::lock_guard<std::mutex> lock(mu_);
    call_ids_ += (call_ids_.empty() ? "" : ",") + std::to_string(call_id);
    sent_ns_ = end;
  }
  // Every rank has answered: records "wait" and returns the time.
  int64_t answered() {
    const int64_t now = profiler::now_ns();
    std::lock_guard<std::mutex> lock(mu_);
    if (!waited_) child("wait", sent_ns_, now);
    waited_ = true;
    return now;
  }
  // Records the call (and its wait, if no result came) and frees the lane.
  void finish(bool ok) {
    const int64_t now = profiler::now_ns();
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (!waited_ && sent_ns_ > 0) child("wait", sent_ns_, now);
    profiler::record({name_, "runtime", begin_ns_, now, tid_,
                      profiler::Args()
                          .add_json("call_ids", "[" + call_ids_ + "]")
                          .add("ok", ok ? 1 : 0)
                          .take()});
    lanes_->release(tid_);
  }

 private:
  CallTrace(std::shared_ptr<profiler::Lanes> lanes, std::string name)
      : lanes_(std::move(lanes)), name_(std::move(name)), tid_(lanes_->acquire()),
        begin_ns_(profiler::now_ns()) {}

  std::shared_ptr<profiler::Lanes> lanes_;
  std::string name_;
  int32_t tid_;
  int64_t begin_ns_;
  std::mutex mu_;
  std::string call_ids_;  // "3,4": the messages' ids, which the workers' spans carry
  int64_t sent_ns_ = 0;
  bool waited_ = false;
  bool finished_ = false;
};
using CallTracePtr = std::shared_ptr<CallTrace>;

// `f`, whose completion first ends `trace`: the call's span is recorded, and
// its lane free for the next call, before the caller can see the result.
template <class T>
Future<T> traced(Future<T> f, CallTracePtr trace) {
  if (!trace) return f;
  Promise<T> out;
  f.on_complete([trace, out](const Future<T>& r) mutable {
    trace->finish(!r.error());
    if (auto e = r.error()) {
      out.set_error(e);
    } else {
      out.set_value(r.get());
    }
  });
  return out.future();
}

// `e` (a failed future argument) as the error of the call it was passed to.
std::exception_ptr upstream_failure(const std::string& where, size_t arg, std::exception_ptr e) {
  const std::string head =
      where + ": argument " + std::to_string(arg) + " is the future of a call that failed";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {  // UpstreamError nests x
    return std::make_exception_ptr(UpstreamError(head + ": " + x.what()));
  } catch (...) {
    return std::make_exception_ptr(UpstreamError(head));
  }
}

}  // namespace

struct WorkerGroup::State : std::enable_shared_from_this<WorkerGroup::State> {
  using SendFn = std::function<Future<Value>(const List& args)>;

  std::string name;
  ParallelLayout layout;
  std::chrono::milliseconds shutdown_grace{0};  // the destructor's
  std::unique_ptr<RoleSet> roles;
  ResourcePool pool;
  bool claimed = false;
  // The rendezvous for the workers' c10d groups; the driver only hosts it.
  std::unique_ptr<StoreServer> store;
  std::vector<std::shared_ptr<WorkerProcess>> workers;
  std::shared_ptr<std::function<void()>> exit_hook;

  // Held while a call's messages are handed to its workers, so that calls
  // reach every worker in submission order. Never held long: handing over
  // never blocks (WorkerProcess::send queues what a socket does not take).
  std::mutex send_mu;

  // The tracks of its calls' spans while profiling (CallTrace).
  std::shared_ptr<profiler::Lanes> lanes;

  std::mutex mu;  // guards what follows; never held while sending
  std::map<std::pair<int, std::string>, MeshInfo> meshes;  // (role or -1, mesh)
  std::deque<std::shared_ptr<Deferred>> deferred;          // calls not yet sent, in order
  std::string failure;  // what happened to the first worker that died
  bool stopping = false;

  explicit State(ResourcePool p) : pool(std::move(p)) {}

  // Sends a call now (`send(args)` on this thread) if none of its arguments
  // is a future and no earlier call waits; otherwise queues it, and the
  // dispatch thread sends it once its futures (and every earlier queued
  // call) are done. What `send` throws is thrown here, or fails the future.
  Future<Value> submit(CallArgs args, std::string where, SendFn send) {
    if (!args.has_futures()) {
      std::lock_guard<std::mutex> sending(send_mu);
      bool now;
      {
        std::lock_guard<std::mutex> lock(mu);
        now = deferred.empty();
      }
      if (now) return send(args.take_values());
    }
    auto d = std::make_shared<Deferred>();
    d->where = std::move(where);
    d->send = std::move(send);
    std::vector<size_t> waiting;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].is_future()) waiting.push_back(i);
    }
    d->unresolved = waiting.size();
    d->values = args.take_values();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) {
        d->promise.fail(CallError(d->where + ": group " + name + " was shut down"));
        return d->promise.future();
      }
      if (!failure.empty()) {
        d->promise.fail(WorkerDiedError(d->where + ": not sent: " + failure));
        return d->promise.future();
      }
      deferred.push_back(d);
    }
    std::weak_ptr<State> weak = weak_from_this();
    for (size_t i : waiting) {
      args[i].future().on_complete([weak, d, i](const Future<Value>& f) {
        if (auto s = weak.lock()) s->resolved(d, i, f);
      });
    }
    if (waiting.empty()) schedule_pump();
    return d->promise.future();
  }

  void resolved(const std::shared_ptr<Deferred>& d, size_t i, const Future<Value>& f) {
    std::exception_ptr e = f.error();
    std::exception_ptr failed = e ? upstream_failure(d->where, i, e) : nullptr;
    Value v = e ? Value() : f.get();
    bool ready;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed && !d->error) d->error = failed;
      if (!e) d->values[i] = std::move(v);
      ready = --d->unresolved == 0;
    }
    if (ready) schedule_pump();
  }

  void schedule_pump() {
    std::weak_ptr<State> weak = weak_from_this();
    Driver::get().post_dispatch([weak] {
      if (auto s = weak.lock()) s->pump();
    });
  }

  // On the dispatch thread: sends the queued calls that are ready, in order,
  // up to the first that still waits.
  void pump() {
    std::lock_guard<std::mutex> sending(send_mu);
    for (;;) {
      std::shared_ptr<Deferred> d;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (deferred.empty() || deferred.front()->unresolved > 0) return;
        d = std::move(deferred.front());
        deferred.pop_front();
      }
      if (d->error) {
        d->promise.set_error(d->error);
      } else {
        try {
          Promise<Value> out = d->promise;
          d->send(d->values).on_complete([out](const Future<Value>& r) {
            if (auto e = r.error()) {
              out.set_error(e);
            } else {
              out.set_value(r.get());
            }
          });
        } catch (...) {
          d->promise.set_error(std::current_exception());
        }
      }
      d->send = nullptr;  // it holds the State
    }
  }

  // Fails every queued call with make_error(where).
  template <class MakeError>
  void fail_deferred(MakeError make_error) {
    std::deque<std::shared_ptr<Deferred>> failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      failed.swap(deferred);
    }
    for (auto& d : failed) {
      d->promise.set_error(std::make_exception_ptr(make_error(d->where)));
      d->send = nullptr;
    }
  }

  void on_death(WorkerProcess& dead, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping || !failure.empty()) return;
      failure = what;
    }
    log(LogLevel::kError, "baton: group " + name + " failed, stopping its other workers: " + what);
    fail_deferred(
        [&](const std::string& where) { return WorkerDiedError(where + ": not sent: " + what); });
    for (auto& w : workers) {
      if (w.get() != &dead) w->kill("its group " + name + " failed: " + what);
    }
  }

  void shutdown(std::chrono::milliseconds grace) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      stopping = true;
    }
    fail_deferred([&](const std::string& where) {
      return CallError(where + ": not sent: group " + name +
                       " was shut down while the call waited for its arguments");
    });
    for (auto& w : workers) {
      if (w->alive()) w->request_exit();
    }
    auto deadline = std::chrono::steady_clock::now() + grace;
    for (auto& w : workers) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!w->wait_exit(std::max(left, std::chrono::milliseconds(0)))) {
        w->kill("the group " + name + " was shut down and it did not exit in time");
      }
    }
    for (auto& w : workers) w->wait_exit(std::chrono::seconds(10));
    if (claimed) pool.release();
    claimed = false;
    store.reset();
  }
};

namespace {

namespace asio = boost::asio;

std::atomic<int> group_counter{0};

Value list_to_value(const List& l) { return Value(l); }
List value_to_list(const Value& v) { return v.as_list(); }

// Sends chunk `chunk_of_rank[r]` of `chunks` to each rank r (none where it
// is -1), encoding each chunk once, however many ranks receive it. Returns
// the futures in ascending rank order, with their ranks.
struct Sent {
  std::vector<Future<Value>> futures;
  std::vector<int> ranks;
};
Sent send_chunks(const std::vector<std::shared_ptr<WorkerProcess>>& workers,
                 const std::string& method, const std::vector<List>& chunks,
                 const std::vector<int>& chunk_of_rank, const CallOptions& options,
                 CallTrace* trace) {
  std::vector<std::optional<OutgoingCall>> messages(chunks.size());
  Sent sent;
  for (size_t r = 0; r < workers.size(); ++r) {
    int c = chunk_of_rank[r];
    if (c < 0) continue;
    if (!messages[c]) {
      const int64_t t0 = trace ? profiler::now_ns() : 0;
      messages[c] = WorkerProcess::encode_call(method, chunks[c]);
      if (trace) trace->child("encode", t0, profiler::now_ns(), profiler::Args().add("chunk", c).take());
    }
    const int64_t t0 = trace ? profiler::now_ns() : 0;
    sent.futures.push_back(workers[r]->send(*messages[c], options.timeout));
    if (trace) trace->sent(static_cast<int>(r), messages[c]->call_id, t0, profiler::now_ns());
    sent.ranks.push_back(static_cast<int>(r));
  }
  for (const auto& msg : messages) {
    if (msg && msg->segment) Driver::get().pool().release(*msg->segment, kSelfPeer);
  }
  return sent;
}

// How long a call whose method raised on one rank waits for its other ranks,
// so that its error can say which ranks failed and why. All ranks raising
// together answer within milliseconds; a rank that does not answer in time
// (say, one blocked in a collective with the failed rank) is named as such.
constexpr std::chrono::milliseconds kFailureGrace{1000};

// Every rank's result, in order; the future fails if any rank fails. A
// RemoteError waits (up to kFailureGrace) for the other ranks and becomes one
// RemoteError naming every rank that raised, with each distinct message; any
// other failure (a death, a timeout) fails the call at once.
Future<List> gather(Sent sent) {
  struct Acc {
    std::mutex mu;
    List results;
    std::vector<int> ranks;
    std::vector<bool> answered;
    std::vector<std::exception_ptr> raised;  // RemoteErrors, by position
    struct Raised {
      std::string worker_class, method, message;
    };
    std::vector<Raised> what;  // theirs, by position
    size_t left = 0;
    bool done = false;
    std::shared_ptr<asio::steady_timer> timer;
    Promise<List> promise;

    // REQUIRES: mu held, !done.
    std::exception_ptr remote_failure() {
      done = true;
      if (ranks.size() == 1) return raised[0];
      std::vector<std::pair<int, const Raised*>> failed;
      std::vector<int> silent;
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (!answered[i]) silent.push_back(ranks[i]);
        if (raised[i]) failed.emplace_back(ranks[i], &what[i]);
      }
      auto rank_list = [](const std::vector<int>& rs) {
        std::string out;
        for (int r : rs) out += (out.empty() ? "" : ", ") + std::to_string(r);
        return out;
      };
      // The distinct messages, each with the ranks that raised it, in rank order.
      std::vector<std::pair<std::string, std::vector<int>>> distinct;
      std::vector<int> all;
      for (const auto& [rank, e] : failed) {
        all.push_back(rank);
        auto it = std::find_if(distinct.begin(), distinct.end(),
                               [&](const auto& d) { return d.first == e->message; });
        if (it == distinct.end()) {
          distinct.push_back({e->message, {rank}});
        } else {
          it->second.push_back(rank);
        }
      }
      const Raised& first = *failed.front().second;
      std::string text = first.worker_class + "." + first.method + " failed on rank " +
                         rank_list(all) + " (" + std::to_string(failed.size()) + " of " +
                         std::to_string(ranks.size()) + " ranks";
      if (!silent.empty()) {
        text += "; no answer from rank " + rank_list(silent) + " within " +
                std::to_string(kFailureGrace.count()) + " ms of the first failure";
      }
      text += ")";
      if (distinct.size() == 1) {
        text += ": " + distinct[0].first;
      } else {
        for (size_t d = 0; d < distinct.size(); ++d) {
          text += (d == 0 ? ": rank " : "; rank ") + rank_list(distinct[d].second) + ": " +
                  distinct[d].first;
        }
      }
      return std::make_exception_ptr(
          RemoteError(first.worker_class, failed.front().first, first.method, first.message, text));
    }
  };
  auto acc = std::make_shared<Acc>();
  const size_t n = sent.futures.size();
  acc->results.resize(n);
  acc->ranks = std::move(sent.ranks);
  acc->answered.assign(n, false);
  acc->raised.resize(n);
  acc->what.resize(n);
  acc->left = n;
  if (n == 0) acc->promise.set_value({});
  for (size_t i = 0; i < n; ++i) {
    sent.futures[i].on_complete([acc, i](const Future<Value>& f) {
      std::exception_ptr fail_now;  // completed outside the lock: callbacks run inline
      bool succeed = false;
      {
        std::lock_guard<std::mutex> lock(acc->mu);
        if (acc->done) return;
        acc->answered[i] = true;
        --acc->left;
        bool any_raised = false;
        if (auto e = f.error()) {
          try {
            std::rethrow_exception(e);
          } catch (const RemoteError& r) {
            acc->raised[i] = e;
            acc->what[i] = {r.worker_class(), r.method(), r.remote_message()};
          } catch (...) {
            acc->done = true;
            fail_now = e;
          }
        } else {
          acc->results[i] = f.get();
        }
        for (const auto& r : acc->raised) any_raised = any_raised || r != nullptr;
        if (!acc->done && acc->left == 0) {
          if (any_raised) {
            fail_now = acc->remote_failure();
          } else {
            acc->done = succeed = true;
          }
        } else if (!acc->done && acc->raised[i] && !acc->timer) {
          acc->timer = std::make_shared<asio::steady_timer>(Driver::get().io(), kFailureGrace);
          acc->timer->async_wait([acc](const boost::system::error_code&) {
            std::exception_ptr e;
            {
              std::lock_guard<std::mutex> lock(acc->mu);
              if (acc->done) return;
              e = acc->remote_failure();
            }
            acc->promise.set_error(e);
          });
        }
      }
      if (fail_now) acc->promise.set_error(fail_now);
      if (succeed) acc->promise.set_value(std::move(acc->results));
    });
  }
  return acc->promise.future();
}

// Lays `args` out with the method's dispatch mode (on `view`: the group, or
// the method's role), checking the plan and every chunk against the method.
// Throws CallError prefixed with `where`.
DispatchPlan plan_call(const WorkerGroup& view, const RoleSet& roles, const RoleSet::Target& t,
                       const std::string& where, const DispatchMode& mode, const List& args) {
  DispatchPlan plan;
  try {
    plan = mode.dispatch(view, args);
  } catch (const Error& e) {  // CallError included
    throw CallError(where + ": " + e.what());
  }
  const int n = view.world_size();
  if (static_cast<int>(plan.chunk_of_rank.size()) != n ||
      (!plan.collect.empty() && static_cast<int>(plan.collect.size()) != n)) {
    throw CallError(where + ": the dispatch function planned for " +
                    std::to_string(plan.chunk_of_rank.size()) + " ranks, the group has " +
                    std::to_string(n));
  }
  for (int c : plan.chunk_of_rank) {
    if (c < -1 || c >= static_cast<int>(plan.chunks.size())) {
      throw CallError(where + ": the dispatch function refers to chunk " + std::to_string(c) +
                      " of " + std::to_string(plan.chunks.size()));
    }
  }
  for (const List& chunk : plan.chunks) t.method->check_args(roles.qualified(t), chunk);
  return plan;
}

// Sends a planned call; its future completes with the collected result once
// every rank that ran has answered (a failure anywhere fails the call).
Future<Value> send_plan(const std::vector<std::shared_ptr<WorkerProcess>>& workers,
                        const std::string& wire_name, const std::string& where,
                        const CollectFn& collect, DispatchPlan plan, const CallOptions& options,
                        CallTracePtr trace) {
  Sent sent = send_chunks(workers, wire_name, plan.chunks, plan.chunk_of_rank, options, trace.get());
  std::vector<int> ranks = sent.ranks;
  // Hand the collected ranks' results, in rank order, to the collect function.
  auto collected = gather(std::move(sent)).then([where, collect, ranks = std::move(ranks),
                                                 mask = std::move(plan.collect), pad = plan.pad,
                                                 info = std::move(plan.info),
                                                 trace](const List& results) {
        const int64_t t0 = trace ? trace->answered() : 0;
        struct Collecting {  // the collect span, however collect() ends
          CallTrace* trace;
          int64_t t0;
          ~Collecting() {
            if (trace) trace->child("collect", t0, profiler::now_ns());
          }
        } collecting{trace.get(), t0};
        CollectInput in;
        in.pad = pad;
        in.info = info;
        for (size_t i = 0; i < results.size(); ++i) {
          if (!mask.empty() && !mask[ranks[i]]) continue;
          in.outputs.push_back(results[i]);
          in.ranks.push_back(ranks[i]);
        }
        try {
          return collect(in);
        } catch (const std::exception& e) {
          throw Error(where + ": collecting the results failed: " + e.what());
        }
      });
  return traced(std::move(collected), std::move(trace));
}

// Plans a call (its "dispatch" span when traced).
DispatchPlan traced_plan(CallTrace* trace, const WorkerGroup& view, const RoleSet& roles,
                         const RoleSet::Target& t, const std::string& where,
                         const DispatchMode& mode, const List& args) {
  const int64_t t0 = trace ? profiler::now_ns() : 0;
  DispatchPlan plan = plan_call(view, roles, t, where, mode, args);
  if (trace) trace->child("dispatch", t0, profiler::now_ns());
  return plan;
}

// The "wait for arguments" span of a call sent once its futures completed.
void waited_for_arguments(CallTrace* trace) {
  if (trace) trace->child("wait for arguments", trace->begin_ns(), profiler::now_ns());
}

}  // namespace

WorkerGroup::WorkerGroup(std::shared_ptr<State> s, int role, bool owner)
    : s_(std::move(s)), role_(role), owner_(owner) {}
WorkerGroup::WorkerGroup(WorkerGroup&&) noexcept = default;
WorkerGroup& WorkerGroup::operator=(WorkerGroup&& other) noexcept {
  if (this != &other) {
    if (s_ && owner_) s_->shutdown(s_->shutdown_grace);
    s_ = std::move(other.s_);
    role_ = other.role_;
    owner_ = other.owner_;
  }
  return *this;
}
WorkerGroup::~WorkerGroup() {
  if (s_ && owner_) s_->shutdown(s_->shutdown_grace);
}

WorkerGroup WorkerGroup::spawn(const std::string& class_name, ResourcePool& pool, List init_args,
                               WorkerGroupOptions options) {
  return spawn_roles({RoleSpec{"", class_name, std::move(init_args)}}, pool, std::move(options));
}

WorkerGroup WorkerGroup::spawn_colocated(std::vector<RoleSpec> roles, ResourcePool& pool,
                                         WorkerGroupOptions options) {
  if (roles.empty()) throw CallError("spawn_colocated: no roles given");
  for (const RoleSpec& r : roles) {
    if (r.role.empty()) {
      throw CallError("spawn_colocated: the role of class " + r.class_name + " has no name");
    }
  }
  return spawn_roles(std::move(roles), pool, std::move(options));
}

WorkerGroup WorkerGroup::spawn_roles(std::vector<RoleSpec> roles, ResourcePool& pool,
                                     WorkerGroupOptions options) {
  auto s = std::make_shared<State>(pool);
  s->roles = std::make_unique<RoleSet>(roles);
  const std::string& class_name = s->roles->name();
  detail::check_can_spawn_workers("WorkerGroup of " + class_name);
  s->name = options.name.empty() ? class_name + "_" + std::to_string(group_counter++) : options.name;
  s->layout = options.layout.value_or(ParallelLayout::data_parallel(pool.world_size()));
  s->shutdown_grace = options.shutdown_grace;
  s->lanes = std::make_shared<profiler::Lanes>("calls " + s->name);
  if (s->layout.world_size() != pool.world_size() || s->layout.tp < 1 || s->layout.cp < 1 ||
      s->layout.dp < 1 || s->layout.pp < 1) {
    throw CallError("WorkerGroup " + s->name + ": layout " + s->layout.to_string() + " has " +
                    std::to_string(s->layout.world_size()) + " ranks, the pool has " +
                    std::to_string(pool.world_size()));
  }
  s->pool.claim();
  s->claimed = true;
  WorkerGroup group(s, -1, true);  // from here on, a throw shuts the partial group down

  const ResourcePoolOptions& po = pool.options();
  std::vector<NodeInfo> nodes;
  if (po.cluster) {
    nodes = po.cluster->nodes();
    // A tensor-parallel group exchanges activations in every layer: it stays
    // within a node. Ranks are placed node by node, tp the fastest.
    for (size_t n = 0; n < po.processes_on_nodes.size(); ++n) {
      if (po.processes_on_nodes[n] % s->layout.tp != 0)
        throw CallError("WorkerGroup " + s->name + ": node " + std::to_string(n) + " has " +
                        std::to_string(po.processes_on_nodes[n]) + " workers, not a multiple of " +
                        "tp=" + std::to_string(s->layout.tp) +
                        ": a tensor-parallel group would span two nodes");
    }
  }

  // The rendezvous store: every connection must prove it holds the cluster
  // token (net/store_server.h). On the loopback interface only, unless
  // node agents run workers: then on the cluster's address.
  StoreServerOptions store_options;
  store_options.name = "WorkerGroup " + s->name + "'s rendezvous store";
  if (po.cluster) store_options.bind_address = po.cluster->bind_host();
  s->store = std::make_unique<StoreServer>(store_options);

  std::weak_ptr<State> weak = s;
  auto on_death = [weak](WorkerProcess& w, const std::string& what) {
    if (auto state = weak.lock()) state->on_death(w, what);
  };
  for (const Placement& p : pool.placements()) {
    WorkerInfo info;
    info.class_name = class_name;
    info.group_name = s->name;
    info.rank = p.rank;
    info.world_size = pool.world_size();
    info.local_rank = p.local_rank;
    info.local_world_size = p.local_world_size;
    info.node = p.node;
    info.use_gpu = po.use_gpu;
    info.device = po.use_gpu ? 0 : -1;
    info.slot = p.local_rank;
    info.intra_op_threads = po.intra_op_threads > 0
                                ? po.intra_op_threads
                                : std::max(1, pool.node_cores(p.node) / p.local_world_size);
    info.wait_policy = po.wait_policy;
    // A remote worker reaches the store where its agent reached the driver.
    info.master_addr = "127.0.0.1";
    for (const NodeInfo& n : nodes)
      if (n.index == p.node) info.master_addr = n.driver_address;
    info.master_port = s->store->port();
    info.layout = s->layout;
    info.coords = s->layout.coords(p.rank);
    s->workers.push_back(WorkerProcess::spawn(std::move(info), on_death, po.cluster));
  }

  std::vector<Future<Value>> inits;
  for (auto& w : s->workers) inits.push_back(w->init(roles));
  std::string errors;
  for (size_t r = 0; r < inits.size(); ++r) {
    if (!inits[r].wait_for(options.start_timeout)) {
      errors += "\n  rank " + std::to_string(r) + ": not started within " +
                std::to_string(options.start_timeout.count()) + " ms";
      continue;
    }
    try {
      inits[r].get();
    } catch (const std::exception& e) {
      errors += "\n  rank " + std::to_string(r) + ": " + e.what();
    }
  }
  if (!errors.empty()) throw Error("WorkerGroup " + s->name + " failed to start:" + errors);

  // At driver exit nobody is left to read results: give running methods a
  // moment, then stop them.
  s->exit_hook = std::make_shared<std::function<void()>>([weak] {
    if (auto state = weak.lock()) state->shutdown(std::chrono::seconds(1));
  });
  Driver::get().add_group_hook(s->exit_hook);
  return group;
}

WorkerGroup WorkerGroup::role(const std::string& role) const {
  if (role_ >= 0) {
    throw CallError("role view '" + s_->roles->role(role_) + "' of group " + name() +
                    " has no roles of its own; call role() on the group");
  }
  return WorkerGroup(s_, static_cast<int>(s_->roles->role_index(role)), false);
}

std::vector<std::string> WorkerGroup::roles() const {
  std::vector<std::string> out;
  if (!s_->roles->colocated()) return out;
  for (size_t i = 0; i < s_->roles->size(); ++i) out.push_back(s_->roles->role(i));
  return out;
}

RoleSet::Target WorkerGroup::target(const std::string& method) const {
  return role_ < 0 ? s_->roles->find(method) : s_->roles->find(static_cast<size_t>(role_), method);
}

int WorkerGroup::world_size() const { return static_cast<int>(s_->workers.size()); }
const std::string& WorkerGroup::class_name() const {
  return role_ < 0 ? s_->roles->name() : s_->roles->spec(static_cast<size_t>(role_)).name;
}
const std::string& WorkerGroup::name() const { return s_->name; }
const ParallelLayout& WorkerGroup::layout() const { return s_->layout; }

MeshInfo WorkerGroup::mesh(const std::string& mesh) const {
  if (role_ < 0 && s_->roles->colocated()) {
    throw CallError("colocated group " + name() +
                    ": meshes are registered per role; use role(name).mesh(\"" + mesh + "\")");
  }
  const auto key = std::make_pair(role_, mesh);
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    auto it = s_->meshes.find(key);
    if (it != s_->meshes.end()) return it->second;
  }
  const std::string who =
      "group " + name() + (role_ < 0 ? "" : " role " + s_->roles->role(static_cast<size_t>(role_)));
  // Sent directly, not in submission order: registrations are made in the
  // workers' constructors, so any order gives the same answer.
  std::vector<int> everyone(s_->workers.size(), 0);
  Sent sent =
      send_chunks(s_->workers, target("_query_mesh").wire_name, {{mesh}}, everyone, {}, nullptr);
  MeshInfo info;
  for (size_t r = 0; r < sent.futures.size(); ++r) {  // the lowest failing rank is named
    Value entry;
    try {
      entry = sent.futures[r].get();
    } catch (const RemoteError& e) {
      throw Error(who + ": rank " + std::to_string(r) + ": " + e.remote_message());
    }
    info.dp_rank.push_back(static_cast<int>(entry.as_list()[0].as_int()));
    info.collect.push_back(entry.as_list()[1].as_int() != 0);
    info.dp_size = std::max(info.dp_size, info.dp_rank.back() + 1);
  }
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->meshes[key] = info;
  return info;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (auto& w : s_->workers) out.push_back(w->pid());
  return out;
}

bool WorkerGroup::alive() const {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->stopping || !s_->failure.empty()) return false;
  }
  return std::all_of(s_->workers.begin(), s_->workers.end(),
                     [](const auto& w) { return w->alive(); });
}

Future<Value> WorkerGroup::call(const std::string& method, CallArgs args, CallOptions options) {
  RoleSet::Target t = target(method);
  const MethodOptions& mo = t.method->options;
  if (mo.execute_mode == Execute::kRankZero) {
    return call_rank(0, method, std::move(args), options);
  }
  const std::string where = s_->roles->qualified(t) + " (" + mo.dispatch_mode + ")";
  DispatchMode mode = find_dispatch_mode(mo.dispatch_mode);
  // The dispatch function sees the method's role (its meshes) or the group.
  const int view_role = s_->roles->colocated() ? static_cast<int>(t.role) : -1;
  std::shared_ptr<State> s = s_;
  CallTracePtr trace = CallTrace::start(s_->lanes, where);
  if (args.has_futures()) {
    return s_->submit(std::move(args), where,
                      [s, view_role, t, where, mode, options, trace](const List& values) {
                        waited_for_arguments(trace.get());
                        WorkerGroup view(s, view_role, false);
                        DispatchPlan plan =
                            traced_plan(trace.get(), view, *s->roles, t, where, mode, values);
                        return send_plan(s->workers, t.wire_name, where, mode.collect,
                                         std::move(plan), options, trace);
                      });
  }
  // No futures: bad arguments throw here, before anything is queued or sent.
  DispatchPlan plan = traced_plan(trace.get(), WorkerGroup(s_, view_role, false), *s_->roles, t,
                                  where, mode, args.take_values());
  return s_->submit({}, where,
                    [s, t, where, collect = mode.collect, plan = std::move(plan), options,
                     trace](const List&) mutable {
                      return send_plan(s->workers, t.wire_name, where, collect, std::move(plan),
                                       options, trace);
                    });
}

Future<List> WorkerGroup::call_all(const std::string& method, CallArgs args, CallOptions options) {
  RoleSet::Target t = target(method);
  const std::string qualified = s_->roles->qualified(t);
  std::shared_ptr<State> s = s_;
  CallTracePtr trace = CallTrace::start(s_->lanes, qualified + " (all ranks)");
  auto deliver = [s, t, options, trace, waits = args.has_futures()](const List& values) {
    if (waits) waited_for_arguments(trace.get());
    std::vector<int> everyone(s->workers.size(), 0);
    return traced(
        gather(send_chunks(s->workers, t.wire_name, {values}, everyone, options, trace.get()))
            .then(list_to_value),
        trace);
  };
  if (!args.has_futures()) {
    List values = args.take_values();
    t.method->check_args(qualified, values);
    return s_
        ->submit({}, qualified,
                 [deliver, values = std::move(values)](const List&) { return deliver(values); })
        .then(value_to_list);
  }
  return s_
      ->submit(std::move(args), qualified,
               [deliver, t, qualified](const List& values) {
                 t.method->check_args(qualified, values);
                 return deliver(values);
               })
      .then(value_to_list);
}

Future<Value> WorkerGroup::call_rank(int rank, const std::string& method, CallArgs args,
                                     CallOptions options) {
  if (rank < 0 || rank >= world_size()) {
    throw CallError("rank " + std::to_string(rank) + " is out of range for group " + name() +
                    " of " + std::to_string(world_size()) + " workers");
  }
  RoleSet::Target t = target(method);
  const std::string qualified = s_->roles->qualified(t);
  std::shared_ptr<State> s = s_;
  CallTracePtr trace =
      CallTrace::start(s_->lanes, qualified + " (rank " + std::to_string(rank) + ")");
  auto deliver = [s, t, rank, options, trace, waits = args.has_futures()](const List& values) {
    if (waits) waited_for_arguments(trace.get());
    std::vector<int> only(s->workers.size(), -1);
    only[rank] = 0;
    return traced(send_chunks(s->workers, t.wire_name, {values}, only, options, trace.get()).futures[0],
                  trace);
  };
  if (!args.has_futures()) {
    List values = args.take_values();
    t.method->check_args(qualified, values);
    return s_->submit({}, qualified, [deliver, values = std::move(values)](const List&) {
      return deliver(values);
    });
  }
  return s_->submit(std::move(args), qualified, [deliver, t, qualified](const List& values) {
    t.method->check_args(qualified, values);
    return deliver(values);
  });
}

Future<List> WorkerGroup::call_per_rank(const std::string& method, std::vector<List> per_rank_args,
                                        CallOptions options) {
  RoleSet::Target t = target(method);
  const std::string qualified = s_->roles->qualified(t);
  if (static_cast<int>(per_rank_args.size()) != world_size()) {
    throw CallError(qualified + ": per-rank arguments for " + std::to_string(per_rank_args.size()) +
                    " ranks, but group " + name() + " has " + std::to_string(world_size()));
  }
  for (size_t r = 0; r < per_rank_args.size(); ++r) {
    try {
      t.method->check_args(qualified, per_rank_args[r]);
    } catch (const CallError& e) {
      throw CallError(std::string(e.what()) + " (rank " + std::to_string(r) + ")");
    }
  }
  std::shared_ptr<State> s = s_;
  CallTracePtr trace = CallTrace::start(s_->lanes, qualified + " (per rank)");
  return s_
      ->submit({}, qualified,
               [s, t, options, per_rank_args = std::move(per_rank_args), trace](const List&) {
                 std::vector<int> own(per_rank_args.size());
                 for (size_t r = 0; r < own.size(); ++r) own[r] = static_cast<int>(r);
                 return traced(gather(send_chunks(s->workers, t.wire_name, per_rank_args, own,
                                                  options, trace.get()))
                                   .then(list_to_value),
                               trace);
               })
      .then(value_to_list);
}

void WorkerGroup::set_profiling(bool on) {
  const std::string wire = s_->roles->find(role_ < 0 ? 0 : static_cast<size_t>(role_),
                                           "_profiler_set").wire_name;
  std::shared_ptr<State> s = s_;
  s_->submit({}, name() + " set_profiling", [s, wire, on](const List&) {
      std::vector<int> everyone(s->workers.size(), 0);
      return gather(send_chunks(s->workers, wire, {{Value(on)}}, everyone, {}, nullptr))
          .then(list_to_value);
    }).get();
}

std::vector<profiler::ProcessProfile> WorkerGroup::collect_profile(int64_t origin_ns) {
  auto wire = [&](const char* method) {
    return s_->roles->find(role_ < 0 ? 0 : static_cast<size_t>(role_), method).wire_name;
  };
  const size_t n = s_->workers.size();
  // Round trips, each stamped here just before its message is queued and on
  // the I/O thread as its answer arrives (in a continuation, so that the
  // stamp is made before get() returns); the shortest per worker is used.
  constexpr int kRoundTrips = 8;
  std::vector<std::vector<profiler::ClockSample>> samples(n);
  std::vector<std::string> domains(n);
  for (int round = 0; round < kRoundTrips; ++round) {
    const OutgoingCall msg = WorkerProcess::encode_call(wire("_profiler_clock"), {});
    std::vector<int64_t> sent(n);
    std::vector<Future<List>> answers;
    for (size_t r = 0; r < n; ++r) {
      sent[r] = profiler::now_ns();
      answers.push_back(s_->workers[r]->send(msg, std::nullopt).then([](const Value& v) {
        return List{v, Value(profiler::now_ns())};
      }));
    }
    if (msg.segment) Driver::get().pool().release(*msg.segment, kSelfPeer);
    for (size_t r = 0; r < n; ++r) {
      const List a = answers[r].get();
      const List& reading = a[0].as_list();
      samples[r].push_back({sent[r], reading[0].as_int(), a[1].as_int()});
      domains[r] = reading[1].as_string();
    }
  }
  std::vector<profiler::ProcessProfile> out(n);
  std::vector<Future<Value>> parts;
  for (size_t r = 0; r < n; ++r) {
    const WorkerProcess& w = *s_->workers[r];
    out[r].pid = w.trace_pid();
    out[r].name = w.info().class_name + ":rank " + std::to_string(w.info().rank);
    out[r].clock = profiler::estimate_clock_offset(samples[r], domains[r] == profiler::clock_domain());
    // The worker's clock reads its events' times as `origin + offset`.
    std::vector<int> only(n, -1);
    only[r] = 0;
    parts.push_back(send_chunks(s_->workers, wire("_profiler_collect"),
                                {{Value(out[r].pid), Value(out[r].name),
                                  Value(origin_ns + out[r].clock.applied_ns())}},
                                only, {}, nullptr)
                        .futures[0]);
  }
  for (size_t r = 0; r < n; ++r) out[r].events_json = parts[r].get().as_string();
  return out;
}

void WorkerGroup::shutdown(std::chrono::milliseconds grace) { s_->shutdown(grace); }

}  // namespace baton
