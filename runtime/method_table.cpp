#include "runtime/method_table.h"

#include <algorithm>

#include "base/profiler.h"
#include "runtime/dispatch_registry.h"
#include "runtime/runtime.h"

namespace baton {

namespace {

// The profiler's side in every worker process (WorkerGroup::set_profiling and
// collect_profile call them; the worker host does not trace them):
//   _profiler_set(on)                     turns recording on or off
//   _profiler_clock() -> [now_ns, domain] a clock reading and the clock's domain
//   _profiler_collect(pid, name, origin_ns) -> string
//                                         the process's events as Chrome trace JSON
std::vector<MethodSpec> profiler_methods() {
  std::vector<MethodSpec> out(3);
  out[0].name = "_profiler_set";
  out[0].params = {TypeSpec::of(ValueKind::kBool)};
  out[0].result = TypeSpec::of(ValueKind::kNone);
  out[0].invoke = [](Worker&, const List& args) {
    profiler::set_enabled(args[0].as_bool());
    return Value();
  };
  out[1].name = "_profiler_clock";
  out[1].result = TypeSpec::of(ValueKind::kList);
  out[1].invoke = [](Worker&, const List&) {
    return Value(List{Value(profiler::now_ns()), Value(profiler::clock_domain())});
  };
  out[2].name = "_profiler_collect";
  out[2].params = {TypeSpec::of(ValueKind::kInt), TypeSpec::of(ValueKind::kString),
                   TypeSpec::of(ValueKind::kInt)};
  out[2].result = TypeSpec::of(ValueKind::kString);
  out[2].invoke = [](Worker&, const List& args) {
    return Value(profiler::collect_process(static_cast<int>(args[0].as_int()), args[1].as_string(),
                                           args[2].as_int())
                     .events_json);
  };
  return out;
}

Registry<MethodSpec>& builtins() {
  static auto* methods = [] {
    auto* r = new Registry<MethodSpec>("built-in method");
    // The driver asks each worker (each role of a colocated one) for its place
    // in a mesh.
    WorkerClassSpec spec;
    MethodTable<Worker>(spec).def("_query_mesh", &Worker::mesh_entry);
    for (auto& [name, method] : spec.methods) r->add(name, std::move(method));
    for (MethodSpec& p : profiler_methods()) {
      std::string name = p.name;  // before p is moved
      r->add(std::move(name), std::move(p));
    }
    return r;
  }();
  return *methods;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

std::string MethodSpec::signature() const {
  std::string s = name + "(";
  for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i].name();
  return s + (variadic ? "...) -> " : ") -> ") + result.name();
}

void MethodSpec::check_args(const std::string& qualified_name, const List& args) const {
  const size_t fixed = variadic ? params.size() - 1 : params.size();
  if (variadic ? args.size() < fixed : args.size() != fixed) {
    throw CallError(qualified_name + " takes " + (variadic ? "at least " : "") +
                    std::to_string(fixed) + " argument(s), " + std::to_string(args.size()) +
                    " given; signature: " + signature());
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const TypeSpec& param = params[std::min(i, params.size() - 1)];
    if (auto m = param.mismatch(args[i])) {
      throw CallError(qualified_name + ": argument " + std::to_string(i) + ": " + *m +
                      "; signature: " + signature());
    }
  }
}

const MethodSpec& WorkerClassSpec::method(const std::string& method) const {
  auto it = methods.find(method);
  if (it != methods.end()) return it->second;
  if (const MethodSpec* builtin = find_builtin_method(method)) return *builtin;
  throw CallError("worker class " + name + " has no method '" + method +
                  "'; registered methods: " + join(method_names()));
}

std::vector<std::string> WorkerClassSpec::method_names() const {
  std::vector<std::string> out;
  for (const auto& [n, m] : methods) out.push_back(n);
  for (const auto& n : builtin_method_names()) {
    if (n[0] != '_' && !methods.count(n)) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void register_builtin_method(MethodSpec spec) {
  if (spec.variadic && spec.params.empty()) {
    throw Error("built-in method " + spec.name + ": variadic, but without parameters");
  }
  std::string name = spec.name;
  builtins().add(std::move(name), std::move(spec));
}

const MethodSpec* find_builtin_method(const std::string& name) { return builtins().find(name); }

std::vector<std::string> builtin_method_names() { return builtins().names(); }

void WorkerRegistry::check_dispatch_modes(const WorkerClassSpec& spec) const {
  std::lock_guard<std::mutex> lock(checked_mu_);
  if (checked_.count(spec.name)) return;
  for (const auto& [name, method] : spec.methods) {
    try {
      find_dispatch_mode(method.options.dispatch_mode);
    } catch (const CallError& e) {
      throw CallError("worker class " + spec.name + ", method '" + name + "': " + e.what());
    }
  }
  checked_.insert(spec.name);
}

WorkerRegistry& WorkerRegistry::global() {
  static WorkerRegistry registry;
  return registry;
}

void WorkerRegistry::add(WorkerClassSpec spec) {
  std::string name = spec.name;
  classes_.add(std::move(name), std::move(spec));
}

const WorkerClassSpec& WorkerRegistry::get(const std::string& class_name) const {
  const WorkerClassSpec& spec = classes_.get(class_name);
  if (!is_worker_process()) check_dispatch_modes(spec);
  return spec;
}

}  // namespace baton
