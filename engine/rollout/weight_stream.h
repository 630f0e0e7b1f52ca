// Weight streams: the plan resharding (reshard.h) and weight sync to
// separate rollout workers (weight_sync.h) share. Every rank derives it from
// the config, the conversion rules and the training layout alone, so no
// metadata travels: the whole one-stage model's tensors in
// whole_model_tensors() order, each with its owning training stage, its TP
// split and (a MoE layer's experts) its EP split, and the byte layout of a
// bucket's flat buffer.
//
// Expert parallelism (ParallelConfig::ep > 1): the training ranks of EP rank
// j hold experts [j·E/ep, (j+1)·E/ep) of each expert tensor, TP-split as
// without EP; the rollout holds every expert. A stream's expert tensors
// therefore have ep × tp training shards, shard (j, k) at index j·tp + k.
//
// Example:
//   auto tensors = stream_tensors(cfg, /*value_model=*/false, training, /*element_size=*/4);
//   std::vector<const StreamTensor*> bucket{&tensors[0], &tensors[1]};
//   RegionLayout l = region_layout(bucket, /*regions=*/training.tp, training.tp);
//   // TP rank k's shard of bucket[i] sits at l.offset[i][k] (-1: replicated, k > 0)
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/parallel_state.h"

namespace baton::engine {

// How a tensor of a given conversion transform is split over TP ranks: along
// `dim` (-1: replicated) in `blocks` separately split sub-blocks (gate/up: 2).
// Fused QKV splits along dim 0 like rows, its kv groups being contiguous.
struct TpSplit {
  int64_t dim = -1;
  int64_t blocks = 1;
};
TpSplit tp_split_of(Transform transform);

// One tensor of the whole model in a stream.
struct StreamTensor {
  std::string name;   // engine name
  int64_t stage = 0;  // the training pipeline stage that owns it
  TpSplit split;      // its layout over TP ranks
  // The full (unsharded) shape as the training layout holds it: the
  // vocabulary tensors with that layout's padding rows (vocab_padding.h).
  std::vector<int64_t> full;
  int64_t bytes = 0;  // the full tensor's bytes in the stream's dtype (padding included)
  // Vocabulary tensors (embedding, LM head): the real vocabulary size, the
  // rows of `full` before the padding; 0 for the others.
  int64_t vocab = 0;
  // A MoE layer's stacked experts (is_expert_tensor; dim 0: the experts).
  bool expert = false;
  // The blocks of experts the training layout splits dim 0 into: its ep for
  // an expert tensor, 1 for the others.
  int64_t ep = 1;

  bool replicated() const { return split.dim < 0; }
  // The shape of one training shard: `full` split `tp` ways (and, an expert
  // tensor, over the training layout's ep ranks).
  std::vector<int64_t> shard_shape(int64_t tp) const;
  int64_t shard_bytes(int64_t tp) const { return replicated() ? bytes : bytes / tp / ep; }
  // The bytes of the model's own tensor: `bytes` without the padding rows.
  int64_t model_bytes() const { return vocab > 0 ? bytes / full[split.dim] * vocab : bytes; }
  // The shape of one shard in `layout`, whose vocabulary padding and ep may
  // differ.
  std::vector<int64_t> shard_shape_in(const ParallelConfig& layout) const;
};

// The whole model (whole_model_tensors order) with owning stages for the
// `training` layout (its layer split), vocabulary tensors padded as it pads
// them, expert tensors split over its ep, and bytes at `element_size`.
// Throws EngineError when a split tensor does not divide over training.tp,
// or the experts over training.ep.
std::vector<StreamTensor> stream_tensors(const ModelConfig& cfg, bool value_model,
                                         const ParallelConfig& training, int64_t element_size);

// Where each tensor's shards sit in a bucket's flat byte buffer: `regions`
// runs, region k holding every tensor's shard of TP rank k of `tp` (a
// replicated tensor only in region 0), each shard 8-byte aligned. With one
// region it holds one shard of every tensor (this rank's own). Each region
// is one message's payload. A bucket with expert tensors split over ep > 1
// EP ranks (StreamTensor::ep, the same for all of them) has ep rows of
// `regions` regions, contiguous row by row: region j·regions + k holds EP
// rank j's shards of TP rank k, the tensors with ep = 1 being in row 0 only.
struct RegionLayout {
  std::vector<std::vector<int64_t>> offset;  // [tensor][region], -1: absent
  std::vector<int64_t> region_begin, region_bytes;
  int64_t total = 0;
};
RegionLayout region_layout(const std::vector<const StreamTensor*>& tensors, int64_t regions,
                           int64_t tp);

// Copies TP rank `r_rank` of `r_tp`'s slice of tensor `t` into `dst`, from
// the shards of its `t_tp`-way split (t.full, t.split): `shard(k)` returns TP
// rank k's shard for k in [k_begin, k_end) (the shards holding the slice must
// be among them). Sub-blocks (2 for gate/up, else 1) are split separately;
// each sub-block's slice is a contiguous range that may span several shards,
// copied piece by piece (and cast to dst's dtype). A vocabulary tensor's
// slice is dst's rows, padded as dst's layout pads them: real rows are
// copied, rows at or past t.vocab are zeroed. An expert tensor split over
// t.ep > 1 EP ranks takes shard(j · t_tp + k) for EP rank j's experts, which
// fill dst's experts [j·E/ep, (j+1)·E/ep).
void copy_tp_slice(at::Tensor dst, const StreamTensor& t, int64_t t_tp, int64_t r_tp,
                   int64_t r_rank, int64_t k_begin, int64_t k_end,
                   const std::function<at::Tensor(int64_t k)>& shard);

}  // namespace baton::engine
