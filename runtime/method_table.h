// Registration of worker classes and their methods, with typed arguments and
// results (see value_traits.h for the supported C++ types).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "base/registry.h"
#include "runtime/value.h"
#include "runtime/worker.h"

namespace baton {

// Names of the built-in dispatch modes. The dispatch layer registers more.
namespace dispatch_mode {
inline constexpr const char* kOneToAll = "ONE_TO_ALL";  // same arguments to every worker
inline constexpr const char* kAllToAll = "ALL_TO_ALL";  // argument i is a list, rank r gets element r
}  // namespace dispatch_mode

enum class Execute {
  kAll,       // every worker runs the method
  kRankZero,  // only rank 0 runs it
};

// How a registered method is called by WorkerGroup::call. The dispatch mode
// is a name in the dispatch registry (dispatch_registry.h): the constants in
// baton::dispatch_mode (here and in dispatch/dispatch_modes.h), or a mode of
// your own. Spawning a group checks that every method's mode is registered
// (see WorkerRegistry::get), so a misspelt mode fails before any worker
// starts, naming the method; register your own modes before spawning.
//
// Example:
//   t.def("shard", &W::shard, MethodOptions().set_dispatch_mode(dispatch_mode::kAllToAll));
//   t.def("head", &W::head, MethodOptions().set_execute_mode(Execute::kRankZero));
struct MethodOptions {
  std::string dispatch_mode = dispatch_mode::kOneToAll;
  Execute execute_mode = Execute::kAll;

  MethodOptions& set_dispatch_mode(std::string mode) {
    dispatch_mode = std::move(mode);
    return *this;
  }
  MethodOptions& set_execute_mode(Execute mode) {
    execute_mode = mode;
    return *this;
  }
};

// A registered method, type-erased.
struct MethodSpec {
  std::string name;
  std::vector<TypeSpec> params;
  // The last parameter repeats: it stands for zero or more trailing arguments
  // of its type (params must not be empty).
  bool variadic = false;
  TypeSpec result;
  MethodOptions options;
  std::function<Value(Worker&, const List&)> invoke;

  // "add(int, list<float>) -> tensor", "execute_with_func(string, dict...) -> any"
  std::string signature() const;
  // Throws CallError naming the method (`qualified_name`, e.g. "Adder.add"),
  // the parameter and the mismatch.
  void check_args(const std::string& qualified_name, const List& args) const;
};

struct WorkerClassSpec {
  std::string name;
  std::function<std::unique_ptr<Worker>(const List& init_args)> factory;
  std::map<std::string, MethodSpec> methods;

  // The class's own method, else a built-in one (see register_builtin_method).
  // Throws CallError listing the available methods if `method` is unknown.
  const MethodSpec& method(const std::string& method) const;
  // The names of the class's methods and of the public built-in ones.
  std::vector<std::string> method_names() const;
};

// Built-in methods: every worker class has them, in addition to its own (a
// class's own method of the same name wins). The runtime registers
// "_query_mesh" (Worker::mesh_entry); the dispatch library "execute_with_func".
// REQUIRES: called during static initialisation, or at least before any
// worker group is spawned. Throws baton::Error if `name` is empty or taken.
// Names starting with '_' are internal: error messages leave them out.
void register_builtin_method(MethodSpec spec);
// nullptr if there is no built-in method `name`.
const MethodSpec* find_builtin_method(const std::string& name);
std::vector<std::string> builtin_method_names();

// Process-wide registry of worker classes, filled by BATON_WORKER at static
// initialisation. Thread-safe.
class WorkerRegistry {
 public:
  static WorkerRegistry& global();
  // Throws baton::InvalidArgument if a class of that name is registered.
  void add(WorkerClassSpec spec);
  // Throws CallError naming the class, the nearest registered name and every
  // registered one if it was never registered. In the driver (not in a worker
  // process, which never dispatches) it also checks, at the class's first
  // lookup (WorkerGroup::spawn makes it, after static initialisation
  // registered the dispatch modes), that every method's dispatch mode is
  // registered: CallError naming the class, the method, the mode and the
  // registered ones otherwise.
  const WorkerClassSpec& get(const std::string& class_name) const;

 private:
  void check_dispatch_modes(const WorkerClassSpec& spec) const;

