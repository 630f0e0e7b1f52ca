// Transformer: the decoder-only model of the HF Llama / Qwen2 / Qwen3 /
// Mistral families (engine/io/model_config.h), as one
// pipeline stage of a Megatron-style TP × PP layout (the whole model when
// pp = 1). The first stage embeds tokens; the last stage applies the final norm
// and either the LM head (logits sharded over the vocabulary on TP ranks) or
// the value head (hidden → 1, the critic's model, seed 000).
//
// The vocabulary is padded for tensor parallelism (vocab_padding.h): the
// embedding and LM head hold ParallelConfig::padded_vocab_size() rows, and
// the padded logit columns hold -inf, so every consumer of the logits sees
// exactly the distribution over the real vocabulary.
//
// Example (one process, whole model):
//   auto cfg = ModelConfig::load(dir);
//   auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
//   model->load_state_dict(hf_to_shard(read_hf_weights(dir), cfg, model->shard_spec()));
//   auto logits = model->forward(ids, position_ids, attention_mask);  // [B, S, Vp]
//
// Thread safety: none; a model belongs to one worker thread. forward() is
// collective over the TP group (every TP rank calls it with the same batch).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer_layer.h"
#include "engine/parallel/parallel_linear.h"
#include "engine/parallel/parallel_state.h"
#include "engine/parallel/vocab_padding.h"
#include "engine/rollout/kv_cache.h"

namespace baton::engine {

// How a packed row's attention runs (Transformer::forward's packed_lengths).
// Per sequence: one causal attention call per sequence (cost: the sum of the
// squared lengths). Dense bias: one call over the whole row with a
// block-diagonal causal bias (cost: the square of the row, one kernel
// launch). Auto: the dense bias for rows up to kDenseBiasMaxTokens on a GPU
// (where many short sequences would otherwise be launch-bound) and up to
// kDenseBiasMaxTokensCpu on the CPU (short rows, where the calls' overhead
// outweighs the masked work), sequence by sequence above.
enum class PackedAttention { kAuto, kPerSequence, kDenseBias };
inline constexpr int64_t kDenseBiasMaxTokens = 4096;
inline constexpr int64_t kDenseBiasMaxTokensCpu = 512;

struct TransformerOptions {
  // Value head (hidden → 1) on the last stage instead of the LM head.
  bool value_model = false;
  // Megatron sequence parallelism: the residual stream between TP regions is
  // split over the sequence (S must divide by tp). LayerNorm and value-head
  // gradients then need a TP all-reduce (`tp_partial_grad`).
  bool sequence_parallel = false;
  // Full activation recomputation: each layer keeps only its input during
  // forward and runs again in backward (memory for compute).
  bool recompute_activations = false;
  // Seed of the value head's fresh initialisation (same on every rank).
  uint64_t value_head_seed = 1234;
  PackedAttention packed_attention = PackedAttention::kAuto;
  // LoRA adapters (lora.h): with a rank > 0 every base parameter is frozen
  // (requires_grad false) and only the adapters train (trainable_params).
  LoraOptions lora;

  TransformerOptions& set_value_model(bool v) {
    value_model = v;
    return *this;
  }
  TransformerOptions& set_sequence_parallel(bool v) {
    sequence_parallel = v;
    return *this;
  }
  TransformerOptions& set_recompute_activations(bool v) {
    recompute_activations = v;
    return *this;
  }
  TransformerOptions& set_packed_attention(PackedAttention v) {
    packed_attention = v;
    return *this;
  }
};

class Transformer : public torch::nn::Module {
 public:
  // Builds this rank's stage: layers [state->layer_begin(), layer_end()).
  // Throws EngineError for unsupported options (Llama with attention or MLP
  // biases) and sizes the TP size does not divide (kv heads, intermediate;
  // the vocabulary is padded).
  Transformer(ModelConfig config, std::shared_ptr<ParallelState> state,
              TransformerOptions options = {});

