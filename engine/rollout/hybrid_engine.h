// HybridEngine: one set of worker processes that both trains and generates
// (verl's colocated 3D HybridEngine, verl-single-controller-spec.md §4). The
// training model stays in its layout (TP_t × CP × DP_t × PP_t); for a rollout
// the weights stream into a rollout model laid out TP_r × DP_r (pp = 1,
// DP_r = world / TP_r) on the same ranks, generation runs there with a paged
// KV cache, and afterwards the rollout weights and cache are freed.
//
//   enter_rollout()  training gradients are released (they are recomputed by
//                    the next backward); the rollout model is allocated and the
//                    weights are resharded into it in buckets (reshard.h); the
//                    KV cache is allocated.
//   generate()       this rank's rollout replica generates; the TP_r ranks of
//                    a replica call it with the same prompts and return the
//                    same sequences.
//   exit_rollout()   the rollout weights and the KV cache are freed; training
//                    resumes on the untouched training model.
//
// With HybridEngineOptions::free_cache false (verl's free_cache_engine) the
// KV cache is allocated at the first enter_rollout() and kept between
// rollouts; the rollout weights are still freed at exit_rollout() (their
// storages emptied in place, allocated again and resharded into at the next
// enter_rollout()).
//
// Example (every rank of a TP2 × PP2 training world, rollout TP2):
//   HybridEngine hybrid(train_model, store, HybridEngineOptions().set_rollout_tp(2));
//   for (step ...) {
//     hybrid.enter_rollout();                            // collective
//     auto seqs = hybrid.generate(my_replica_prompts, params);
//     hybrid.exit_rollout();
//     ... forward_backward + optimizer step on train_model ...
//   }
//
// When both layouts hold the whole model on every rank (training TP = PP =
// CP = 1 and rollout TP 1: pure data parallelism, the usual CPU run), there is
// nothing to reshard: the rollout generates with the training model itself,
// and only the KV cache is allocated and freed (shares_training_weights()).
//
// On a GPU the rollout model and KV cache live on the training model's device,
// in its dtype. The optimizer state is the caller's: Optimizer::offload()
// before enter_rollout() and reload() after exit_rollout() move it to pinned
// host memory and back (no-ops on the CPU). Rollout workers in other
// processes are fed by weight_sync.h instead.
// Thread safety: none; the worker thread that owns the training model drives it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/rollout/generation.h"
#include "engine/rollout/reshard.h"

namespace baton::engine {

struct HybridEngineOptions {
  int64_t rollout_tp = 1;
  ReshardOptions reshard;
  GenerationOptions generation;
  bool release_grads = true;  // free the training gradients while in rollout
  // verl's free_cache_engine: exit_rollout() frees the KV cache. false: the
  // cache stays allocated between rollouts (sized once, at the first
  // enter_rollout()); the rollout weights are freed either way.
  bool free_cache = true;

  HybridEngineOptions& set_rollout_tp(int64_t tp) {
    rollout_tp = tp;
    return *this;
  }
  HybridEngineOptions& set_free_cache(bool on) {
    free_cache = on;
    return *this;
  }
};

class HybridEngine {
 public:
  // Collective over the training world (builds the rollout layout's groups
  // through `store`, see make_rollout_state). Allocates no rollout memory.
  // Throws EngineError when rollout_tp does not divide the world size or the
  // model's kv heads and intermediate size. The rollout layout pads the
  // vocabulary as the training layout's make_vocab_size_divisible_by says.
  HybridEngine(std::shared_ptr<Transformer> train, c10::intrusive_ptr<c10d::Store> store,
               HybridEngineOptions options = {});
  ~HybridEngine();

  // Collective over the training world. Throws EngineError when already in
  // rollout.
  ReshardStats enter_rollout();
  // REQUIRES: in rollout (EngineError otherwise). See GenerationEngine::generate.
  std::vector<GeneratedSequence> generate(const std::vector<std::vector<int64_t>>& prompts,
                                          const SamplingParams& params,
                                          const std::vector<uint64_t>& request_seeds = {},
                                          const std::vector<Continuation>& continuations = {},
                                          TurnHandler* turns = nullptr);
  // Frees the rollout weights and (free_cache) the KV cache. Not collective;
  // a no-op when not in rollout.
  void exit_rollout();

  bool in_rollout() const { return in_rollout_; }
  // This rank's rollout replica (its DP rank in the rollout layout) and their count.
  int64_t rollout_replica() const { return rollout_state_->coords().dp; }
  int64_t rollout_replicas() const { return rollout_state_->config().dp; }
  const ParallelState& rollout_state() const { return *rollout_state_; }
  // Bytes held for the rollout now: its weights (none when it shares the
  // training model's; none outside rollout) plus the KV cache (outside
  // rollout: none, or the kept cache when free_cache is off).
  int64_t rollout_bytes() const;
  // Bytes the KV cache holds now (KvCache::allocated_bytes; 0 when there is none).
  int64_t kv_cache_bytes() const;
  // True when the rollout generates with the training model itself.
  bool shares_training_weights() const { return shares_weights_; }
  // The rollout model (REQUIRES: in rollout), e.g. to compare weights.
  Transformer& rollout_model();

 private:
  // A kept rollout model's weights (free_cache off, resharded copy): their
  // memory freed at exit_rollout and allocated again at enter_rollout.
  class RolloutWeights;

  std::shared_ptr<Transformer> train_;
  HybridEngineOptions options_;
  std::shared_ptr<ParallelState> rollout_state_;
  std::shared_ptr<Transformer> rollout_;
  std::unique_ptr<GenerationEngine> engine_;
  std::unique_ptr<RolloutWeights> kept_weights_;
  bool shares_weights_ = false;
  bool in_rollout_ = false;
};

}  // namespace baton::engine
