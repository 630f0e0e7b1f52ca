// Sequence-length balancing over data-parallel ranks (verl's
// trainer.balance_batch): a batch is cut into `k` equal-size contiguous
// chunks, one per DP rank, so reordering its rows first can give every rank
// about the same number of tokens, and the slowest rank sets the step time.
//
// Example:
//   std::vector<int64_t> order = balanced_order(balanced_partitions(token_counts, /*k=*/dp));
//   batch = batch.select_rows(order);   // rank r gets rows [r*n/k, (r+1)*n/k)
//
// The partition is the Karmarkar–Karp largest-differencing heuristic with
// equal-size parts (as verl's get_seqlen_balanced_partitions): items sorted by
// size enter in groups of k, one per part; the two sets of k parts with the
// largest spread are merged repeatedly, the largest part of one with the
// smallest of the other. Deterministic: ties are broken by index.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace baton::trainer {

// `k` parts of `sizes`' indices, each of sizes.size() / k items, each part's
// indices ascending, parts ordered by their smallest index. REQUIRES k >= 1
// and sizes.size() a multiple of k (baton::Error naming both otherwise).
std::vector<std::vector<int64_t>> balanced_partitions(const std::vector<int64_t>& sizes, int64_t k);

// `parts` (of balanced_partitions) concatenated: the row order that gives
// rank r the r-th part under an equal contiguous split.
std::vector<int64_t> balanced_order(const std::vector<std::vector<int64_t>>& parts);

// verl's global_seqlen metrics of a split into `parts`: min, max, minmax_diff
// of the contiguous split in the original order, balanced_min and
// balanced_max of `parts`, and mean (all in tokens per rank), under `prefix`.
std::map<std::string, double> seqlen_balance_metrics(const std::vector<int64_t>& sizes,
                                                     const std::vector<std::vector<int64_t>>& parts,
                                                     const std::string& prefix = "global_seqlen");

}  // namespace baton::trainer
