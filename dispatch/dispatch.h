// The DataProto dispatch modes in one include: DataProto (a batch of named
// tensors, per-row columns and meta), the modes that split it over a worker
// group and collect the results (DP, Megatron, mesh, PP-as-DP), and named
// worker functions.
//
// Example:
//   #include "dispatch/dispatch.h"
//   t.def("score", &Scorer::score,
//         baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
#pragma once

#include "dispatch/data_proto.h"       // IWYU pragma: export
#include "dispatch/dispatch_modes.h"   // IWYU pragma: export
#include "dispatch/worker_function.h"  // IWYU pragma: export
