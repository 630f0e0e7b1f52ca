// Dispatch modes: how WorkerGroup::call lays a call's arguments out over the
// ranks, and how it collects the results. A mode is a pair of functions
// registered by name; the runtime registers ONE_TO_ALL and ALL_TO_ALL, the
// dispatch layer the DataProto modes, and users may add their own.
//
// Example:
//   register_dispatch_mode("FIRST_TWO",
//       [](const WorkerGroup& g, const List& args) {
//         DispatchPlan p;
//         p.chunks = {args};
//         p.chunk_of_rank.assign(g.world_size(), -1);
//         p.chunk_of_rank[0] = p.chunk_of_rank[1] = 0;
//         return p;
//       },
//       [](const CollectInput& in) { return Value(in.outputs); });
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/value.h"

namespace baton {

class WorkerGroup;

// Where each rank's arguments come from. Each distinct argument list is
// encoded, and its tensors copied to shared memory, once, however many
// ranks receive it (TP/PP replicas of one DP chunk).
struct DispatchPlan {
  std::vector<List> chunks;
  // Per rank: the index of its chunk, or -1 if the rank does not run the call.
  std::vector<int> chunk_of_rank;
  // Per rank: whether its result is collected. Empty: every rank that ran.
  std::vector<bool> collect;
  // Rows of padding the dispatch added; the collect function removes them.
  int64_t pad = 0;
  // Anything else the collect function needs to know about the dispatch.
  Value info;
};

// What a collect function gets: the results of the collected ranks, in rank
// order. It runs when the last of them arrives, on the runtime's I/O thread.
struct CollectInput {
  List outputs;
  std::vector<int> ranks;  // the rank of each output
  int64_t pad = 0;         // from the plan
  Value info;              // from the plan
};

using DispatchFn = std::function<DispatchPlan(const WorkerGroup&, const List& args)>;
using CollectFn = std::function<Value(const CollectInput&)>;

struct DispatchMode {
  DispatchFn dispatch;
  CollectFn collect;
};

// For dispatch functions: every argument must be a list of `parts` elements;
// returns, for each part, the list of its elements. Throws CallError
// ("<mode>: argument 1 must be a list with one element per <part> (4), got
// a list of 3").
std::vector<List> split_list_arguments(const List& args, int parts, const std::string& mode,
                                       const std::string& part);

// Throws baton::Error if `name` is taken (use replace_dispatch_mode).
// Thread safety: registering and looking up may race; replacing a mode may
// not race with a call that uses it: replace modes at start-up, before any
// group that uses them is spawned.
void register_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect);
void replace_dispatch_mode(const std::string& name, DispatchFn dispatch, CollectFn collect);
// A copy of the mode; throws CallError naming the registered modes if `name`
// is unknown.
DispatchMode find_dispatch_mode(const std::string& name);

}  // namespace baton