  // One stage's forward. `input`: token ids [B, S] (int64) on the first
  // stage, else the previous stage's output. `position_ids` and
  // `attention_mask` ([B, S], 1 = real token) are the whole batch's, on every
  // stage; inputs on another device than the parameters (host tensors for a
  // GPU model) are moved to it. Token ids must be below config().vocab_size
  // (EngineError). Returns
  // the next stage's input, or on the last stage the logits shard
  // [B, S, Vp/tp] (LM; Vp = padded_vocab_size(), this rank's columns
  // vocab_shard(); padded columns hold -inf, see vocab_padding.h) or values
  // [B, S, 1] (value model); with set_output_lm_head_input(true) an LM's
  // last stage returns the LM head's input instead (below).
  // `packed_lengths` non-empty: the batch is one packed row (B = 1) of
  // sequences of these lengths back to back (dynamic batching: no padding);
  // each sees only itself (AttentionMask), position_ids restart at each, and
  // attention_mask is not read. Lengths that do not fill the row: EngineError.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& position_ids,
                     const at::Tensor& attention_mask,
                     const std::vector<int64_t>& packed_lengths = {});

  // One generation step (no autograd; pp = 1, LM only, no sequence
  // parallelism: EngineError otherwise). `ids` and `position_ids` [B, Q] are
  // each row's new tokens (padded rows included, see CacheStep); keys and
  // values go into `cache`. Returns the FULL-vocabulary logits [B, V] (gathered
  // over TP, identical on every TP rank, padding columns removed) of token
  // `last[b]` of each row.
  // Collective over the TP group.
  at::Tensor forward_cached(const at::Tensor& ids, const at::Tensor& position_ids,
                            const CacheStep& step, KvCache& cache, const at::Tensor& last);
  // The device decode loop's step (GenerationEngine): one new token per row,
  // every tensor on the model's device, keys and values read in place
  // through the block tables (engine/kernels/paged_attention.h). Values are
  // not read on the host (no synchronisation; the caller guarantees them),
  // only shapes are checked (EngineError). Returns the full-vocabulary
  // logits [B, V] as forward_cached. Same conditions as forward_cached;
  // collective over the TP group.
  at::Tensor forward_decode(const DecodeStep& step, KvCache& cache);
  // Whether forward_decode runs without any host synchronisation, so a CUDA
  // graph can capture it: dense layers (a sparse layer reads its expert
  // counts), TP 1 (the group's collectives wait on the host) and a RoPE whose
  // tables do not depend on the call (not dynamic NTK).
  bool supports_graph_capture() const;
  // The same step in packed form on the CPU (PagedStep: no padding, keys and
  // values read through the block tables by engine/kernels/decode_kernels.h), with
  // the same result: logits [B, V] of each sequence's last new token.
  // REQUIRES supports_paged_step(). Checks the step's shapes and ranges on
  // the host (EngineError). Collective over the TP group.
  at::Tensor forward_paged(const PagedStep& step, KvCache& cache);
  // forward_cached's conditions, and fp32 parameters on the CPU.
  bool supports_paged_step() const;
  // Packs the weights forward_paged multiplies by for oneDNN
  // (engine/kernels/packed_linear.h: a copy, taken now); until drop_paged_weights(),
  // forward_paged uses that copy, so the parameters must not change in
  // between. GenerationEngine::generate packs at its start and drops at its
  // end. Returns false, packing nothing, without supports_paged_step() or
  // without oneDNN in this LibTorch (forward_paged then multiplies with mm).
  bool pack_paged_weights();
  void drop_paged_weights();
  bool paged_weights_packed() const { return packed_lm_head_.defined(); }
  // A KV cache fitting this rank's layers, kv heads, dtype and device.
  std::unique_ptr<KvCache> make_kv_cache(const KvCacheOptions& options) const;

