// The DataProto dispatch modes. Every translation unit that includes this
// header registers them during static initialisation (register_dispatch_modes
// below), so naming a mode through these constants is enough to have it,
// whatever the linker keeps of the static baton_dispatch library.
//
// DataProto arguments: a DataProto itself (it converts to a Value), its
// to_value(), or the Future of an earlier call that returns one.
//
//   DP_COMPUTE          every argument is a list with one element per rank (as
//                       ALL_TO_ALL); results: a list, one per rank.
//   DP_COMPUTE_PROTO    every argument is a DataProto (DataProto::to_value());
//                       each is padded to a multiple of the world size (copies
//                       of its last row; the caller's batch is untouched),
//                       chunked, chunk r to rank r; the results (DataProto per
//                       rank, as many rows as it got) are concatenated in rank
//                       order and the padding rows dropped.
//   DP_COMPUTE_METRIC   dispatched as DP_COMPUTE_PROTO; results: a list, one
//                       per rank (metrics need no trimming).
//   DP_COMPUTE_PROTO_WITH_FUNC
//                       argument 0 names a function registered in every process
//                       (worker_function.h; checked at the driver before
//                       anything is sent), sent to every rank; the other
//                       arguments are DataProtos chunked by the world size
//                       without padding (as verl: the batch must divide).
//                       Collected as DP_COMPUTE_PROTO. The built-in method
//                       "execute_with_func" of every worker class uses it.
//
// Megatron modes use the group's ParallelLayout (WorkerGroupOptions::layout);
// dp_rank excludes context parallelism, so CP ranks of a replica share a chunk.
// A chunk goes to shared memory once, however many ranks receive it.
//
//   MEGATRON_COMPUTE         every argument a list of dp_size; rank r gets
//                            element dp(r). Collect: ranks with tp 0, the last
//                            pp stage and cp 0, in rank (= dp) order: a list.
//   MEGATRON_COMPUTE_PROTO   DataProtos chunked by dp_size (no padding: the
//                            batch must divide), then as above; concatenated.
//   MEGATRON_PP_AS_DP        every argument a list of pp*dp*cp; rank r gets
//                            element (cp*dp_size + dp)*pp_size + pp (pp fastest).
//                            Collect: every tp 0 rank, in that element order.
//   MEGATRON_PP_AS_DP_PROTO  DataProtos chunked by pp*dp*cp, then as above;
//                            concatenated.
//   MEGATRON_PP_ONLY         as ONE_TO_ALL; collect: ranks with tp 0 and dp 0
//                            (one result per pipeline stage, cp 0).
//
//   mesh_proto(name)         DataProtos chunked by the mesh's dp size (no
//                            padding); rank r gets the chunk of the dp rank it
//                            registered (Worker::register_mesh); the results of
//                            the ranks that registered as collectors are
//                            concatenated in rank order.
#pragma once

#include <string>

namespace baton::dispatch_mode {
inline constexpr const char* kDpCompute = "DP_COMPUTE";
inline constexpr const char* kDpComputeProto = "DP_COMPUTE_PROTO";
inline constexpr const char* kDpComputeProtoWithFunc = "DP_COMPUTE_PROTO_WITH_FUNC";
inline constexpr const char* kDpComputeMetric = "DP_COMPUTE_METRIC";
inline constexpr const char* kMegatronCompute = "MEGATRON_COMPUTE";
inline constexpr const char* kMegatronComputeProto = "MEGATRON_COMPUTE_PROTO";
inline constexpr const char* kMegatronPpAsDp = "MEGATRON_PP_AS_DP";
inline constexpr const char* kMegatronPpAsDpProto = "MEGATRON_PP_AS_DP_PROTO";
inline constexpr const char* kMegatronPpOnly = "MEGATRON_PP_ONLY";

// The name of the mesh-dispatch mode of `mesh` ("MESH_PROTO:actor"),
// registering it on first use.
std::string mesh_proto(const std::string& mesh);
}  // namespace baton::dispatch_mode

namespace baton {

// Registers the modes above (and the built-in worker method
// "execute_with_func", worker_function.h). Idempotent and thread-safe: calling
// it again changes nothing (a mode replaced since, with replace_dispatch_mode,
// stays replaced). Including this header calls it; call it yourself only in a
// program that names the modes by string without including it.
void register_dispatch_modes();

namespace detail {
inline const bool dispatch_modes_registered = (register_dispatch_modes(), true);
}  // namespace detail

}  // namespace baton
