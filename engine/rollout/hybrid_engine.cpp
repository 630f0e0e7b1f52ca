#include "engine/rollout/hybrid_engine.h"

#include "base/profiler.h"
#include "engine/errors.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/parallel_linear.h"

namespace baton::engine {

HybridEngine::HybridEngine(std::shared_ptr<Transformer> train,
                           c10::intrusive_ptr<c10d::Store> store, HybridEngineOptions options)
    : train_(std::move(train)), options_(options) {
  validate_tensor_parallel(train_->config(), options_.rollout_tp);
  const ParallelState& ps = train_->parallel();
  // The rollout groups use the training groups' backend (NCCL for a GPU
  // model) and collective deadline.
  rollout_state_ = make_rollout_state(std::move(store), ps.rank(), ps.config(), options_.rollout_tp,
                                      ps.backend(), ps.collective_timeout());
  rollout_state_->set_num_layers(train_->config().num_layers);
  const ParallelConfig& pc = ps.config();
  shares_weights_ =
      pc.tp == 1 && pc.pp == 1 && pc.cp == 1 && pc.ep == 1 && options_.rollout_tp == 1;
}

ReshardStats HybridEngine::enter_rollout() {
  // Resharding the training weights into the rollout layout (or sharing them).
  BATON_PROFILE_SCOPE("engine", "reshard (enter rollout)");
  if (in_rollout()) throw EngineError("HybridEngine::enter_rollout: already in rollout");
  if (options_.release_grads) {
    for (auto& p : train_->parameters()) p.mutable_grad() = at::Tensor();
  }
  if (shares_weights_) {
    // Both layouts hold the whole model on every rank: generate with the
    // training model itself (no copy, nothing to reshard).
    ReshardStats stats;
    stats.model_bytes = train_->param_bytes();
    engine_ = std::make_unique<GenerationEngine>(train_, options_.generation);
    rollout_ = train_;
    return stats;
  }
  TransformerOptions opts;
  opts.value_model = train_->options().value_model;
  std::shared_ptr<Transformer> rollout;
  {
    SkipWeightInit uninitialised;  // reshard_weights writes every weight
    rollout = std::make_shared<Transformer>(train_->config(), rollout_state_, opts);
  }
  // A Transformer is built in fp32 on the CPU; the rollout model lives where
  // the training model does, in its dtype (bf16 on the GPU, say).
  const at::Device device = train_->device();
  const at::ScalarType dtype = train_->named_params().front().second.scalar_type();
  if (device != rollout->device() || dtype != at::kFloat) rollout->to(device, dtype);
  auto stats = reshard_weights(*train_, *rollout, options_.reshard);
  engine_ = std::make_unique<GenerationEngine>(rollout, options_.generation);
  rollout_ = std::move(rollout);
  return stats;
}

std::vector<GeneratedSequence> HybridEngine::generate(
    const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params,
    const std::vector<uint64_t>& request_seeds, const std::vector<Continuation>& continuations) {
  if (!in_rollout())
    throw EngineError("HybridEngine::generate: not in rollout; call enter_rollout() first");
  return engine_->generate(prompts, params, request_seeds, continuations);
}

void HybridEngine::exit_rollout() {
  BATON_PROFILE_SCOPE("engine", "exit rollout");
  engine_.reset();
  rollout_.reset();
}

int64_t HybridEngine::rollout_bytes() const {
  if (!in_rollout()) return 0;
  const int64_t cache = engine_->cache().allocated_bytes();
  // Shared weights are the training model's, not the rollout's.
  return shares_weights_ ? cache : cache + rollout_->param_bytes();
}

Transformer& HybridEngine::rollout_model() {
  if (!in_rollout()) throw EngineError("HybridEngine::rollout_model: not in rollout");
  return *rollout_;
}

}  // namespace baton::engine
