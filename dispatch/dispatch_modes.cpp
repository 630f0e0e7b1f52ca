#include "dispatch/dispatch_modes.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "base/errors.h"
#include "dispatch/data_proto.h"
#include "dispatch/worker_function.h"
#include "runtime/dispatch_registry.h"
#include "runtime/worker_group.h"

namespace baton {

namespace {

// Every argument as a DataProto, all with the same number of rows. Errors
// number the arguments from `first` (the caller's position of args[0]).
std::vector<DataProto> proto_arguments(const List& args, size_t first = 0) {
  std::vector<DataProto> out;
  for (size_t i = 0; i < args.size(); ++i) {
    try {
      out.push_back(DataProto::from_value(args[i]));
    } catch (const Error& e) {
      throw CallError("argument " + std::to_string(first + i) +
                      " must be a DataProto: " + e.what());
    }
    if (out.back().size() != out.front().size()) {
      throw CallError("argument " + std::to_string(first + i) + " has " +
                      std::to_string(out.back().size()) + " rows, argument " +
                      std::to_string(first) + " has " + std::to_string(out.front().size()));
    }
  }
  return out;
}

DispatchPlan dp_compute_proto(const WorkerGroup& g, const List& args) {
  const int n = g.world_size();
  DispatchPlan p;
  p.chunks.resize(static_cast<size_t>(n));
  int64_t rows = 0;
  for (const DataProto& batch : proto_arguments(args)) {
    rows = batch.size();
    auto [padded, pad] = batch.pad_to_multiple(n);
    p.pad = pad;
    std::vector<DataProto> parts = padded.chunk(n);
    for (int r = 0; r < n; ++r) p.chunks[r].push_back(parts[r].to_value());
  }
  for (int r = 0; r < n; ++r) p.chunk_of_rank.push_back(r);
  p.info = Value((rows + p.pad) / n);  // rows each rank received
  return p;
}

Value collect_list(const CollectInput& in) { return Value(in.outputs); }

// Splits each DataProto argument into `parts` chunks (no padding); returns
// chunks[part] = the argument list for that part. `first` as in
// proto_arguments.
std::vector<List> split_protos(const List& args, int parts, size_t first = 0) {
  std::vector<List> chunks(static_cast<size_t>(parts));
  std::vector<DataProto> batches = proto_arguments(args, first);
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i].size() % parts != 0) {
      throw CallError("argument " + std::to_string(first + i) + " has " +
                      std::to_string(batches[i].size()) + " rows, not divisible into " +
                      std::to_string(parts) + " parts (this mode does not pad)");
    }
    std::vector<DataProto> pieces = batches[i].chunk(parts);
    for (int p = 0; p < parts; ++p) chunks[p].push_back(pieces[p].to_value());
  }
  return chunks;
}

// The layout's sizes and coordinates are int64; a group's ranks fit an int.
int pp_as_dp_index(const ParallelLayout& l, const ParallelCoords& c) {
  return static_cast<int>((c.cp * l.dp + c.dp) * l.pp + c.pp);
}

DispatchPlan megatron_plan(const WorkerGroup& g, std::vector<List> chunks) {
  const ParallelLayout& l = g.layout();
  DispatchPlan p;
  p.chunks = std::move(chunks);
  for (int r = 0; r < g.world_size(); ++r) {
    ParallelCoords c = l.coords(r);
    p.chunk_of_rank.push_back(static_cast<int>(c.dp));
    p.collect.push_back(c.tp == 0 && c.pp == l.pp - 1 && c.cp == 0);
  }
  return p;
}

DispatchPlan pp_as_dp_plan(const WorkerGroup& g, std::vector<List> chunks) {
  const ParallelLayout& l = g.layout();
  DispatchPlan p;
  p.chunks = std::move(chunks);
  std::vector<int64_t> order;  // per rank: its chunk index, the order results are collected in
  for (int r = 0; r < g.world_size(); ++r) {
    ParallelCoords c = l.coords(r);
    int idx = pp_as_dp_index(l, c);
    p.chunk_of_rank.push_back(idx);
    p.collect.push_back(c.tp == 0);
    order.push_back(idx);
  }
  // The Values are made in place: pushing them one by one into a List makes
  // GCC 12 warn (wrongly) about every alternative of each moved variant.
  p.info = Value(List(order.begin(), order.end()));
  return p;
}

// The collected outputs (and their ranks) reordered by the chunk index each
// rank received.
CollectInput in_chunk_order(const CollectInput& in) {
  std::vector<size_t> idx(in.outputs.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  const List& order = in.info.as_list();
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return order[in.ranks[a]].as_int() < order[in.ranks[b]].as_int();
  });
  CollectInput out;
  for (size_t i : idx) {
    out.outputs.push_back(in.outputs[i]);
    out.ranks.push_back(in.ranks[i]);
  }
  return out;
}

Value concat_protos(const List& outputs, const std::vector<int>& ranks) {
  std::vector<DataProto> parts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    try {
      parts.push_back(DataProto::from_value(outputs[i]));
    } catch (const Error& e) {
      throw Error("rank " + std::to_string(ranks[i]) + " did not return a DataProto: " + e.what());
    }
  }
  return DataProto::concat(parts).to_value();
}

