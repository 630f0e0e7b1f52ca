#include "dispatch/dispatch_modes.h"

#include "dispatch/data_proto.h"
#include "runtime/dispatch_registry.h"
#include "runtime/errors.h"
#include "runtime/worker_group.h"

namespace baton {

namespace {

DispatchPlan dp_compute_proto(const WorkerGroup& g, const List& args) {
  const int n = g.world_size();
  DispatchPlan p;
  p.chunks.resize(static_cast<size_t>(n));
  int64_t rows = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    DataProto batch;
    try {
      batch = DataProto::from_value(args[i]);
    } catch (const Error& e) {
      throw CallError("argument " + std::to_string(i) + " must be a DataProto: " + e.what());
    }
    if (rows >= 0 && batch.size() != rows) {
      throw CallError("argument " + std::to_string(i) + " has " + std::to_string(batch.size()) +
                      " rows, argument 0 has " + std::to_string(rows));
    }
    rows = batch.size();
    auto [padded, pad] = batch.pad_to_multiple(n);
    p.pad = pad;
    std::vector<DataProto> parts = padded.chunk(n);
    for (int r = 0; r < n; ++r) p.chunks[r].push_back(parts[r].to_value());
  }
  for (int r = 0; r < n; ++r) p.chunk_of_rank.push_back(r);
  p.info = Value(rows < 0 ? 0 : (rows + p.pad) / n);  // rows each rank received
  return p;
}

Value collect_list(const CollectInput& in) { return Value(in.outputs); }

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

}  // namespace

// Called from data_proto.cpp's static initialiser, so that linking DataProto
// is enough to have these modes.
void register_data_proto_modes() {
  // DP_COMPUTE lays arguments out exactly as ALL_TO_ALL does.
  DispatchMode all_to_all = find_dispatch_mode(dispatch_mode::kAllToAll);
  replace_dispatch_mode(dispatch_mode::kDpCompute, all_to_all.dispatch, all_to_all.collect);
  replace_dispatch_mode(dispatch_mode::kDpComputeProto, dp_compute_proto, collect_concat);
  replace_dispatch_mode(dispatch_mode::kDpComputeMetric, dp_compute_proto, collect_list);
}

}  // namespace baton
