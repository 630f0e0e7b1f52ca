// Expert parallelism: the collectives that carry tokens to the ranks holding
// their experts and back (ParallelConfig::ep, GroupKind::kExpert).
//
// A MoE layer under EP sorts its (token, expert) assignments by expert, so
// the rows bound for EP rank j are one contiguous run; all_to_all sends run j
// to rank j and receives, from each rank in rank order, the rows for this
// rank's experts. The backward sends the gradients the opposite way.
//
// Example (one sparse layer, every rank of an EP group of 2):
//   std::vector<int64_t> send = {3, 5};                   // rows for rank 0, 1
//   std::vector<int64_t> recv = exchange_counts(send, ep);  // rows from rank 0, 1
//   at::Tensor mine = all_to_all(rows, send, recv, ep);   // [Σ recv, H]
//   ... the local experts ...
//   at::Tensor back = all_to_all(out, recv, send, ep);    // [Σ send, H]
//
// Both are collective over `ep` and blocking; every rank calls them in the
// same order (a MoE model's EP ranks therefore run the same number of
// forwards and backwards). A group of one returns the input.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/parallel/parallel_state.h"

namespace baton::engine {

// The counts every rank of `ep` sends this rank, given what this rank sends
// each of them (`send[j]` for group rank j): one all-to-all of ep integers.
// Returns a host vector indexed by group rank. Also usable for a matrix:
// `send` of ep × m entries (m per destination) returns ep × m (m per source).
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, const Group& ep);

// Rows [Σ send[<j], Σ send[≤j]) of `x` ([Σ send, ...], contiguous along dim
// 0) go to group rank j; the result is the rows every rank sent here,
// concatenated in rank order ([Σ recv, ...]). Differentiable: the backward
// is the all-to-all with send and recv swapped. REQUIRES: send.size() ==
// recv.size() == ep.size, x.size(0) == Σ send (EngineError otherwise).
at::Tensor all_to_all(const at::Tensor& x, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv, const Group& ep);

}  // namespace baton::engine
