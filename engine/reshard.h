// Reshard: stream a model's weights from its training layout (TP_t × CP × DP_t
// × PP_t, Megatron rank order) into a rollout model on the same ranks, laid out
// TP_r × DP_r with pp = 1 and DP_r = world / TP_r (the 3D HybridEngine's weight
// sync, verl-single-controller-spec.md §4). Rollout rank r is rollout TP rank
// r % TP_r: consecutive ranks form one rollout replica.
//
// Tensors travel in buckets of about `bucket_bytes` of full (unsharded)
// tensors: the owning pipeline stage all-gathers its TP shards (skipped when
// TP_r == TP_t), broadcasts the bucket over the pipeline group (skipped when
// pp = 1), and every rank copies its TP_r slice (fused QKV and gate/up
// re-split as docs/engine.md lays them out) into the rollout parameters. Peak
// extra memory is the bucket buffers, not a second copy of the model.
//
// Example (every rank of a TP2 × PP2 training world, rollout TP2):
//   auto rollout_state = make_rollout_state(store, rank, train_state->config(), /*tp=*/2);
//   Transformer rollout(cfg, rollout_state);
//   auto stats = reshard_weights(*train_model, rollout);   // collective
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>

#include "engine/parallel_state.h"
#include "engine/transformer.h"

namespace baton::engine {

struct ReshardOptions {
  // Bytes of full tensors per bucket (a tensor larger than this travels alone).
  int64_t bucket_bytes = 64 << 20;
};

struct ReshardStats {
  double seconds = 0;              // wall time of the whole reshard on this rank
  int64_t model_bytes = 0;         // bytes of the full model, each tensor once
  int64_t buckets = 0;             // buckets streamed
  int64_t peak_buffer_bytes = 0;   // most bucket-buffer bytes held at once on this rank
};

// The rollout layout's ParallelState over the ranks of a training world:
// tp = rollout_tp, dp = world / rollout_tp, cp = pp = 1. Collective over the
// world; uses store keys under a prefix of its own, so it can share the
// training state's store. Throws EngineError when rollout_tp does not divide
// the world size.
std::shared_ptr<ParallelState> make_rollout_state(c10::intrusive_ptr<c10d::Store> store,
                                                  int64_t rank, const ParallelConfig& training,
                                                  int64_t rollout_tp);

// Copies `train`'s weights into `rollout` (cast to the rollout's dtype).
// Collective over the training world: every rank calls it, with models built
// on ParallelStates over the same ranks. Throws EngineError, before any
// communication, when the two models disagree (config, value-model flag,
// world size, rollout pp != 1).
ReshardStats reshard_weights(const Transformer& train, Transformer& rollout,
                             const ReshardOptions& options = {});

}  // namespace baton::engine