  Registry<WorkerClassSpec, CallError> classes_{"worker class", "register it with BATON_WORKER"};
  mutable std::mutex checked_mu_;
  mutable std::set<std::string> checked_;  // classes whose dispatch modes were found
};

template <class W>
class MethodTable {
 public:
  explicit MethodTable(WorkerClassSpec& spec) : spec_(spec) {}

  template <class R, class... A>
  MethodTable& def(const std::string& name, R (W::*fn)(A...), MethodOptions options = {}) {
    return def_impl<R, A...>(name, [fn](W& w, auto&&... a) -> R { return (w.*fn)(a...); },
                             std::move(options));
  }
  template <class R, class... A>
  MethodTable& def(const std::string& name, R (W::*fn)(A...) const, MethodOptions options = {}) {
    return def_impl<R, A...>(name, [fn](W& w, auto&&... a) -> R { return (w.*fn)(a...); },
                             std::move(options));
  }

 private:
  template <class R, class... A, class F>
  MethodTable& def_impl(const std::string& name, F call, MethodOptions options) {
    constexpr bool supported = (is_value_type_v<std::decay_t<A>> && ... && true) &&
                               result_supported<R>();
    if constexpr (!supported) {
      // One static_assert per unsupported type, naming it (value_traits.h).
      (require_value_type<std::decay_t<A>>(), ...);
      if constexpr (!std::is_void_v<R>) require_value_type<std::decay_t<R>>();
      return *this;
    } else {
      return def_supported<R, A...>(name, std::move(call), std::move(options));
    }
  }

  template <class R>
  static constexpr bool result_supported() {
    if constexpr (std::is_void_v<R>) {
      return true;
    } else {
      return is_value_type_v<std::decay_t<R>>;
    }
  }

  template <class T>
  static void require_value_type() {
    if constexpr (!is_value_type_v<T>) ValueTraits<T>::spec();  // fails, naming T
  }

  template <class R, class... A, class F>
  MethodTable& def_supported(const std::string& name, F call, MethodOptions options) {
    MethodSpec m;
    m.name = name;
    m.params = {ValueTraits<std::decay_t<A>>::spec()...};
    if constexpr (std::is_void_v<R>) {
      m.result = TypeSpec::of(ValueKind::kNone);
    } else {
      m.result = ValueTraits<std::decay_t<R>>::spec();
    }
    m.options = std::move(options);
    m.invoke = [call](Worker& w, const List& args) -> Value {
      return invoke_with<R, A...>(static_cast<W&>(w), call, args,
                                  std::index_sequence_for<A...>{});
    };
    spec_.methods[name] = std::move(m);
    return *this;
  }

  template <class R, class... A, class F, size_t... I>
  static Value invoke_with(W& w, const F& call, const List& args, std::index_sequence<I...>) {
    if constexpr (std::is_void_v<R>) {
      call(w, ValueTraits<std::decay_t<A>>::from_value(args[I])...);
      return Value();
    } else {
      return ValueTraits<std::decay_t<R>>::to_value(
          call(w, ValueTraits<std::decay_t<A>>::from_value(args[I])...));
    }
  }

  WorkerClassSpec& spec_;
};

template <class W>
bool register_worker_class(const std::string& name) {
  static_assert(std::is_base_of_v<Worker, W>, "a worker class must derive from baton::Worker");
  WorkerClassSpec spec;
  spec.name = name;
  spec.factory = [name](const List& init_args) -> std::unique_ptr<Worker> {
    if constexpr (std::is_constructible_v<W, const List&>) {
      return std::make_unique<W>(init_args);
    } else {
      static_assert(std::is_default_constructible_v<W>,
                    "a worker class needs W(const baton::List&) or W()");
      if (!init_args.empty()) {
        throw CallError("worker class " + name + " takes no init arguments, " +
                        std::to_string(init_args.size()) + " given");
      }
      return std::make_unique<W>();
    }
  };
  MethodTable<W> table(spec);
  W::register_methods(table);
  WorkerRegistry::global().add(std::move(spec));
  return true;
}

}  // namespace baton

// Registers a worker class under its own name. Use at namespace scope in a
// .cpp file linked into the driver executable.
#define BATON_WORKER(Class) \
  static const bool baton_worker_registered_##Class = ::baton::register_worker_class<Class>(#Class)