  // This rank's parameters under their engine names (docs/engine.md), in a
  // fixed order. The tensors are the parameters themselves. The base model's
  // only: LoRA adapters are lora_params().
  std::vector<std::pair<std::string, at::Tensor>> named_params() const;
  // The LoRA adapters ("decoder.layers.{i}.lora.<module>.A" / ".B"); empty
  // without LoRA.
  std::vector<std::pair<std::string, at::Tensor>> lora_params() const;
  // What an optimizer updates: the parameters that require gradients (all
  // of named_params without LoRA; the adapters alone with it).
  std::vector<std::pair<std::string, at::Tensor>> trainable_params() const;
  // named_params with the adapters merged in (W + (alpha / rank) · B A, new
  // tensors for the adapted weights): what a rollout model without adapters
  // computes the same with. named_params itself without LoRA.
  std::vector<std::pair<std::string, at::Tensor>> merged_params() const;
  // Adapters on (the default) or off: off, the model computes its frozen
  // base, which is a LoRA actor's reference policy (no second copy).
  void set_lora_enabled(bool on);
  bool lora_enabled() const { return options_.lora.enabled() && lora_on_; }
  // The bytes of this rank's parameters (named_params()).
  int64_t param_bytes() const;
  // Whether a parameter is the same on every TP rank (norm weights, value
  // head) rather than a shard.
  static bool tp_replicated(const std::string& name);
  // Qwen3's per-head q / k norm weights (self_attention.{q,k}_layernorm).
  static bool is_head_norm(const std::string& name);
  // Whether a TP-replicated parameter's gradient is a partial sum on each TP
  // rank, which needs a TP all-reduce before the update: every one under
  // sequence parallelism (each rank saw its tokens), and the q / k norms
  // always (each rank normed its heads). False with one TP rank.
  bool tp_partial_grad(const std::string& name) const;
  // The parameters for which tp_partial_grad holds.
  std::vector<std::string> tp_partial_grad_params() const;

  // Mixture of experts (Qwen3-MoE). The router's load-balancing loss, as
  // HF's load_balancing_loss_func, over this stage's sparse layers in the
  // last forward with gradients: num_experts · Σ_e (tokens routed to e /
  // tokens) · (mean router probability of e), over the tokens where
  // `attention_mask` [B, S] is 1 (undefined: all, as a packed row's).
  // Differentiable. With pp = 1 it is HF's value; with pp > 1 each stage
  // balances its own layers. EngineError when the stage has no sparse layer.
  at::Tensor router_aux_loss(const at::Tensor& attention_mask) const;
  bool has_sparse_layers() const;
  // Every later forward with gradients adds scale × router_aux_loss to what
  // its backward differentiates (0, the default: a metric only). The trainer
  // sets router_aux_loss_coef / micro-batches before an update. EngineError
  // with activation recompute (the router logits' graph is not kept).
  void set_router_aux_loss_scale(double scale);
  // router_aux_loss of the last forward with gradients on a stage with
  // sparse layers (NaN before the first).
  double last_router_aux_loss() const { return last_aux_loss_; }

  // Detached copies of the parameters, by engine name, LoRA adapters included.
  std::map<std::string, at::Tensor> state_dict() const;
  // Copies `weights` into the parameters. Every parameter must be present
  // with its exact shape, and nothing else, except a value model's head
  // (`value_head.weight`, `value_head.bias`): when absent (an LM checkpoint)
  // it keeps its fresh initialisation and a notice is logged; and LoRA
  // adapters, which keep theirs when absent (a base checkpoint). Errors name
  // the keys and shapes.
  void load_state_dict(const std::map<std::string, at::Tensor>& weights);

