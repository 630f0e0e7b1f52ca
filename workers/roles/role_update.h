// What the trained roles (actor, critic) share in an update: the rank's
// mini-batches of its DP chunk, the global counts that normalise a loss over
// the whole mini-batch (all micro-batches, all DP ranks), and metrics returned
// to the driver as lists in a DataProto's meta (DataProto::concat merges the
// ranks' lists; the trainer averages them).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "dispatch/data_proto.h"
#include "engine/parallel/parallel_state.h"
#include "workers/algos/agg_loss.h"
#include "workers/roles/role_options.h"

namespace baton::workers {

using MetricLists = std::map<std::string, std::vector<double>>;

// This DP rank's mini-batches of its chunk `batch`: options.mini_batch_size
// rows over all `dp` ranks (which must divide it; capped at the rows there
// are), options.epochs passes, shuffled when asked with options.seed plus the
// batch's meta "global_steps" (the trainer's step, so that a resumed run
// shuffles as an uninterrupted one), or else plus `calls` (counted here) —
// the same order on every TP/PP rank of a replica. Errors name `method` and
// the sizes.
std::vector<DataProto> local_mini_batches(const DataProto& batch, const UpdateOptions& options,
                                          int64_t dp, int64_t& calls, const std::string& method);

// dp size, valid response tokens and rows of `mini` summed over the DP group
// (collective over it).
algos::GlobalBatchInfo global_batch_info(const DataProto& mini, const engine::ParallelState& ps);

// A zero-row DataProto whose meta "metrics" holds `metrics`.
DataProto metrics_proto(const MetricLists& metrics);

// Bytes in GB (1e9), as verl's perf/* metrics.
double gigabytes(int64_t bytes);

// Memory metrics of the phase that just ended on `device`: on a GPU the
// caching allocator's peaks since the last call (perf/max_memory_allocated_gb,
// perf/max_memory_reserved_gb, as verl's), which it then resets; on the CPU
// the process's resident memory now (perf/cpu_memory_used_gb).
void add_device_memory_metrics(MetricLists& metrics, at::Device device);

}  // namespace baton::workers
