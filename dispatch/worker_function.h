// Named worker functions, for DP_COMPUTE_PROTO_WITH_FUNC: verl's mode where
// the first argument is a function applied on each worker to its chunk of
// the batch. verl sends a pickled Python function; here the function is a
// C++ function registered under a name in every process, and the driver
// sends the name.
//
// Workers are the driver's executable re-executed, and run its main() only
// up to baton::init(): register functions at namespace scope (BATON_FUNCTION)
// or in main() before baton::init(). Registering one in the driver after
// init() is an error, since the workers would never see it.
//
// Every worker class (every role of a colocated group) has the built-in
// method "execute_with_func", registered with DP_COMPUTE_PROTO_WITH_FUNC:
// argument 0 is the function's name, the others DataProtos, each chunked by
// the world size without padding (the batch must divide). Rank r runs the
// function on its worker instance (for a role: that role's instance) and its
// chunks; the DataProtos returned are concatenated in rank order. An unknown
// name fails at the driver with a CallError naming the function and the
// method, before anything is sent.
//
// Example:
//   BATON_FUNCTION(add_one, [](baton::Worker& w, const baton::DataProto& batch) {
//     baton::DataProto out = batch;
//     out.set_tensor("x", batch.tensor("x") + 1);
//     return out;
//   });
//   ...
//   baton::DataProto out =
//       group.call(baton::kExecuteWithFunc, {"add_one", batch}).get().as<baton::DataProto>();
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/value.h"
#include "runtime/worker.h"

namespace baton {

inline constexpr const char* kExecuteWithFunc = "execute_with_func";

// The general form: the worker and the rank's chunks (one DataProto value per
// DataProto argument of the call).
using WorkerFunction = std::function<Value(Worker& worker, const List& chunks)>;
// One DataProto in, one out.
using ProtoFunction = std::function<DataProto(Worker& worker, const DataProto& chunk)>;

// Throws baton::Error if `name` is taken, or if this is the driver and
// baton::init() has run. Thread-safe.
void register_function(const std::string& name, WorkerFunction fn);
// A ProtoFunction called with other than one DataProto throws, giving the
// count.
void register_function(const std::string& name, ProtoFunction fn);

bool has_function(const std::string& name);
std::vector<std::string> function_names();

// Runs function `name` (in a worker: what execute_with_func does). Throws
// baton::Error naming the function if it is not registered in this process;
// an exception from the function comes out prefixed with its name.
Value call_function(const std::string& name, Worker& worker, const List& chunks);

namespace detail {
// Registers the built-in method execute_with_func (register_dispatch_modes
// calls it once).
void register_execute_with_func();
}  // namespace detail

}  // namespace baton

// Registers a function under the identifier `name`, at namespace scope, so
// that the driver and every worker have it:
//   BATON_FUNCTION(add_one, [](baton::Worker& w, const baton::DataProto& b) { ... });
#define BATON_FUNCTION(name, ...)                      \
  static const bool baton_function_registered_##name = \
      (::baton::register_function(#name, __VA_ARGS__), true)
