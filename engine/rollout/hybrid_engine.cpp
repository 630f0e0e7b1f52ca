#include "engine/rollout/hybrid_engine.h"

#include <c10/core/DeviceGuard.h>

#include <set>

#include "base/profiler.h"
#include "engine/errors.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/parallel_linear.h"

namespace baton::engine {

// The storages of a kept rollout model's parameters, emptied in place and
// allocated again (as TensorOffload does, engine/optim/offload.h, but
// keeping no bytes: the next reshard writes every weight). Each StorageImpl
// stays, so the parameters are the same tensors afterwards, and the
// GenerationEngine that holds the model needs no telling. Storages another
// allocator owns cannot be re-allocated in place and stay resident.
class HybridEngine::RolloutWeights {
 public:
  explicit RolloutWeights(const Transformer& model) {
    std::set<const c10::StorageImpl*> seen;
    for (const auto& [name, p] : model.named_params()) {
      if (!p.defined() || !p.has_storage()) continue;
      const c10::Storage& s = p.storage();
      if (!seen.insert(s.unsafeGetStorageImpl()).second || s.nbytes() == 0) continue;
      if (s.allocator() == nullptr || s.allocator() != c10::GetAllocator(s.device_type())) continue;
      storages_.push_back({s, s.nbytes()});
    }
  }

  void free() {
    if (!allocated_) return;
    for (Entry& e : storages_) {
      e.storage.set_data_ptr_noswap(e.storage.allocator()->allocate(0));
      e.storage.set_nbytes(0);
    }
    allocated_ = false;
  }
  // The bytes are uninitialised until the reshard writes them.
  void allocate() {
    if (allocated_) return;
    for (Entry& e : storages_) {
      c10::DeviceGuard guard(e.storage.device());
      e.storage.set_data_ptr_noswap(e.storage.allocator()->allocate(e.nbytes));
      e.storage.set_nbytes(e.nbytes);
    }
    allocated_ = true;
  }

 private:
  struct Entry {
    c10::Storage storage;
    size_t nbytes = 0;
  };
  std::vector<Entry> storages_;
  bool allocated_ = true;
};

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

HybridEngine::~HybridEngine() = default;

ReshardStats HybridEngine::enter_rollout() {
  // Resharding the training weights into the rollout layout (or sharing them).
  BATON_PROFILE_SCOPE("engine", "reshard (enter rollout)");
  if (in_rollout()) throw EngineError("HybridEngine::enter_rollout: already in rollout");
  if (options_.release_grads) {
    for (auto& p : train_->parameters()) p.mutable_grad() = at::Tensor();
  }
  // engine_ (and with it the KV cache) exists here only when free_cache is
  // off and an earlier rollout built it.
  if (shares_weights_) {
    // Both layouts hold the whole model on every rank: generate with the
    // training model itself (no copy, nothing to reshard).
    ReshardStats stats;
    stats.model_bytes = train_->param_bytes();
    if (!engine_) engine_ = std::make_unique<GenerationEngine>(train_, options_.generation);
    rollout_ = train_;
    in_rollout_ = true;
    return stats;
  }
  // A model kept from the last rollout (free_cache off) gets its weights'
  // memory back; otherwise one is built.
  std::shared_ptr<Transformer> rollout = rollout_;
  if (rollout) {
    kept_weights_->allocate();
  } else {
    TransformerOptions opts;
    opts.value_model = train_->options().value_model;
    {
      SkipWeightInit uninitialised;  // reshard_weights writes every weight
      rollout = std::make_shared<Transformer>(train_->config(), rollout_state_, opts);
    }
    // A Transformer is built in fp32 on the CPU; the rollout model lives where
    // the training model does, in its dtype (bf16 on the GPU, say).
    const at::Device device = train_->device();
    const at::ScalarType dtype = train_->named_params().front().second.scalar_type();
    if (device != rollout->device() || dtype != at::kFloat) rollout->to(device, dtype);
  }
  auto stats = reshard_weights(*train_, *rollout, options_.reshard);
  if (!engine_) engine_ = std::make_unique<GenerationEngine>(rollout, options_.generation);
  rollout_ = std::move(rollout);
  in_rollout_ = true;
  return stats;
}

std::vector<GeneratedSequence> HybridEngine::generate(
    const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params,
    const std::vector<uint64_t>& request_seeds, const std::vector<Continuation>& continuations,
    TurnHandler* turns) {
  if (!in_rollout())
    throw EngineError("HybridEngine::generate: not in rollout; call enter_rollout() first");
  return engine_->generate(prompts, params, request_seeds, continuations, turns);
}

void HybridEngine::exit_rollout() {
  BATON_PROFILE_SCOPE("engine", "exit rollout");
  if (!in_rollout_) return;
  in_rollout_ = false;
  if (options_.free_cache) {
    engine_.reset();
    rollout_.reset();
    return;
  }
  // The engine and its cache stay. Shared weights are the training model's;
  // a resharded copy's memory goes, its tensors stay for the next reshard.
  if (shares_weights_) return;
  if (!kept_weights_) kept_weights_ = std::make_unique<RolloutWeights>(*rollout_);
  kept_weights_->free();
}

int64_t HybridEngine::rollout_bytes() const {
  const int64_t cache = kv_cache_bytes();
  // Shared weights are the training model's, not the rollout's.
  if (!in_rollout() || shares_weights_) return cache;
  return cache + rollout_->param_bytes();
}

int64_t HybridEngine::kv_cache_bytes() const {
  return engine_ ? engine_->cache().allocated_bytes() : 0;
}

Transformer& HybridEngine::rollout_model() {
  if (!in_rollout()) throw EngineError("HybridEngine::rollout_model: not in rollout");
  return *rollout_;
}

}  // namespace baton::engine
