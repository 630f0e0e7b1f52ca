// Reshard: stream a model's weights from its training layout (TP_t × CP × DP_t
// × PP_t, Megatron rank order) into a rollout model on the same ranks, laid out
// TP_r × DP_r with pp = 1 and DP_r = world / TP_r (the 3D HybridEngine's weight
// sync, verl-single-controller-spec.md §4). Rollout rank r is rollout TP rank
// r % TP_r: consecutive ranks form one rollout replica.
//
// Every rank derives the whole plan (each tensor's owning stage, TP layout and
// full shape) from the configs and the conversion rules, so no metadata is
// exchanged. Tensors travel in buckets of about `bucket_bytes` of full
// (unsharded) tensors, each bucket one flat buffer: the owning pipeline stage
// gathers its TP shards into it (skipped when TP_t == 1, or TP_r == TP_t and
// both pad the vocabulary alike; its own shards are then the source), and
// every rank of it copies its TP_r slice (fused QKV and gate/up re-split as
// docs/engine.md lays them out; the embedding and LM head without the
// training layout's vocabulary padding, padded with zero rows as the rollout
// layout pads them) straight into the rollout parameters, cast to their
// dtype. With pp > 1 the owning stage's rank also cuts each other stage's
// rank its TP_r slices and sends them over the pipeline group, one message
// per tensor, received straight into that rank's rollout parameters: a
// scatter, so each rank takes 1/TP_r of the bucket instead of all of it.
// make_rollout_state gives the rollout layout the training layout's
// make_vocab_size_divisible_by. The TP gather is one in-place broadcast per
// TP rank, all in flight together: Gloo's all-gather would copy through a
// temporary as large as the bucket. Two buckets are in flight at once (the
// next travels while this one is copied out), so the extra memory is at most
// two buffers, each one bucket or one tensor larger than a bucket (plus
// 8-byte alignment per tensor), and on an owning stage the slices on their
// way to the other pp − 1 stages (1/TP_r of a bucket each): not a second
// copy of the model. With TP_r == TP_t (padding alike) and pp = 1 nothing is
// communicated (but the experts under EP). Each CP/DP replica of the training layout streams over
// its own groups.
//
// Expert parallelism (training ep > 1; the rollout layout has ep = 1, every
// rollout rank holding every expert): a MoE layer's expert tensors travel in
// buckets of their own, which always use a buffer of ep rows, row j for the
// experts of EP rank j. The owning stage fills its row (gathered over TP as
// above), then each EP rank broadcasts its row over the EP group (the ranks
// of the same TP rank whose dp ranks form an EP block), so every rank of the
// block holds every expert of its TP shard before slicing. Which rank holds
// which experts follows from the layout (ParallelConfig::ep_rank_of): still
// no metadata.
//
// Example (every rank of a TP2 × PP2 training world, rollout TP2):
//   auto rollout_state = make_rollout_state(store, rank, train_state->config(), /*tp=*/2);
//   Transformer rollout(cfg, rollout_state);
//   auto stats = reshard_weights(*train_model, rollout);   // collective
//
// Thread safety: none; call from the thread that owns both models.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"

namespace baton::engine {

struct ReshardOptions {
  // Bytes of full tensors per bucket (a tensor larger than this travels alone).
  int64_t bucket_bytes = 64 << 20;
};

struct ReshardStats {
  double seconds = 0;             // wall time of the whole reshard on this rank
  int64_t model_bytes = 0;        // bytes of the full model in the rollout dtype, each tensor once
  int64_t buckets = 0;            // buckets in the plan (also when nothing is communicated)
  int64_t peak_buffer_bytes = 0;  // most bucket-buffer bytes held at once on this rank
};

// The rollout layout's ParallelState over the ranks of a training world:
// tp = rollout_tp, dp = world / rollout_tp, cp = pp = 1. Collective over the
// world; the n-th call in a process uses store keys under "baton/rollout/<n>/",
// so it can share the training state's store and be called again (every rank
// must make its rollout states in the same order). `backend`: the training
// state's (kNccl for a model on the GPU); `timeout`: its collective deadline
// (the training state's collective_timeout()). Throws EngineError, before
// touching the store, when rollout_tp does not divide the world size.
std::shared_ptr<ParallelState> make_rollout_state(
    c10::intrusive_ptr<c10d::Store> store, int64_t rank, const ParallelConfig& training,
    int64_t rollout_tp, CollectiveBackend backend = CollectiveBackend::kGloo,
    std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

// Copies `train`'s weights into `rollout` (cast to the rollout's dtype); for
// fp32 the result equals hf_to_shard of the full weights for the rollout TP
// rank bit for bit. Works for value models (value_head.*) too. A tied model's
// embedding comes from stage 0 (the last stage's output_layer copy is not
// read). Collective over the training world and blocking: every rank calls it,
// with models built on ParallelStates over the same ranks. Throws EngineError
// before any bucket moves: when the two models disagree (config, value-model
// flag, world size, rank, rollout pp != 1) or bucket_bytes < 1, at once; when
// some rank's training shard has an unexpected shape, on every rank (one
// all-reduce of the verdicts), so none is left waiting. The bucket buffers
// are on the training state's device() (the GPU with NCCL groups).
ReshardStats reshard_weights(const Transformer& train, Transformer& rollout,
                             const ReshardOptions& options = {});

}  // namespace baton::engine
