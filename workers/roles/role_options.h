// What the RL worker roles are told at spawn: the model, its layout, the
// optimizer and the update and rollout settings, as plain structs. The
// trainer fills them from a config (trainer/ppo_trainer.cpp maps verl's keys
// onto them); a custom driver fills them by hand. They travel to the worker
// processes as JSON text, one init argument:
//
//   ActorRolloutRefOptions o;
//   o.model.path = "models/toy";  o.rollout.n = 8;
//   auto group = WorkerGroup::spawn(actor_rollout_ref_worker_class(), pool,
//                                   {o.to_json()}, WorkerGroupOptions().set_layout(...));
//
// Sizes here are in ROWS (sequences), already multiplied by rollout.n where
// verl's config counts prompts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/model/lora.h"

namespace baton::workers {

// What of a role leaves the device between the phases that need it (verl's
// megatron.param_offload / grad_offload / optimizer_offload;
// engine/optim/offload.h): parameters outside the role's forwards, gradients and
// optimizer state outside its updates.
struct OffloadOptions {
  bool params = false;
  bool grads = false;
  bool optimizer = false;

  bool operator==(const OffloadOptions&) const = default;
};

struct ModelOptions {
  std::string path;          // HF model directory (config.json + safetensors)
  bool value_model = false;  // a value head (critic, reward model) instead of the LM head
  int64_t tp = 1;            // tensor-parallel size of the training layout
  int64_t pp = 1;            // pipeline stages
  // Expert parallelism (Megatron's expert_model_parallel_size,
  // engine::ParallelConfig::ep): a MoE model's experts split over this many
  // of the data-parallel ranks. Must divide dp and num_experts.
  int64_t ep = 1;
  int64_t vocab_divisible_by = 128;  // Megatron's make_vocab_size_divisible_by
  uint64_t seed = 42;                // fresh parameters (a value head) and dropout-free RNG
  // The parameters' dtype: "float32" or "bfloat16". A trained model keeps
  // fp32 master weights and optimizer state either way (engine::Optimizer).
  std::string dtype = "float32";
  OffloadOptions offload;
  // Megatron sequence parallelism (engine::TransformerOptions::sequence_parallel):
  // between TP regions the residual stream is split over the sequence, so a
  // rank holds 1/tp of those activations. Nothing at tp 1. The role pads each
  // micro-batch's sequence to a multiple of tp (MicroBatching::sequence_multiple).
  bool sequence_parallel = false;
  // Full activation recomputation (verl's enable_gradient_checkpointing;
  // engine::TransformerOptions::recompute_activations): each layer keeps only
  // its input and runs again in the backward. Same gradients; forwards
  // without autograd (log-probs, values) are unaffected.
  bool recompute_activations = false;
  // The LM head fused with the log-probs and entropy (verl's
  // use_fused_kernels; engine/parallel/fused_lm_head.h): the head is applied
  // to the response positions only, in token chunks, and neither the logits
  // nor their gradient exist whole. Same results (to rounding). An LM role
  // only; a value model ignores it.
  bool fused_lm_head = false;
  // LoRA adapters (verl's actor_rollout_ref.model.lora_rank, lora_alpha,
  // target_modules; engine/model/lora.h): with a rank > 0 the base weights
  // are frozen and only the adapters train; the rollout generates with the
  // merged weights, and an actor-rollout-ref worker's reference policy is its
  // actor with the adapters off (no second copy). Rank 0: none.
  engine::LoraOptions lora;
  // A PEFT adapter directory to start the adapters from (verl's
  // lora_adapter_path; engine/io/peft_adapter.h), loaded after the base
  // weights; "": none. `lora` must be the adapter's r, lora_alpha and
  // target modules (the trainer takes them from its adapter_config.json).
  std::string lora_adapter_path;
  // The deadline of every collective of the role's groups and of its weight
  // syncs (engine/parallel/deadline_group.h): a rank that waits longer for another
  // throws, naming the group, the operation and the ranks that did not
  // arrive (trainer.collective_timeout_s).
  int64_t collective_timeout_ms = 600'000;

  bool operator==(const ModelOptions&) const = default;
};

struct OptimOptions {
  double lr = 1e-6;
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999;
  int64_t warmup_steps = 0;
  std::string scheduler = "constant";  // "constant" or "cosine"
  double min_lr_ratio = 0.0;
  int64_t total_steps = 0;  // cosine decay length (optimizer steps)
  double grad_clip = 1.0;   // <= 0: no clipping
  bool distributed = true;  // ZeRO-1 over DP (engine::OptimizerOptions::distributed)
  // The plain optimizer's DP all-reduce overlapped with the backward, and
  // its bucket size (engine::OptimizerOptions::overlap_grad_reduce).
  bool overlap_grad_reduce = true;
  int64_t bucket_bytes = 4 << 20;

  bool operator==(const OptimOptions&) const = default;
};

// One PPO-style update pass over a batch (actor or critic).
struct UpdateOptions {
  int64_t mini_batch_size = 1;   // rows per optimizer step (all DP ranks)
  int64_t micro_batch_size = 1;  // rows per forward/backward on one rank
  // > 0: dynamic batch size instead (use_dynamic_bsz): micro-batches packed
  // with at most this many tokens (ppo_max_token_len_per_gpu).
  int64_t max_token_len = 0;
  int64_t epochs = 1;    // passes over the batch
  bool shuffle = false;  // reshuffle the mini-batches every epoch
  std::string loss_agg_mode = "token-mean";
  // seq-mean-token-sum-norm's divisor (none: the padded response length).
  std::optional<double> loss_scale_factor;
  uint64_t seed = 0;  // of the shuffle

