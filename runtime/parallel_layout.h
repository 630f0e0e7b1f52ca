// ParallelLayout: how a group's ranks form a Megatron-style grid. Rank order
// is Megatron's: tensor-parallel fastest, then context, data, pipeline.
//
// Example: tp=2, pp=2, dp=2 over 8 ranks: rank 5 is tp 1, dp 0, pp 1.
#pragma once

#include <string>

namespace baton {

struct ParallelCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};

struct ParallelLayout {
  int tp = 1, cp = 1, dp = 1, pp = 1;

  int world_size() const { return tp * cp * dp * pp; }
  ParallelCoords coords(int rank) const {
    ParallelCoords c;
    c.tp = rank % tp;
    c.cp = rank / tp % cp;
    c.dp = rank / (tp * cp) % dp;
    c.pp = rank / (tp * cp * dp);
    return c;
  }
  // "tp=2 cp=1 dp=2 pp=2"
  std::string to_string() const {
    return "tp=" + std::to_string(tp) + " cp=" + std::to_string(cp) + " dp=" + std::to_string(dp) +
           " pp=" + std::to_string(pp);
  }
  // All data parallel: the layout of a group with no layout given.
  static ParallelLayout data_parallel(int world) {
    ParallelLayout l;
    l.dp = world;
    return l;
  }
};

}  // namespace baton
