#include "trainer/config/verl_keys.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <sstream>

#include "trainer/config/config.h"

namespace baton::trainer {
namespace {

using F = VerlFate;

// Reasons several entries share.
constexpr const char* kNoRay = "baton has no Ray: its workers are its own processes";
constexpr const char* kPyClass =
    "names verl's Python config class; baton's settings are plain keys";
constexpr const char* kProfiler =
    "verl's per-role profiler; baton's is global_profiler.steps and global_profiler.save_path "
    "(one Chrome trace of every process)";
constexpr const char* kFsdpInternals =
    "an FSDP wrapping/sharding/prefetch setting: baton's data-parallel ranks hold whole "
    "parameters and shard the optimizer state (use_distributed_optimizer)";
constexpr const char* kUlysses =
    "baton has no Ulysses sequence parallelism; for long sequences use "
    "megatron.tensor_model_parallel_size with megatron.sequence_parallel=true";
constexpr const char* kNoCode =
    "baton runs no Python from a model or data folder: its model families are built in";
constexpr const char* kShm =
    "verl copies the model to /dev/shm first; baton maps the safetensors files directly";
constexpr const char* kNoCompile = "baton's model is C++ with its own fused kernels";
constexpr const char* kMbridge =
    "how verl converts HF weights for Megatron; baton reads HF safetensors itself";
constexpr const char* kDistCkpt =
    "baton loads HF safetensors and saves its own sharded checkpoints (trainer.default_local_dir)";
constexpr const char* kNoCp =
    "baton has no context parallelism; use tensor parallelism with megatron.sequence_parallel";
constexpr const char* kNoVpp =
    "baton's pipeline schedule is 1F1B without virtual (interleaved) stages";
constexpr const char* kNoEtp =
    "baton has no separate expert tensor-parallel size (experts are split by "
    "expert_model_parallel_size)";
constexpr const char* kRecompute =
    "baton's recomputation is actor_rollout_ref.model.enable_gradient_checkpointing (whole "
    "layers)";
constexpr const char* kRefLayout = "the reference policy runs in the actor's layout";
constexpr const char* kOptimOnly =
    "baton's optimizer is AdamW (optim.lr, weight_decay, betas) with a constant or cosine "
    "schedule (optim.lr_scheduler_type, min_lr_ratio, lr_warmup_steps[_ratio])";
constexpr const char* kTextOnly = "baton trains text models: image and video columns are not read";
constexpr const char* kCkptContents =
    "baton's checkpoints always hold the model, the optimizer state and the trainer's state, "
    "saved synchronously";
constexpr const char* kLoraMegatron =
    "verl's Megatron LoRA block; baton's LoRA keys are actor_rollout_ref.model.lora_rank, "
    "lora_alpha, target_modules (HF module names) and lora_adapter_path";
constexpr const char* kNoCriticLora = "baton trains LoRA adapters for the actor only";
constexpr const char* kOverrideModel =
    "baton builds the model from config.json as it is; edit config.json to change it";
constexpr const char* kMoeReplay = "baton does not record or replay MoE routing decisions";
constexpr const char* kEngineServer =
    "a setting of the vLLM/SGLang server verl drives; baton's own engine generates";
constexpr const char* kGenRm =
    "verl's generative reward-model server; baton's reward model scores with a value head "
    "(reward_model.*)";
constexpr const char* kRmPlacement =
    "baton's reward model runs on the trainer's workers (reward_model.centralized: on one)";
constexpr const char* kNoMtp = "baton has no multi-token-prediction heads";
constexpr const char* kTiledMlp =
    "baton does not tile the MLP; to save activation memory use "
    "actor_rollout_ref.model.enable_gradient_checkpointing";
constexpr const char* kGlobalMicro = "use the per-GPU size (..._micro_batch_size_per_gpu)";
constexpr const char* kCollective =
    "baton has one collective timeout for every role: trainer.collective_timeout_s";
constexpr const char* kPythonClass =
    "a Python class verl imports; baton reads parquet/JSONL rows with verl's columns";

// Keys are tried in this order: specific entries before the patterns that
// would also match them.
constexpr std::array kTable = {
    // --- verl's config classes, profilers, Ray ---
    VerlKey{"**._target_", F::kIgnored, kPyClass},
    VerlKey{"**.profiler.**", F::kIgnored, kProfiler},
    VerlKey{"global_profiler.tool", F::kIgnored,
            "baton's profiler writes one Chrome trace (its own spans); there is no tool to pick"},
    VerlKey{"global_profiler.profile_continuous_steps", F::kIgnored,
            "baton traces each of global_profiler.steps"},
    VerlKey{"global_profiler.global_tool_config.**", F::kIgnored,
            "options of nsys / torch memory profiling, which baton's profiler does not run"},
    VerlKey{"ray_kwargs.**", F::kIgnored, kNoRay},
    VerlKey{"trainer.ray_wait_register_center_timeout", F::kIgnored, kNoRay},
    VerlKey{"transfer_queue.enable", F::kDefaultOnly,
            "verl's experimental TransferQueue; baton's controller moves batches through shared "
            "memory itself",
            "false"},
    // --- trainer ---
    VerlKey{"trainer.use_legacy_worker_impl", F::kIgnored,
            "chooses between verl's worker implementations; baton has one"},
    VerlKey{"trainer.default_hdfs_dir", F::kDefaultOnly,
            "baton saves to trainer.default_local_dir only; copy it elsewhere yourself", "null"},
    VerlKey{"trainer.del_local_ckpt_after_load", F::kDefaultOnly,
            "baton never deletes a checkpoint it loaded", "false"},
    VerlKey{"trainer.esi_redundant_time", F::kIgnored,
            "verl's margin for saving before a spot instance expires; baton saves at "
            "trainer.save_freq"},
    VerlKey{"trainer.max_actor_ckpt_to_keep", F::kDefaultOnly,
            "baton keeps every checkpoint it saves", "null"},
    VerlKey{"trainer.max_critic_ckpt_to_keep", F::kDefaultOnly,
            "baton keeps every checkpoint it saves", "null"},
    VerlKey{"trainer.val_only", F::kDefaultOnly, "baton has no validation-only run", "false"},
    // --- actor_rollout_ref: the model ---
    VerlKey{"actor_rollout_ref.hybrid_engine", F::kDefaultOnly,
            "baton's actor, rollout and reference share their processes (the HybridEngine); a "
            "separate rollout is the fully-async mode (async_training.enable)",
            "true"},
    VerlKey{"actor_rollout_ref.nccl_timeout", F::kMapped, "trainer.collective_timeout_s"},
    VerlKey{"actor_rollout_ref.model.custom_chat_template", F::kDefaultOnly,
            "baton renders the tokenizer's chat_template (tokenizer_config.json); put another "
            "template there",
            "null"},
    VerlKey{"actor_rollout_ref.model.enable_activation_offload", F::kDefaultOnly, kRecompute,
            "false"},
    VerlKey{"actor_rollout_ref.model.exclude_modules", F::kDefaultOnly,
            "baton's LoRA targets are actor_rollout_ref.model.target_modules", "null"},
    VerlKey{"actor_rollout_ref.model.external_lib", F::kDefaultOnly, kNoCode, "null"},
    VerlKey{"actor_rollout_ref.model.fused_kernel_options.**", F::kIgnored,
            "baton's fused LM head (model.use_fused_kernels) has one implementation"},
    VerlKey{"actor_rollout_ref.model.hf_config_path", F::kDefaultOnly,
            "baton reads config.json from actor_rollout_ref.model.path", "null"},
    VerlKey{"actor_rollout_ref.model.override_config.**", F::kDefaultOnly, kOverrideModel,
            "{}|false|null"},
    VerlKey{"actor_rollout_ref.model.tiled_mlp.enabled", F::kDefaultOnly, kTiledMlp, "false"},
    VerlKey{"actor_rollout_ref.model.tiled_mlp.num_shards", F::kIgnored,
            "only with tiled_mlp.enabled"},
    VerlKey{"actor_rollout_ref.model.tokenizer_path", F::kMapped, "data.tokenizer"},
    VerlKey{"actor_rollout_ref.model.trust_remote_code", F::kIgnored, kNoCode},
    VerlKey{"actor_rollout_ref.model.use_liger", F::kDefaultOnly,
            "Liger kernels; baton's own fused LM head is actor_rollout_ref.model.use_fused_kernels",
            "false"},
    VerlKey{"actor_rollout_ref.model.use_shm", F::kIgnored, kShm},
    VerlKey{"actor_rollout_ref.model.lora.rank", F::kMapped, "actor_rollout_ref.model.lora_rank"},
    VerlKey{"actor_rollout_ref.model.lora.alpha", F::kMapped,
            "actor_rollout_ref.model.lora_alpha"},
    VerlKey{"actor_rollout_ref.model.lora.adapter_path", F::kMapped,
            "actor_rollout_ref.model.lora_adapter_path"},
    VerlKey{"actor_rollout_ref.model.lora.target_modules", F::kRefused, kLoraMegatron},
    VerlKey{"actor_rollout_ref.model.lora.merge", F::kIgnored,
            "baton's rollout receives the adapted weights by resharding, merged or not as it "
            "decides"},
    VerlKey{"actor_rollout_ref.model.lora.dropout", F::kDefaultOnly, "baton's LoRA has no dropout",
            "0|0.0"},
    VerlKey{"actor_rollout_ref.model.lora.type", F::kDefaultOnly, kLoraMegatron, "lora"},
    VerlKey{"actor_rollout_ref.model.lora.exclude_modules", F::kDefaultOnly, kLoraMegatron,
            "[]|null"},
    VerlKey{"actor_rollout_ref.model.lora.dtype", F::kDefaultOnly,
            "baton's adapters train in the actor's dtype", "null"},
    VerlKey{"actor_rollout_ref.model.lora.freeze_language_model", F::kDefaultOnly, kLoraMegatron,
            "true"},
    VerlKey{"actor_rollout_ref.model.lora.*", F::kIgnored,
            "an option of Megatron-Bridge's LoRA (vision towers, init methods, dropout position, "
            "all-to-all); baton's LoRA initialises A randomly and B to zero"},
    VerlKey{"actor_rollout_ref.model.mtp.enable", F::kDefaultOnly, kNoMtp, "false"},
    VerlKey{"actor_rollout_ref.model.mtp.*", F::kIgnored, "only with mtp.enable"},
    // --- actor ---
    VerlKey{"actor_rollout_ref.actor.calculate_entropy", F::kIgnored,
            "baton reports actor/entropy from the old-log-prob pass always"},
    VerlKey{"actor_rollout_ref.actor.sum_pi_squared_checkpointing", F::kIgnored,
            "a memory option of verl's sum-of-squared-probabilities pass"},
    VerlKey{"**.checkpoint.async_save", F::kDefaultOnly, kCkptContents, "false"},
    VerlKey{"**.checkpoint.*", F::kIgnored, kCkptContents},
    VerlKey{"actor_rollout_ref.actor.data_loader_seed", F::kIgnored,
            "baton seeds the mini-batch shuffle (actor.shuffle) from data.seed"},
    VerlKey{"critic.data_loader_seed", F::kIgnored,
            "baton seeds the mini-batch shuffle (critic.shuffle) from data.seed"},
    VerlKey{"**.entropy_checkpointing", F::kIgnored,
            "a memory option of verl's entropy pass; baton computes entropy per micro-batch"},
    VerlKey{"**.entropy_from_logits_with_chunking", F::kIgnored,
            "a memory option of verl's entropy pass; baton computes entropy per micro-batch"},
    VerlKey{"actor_rollout_ref.actor.freeze_vision_tower", F::kDefaultOnly, kTextOnly, "false"},
    VerlKey{"**.load_weight", F::kDefaultOnly,
            "baton always loads the weights from model.path", "true"},
    VerlKey{"actor_rollout_ref.actor.ppo_micro_batch_size", F::kDefaultOnly, kGlobalMicro,
            "null"},
    VerlKey{"critic.ppo_micro_batch_size", F::kDefaultOnly, kGlobalMicro, "null"},
    VerlKey{"actor_rollout_ref.ref.log_prob_micro_batch_size", F::kDefaultOnly, kGlobalMicro,
            "null"},
    VerlKey{"actor_rollout_ref.rollout.log_prob_micro_batch_size", F::kDefaultOnly, kGlobalMicro,
            "null"},
    VerlKey{"reward_model.micro_batch_size", F::kDefaultOnly, kGlobalMicro, "null"},
    VerlKey{"critic.forward_micro_batch_size", F::kDefaultOnly, kGlobalMicro, "null"},
    VerlKey{"critic.forward_micro_batch_size_per_gpu", F::kIgnored,
            "the critic's forward passes use critic.ppo_micro_batch_size_per_gpu (or its token "
            "budget with use_dynamic_bsz)"},
    VerlKey{"**.rollout_n", F::kIgnored, "follows actor_rollout_ref.rollout.n"},
    VerlKey{"actor_rollout_ref.actor.router_replay.mode", F::kDefaultOnly, kMoeReplay,
            "disabled"},
    VerlKey{"actor_rollout_ref.ref.router_replay.mode", F::kDefaultOnly, kMoeReplay, "disabled"},
    VerlKey{"**.router_replay.*", F::kIgnored, "only with router_replay.mode"},
    VerlKey{"actor_rollout_ref.actor.tau_pos", F::kMapped,
            "actor_rollout_ref.actor.policy_loss.tau_pos"},
    VerlKey{"actor_rollout_ref.actor.tau_neg", F::kMapped,
            "actor_rollout_ref.actor.policy_loss.tau_neg"},
    VerlKey{"**.ulysses_sequence_parallel_size", F::kDefaultOnly, kUlysses, "1"},
    VerlKey{"actor_rollout_ref.actor.use_fused_kernels", F::kMapped,
            "actor_rollout_ref.model.use_fused_kernels"},
    VerlKey{"actor_rollout_ref.actor.use_remove_padding", F::kMapped,
            "actor_rollout_ref.model.use_remove_padding"},
    VerlKey{"actor_rollout_ref.actor.megatron.use_remove_padding", F::kMapped,
            "actor_rollout_ref.model.use_remove_padding"},
    VerlKey{"actor_rollout_ref.actor.use_prefix_grouper", F::kDefaultOnly,
            "baton shares a prompt's KV blocks among its samples in the rollout; training "
            "computes each sequence whole",
            "false"},
    VerlKey{"**.use_torch_compile", F::kIgnored, kNoCompile},
    // FSDP settings: the ones baton has under its own names, then the rest.
    VerlKey{"actor_rollout_ref.actor.fsdp_config.param_offload", F::kMapped,
            "actor_rollout_ref.actor.megatron.param_offload"},
    VerlKey{"actor_rollout_ref.actor.fsdp_config.optimizer_offload", F::kMapped,
            "actor_rollout_ref.actor.megatron.optimizer_offload"},
    VerlKey{"actor_rollout_ref.actor.fsdp_config.offload_policy", F::kDefaultOnly,
            "FSDP2's CPU offload policy; baton's offload keys are fsdp_config.param_offload and "
            "optimizer_offload (megatron.*_offload)",
            "false"},
    VerlKey{"actor_rollout_ref.actor.fsdp_config.dtype", F::kMapped,
            "actor_rollout_ref.actor.megatron.dtype"},
    VerlKey{"actor_rollout_ref.actor.fsdp_config.seed", F::kMapped,
            "actor_rollout_ref.actor.megatron.seed"},
    VerlKey{"actor_rollout_ref.actor.fsdp_config.strategy", F::kMapped,
            "actor_rollout_ref.actor.strategy"},
    VerlKey{"actor_rollout_ref.ref.fsdp_config.param_offload", F::kMapped,
            "actor_rollout_ref.ref.megatron.param_offload"},
    VerlKey{"critic.model.fsdp_config.param_offload", F::kMapped, "critic.megatron.param_offload"},
    VerlKey{"critic.model.fsdp_config.optimizer_offload", F::kMapped,
            "critic.megatron.optimizer_offload"},
    VerlKey{"critic.model.fsdp_config.dtype", F::kMapped, "critic.megatron.dtype"},
    VerlKey{"critic.model.fsdp_config.seed", F::kMapped, "critic.megatron.seed"},
    VerlKey{"critic.model.fsdp_config.strategy", F::kMapped, "critic.strategy"},
    VerlKey{"reward_model.model.fsdp_config.param_offload", F::kMapped,
            "reward_model.megatron.param_offload"},
    VerlKey{"**.fsdp_config.model_dtype", F::kIgnored,
            "baton keeps fp32 master weights in the optimizer whatever megatron.dtype is"},
    VerlKey{"**.fsdp_config.**", F::kIgnored, kFsdpInternals},
    // Megatron settings baton lacks.
    VerlKey{"actor_rollout_ref.ref.megatron.*", F::kIgnored, kRefLayout},
    VerlKey{"**.megatron.context_parallel_size", F::kDefaultOnly, kNoCp, "1"},
    VerlKey{"**.megatron.virtual_pipeline_model_parallel_size", F::kDefaultOnly, kNoVpp, "null"},
    VerlKey{"**.megatron.expert_tensor_parallel_size", F::kDefaultOnly, kNoEtp, "null|1"},
    VerlKey{"**.megatron.use_dist_checkpointing", F::kDefaultOnly, kDistCkpt, "false"},
    VerlKey{"**.megatron.dist_checkpointing_*", F::kIgnored, "only with use_dist_checkpointing"},
    VerlKey{"**.megatron.forward_only", F::kIgnored, "baton knows which roles only run forward"},
    VerlKey{"**.megatron.override_ddp_config", F::kDefaultOnly,
            "baton's data-parallel gradient reduction is set by megatron.overlap_grad_reduce and "
            "grad_reduce_bucket_bytes",
            "{}|null"},
    VerlKey{"**.megatron.override_mcore_model_config", F::kDefaultOnly, kOverrideModel,
            "{}|null"},
    VerlKey{"**.override_transformer_config.attention_backend", F::kIgnored,
            "baton picks its attention kernel for the device"},
    VerlKey{"**.override_transformer_config.recompute_*", F::kDefaultOnly, kRecompute,
            "null|[core_attn]"},
    VerlKey{"**.megatron.override_transformer_config", F::kIgnored,
            "follows the actor's (baton's recomputation is model.enable_gradient_checkpointing)"},
    VerlKey{"**.megatron.use_mbridge", F::kIgnored, kMbridge},
    VerlKey{"**.megatron.vanilla_mbridge", F::kIgnored, kMbridge},
    VerlKey{"critic.megatron.use_remove_padding", F::kIgnored,
            "the critic packs its micro-batches with critic.use_dynamic_bsz"},
    VerlKey{"reward_model.megatron.use_remove_padding", F::kIgnored,
            "the reward model packs its micro-batches with reward_model.use_dynamic_bsz"},
    VerlKey{"reward_model.megatron.dtype", F::kIgnored,
            "the reward model runs in the dtype of its safetensors files"},
    VerlKey{"reward_model.megatron.seed", F::kIgnored, "the reward model has no random state"},
    VerlKey{"reward_model.megatron.expert_model_parallel_size", F::kDefaultOnly,
            "baton's reward model runs without expert parallelism", "1"},
    VerlKey{"reward_model.megatron.use_distributed_optimizer", F::kIgnored,
            "the reward model is not trained"},
    // Optimizers (the actor's and the critic's).
    VerlKey{"actor_rollout_ref.actor.optim.clip_grad", F::kMapped,
            "actor_rollout_ref.actor.grad_clip"},
    VerlKey{"critic.optim.clip_grad", F::kMapped, "critic.grad_clip"},
    VerlKey{"actor_rollout_ref.actor.optim.lr_decay_style", F::kMapped,
            "actor_rollout_ref.actor.optim.lr_scheduler_type"},
    VerlKey{"critic.optim.lr_decay_style", F::kMapped, "critic.optim.lr_scheduler_type"},
    VerlKey{"actor_rollout_ref.actor.optim.warmup_style", F::kMapped,
            "actor_rollout_ref.actor.optim.lr_scheduler_type"},
    VerlKey{"critic.optim.warmup_style", F::kMapped, "critic.optim.lr_scheduler_type"},
    VerlKey{"**.optim.total_training_steps", F::kIgnored,
            "set by the trainer from trainer.total_training_steps"},
    VerlKey{"**.optim.optimizer", F::kDefaultOnly, kOptimOnly, "adam|adamw"},
    VerlKey{"**.optim.optimizer_impl", F::kDefaultOnly, kOptimOnly, "torch.optim"},
    VerlKey{"**.optim.override_optimizer_config", F::kDefaultOnly, kOptimOnly, "{}|null"},
    VerlKey{"**.optim.min_lr", F::kDefaultOnly,
            "the schedule's floor is optim.min_lr_ratio (a fraction of optim.lr)", "0|0.0"},
    VerlKey{"**.optim.lr_warmup_init", F::kDefaultOnly, "baton's warm-up starts from 0", "0|0.0"},
    VerlKey{"**.optim.lr_decay_steps", F::kDefaultOnly,
            "baton's schedule decays over the whole run", "null"},
    VerlKey{"**.optim.num_cycles", F::kDefaultOnly,
            "baton's cosine schedule is half a cycle", "0.5"},
    VerlKey{"**.optim.weight_decay_incr_style", F::kDefaultOnly,
            "baton's weight decay is constant (optim.weight_decay)", "constant"},
    VerlKey{"**.optim.use_checkpoint_opt_param_scheduler", F::kDefaultOnly,
            "baton's schedule always resumes from the checkpoint's step", "false"},
    VerlKey{"**.optim.lr_wsd_*", F::kIgnored, "only with the WSD schedule, which baton lacks"},
    // --- the reference policy ---
    VerlKey{"actor_rollout_ref.ref.strategy", F::kIgnored, kRefLayout},
    // --- the rollout ---
    VerlKey{"actor_rollout_ref.rollout.name", F::kIgnored,
            "baton's own engine generates (vllm, sglang, trtllm and hf all name it)"},
    VerlKey{"actor_rollout_ref.rollout.mode", F::kIgnored,
            "baton's rollout serves all of a step's requests at once, as verl's async mode does; "
            "there is no sync/async switch"},
    VerlKey{"actor_rollout_ref.rollout.agent.agent_loop_config_path", F::kDefaultOnly,
            "baton's agent loop is configured by rollout.multi_turn (tools: BATON_TOOL or "
            "tool_config_path)",
            "null"},
    VerlKey{"actor_rollout_ref.rollout.agent.custom_async_server.*", F::kDefaultOnly,
            kEngineServer, "null"},
    VerlKey{"actor_rollout_ref.rollout.agent.default_agent_loop", F::kIgnored,
            "baton picks the loop from rollout.multi_turn.enable"},
    VerlKey{"actor_rollout_ref.rollout.agent.num_workers", F::kIgnored,
            "baton's agent loops run inside the rollout workers"},
    VerlKey{"actor_rollout_ref.rollout.calculate_log_probs", F::kIgnored,
            "baton's rollout returns its log-probs whenever a correction needs them"},
    VerlKey{"actor_rollout_ref.rollout.checkpoint_engine.**", F::kIgnored,
            "how verl ships weights to the inference server; baton reshards them in place"},
    VerlKey{"actor_rollout_ref.rollout.cudagraph_capture_sizes", F::kIgnored,
            "baton captures CUDA graphs for its own decode batch sizes (rollout.enforce_eager)"},
    VerlKey{"actor_rollout_ref.rollout.data_parallel_size", F::kDefaultOnly,
            "the rollout's data-parallel size is the workers over "
            "rollout.tensor_model_parallel_size",
            "1"},
    VerlKey{"actor_rollout_ref.rollout.pipeline_model_parallel_size", F::kDefaultOnly,
            "baton's rollout is split by tensor parallelism only", "1"},
    VerlKey{"actor_rollout_ref.rollout.expert_parallel_size", F::kDefaultOnly,
            "baton's rollout is split by tensor parallelism only", "1"},
    VerlKey{"actor_rollout_ref.rollout.disable_log_stats", F::kIgnored, kEngineServer},
    VerlKey{"actor_rollout_ref.rollout.enable_chunked_prefill", F::kIgnored,
            "baton's scheduler decides how prefill is batched"},
    VerlKey{"actor_rollout_ref.rollout.enable_prefix_caching", F::kIgnored,
            "baton always shares a prompt's KV blocks among its n samples"},
    VerlKey{"actor_rollout_ref.rollout.enable_rollout_routing_replay", F::kDefaultOnly, kMoeReplay,
            "false"},
    VerlKey{"actor_rollout_ref.rollout.engine_kwargs.**", F::kIgnored, kEngineServer},
    VerlKey{"actor_rollout_ref.rollout.ignore_eos", F::kDefaultOnly,
            "baton's rollout stops at the end-of-sequence token", "false"},
    VerlKey{"actor_rollout_ref.rollout.layer_name_map.*", F::kIgnored, kEngineServer},
    VerlKey{"actor_rollout_ref.rollout.layered_summon", F::kIgnored,
            "verl gathers FSDP (LoRA) weights layer by layer; baton's resharding moves to each "
            "rollout rank only what it needs"},
    VerlKey{"actor_rollout_ref.rollout.load_format", F::kIgnored,
            "baton's rollout receives the trained weights by resharding, never from a file"},
    VerlKey{"actor_rollout_ref.rollout.logprobs_mode", F::kIgnored,
            "baton's rollout log-probs are those of the distribution it samples from"},
    VerlKey{"actor_rollout_ref.rollout.max_model_len", F::kIgnored,
            "baton's limit is data.max_prompt_length + rollout.response_length"},
    VerlKey{"actor_rollout_ref.rollout.max_num_batched_tokens", F::kIgnored,
            "baton bounds a step by rollout.max_num_seqs and the KV-cache budget"},
    VerlKey{"actor_rollout_ref.rollout.mtp", F::kIgnored, kNoMtp},
    VerlKey{"actor_rollout_ref.rollout.multi_stage_wake_up", F::kIgnored, kEngineServer},
    VerlKey{"actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", F::kDefaultOnly,
            "use rollout.n", "null"},
    VerlKey{"actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", F::kIgnored,
            "baton builds multi-turn token ids directly; there is no re-tokenisation to check"},
    VerlKey{"actor_rollout_ref.rollout.multi_turn.use_inference_chat_template", F::kDefaultOnly,
            "baton renders every turn with the tokenizer's chat template", "false"},
    VerlKey{"actor_rollout_ref.rollout.over_sample_rate", F::kDefaultOnly,
            "baton waits for every sample of a step (use async_training for partial batches)",
            "0|0.0"},
    VerlKey{"actor_rollout_ref.rollout.prometheus.**", F::kIgnored, kEngineServer},
    VerlKey{"actor_rollout_ref.rollout.prompt_length", F::kIgnored,
            "baton takes data.max_prompt_length"},
    VerlKey{"actor_rollout_ref.rollout.quantization", F::kDefaultOnly,
            "baton's rollout runs in rollout.dtype", "null"},
    VerlKey{"actor_rollout_ref.rollout.quantization_config_file", F::kDefaultOnly,
            "baton's rollout runs in rollout.dtype", "null"},
    VerlKey{"actor_rollout_ref.rollout.scheduling_policy", F::kDefaultOnly,
            "baton's scheduler serves requests first come, first served", "fcfs"},
    VerlKey{"actor_rollout_ref.rollout.skip_rollout", F::kDefaultOnly,
            "baton always generates", "false"},
    VerlKey{"actor_rollout_ref.rollout.skip_dump_dir", F::kIgnored, "only with skip_rollout"},
    VerlKey{"actor_rollout_ref.rollout.skip_tokenizer_init", F::kIgnored,
            "baton's engine works on token ids; the driver holds the tokenizer"},
    VerlKey{"actor_rollout_ref.rollout.trace.**", F::kIgnored, kProfiler},
    // --- algorithm ---
    VerlKey{"algorithm.use_pf_ppo", F::kDefaultOnly,
            "baton has no PF-PPO reweighting of the batch", "false"},
    VerlKey{"algorithm.pf_ppo.*", F::kIgnored, "only with algorithm.use_pf_ppo"},
    // --- critic ---
    VerlKey{"critic.nccl_timeout", F::kIgnored, kCollective},
    VerlKey{"critic.model.enable_activation_offload", F::kDefaultOnly, kRecompute, "false"},
    VerlKey{"critic.model.external_lib", F::kDefaultOnly, kNoCode, "null"},
    VerlKey{"critic.model.lora_rank", F::kDefaultOnly, kNoCriticLora, "0"},
    VerlKey{"critic.model.lora_alpha", F::kIgnored, "only with critic.model.lora_rank"},
    VerlKey{"critic.model.target_modules", F::kIgnored, "only with critic.model.lora_rank"},
    VerlKey{"critic.model.lora.rank", F::kDefaultOnly, kNoCriticLora, "0"},
    VerlKey{"critic.model.lora.*", F::kIgnored, "only with critic.model.lora.rank"},
    VerlKey{"critic.model.override_config.**", F::kDefaultOnly, kOverrideModel, "{}|false|null"},
    VerlKey{"critic.model.tiled_mlp.enabled", F::kDefaultOnly, kTiledMlp, "false"},
    VerlKey{"critic.model.tiled_mlp.num_shards", F::kIgnored, "only with tiled_mlp.enabled"},
    VerlKey{"critic.model.tokenizer_path", F::kIgnored, "the critic uses data.tokenizer"},
    VerlKey{"critic.model.trust_remote_code", F::kIgnored, kNoCode},
    VerlKey{"critic.model.use_remove_padding", F::kIgnored,
            "the critic packs its micro-batches with critic.use_dynamic_bsz"},
    VerlKey{"critic.model.use_shm", F::kIgnored, kShm},
    // --- data ---
    VerlKey{"data.apply_chat_template_kwargs", F::kDefaultOnly,
            "baton renders the chat template with its defaults", "{}|null"},
    VerlKey{"data.custom_cls.*", F::kDefaultOnly, kPythonClass, "null"},
    VerlKey{"data.datagen.*", F::kDefaultOnly, kPythonClass, "null"},
    VerlKey{"data.sampler.*", F::kDefaultOnly,
            "baton's sampler shuffles with data.seed (data.shuffle)", "null"},
    VerlKey{"data.dataloader_num_workers", F::kIgnored,
            "baton's loader reads the files in the driver process"},
    VerlKey{"data.filter_overlong_prompts_workers", F::kIgnored,
            "baton's loader reads the files in the driver process"},
    VerlKey{"data.image_key", F::kIgnored, kTextOnly},
    VerlKey{"data.video_key", F::kIgnored, kTextOnly},
    VerlKey{"data.image_patch_size", F::kIgnored, kTextOnly},
    VerlKey{"data.return_multi_modal_inputs", F::kIgnored, kTextOnly},
    VerlKey{"data.return_raw_chat", F::kIgnored,
            "baton keeps the chat and renders its template itself, as verl's async rollout does"},
    VerlKey{"data.return_full_prompt", F::kIgnored,
            "baton keeps the chat and renders its template itself"},
    VerlKey{"data.return_raw_input_ids", F::kIgnored,
            "baton's rollout and reward model share the actor's tokenizer"},
    VerlKey{"data.tool_config_path", F::kIgnored,
            "baton reads actor_rollout_ref.rollout.multi_turn.tool_config_path"},
    VerlKey{"data.train_max_samples", F::kDefaultOnly,
            "baton reads every row of data.train_files", "-1"},
    VerlKey{"data.val_max_samples", F::kDefaultOnly, "baton reads every row of data.val_files",
            "-1"},
    VerlKey{"data.trust_remote_code", F::kIgnored, kNoCode},
    VerlKey{"data.use_shm", F::kIgnored, "baton reads the data files where they are"},
    VerlKey{"data.validation_shuffle", F::kDefaultOnly,
            "baton validates on data.val_files in order", "false"},
    // --- reward ---
    VerlKey{"reward_manager.name", F::kMapped, "reward_model.reward_manager"},
    VerlKey{"reward_manager.source", F::kDefaultOnly,
            "baton's reward managers are built in (reward_model.reward_manager)", "register"},
    VerlKey{"reward_manager.module.*", F::kDefaultOnly,
            "a Python reward manager class; baton's reward managers are built in, and a Python "
            "reward function is custom_reward_function.path",
            "null|custom_reward_manager"},
    VerlKey{"reward_model.enable_resource_pool", F::kDefaultOnly, kRmPlacement, "false"},
    VerlKey{"reward_model.n_gpus_per_node", F::kIgnored, kRmPlacement},
    VerlKey{"reward_model.nnodes", F::kIgnored, kRmPlacement},
    VerlKey{"reward_model.num_workers", F::kIgnored, kRmPlacement},
    VerlKey{"reward_model.nccl_timeout", F::kIgnored, kCollective},
    VerlKey{"reward_model.strategy", F::kIgnored,
            "the reward model's layout is reward_model.megatron.*"},
    VerlKey{"reward_model.launch_reward_fn_async", F::kIgnored,
            "baton scores rewards while the other passes run (reward_model.prefetch)"},
    VerlKey{"reward_model.max_length", F::kIgnored,
            "baton scores each prompt and response as generated"},
    VerlKey{"reward_model.model.input_tokenizer", F::kIgnored,
            "baton's reward model shares the actor's tokenizer"},
    VerlKey{"reward_model.model.external_lib", F::kDefaultOnly, kNoCode, "null"},
    VerlKey{"reward_model.model.trust_remote_code", F::kIgnored, kNoCode},
    VerlKey{"reward_model.model.override_config", F::kDefaultOnly, kOverrideModel, "{}|null"},
    VerlKey{"reward_model.model.use_fused_kernels", F::kIgnored,
            "the reward model reads a value head, not the LM head"},
    VerlKey{"reward_model.model.use_remove_padding", F::kIgnored,
            "the reward model packs its micro-batches with reward_model.use_dynamic_bsz"},
    VerlKey{"reward_model.model.use_shm", F::kIgnored, kShm},
    VerlKey{"reward_model.reward_loop_source", F::kDefaultOnly,
            "baton's reward managers are built in", "register"},
    VerlKey{"reward_model.reward_loop_*", F::kDefaultOnly, "baton's reward managers are built in",
            "null"},
    VerlKey{"reward_model.use_reward_loop", F::kIgnored,
            "baton scores with its reward manager and reward model directly"},
    VerlKey{"reward_model.sandbox_fusion.url", F::kDefaultOnly,
            "baton's code tools run in its own sandbox (workers/tools, configs/tools)", "null"},
    VerlKey{"reward_model.sandbox_fusion.*", F::kIgnored, "only with sandbox_fusion.url"},
    VerlKey{"reward_model.rollout.**", F::kIgnored, kGenRm},
};

// Whether `pattern` (segments, `*`, `**`) matches `key`.
bool matches(std::string_view pattern, std::string_view key) {
  if (pattern.empty()) return key.empty();
  const size_t pdot = pattern.find('.');
  const std::string_view head = pattern.substr(0, pdot);
  const std::string_view rest = pdot == std::string_view::npos ? "" : pattern.substr(pdot + 1);
  if (head == "**") {
    if (matches(rest, key)) return true;
    for (size_t dot = key.find('.'); !key.empty(); dot = key.find('.')) {
      key = dot == std::string_view::npos ? "" : key.substr(dot + 1);
      if (matches(rest, key)) return true;
      if (dot == std::string_view::npos) break;
    }
    return false;
  }
  if (key.empty()) return false;
  const size_t kdot = key.find('.');
  const std::string_view segment = key.substr(0, kdot);
  // A segment pattern: `*`, or a name with at most one trailing `*` (`recompute_*`).
  const bool segment_ok =
      head == "*" || head == segment ||
      (head.back() == '*' && segment.substr(0, head.size() - 1) == head.substr(0, head.size() - 1));
  if (!segment_ok) return false;
  const std::string_view key_rest = kdot == std::string_view::npos ? "" : key.substr(kdot + 1);
  if (rest.empty()) return key_rest.empty() && (pdot == std::string_view::npos);
  return matches(rest, key_rest);
}

// A value as the comparison sees it: lower case, unquoted, spaces dropped,
// `~` and "" as null.
std::string normalized(std::string_view value) {
  std::string v;
  for (char c : value)
    if (!std::isspace(static_cast<unsigned char>(c)))
      v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"') && v.back() == v.front())
    v = v.substr(1, v.size() - 2);
  if (v.empty() || v == "~" || v == "none") return "null";
  return v;
}

bool same_value(std::string_view given, std::string_view accepted) {
  const std::string a = normalized(given), b = normalized(accepted);
  if (a == b) return true;
  double x = 0, y = 0;
  const auto [pa, ea] = std::from_chars(a.data(), a.data() + a.size(), x);
  const auto [pb, eb] = std::from_chars(b.data(), b.data() + b.size(), y);
  return ea == std::errc() && eb == std::errc() && pa == a.data() + a.size() &&
         pb == b.data() + b.size() && x == y;
}

bool accepted_value(const VerlKey& entry, std::string_view value) {
  std::string_view list = entry.accepted;
  while (true) {
    const size_t bar = list.find('|');
    if (same_value(value, list.substr(0, bar))) return true;
    if (bar == std::string_view::npos) return false;
    list = list.substr(bar + 1);
  }
}

const char* fate_name(VerlFate fate) {
  switch (fate) {
    case VerlFate::kMapped:
      return "mapped";
    case VerlFate::kIgnored:
      return "ignored";
    case VerlFate::kDefaultOnly:
      return "default only";
    case VerlFate::kRefused:
      return "refused";
  }
  return "";
}

}  // namespace

std::span<const VerlKey> verl_keys() { return kTable; }

const VerlKey* find_verl_key(std::string_view key) {
  for (const VerlKey& entry : kTable)
    if (matches(entry.pattern, key)) return &entry;
  return nullptr;
}

void apply_verl_override(Config& config, std::string_view override_text,
                         std::vector<std::string>& notes) {
  std::string_view body = override_text;
  while (!body.empty() && body.front() == '+') body.remove_prefix(1);
  const size_t eq = body.find('=');
  const std::string_view key = body.substr(0, eq);
  const VerlKey* entry = eq == std::string_view::npos || config.has(key) ? nullptr
                                                                         : find_verl_key(key);
  if (!entry) {
    config.apply_override(override_text);
    return;
  }
  const std::string value(body.substr(eq + 1));
  const std::string what = std::string(key) + "=" + value;
  switch (entry->fate) {
    case VerlFate::kMapped:
      config.apply_override(std::string(entry->detail) + "=" + value);
      notes.push_back(what + ": verl's name for " + entry->detail);
      return;
    case VerlFate::kIgnored:
      notes.push_back(what + ": ignored: " + entry->detail);
      return;
    case VerlFate::kDefaultOnly:
      if (accepted_value(*entry, value)) {
        notes.push_back(what + ": no effect: " + entry->detail);
        return;
      }
      throw ConfigError(what + ": baton accepts only " + entry->accepted + " here: " +
                        entry->detail);
    case VerlFate::kRefused:
      throw ConfigError(what + ": verl's key is not baton's: " + entry->detail);
  }
}

std::string verl_keys_markdown() {
  std::ostringstream out;
  out << "| verl key | fate | in baton |\n|---|---|---|\n";
  for (const VerlKey& e : kTable) {
    std::string detail = e.detail;
    if (e.fate == VerlFate::kMapped) detail = "`" + detail + "`";
    if (e.fate == VerlFate::kDefaultOnly) {
      std::string accepted = e.accepted;
      std::replace(accepted.begin(), accepted.end(), '|', ',');
      detail = "accepted: `" + accepted + "`; " + detail;
    }
    out << "| `" << e.pattern << "` | " << fate_name(e.fate) << " | " << detail << " |\n";
  }
  return out.str();
}

}  // namespace baton::trainer
