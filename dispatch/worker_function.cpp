#include "dispatch/worker_function.h"

#include <c10/util/Exception.h>

#include <utility>

#include "base/errors.h"
#include "base/registry.h"
#include "runtime/method_table.h"
#include "runtime/runtime.h"

namespace baton {

namespace {

Registry<WorkerFunction>& functions() {
  // Never destroyed: used at static initialisation and at exit.
  static auto* registry = new Registry<WorkerFunction>(
      "function",
      "each process has the functions registered with BATON_FUNCTION, or before "
      "baton::init()");
  return *registry;
}

}  // namespace

void register_function(const std::string& name, WorkerFunction fn) {
  if (!fn) throw Error("register_function('" + name + "'): empty function");
  // A taken name is reported as such, after init() too.
  if (!is_worker_process() && is_initialized() && !functions().find(name)) {
    throw Error("register_function('" + name +
                "') after baton::init(): worker processes would never have it; register it "
                "with BATON_FUNCTION at namespace scope, or before baton::init()");
  }
  functions().add(name, std::move(fn));
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

bool has_function(const std::string& name) { return functions().find(name) != nullptr; }

std::vector<std::string> function_names() { return functions().names(); }

Value call_function(const std::string& name, Worker& worker, const List& chunks) {
  const WorkerFunction fn = functions().get(name);
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