// Argument 0 names a registered function, sent to every rank; the rest are
// DataProtos, chunked (no padding) by the world size.
DispatchPlan dp_compute_proto_with_func(const WorkerGroup& g, const List& args) {
  if (args.empty() || args[0].kind() != ValueKind::kString) {
    throw CallError(
        "argument 0 must name a function registered with BATON_FUNCTION or "
        "register_function, got " +
        (args.empty() ? std::string("no arguments")
                      : std::string("a ") + kind_name(args[0].kind())));
  }
  const std::string& fn = args[0].as_string();
  if (!has_function(fn)) {
    std::string known;
    for (const std::string& n : function_names()) known += (known.empty() ? "" : ", ") + n;
    throw CallError("function '" + fn +
                    "' is not registered (BATON_FUNCTION or register_function); registered: " +
                    (known.empty() ? "none" : known));
  }
  const int n = g.world_size();
  DispatchPlan p;
  p.chunks = split_protos(List(args.begin() + 1, args.end()), n, 1);
  for (int r = 0; r < n; ++r) {
    p.chunks[r].insert(p.chunks[r].begin(), args[0]);
    p.chunk_of_rank.push_back(r);
  }
  return p;
}

Value collect_concat(const CollectInput& in) {
  std::vector<DataProto> parts;
  const int64_t expected = in.info.kind() == ValueKind::kInt ? in.info.as_int() : -1;
  for (size_t i = 0; i < in.outputs.size(); ++i) {
    DataProto part;
    try {
      part = DataProto::from_value(in.outputs[i]);
    } catch (const Error& e) {
      throw Error("rank " + std::to_string(in.ranks[i]) + " did not return a DataProto: " +
                  e.what());
    }
    if (in.pad > 0 && part.size() != expected) {
      throw Error("rank " + std::to_string(in.ranks[i]) + " returned " +
                  std::to_string(part.size()) + " rows for a chunk of " + std::to_string(expected) +
                  "; padding can only be removed when every rank returns one row per input row");
    }
    parts.push_back(std::move(part));
  }
  return DataProto::concat(parts).unpad(in.pad).to_value();
}

// The modes, and the built-in method execute_with_func, once per process.
void register_modes_once() {
  // DP_COMPUTE lays arguments out exactly as ALL_TO_ALL does.
  DispatchMode all_to_all = find_dispatch_mode(dispatch_mode::kAllToAll);
  replace_dispatch_mode(dispatch_mode::kDpCompute, all_to_all.dispatch, all_to_all.collect);
  replace_dispatch_mode(dispatch_mode::kDpComputeProto, dp_compute_proto, collect_concat);
  replace_dispatch_mode(dispatch_mode::kDpComputeMetric, dp_compute_proto, collect_list);

  replace_dispatch_mode(
      dispatch_mode::kMegatronCompute,
      [](const WorkerGroup& g, const List& args) {
        return megatron_plan(g, split_list_arguments(args, g.layout().dp,
                                                     dispatch_mode::kMegatronCompute,
                                                     "data-parallel rank"));
      },
      collect_list);
  replace_dispatch_mode(
      dispatch_mode::kMegatronComputeProto,
      [](const WorkerGroup& g, const List& args) {
        return megatron_plan(g, split_protos(args, g.layout().dp));
      },
      [](const CollectInput& in) { return concat_protos(in.outputs, in.ranks); });
  auto pp_dp_cp = [](const WorkerGroup& g) {
    return g.layout().pp * g.layout().dp * g.layout().cp;
  };
  replace_dispatch_mode(
      dispatch_mode::kMegatronPpAsDp,
      [pp_dp_cp](const WorkerGroup& g, const List& args) {
        return pp_as_dp_plan(g, split_list_arguments(args, pp_dp_cp(g),
                                                     dispatch_mode::kMegatronPpAsDp,
                                                     "(pp, dp, cp) part"));
      },
      [](const CollectInput& in) { return Value(in_chunk_order(in).outputs); });
  replace_dispatch_mode(
      dispatch_mode::kMegatronPpAsDpProto,
      [pp_dp_cp](const WorkerGroup& g, const List& args) {
        return pp_as_dp_plan(g, split_protos(args, pp_dp_cp(g)));
      },
      [](const CollectInput& in) {
        CollectInput ordered = in_chunk_order(in);
        return concat_protos(ordered.outputs, ordered.ranks);
      });
  DispatchMode one_to_all = find_dispatch_mode(dispatch_mode::kOneToAll);
  replace_dispatch_mode(
      dispatch_mode::kMegatronPpOnly,
      [one_to_all](const WorkerGroup& g, const List& args) {
        DispatchPlan p = one_to_all.dispatch(g, args);
        for (int r = 0; r < g.world_size(); ++r) {
          ParallelCoords c = g.layout().coords(r);
          p.collect.push_back(c.tp == 0 && c.dp == 0 && c.cp == 0);
        }
        return p;
      },
      collect_list);
  replace_dispatch_mode(dispatch_mode::kDpComputeProtoWithFunc, dp_compute_proto_with_func,
                        [](const CollectInput& in) { return concat_protos(in.outputs, in.ranks); });
  detail::register_execute_with_func();
}

}  // namespace

std::string dispatch_mode::mesh_proto(const std::string& mesh) {
  std::string name = "MESH_PROTO:" + mesh;
  replace_dispatch_mode(
      name,
      [mesh](const WorkerGroup& g, const List& args) {
        MeshInfo info = g.mesh(mesh);
        DispatchPlan p;
        p.chunks = split_protos(args, info.dp_size);
        p.chunk_of_rank = info.dp_rank;
        p.collect = info.collect;
        return p;
      },
      [](const CollectInput& in) { return concat_protos(in.outputs, in.ranks); });
  return name;
}

void register_dispatch_modes() {
  static std::once_flag once;
  std::call_once(once, register_modes_once);
}

}  // namespace baton
