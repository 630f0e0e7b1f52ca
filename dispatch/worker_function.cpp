#include "dispatch/worker_function.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>

#include "runtime/errors.h"
#include "runtime/method_table.h"
#include "runtime/runtime.h"

namespace baton {

namespace {

struct Functions {
  std::mutex mu;
  std::map<std::string, WorkerFunction> by_name;
};

Functions& functions() {
  static Functions* f = new Functions();  // never destroyed: used at static init and exit
  return *f;
}

}  // namespace

void register_function(const std::string& name, WorkerFunction fn) {
  if (!fn) throw Error("register_function('" + name + "'): empty function");
  Functions& f = functions();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.by_name.count(name)) throw Error("a function named '" + name + "' is already registered");
  if (!is_worker_process() && is_initialized()) {
    throw Error("register_function('" + name +
                "') after baton::init(): worker processes would never have it; register it "
                "with BATON_FUNCTION at namespace scope, or before baton::init()");
  }
  f.by_name.emplace(name, std::move(fn));
}

void register_function(const std::string& name, ProtoFunction fn) {
  if (!fn) throw Error("register_function('" + name + "'): empty function");
  register_function(name, WorkerFunction([fn](Worker& w, const List& chunks) -> Value {
                      if (chunks.size() != 1) {
                        throw Error("it takes one DataProto argument, the call gave " +
                                    std::to_string(chunks.size()));
                      }
                      return fn(w, DataProto::from_value(chunks[0])).to_value();
                    }));
}

bool has_function(const std::string& name) {
  Functions& f = functions();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.by_name.count(name) > 0;
}

std::vector<std::string> function_names() {
  Functions& f = functions();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<std::string> out;
  for (const auto& [n, fn] : f.by_name) out.push_back(n);
  return out;
}

Value call_function(const std::string& name, Worker& worker, const List& chunks) {
  WorkerFunction fn;
  {
    Functions& f = functions();
    std::lock_guard<std::mutex> lock(f.mu);
    auto it = f.by_name.find(name);
    if (it == f.by_name.end()) {
      throw Error("function '" + name +
                  "' is not registered in this process (register it with BATON_FUNCTION, or "
                  "before baton::init())");
    }
    fn = it->second;
  }
  try {
    return fn(worker, chunks);
  } catch (const c10::Error& e) {  // LibTorch's message, without its backtrace
    throw Error("function '" + name + "': " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error("function '" + name + "': " + e.what());
  }
}

namespace detail {

void register_execute_with_func() {
  MethodSpec m;
  m.name = kExecuteWithFunc;
  m.params = {TypeSpec::of(ValueKind::kString), TypeSpec::of(ValueKind::kDict)};
  m.variadic = true;  // (name, DataProto...)
  m.result = TypeSpec::any();
  m.options.dispatch_mode = dispatch_mode::kDpComputeProtoWithFunc;
  m.invoke = [](Worker& w, const List& args) {
    return call_function(args[0].as_string(), w, List(args.begin() + 1, args.end()));
  };
  register_builtin_method(std::move(m));
}

}  // namespace detail

}  // namespace baton
