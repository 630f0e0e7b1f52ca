// ParallelLayout: how a group's ranks form a Megatron-style grid of tensor ×
// context × data × pipeline parallel ranks. The one layout type: a worker
// group's (runtime/worker_group.h), a worker's (WorkerInfo::layout) and the
// engine's (engine::ParallelConfig extends it with how the model is split).
//
// Rank order is Megatron's, tp fastest, then cp, dp, pp (docs/engine.md):
//   rank = ((pp·dp_size + dp)·cp_size + cp)·tp_size + tp
//
// Example: tp=2, dp=2, pp=2 over 8 ranks: rank 5 is tp 1, dp 0, pp 1.
//   ParallelLayout l{.tp = 2, .dp = 2, .pp = 2};
//   ParallelCoords c = l.coords(5);  // {.tp = 1, .cp = 0, .dp = 0, .pp = 1}
//   l.rank_of(c);                    // 5
#pragma once

#include <cstdint>
#include <string>

namespace baton {

// One rank's coordinates along the four dimensions.
struct ParallelCoords {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;

  bool operator==(const ParallelCoords&) const = default;
};

struct ParallelLayout {
  int64_t tp = 1;  // tensor parallel
  int64_t cp = 1;  // context parallel
  int64_t dp = 1;  // data parallel
  int64_t pp = 1;  // pipeline parallel (stages)

  int64_t world_size() const { return tp * cp * dp * pp; }

  // Whether `rank` is one of this layout's: 0 <= rank < world_size().
  bool contains(int64_t rank) const { return rank >= 0 && rank < world_size(); }
  // Whether every coordinate of `c` is within its size.
  bool contains(const ParallelCoords& c) const {
    return c.tp >= 0 && c.tp < tp && c.cp >= 0 && c.cp < cp && c.dp >= 0 && c.dp < dp &&
           c.pp >= 0 && c.pp < pp;
  }

  // REQUIRES: contains(rank), every size at least 1.
  ParallelCoords coords(int64_t rank) const {
    ParallelCoords c;
    c.tp = rank % tp;
    rank /= tp;
    c.cp = rank % cp;
    rank /= cp;
    c.dp = rank % dp;
    c.pp = rank / dp;
    return c;
  }
  // The inverse of coords(). REQUIRES: contains(c).
  int64_t rank_of(const ParallelCoords& c) const {
    return ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp;
  }

  // "tp=2 cp=1 dp=2 pp=2"
  std::string to_string() const {
    return "tp=" + std::to_string(tp) + " cp=" + std::to_string(cp) + " dp=" + std::to_string(dp) +
           " pp=" + std::to_string(pp);
  }

  // All data parallel: the layout of a group with no layout given.
  static ParallelLayout data_parallel(int64_t world) {
    ParallelLayout l;
    l.dp = world;
    return l;
  }

  bool operator==(const ParallelLayout&) const = default;
};

}  // namespace baton