  bool operator==(const UpdateOptions&) const = default;
};

struct PolicyOptions {
  std::string loss_mode = "vanilla";  // a registered policy loss (workers/algos/algo_registry.h)
  double clip_ratio = 0.2;
  double clip_ratio_low = 0.2, clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;
  double clip_cov_ratio = 2e-4, clip_cov_lb = 1.0, clip_cov_ub = 5.0;
  double kl_cov_ratio = 2e-4, ppo_kl_coef = 0.1;
  double tau_pos = 1.0, tau_neg = 1.05;  // sapo
  std::optional<double> dro_beta;        // dro (required by it)
  double entropy_coeff = 0.0;
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  std::string kl_loss_type = "low_var_kl";

  bool operator==(const PolicyOptions&) const = default;
};

// verl's actor_rollout_ref.rollout.multi_turn: a rollout whose model calls
// tools between its turns (workers/roles/agent_loop.h).
struct MultiTurnRolloutOptions {
  bool enable = false;
  std::string tool_config_path;            // verl's tool config file
  std::string interaction_config_path;     // verl's interaction config file
  // (enabled, at least one of the two is set)
  std::string tokenizer_path;  // tokenizer.json and its chat template (the model's directory)
  std::string format = "hermes";           // how the model writes calls: hermes | llama3_json
  int64_t max_assistant_turns = 0;         // 0 (verl's null): until the response budget
  int64_t max_user_turns = 0;              // an interaction's turns; 0 (null): no limit
  int64_t max_parallel_calls = 1;          // calls run per turn
  int64_t max_tool_response_length = 256;  // characters of each result the model sees
  std::string tool_response_truncate_side = "middle";  // left | right | middle

  bool operator==(const MultiTurnRolloutOptions&) const = default;
};

struct RolloutOptions {
  int64_t tp = 1;                // rollout tensor parallelism (divides the world)
  int64_t response_length = 64;  // max new tokens; responses are padded to it
  int64_t max_batch = 64;        // running sequences per replica
  // KV-cache budget per rank in bytes: on the CPU always, on a GPU when
  // gpu_memory_utilization is 0.
  int64_t cache_bytes = 64 << 20;
  // > 0: on a GPU the KV cache is this fraction of the device's memory less
  // what is in use on it when the cache is allocated (verl's
  // gpu_memory_utilization, engine::KvCacheOptions::memory_utilization), and
  // cache_bytes is ignored there. 0: cache_bytes everywhere. (The trainer's
  // default is verl's 0.5.)
  double gpu_memory_utilization = 0;
  // verl's free_cache_engine: the KV cache is freed after each rollout
  // (HybridEngineOptions::free_cache; a RolloutWorker's engine sleeps
  // between generate calls). false: it stays allocated between rollouts.
  bool free_cache_engine = true;
  bool packed_cpu_steps = true;  // GenerationOptions::packed_cpu_steps
  // GenerationOptions::device_decode_steps (decode steps on the device per
  // host check) and cuda_graphs (verl's enforce_eager, negated).
  int64_t device_decode_steps = 8;
  bool cuda_graphs = true;
  int64_t log_prob_micro_batch_size = 8;
  int64_t log_prob_max_token_len = 0;  // > 0: packed micro-batches (UpdateOptions::max_token_len)
  MultiTurnRolloutOptions multi_turn;

  bool operator==(const RolloutOptions&) const = default;
};

struct ActorRolloutRefOptions {
  ModelOptions model;
  OptimOptions optim;
  UpdateOptions update;
  PolicyOptions policy;
  RolloutOptions rollout;
  bool actor = true;  // the actor role (training); false: rollout/ref only
  // Reference log-probs: a frozen copy of the initial weights, or, for a
  // LoRA actor (model.lora), the actor with its adapters off (ref_dtype and
  // ref_param_offload are then the actor's).
  bool ref = false;
  std::string ref_dtype = "float32";  // the reference copy's parameter dtype (ModelOptions::dtype)
  int64_t ref_log_prob_micro_batch_size = 8;  // rows per reference log-prob forward on one rank
  int64_t ref_log_prob_max_token_len = 0;     // > 0: packed (UpdateOptions::max_token_len)
  bool ref_param_offload = false;  // the reference's parameters resident only while it computes

  bool operator==(const ActorRolloutRefOptions&) const = default;

  // The JSON text of every field. from_json is its inverse: it throws
  // baton::Error naming the key (`ActorRolloutRefOptions.optim.lr`) for
  // malformed text, a missing or unknown key, or a value of the wrong type.
  std::string to_json() const;
  static ActorRolloutRefOptions from_json(const std::string& text);
};

struct CriticOptions {
  ModelOptions model;
  OptimOptions optim;
  UpdateOptions update;
  double cliprange_value = 0.5;
  int64_t forward_micro_batch_size = 8;
  int64_t forward_max_token_len = 0;  // > 0: packed (UpdateOptions::max_token_len)

  bool operator==(const CriticOptions&) const = default;

  std::string to_json() const;  // as ActorRolloutRefOptions'
  static CriticOptions from_json(const std::string& text);
};

struct RewardModelOptions {
  ModelOptions model;            // a value model (value_model is forced on)
  int64_t micro_batch_size = 8;  // rows per scoring forward on one rank
  int64_t max_token_len = 0;     // > 0: packed (UpdateOptions::max_token_len)

  bool operator==(const RewardModelOptions&) const = default;

  std::string to_json() const;  // as ActorRolloutRefOptions'
  static RewardModelOptions from_json(const std::string& text);
};

}  // namespace baton::workers
