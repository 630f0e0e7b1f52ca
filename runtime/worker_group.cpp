#include "runtime/worker_group.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <utility>

#include "runtime/dispatch_registry.h"
#include "runtime/driver.h"
#include "runtime/errors.h"
#include "runtime/worker_process.h"

namespace baton {

struct WorkerGroup::State {
  std::string name;
  ParallelLayout layout;
  std::unique_ptr<RoleSet> roles;
  ResourcePool pool;
  bool claimed = false;
  // The rendezvous for the workers' c10d groups; the driver only hosts it.
  std::unique_ptr<c10d::TCPStore> store;
  std::vector<std::shared_ptr<WorkerProcess>> workers;
  std::shared_ptr<std::function<void()>> exit_hook;

  std::mutex mu;
  std::map<std::pair<int, std::string>, MeshInfo> meshes;  // (role or -1, mesh)
  std::string failure;  // what happened to the first worker that died
  bool stopping = false;

  explicit State(ResourcePool p) : pool(std::move(p)) {}

  void on_death(WorkerProcess& dead, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping || !failure.empty()) return;
      failure = what;
    }
    spdlog::error("baton: group {} failed, stopping its other workers: {}", name, what);
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

std::atomic<int> group_counter{0};

int cores() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

Future<List> gather(std::vector<Future<Value>> futures) {
  struct Acc {
    std::mutex mu;
    List results;
    size_t left;
    Promise<List> promise;
  };
  auto acc = std::make_shared<Acc>();
  acc->results.resize(futures.size());
  acc->left = futures.size();
  if (futures.empty()) acc->promise.set_value({});
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].on_complete([acc, i](const Future<Value>& f) {
      if (auto e = f.error()) {
        acc->promise.set_error(e);
        return;
      }
      bool last;
      {
        std::lock_guard<std::mutex> lock(acc->mu);
        acc->results[i] = f.get();
        last = --acc->left == 0;
      }
      if (last) acc->promise.set_value(std::move(acc->results));
    });
  }
  return acc->promise.future();
}

