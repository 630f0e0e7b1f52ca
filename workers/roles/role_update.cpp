#include "workers/roles/role_update.h"

#include <algorithm>

#include "runtime/errors.h"
#include "workers/roles/role_model.h"

namespace baton::workers {

std::vector<DataProto> local_mini_batches(const DataProto& batch, const UpdateOptions& options,
                                          int64_t dp, int64_t& calls, const std::string& method) {
  const Value* step = batch.meta_value("global_steps");
  const int64_t call = step != nullptr && !step->is_none() ? step->as_int() : calls;
  ++calls;
  if (options.mini_batch_size < 1 || options.mini_batch_size % dp != 0) {
    throw Error(method + ": mini-batch size " + std::to_string(options.mini_batch_size) +
                " rows does not split over " + std::to_string(dp) + " data-parallel ranks");
  }
  if (options.micro_batch_size < 1) {
    throw Error(method + ": micro-batch size " + std::to_string(options.micro_batch_size));
  }
  if (batch.size() == 0) throw Error(method + ": an empty batch");
  const int64_t local = std::min(options.mini_batch_size / dp, batch.size());
  if (batch.size() % local != 0) {
    throw Error(method + ": this rank's " + std::to_string(batch.size()) +
                " rows do not split into mini-batches of " + std::to_string(local) +
                " (mini-batch size " + std::to_string(options.mini_batch_size) + " over " +
                std::to_string(dp) + " data-parallel ranks)");
  }
  return batch.mini_batches(local, options.epochs, options.shuffle,
                            options.seed + static_cast<uint64_t>(call));
}

algos::GlobalBatchInfo global_batch_info(const DataProto& mini, const engine::ParallelState& ps) {
  std::vector<double> counts = {response_mask_of(mini).sum().item<double>(),
                                static_cast<double>(mini.size())};
  all_reduce_sum(counts, ps.dp(), ps.device());
  algos::GlobalBatchInfo info;
  info.dp_size = ps.config().dp;
  info.batch_num_tokens = counts[0];
  info.global_batch_size = counts[1];
  return info;
}

DataProto metrics_proto(const MetricLists& metrics) {
  Dict d;
  for (const auto& [k, v] : metrics) {
    List l;
    for (double x : v) l.emplace_back(x);
    d.emplace_back(k, Value(std::move(l)));
  }
  DataProto out;
  out.set_meta("metrics", Value(std::move(d)));
  return out;
}

}  // namespace baton::workers