  const ModelConfig& config() const { return config_; }
  // Rows of the embedding and LM head over all TP ranks (>= vocab_size).
  int64_t padded_vocab_size() const { return padded_vocab_; }
  // This rank's rows of them (its logit columns).
  const VocabShard& vocab_shard() const { return vocab_shard_; }
  // An LM's last stage returns, instead of the logits, the LM head's input:
  // the final-normed hidden states entered into the TP region ([B, S, H],
  // gathered over the sequence under sequence parallelism), for a loss that
  // applies the head itself in chunks without the logits
  // (engine/parallel/fused_lm_head.h, with lm_head_weight()). forward()
  // only; the generation steps are unaffected. Not thread-safe.
  void set_output_lm_head_input(bool on) { output_head_input_ = on; }
  bool outputs_lm_head_input() const { return output_head_input_; }
  // The LM head's weight on this rank, [vocab_shard().rows, H]: the output
  // layer's, or the embedding's when tied on one stage. REQUIRES: an LM's
  // last stage (EngineError otherwise).
  const at::Tensor& lm_head_weight() const;
  // This rank's ShardSpec (hf_to_shard) for its layout and model kind.
  ShardSpec shard_spec() const;
  const ParallelState& parallel() const { return *state_; }
  // The device of this rank's parameters (CPU until the model is moved with
  // to(); every parameter is on the same one). Tensors the engine makes for
  // this model, and those its collectives carry, go there.
  at::Device device() const;
  const TransformerOptions& options() const { return options_; }
  bool first_stage() const;
  bool last_stage() const;

  // Run by forward_backward before each micro-batch's backward, `last` for
  // the last one: an optimizer that overlaps its DP gradient reduction with
  // that backward arms itself there (Optimizer, `overlap_grad_reduce`). One
  // hook per model, replaced by the next owner's; clear_backward_hook
  // removes it only while `owner` still holds it.
  void set_backward_hook(const void* owner, std::function<void(bool last)> hook) {
    backward_hook_owner_ = owner;
    backward_hook_ = std::move(hook);
  }
  void clear_backward_hook(const void* owner) {
    if (backward_hook_owner_ != owner) return;
    backward_hook_owner_ = nullptr;
    backward_hook_ = nullptr;
  }
  void before_backward(bool last) const {
    if (backward_hook_) backward_hook_(last);
  }

 private:
  // `packed`: the output weight packed for oneDNN (one TP rank, no
  // sequence parallelism), or undefined.
  at::Tensor lm_head(const at::Tensor& h, const at::Tensor& packed = {});
  // h entered into the TP region as the LM head takes it (lm_head's first step).
  at::Tensor lm_head_input(const at::Tensor& h) const;
  // EngineError when an id is a padding row rather than a token.
  void check_token_ids(const at::Tensor& ids, const char* who) const;
  // EngineError when a sequence of `longest` tokens exceeds the config's
  // sliding window (ModelConfig::sliding_window), naming `who`.
  void check_window(int64_t longest, const char* who) const;
  at::Tensor value_head(const at::Tensor& h);

  ModelConfig config_;
  std::shared_ptr<ParallelState> state_;
  TransformerOptions options_;
  RotaryEmbedding rope_;
  VocabParallelEmbedding embedding_{nullptr};
  std::vector<std::shared_ptr<TransformerLayer>> layers_;
  at::Tensor final_norm_;
  int64_t padded_vocab_ = 0;
  VocabShard vocab_shard_;
  at::Tensor output_weight_;  // [Vp/tp, H]; undefined when tied to the embedding
  at::Tensor value_head_;     // [1, H]
  at::Tensor value_bias_;     // [1]
  // forward_paged's reused step buffers, residual stream and rotary rows
  // [positions, d] (fp32, grown on demand).
  PagedWorkspace paged_ws_;
  at::Tensor paged_hidden_;  // the residual stream [capacity, H]
  Rotary paged_rotary_;
  at::Tensor packed_lm_head_;  // pack_paged_weights(); undefined otherwise
  bool lora_on_ = true;
  bool output_head_input_ = false;
  double aux_loss_scale_ = 0;
  double last_aux_loss_ = std::numeric_limits<double>::quiet_NaN();
  std::function<void(bool last)> backward_hook_;
  const void* backward_hook_owner_ = nullptr;
};

// Log-probabilities of each next token: position t scores input_ids[:, t+1]
// under logits[:, t]. logits_shard [B, S, Vp/tp] (Transformer::forward's,
// padded columns included) → [B, S-1]. Collective over `tp`; differentiable;
// the full vocabulary is never gathered.
at::Tensor next_token_log_probs(const at::Tensor& logits_shard, const at::Tensor& input_ids,
                                const Group& tp);

}  // namespace baton::engine
