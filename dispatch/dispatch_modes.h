// The DataProto dispatch modes (registered when this library is linked):
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
#pragma once

namespace baton::dispatch_mode {
inline constexpr const char* kDpCompute = "DP_COMPUTE";
inline constexpr const char* kDpComputeProto = "DP_COMPUTE_PROTO";
inline constexpr const char* kDpComputeMetric = "DP_COMPUTE_METRIC";
}  // namespace baton::dispatch_mode
