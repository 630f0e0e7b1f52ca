#include "runtime/dispatch_registry.h"

#include "base/errors.h"
#include "base/registry.h"
#include "runtime/method_table.h"
#include "runtime/worker_group.h"

namespace baton {

namespace {

DispatchPlan one_to_all(const WorkerGroup& g, const List& args) {
  DispatchPlan p;
  p.chunks = {args};
  p.chunk_of_rank.assign(static_cast<size_t>(g.world_size()), 0);
  return p;
}

DispatchPlan all_to_all(const WorkerGroup& g, const List& args) {
  DispatchPlan p;
  p.chunks = split_list_arguments(args, g.world_size(), dispatch_mode::kAllToAll, "rank");
  for (int r = 0; r < g.world_size(); ++r) p.chunk_of_rank.push_back(r);
  return p;
}

Value collect_all(const CollectInput& in) { return Value(in.outputs); }

Registry<DispatchMode, CallError>& modes() {
  static Registry<DispatchMode, CallError>* registry = [] {
    auto* r = new Registry<DispatchMode, CallError>(
        "dispatch mode",
        "the DataProto modes come with dispatch/dispatch_modes.h; register your own with "
        "register_dispatch_mode before spawning a group that uses it");
    r->add(dispatch_mode::kOneToAll, {one_to_all, collect_all});
    r->add(dispatch_mode::kAllToAll, {all_to_all, collect_all});
    return r;
  }();
  return *registry;
}

}  // namespace

std::vector<List> split_list_arguments(const List& args, int parts, const std::string& mode,
                                       const std::string& part) {
  std::vector<List> out(static_cast<size_t>(parts));
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind() != ValueKind::kList || static_cast<int>(args[i].as_list().size()) != parts) {
      throw CallError(mode + ": argument " + std::to_string(i) +
                      " must be a list with one element per " + part + " (" +
                      std::to_string(parts) + "), got " +
                      (args[i].kind() == ValueKind::kList
                           ? "a list of " + std::to_string(args[i].as_list().size())
                           : std::string("a ") + kind_name(args[i].kind())));
    }
    for (int p = 0; p < parts; ++p) out[p].push_back(args[i].as_list()[p]);
  }
  return out;
}

void register_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect) {
  modes().add(name, {std::move(dispatch), std::move(collect)});
}

void replace_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect) {
  modes().replace(name, {std::move(dispatch), std::move(collect)});
}

DispatchMode find_dispatch_mode(const std::string& name) { return modes().get(name); }

}  // namespace baton