// Sends chunk `chunk_of_rank[r]` of `chunks` to each rank r (none where it
// is -1), encoding each chunk once, however many ranks receive it. Returns
// the futures in ascending rank order, with their ranks.
struct Sent {
  std::vector<Future<Value>> futures;
  std::vector<int> ranks;
};
Sent send_chunks(const std::vector<std::shared_ptr<WorkerProcess>>& workers,
                 const std::string& method, const std::vector<List>& chunks,
                 const std::vector<int>& chunk_of_rank, const CallOptions& options) {
  std::vector<std::optional<OutgoingCall>> messages(chunks.size());
  Sent sent;
  for (size_t r = 0; r < workers.size(); ++r) {
    int c = chunk_of_rank[r];
    if (c < 0) continue;
    if (!messages[c]) messages[c] = WorkerProcess::encode_call(method, chunks[c]);
    sent.futures.push_back(workers[r]->send(*messages[c], options.timeout));
    sent.ranks.push_back(static_cast<int>(r));
  }
  for (const auto& msg : messages) {
    if (msg && msg->segment) Driver::get().pool().release(*msg->segment, kSelfPeer);
  }
  return sent;
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
                        const CollectFn& collect, DispatchPlan plan, const CallOptions& options) {
  Sent sent = send_chunks(workers, wire_name, plan.chunks, plan.chunk_of_rank, options);
  // Hand the collected ranks' results, in rank order, to the collect function.
  return gather(std::move(sent.futures))
      .then([where, collect, ranks = std::move(sent.ranks), mask = std::move(plan.collect),
             pad = plan.pad, info = std::move(plan.info)](const List& results) {
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
}

}  // namespace

WorkerGroup::WorkerGroup(std::shared_ptr<State> s, int role, bool owner)
    : s_(std::move(s)), role_(role), owner_(owner) {}
WorkerGroup::WorkerGroup(WorkerGroup&&) noexcept = default;
WorkerGroup& WorkerGroup::operator=(WorkerGroup&& other) noexcept {
  if (this != &other) {
    if (s_ && owner_) s_->shutdown(std::chrono::seconds(10));
    s_ = std::move(other.s_);
    role_ = other.role_;
    owner_ = other.owner_;
  }
  return *this;
}
WorkerGroup::~WorkerGroup() {
  if (s_ && owner_) s_->shutdown(std::chrono::seconds(10));
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
  s->name = options.name.empty() ? class_name + "_" + std::to_string(group_counter++) : options.name;
  s->layout = options.layout.value_or(ParallelLayout::data_parallel(pool.world_size()));
  if (s->layout.world_size() != pool.world_size() || s->layout.tp < 1 || s->layout.cp < 1 ||
      s->layout.dp < 1 || s->layout.pp < 1) {
    throw CallError("WorkerGroup " + s->name + ": layout " + s->layout.to_string() + " has " +
                    std::to_string(s->layout.world_size()) + " ranks, the pool has " +
                    std::to_string(pool.world_size()));
  }
  s->pool.claim();
  s->claimed = true;
  WorkerGroup group(s, -1, true);  // from here on, a throw shuts the partial group down

  c10d::TCPStoreOptions store_options;
  store_options.port = 0;  // any free port
  store_options.isServer = true;
  store_options.waitWorkers = false;
  s->store = std::make_unique<c10d::TCPStore>("127.0.0.1", store_options);

  std::weak_ptr<State> weak = s;
  auto on_death = [weak](WorkerProcess& w, const std::string& what) {
    if (auto state = weak.lock()) state->on_death(w, what);
  };
  const ResourcePoolOptions& po = pool.options();
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
    info.intra_op_threads = std::max(1, cores() / p.local_world_size);
    info.master_addr = "127.0.0.1";
    info.master_port = s->store->getPort();
    info.layout = s->layout;
    info.coords = s->layout.coords(p.rank);
    s->workers.push_back(WorkerProcess::spawn(std::move(info), on_death));
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
  Sent sent = send_chunks(s_->workers, target("_query_mesh").wire_name, {{mesh}}, everyone, {});
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

Future<Value> WorkerGroup::call(const std::string& method, List args, CallOptions options) {
  RoleSet::Target t = target(method);
  const MethodOptions& mo = t.method->options;
  if (mo.execute_mode == Execute::kRankZero) {
    return call_rank(0, method, std::move(args), options);
  }
  const std::string where = s_->roles->qualified(t) + " (" + mo.dispatch_mode + ")";
  DispatchMode mode = find_dispatch_mode(mo.dispatch_mode);
  // The dispatch function sees the method's role (its meshes) or the group.
  const int view_role = s_->roles->colocated() ? static_cast<int>(t.role) : -1;
  DispatchPlan plan =
      plan_call(WorkerGroup(s_, view_role, false), *s_->roles, t, where, mode, args);
  return send_plan(s_->workers, t.wire_name, where, mode.collect, std::move(plan), options);
}

Future<List> WorkerGroup::call_all(const std::string& method, List args, CallOptions options) {
  RoleSet::Target t = target(method);
  t.method->check_args(s_->roles->qualified(t), args);
  std::vector<int> everyone(s_->workers.size(), 0);
  return gather(send_chunks(s_->workers, t.wire_name, {args}, everyone, options).futures);
}

Future<Value> WorkerGroup::call_rank(int rank, const std::string& method, List args,
                                     CallOptions options) {
  if (rank < 0 || rank >= world_size()) {
    throw CallError("rank " + std::to_string(rank) + " is out of range for group " + name() +
                    " of " + std::to_string(world_size()) + " workers");
  }
  RoleSet::Target t = target(method);
  t.method->check_args(s_->roles->qualified(t), args);
  std::vector<int> only(s_->workers.size(), -1);
  only[rank] = 0;
  return send_chunks(s_->workers, t.wire_name, {args}, only, options).futures[0];
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
  std::vector<int> own(per_rank_args.size());
  for (size_t r = 0; r < own.size(); ++r) own[r] = static_cast<int>(r);
  return gather(send_chunks(s_->workers, t.wire_name, per_rank_args, own, options).futures);
}

void WorkerGroup::shutdown(std::chrono::milliseconds grace) { s_->shutdown(grace); }

}  // namespace baton
