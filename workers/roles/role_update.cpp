#include "workers/roles/role_update.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#if defined(BATON_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "base/errors.h"
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

double gigabytes(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

void add_device_memory_metrics(MetricLists& metrics, at::Device device) {
#if defined(BATON_CUDA)
  if (device.is_cuda()) {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const auto stats = alloc::getDeviceStats(device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    metrics["perf/max_memory_allocated_gb"].push_back(gigabytes(stats.allocated_bytes[all].peak));
    metrics["perf/max_memory_reserved_gb"].push_back(gigabytes(stats.reserved_bytes[all].peak));
    alloc::resetPeakStats(device.index());
    return;
  }
#endif
  // statm's second field: resident pages.
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  metrics["perf/cpu_memory_used_gb"].push_back(
      gigabytes(static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE)));
}

}  // namespace baton::workers
