// Weight conversion between HF checkpoints and the engine's per-rank shards
// (Megatron-core names and TP layouts, docs/engine.md), driven by a table of
// rules per model family: adding a family means adding a table.
//
// Example (one rank of a TP=2 × PP=2 layout loading an HF checkpoint):
//   auto cfg = ModelConfig::load(dir);
//   auto split = even_layer_split(cfg.num_layers, 2);
//   auto spec = ShardSpec::for_rank(cfg, /*tp_rank=*/1, /*tp_size=*/2, /*pp_rank=*/0, split);
//   TensorMap mine = hf_to_shard(read_hf_weights(dir), cfg, spec);
//
// The conversions only copy and rearrange elements, so HF → any layout → HF
// is bit-exact. The vocabulary tensors (embedding, LM head) are padded with
// zero rows to the layout's padded size (vocab_padding.h) on the way in and
// stripped on the way out. Errors (bad checkpoints, layouts that do not fit the model)
// are EngineError with the tensor names and sizes involved. Thread safety: the
// functions are pure; the tables are immutable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/parallel/vocab_padding.h"

namespace baton::engine {

// How one engine tensor is made from its HF tensor(s) on TP rank k of t.
enum class Transform {
  kReplicated,  // the same tensor on every rank
  kSplitRows,   // rows [k·n/t, (k+1)·n/t) of dim 0 (vocab-parallel, column-parallel;
                // vocabulary rows are padded first, see is_vocab_rule)
  kSplitCols,   // columns of dim 1 (row-parallel)
  kQkv,         // q, k, v fused group by group, then split by kv groups (docs/engine.md)
  kGateUp,      // cat(gate rows of rank k, up rows of rank k)
  // MoE experts, stacked along a new dim 0 (expert e at e): their HF tensors
  // are one per expert ("{e}" in the name stands for the expert id).
  kExpertsGateUp,  // [E, 2F/t, H]: each expert's gate/up as kGateUp
  kExpertsDown,    // [E, H, F/t]: each expert's down_proj columns of rank k
};

// Which ranks hold a tensor.
enum class Scope {
  kFirstStage,  // the embedding
  kLayer,       // one per decoder layer, on the stage holding that layer
  kLastStage,   // the final norm
  kLmHead,      // the last stage of an LM (see ConversionRule::tied_hf_name)
  kValueHead,   // the last stage of a value model
};

// When a rule applies, given the config.
enum class Condition {
  kAlways,
  kQkvBias,  // ModelConfig::qkv_bias (Llama's attention_bias; always on for Qwen2)
  kMlpBias,  // ModelConfig::mlp_bias (Llama)
  kQkNorm,   // ModelConfig::qk_norm (Qwen3)
  // Per layer (ModelConfig::sparse_layer): a dense MLP's tensors, or the
  // experts' and their router's.
  kDenseMlp,
  kSparseMlp,
};

// A symbolic size, resolved against a ModelConfig.
enum class Dim {
  kOne,
  kVocab,            // V
  kHidden,           // H
  kIntermediate,     // F
  kQ,                // nq · d
  kKv,               // nkv · d
  kHeadDim,          // d
  kExperts,          // E (MoeConfig::num_experts)
  kMoeIntermediate,  // one expert's F (MoeConfig::intermediate_size)
};

// An HF tensor as a rule names it: "{i}" in the name stands for the layer id.
struct HfTensor {
  std::string name;
  std::vector<Dim> shape;  // the full (unsharded) HF shape
};

// Every member has an initializer: the tables are designated initializers
// that leave members out, which GCC 12's -Wmissing-field-initializers reports
// for members without one.
struct ConversionRule {
  std::string engine_name{};  // "{i}" stands for the global layer id
  Scope scope = Scope::kLayer;
  Condition condition = Condition::kAlways;
  Transform transform = Transform::kReplicated;
  // 1 tensor; 3 (q, k, v) for kQkv; 2 (gate, up) for kGateUp and
  // kExpertsGateUp, 1 for kExpertsDown, each then named once per expert.
  std::vector<HfTensor> hf{};
  // kLmHead: the HF tensor read instead of hf[0] when embeddings are tied.
  std::string tied_hf_name{};
  // The HF tensor may be absent (then so is the engine tensor).
  bool optional = false;
  // Export of an optional tensor absent from the shards while the rest of its
  // scope is present: written as zeros of its HF shape (HF's `score.bias`).
  bool zero_fill_on_export = false;
};

// The rule table of a family. Every family shares the trunk rules; Qwen2 has
// q/k/v biases, Llama optional attention (q/k/v/o) and MLP biases, Qwen3
// optional attention biases and the per-head q/k norms, Mistral no biases.
const std::vector<ConversionRule>& conversion_rules(ModelFamily family);

// Whether the rule splits the vocabulary (its rows are token ids: the
// embedding and the LM head), whose rows a layout pads (vocab_padding.h).
bool is_vocab_rule(const ConversionRule& rule);

// The rule whose engine-name pattern matches `engine_name` (its layer id, or
// -1 for a tensor outside the layers, goes to `layer`), or nullptr. Resharding
// code uses it to learn how a parameter is laid out over TP ranks.
const ConversionRule* find_rule(ModelFamily family, const std::string& engine_name,
                                int64_t* layer = nullptr);

// One engine tensor of the whole (unsharded, one-stage) model.
struct ModelTensor {
  std::string engine_name;
  const ConversionRule* rule = nullptr;
  int64_t layer = -1;          // global layer id, -1 outside the layers
  std::vector<int64_t> shape;  // full shape (fused QKV and gate/up included), unpadded
};

// Every tensor of the whole model at pp = 1, derived from the config and the
// rule table alone: the embedding, each layer's tensors in layer order, the
// final norm, then the LM head (absent when tied) or the value head (weight
// and bias). Senders and receivers of streamed weights agree on it without
// exchanging metadata.
std::vector<ModelTensor> whole_model_tensors(const ModelConfig& cfg, bool value_model);

// One rank's part of the model.
struct ShardSpec {
  int64_t tp_rank = 0;
  int64_t tp_size = 1;
  int64_t layer_begin = 0;  // global layer ids [layer_begin, layer_end)
  int64_t layer_end = 0;
  bool first_stage = true;
  bool last_stage = true;
  bool value_model = false;
  // Expert parallelism (ParallelConfig::ep): this rank holds experts
  // [ep_rank · E / ep_size, (ep_rank + 1) · E / ep_size) of each sparse layer.
  int64_t ep_rank = 0;
  int64_t ep_size = 1;
  // The layout's vocabulary padding (ParallelConfig's field of the same name).
  int64_t make_vocab_size_divisible_by = kDefaultVocabDivisibleBy;

  // Rows of the padded vocabulary tensors over all TP ranks.
  int64_t padded_vocab_size(const ModelConfig& cfg) const {
    return engine::padded_vocab_size(cfg.vocab_size, tp_size, make_vocab_size_divisible_by);
  }

  // The spec of (tp_rank, pp_rank) in a layout with `layer_split.size()`
  // stages. Throws EngineError for ranks out of range or an invalid split.
  static ShardSpec for_rank(const ModelConfig& cfg, int64_t tp_rank, int64_t tp_size,
                            int64_t pp_rank, const std::vector<int64_t>& layer_split,
                            bool value_model = false);
};

// Layers per stage for `pp` stages: as even as possible, the remainder going
// to the first stages ([2,1,1] for 4 layers on 3 stages). Throws EngineError
// when pp < 1 or there are fewer layers than stages.
std::vector<int64_t> even_layer_split(int64_t num_layers, int64_t pp);

// Throws EngineError unless `split` is non-empty, every entry is positive and
// the entries sum to `num_layers`; the message shows the split.
void validate_layer_split(const std::vector<int64_t>& split, int64_t num_layers);

// Throws EngineError naming the sizes when `tp_size` does not divide the kv
// heads or the intermediate size (or is not positive). Any vocabulary fits:
// it is padded.
void validate_tensor_parallel(const ModelConfig& cfg, int64_t tp_size);

// Throws EngineError naming the sizes when `ep_size` is not positive or, for
// a MoE model, does not divide num_experts; a dense model takes any ep_size
// (expert parallelism then changes nothing).
void validate_expert_parallel(const ModelConfig& cfg, int64_t ep_size);

// Whether an engine tensor is a MoE layer's stacked experts ([E/ep, ...],
// split over the EP group along dim 0).
bool is_expert_tensor(const std::string& engine_name);

// One TP/PP rank's shard with every expert, from the shards of its EP group
// in EP-rank order: the expert tensors concatenated along dim 0, the others
// taken from EP rank 0. What shards_to_hf takes under expert parallelism.
// Throws EngineError when the shards' names differ.
TensorMap join_expert_shards(const std::vector<TensorMap>& by_ep_rank);

// The engine tensors of one rank, from a whole HF checkpoint (docs/engine.md).
// - Every HF tensor the config implies must be present with the full shape
//   the config implies (checked for the whole model, not just this rank's
//   part, so all ranks agree); errors name the tensors and both shapes.
// - HF tensors no rule consumes are an error naming them, except
//   `*rotary_emb.inv_freq`, `lm_head.weight` of a value model (an LM
//   checkpoint loaded as a critic) and `lm_head.weight` of a tied model.
// - Tied embeddings: the last stage's `output_layer.weight` comes from
//   `model.embed_tokens.weight`, and is absent when one stage is both first
//   and last (the LM head then uses the embedding).
// - Value model: `value_head.weight` (and `value_head.bias`) from `score.weight`
//   (`score.bias`) when present, else absent: the caller initialises the head.
// - Vocabulary tensors: `spec.padded_vocab_size(cfg) / tp_size` rows per
//   rank, the rows past the vocabulary zeros.
// The results may share storage with `hf` (they are views where the layout
// allows); clone them before modifying `hf` or them in place.
TensorMap hf_to_shard(const TensorMap& hf, const ModelConfig& cfg, const ShardSpec& spec);

// The inverse: a whole HF checkpoint from every rank's shard, `shards[p][k]`
// being pipeline stage p, TP rank k (holding every expert: join_expert_shards), padded with
// `make_vocab_size_divisible_by` (the padding rows are dropped, whatever they hold). Replicated
// tensors are taken from TP rank 0; a tied model's embedding from the first stage. A value model
// with a `value_head.weight` but no `value_head.bias` gets a zero `score.bias`, which HF's
// token-classification head has. Throws EngineError when the grid does not match `layer_split`, or
// a shard lacks a tensor, holds an unknown one or one with the wrong shape (naming rank, tensor and
// shapes).
TensorMap shards_to_hf(const std::vector<std::vector<TensorMap>>& shards, const ModelConfig& cfg,
                       const std::vector<int64_t>& layer_split, bool value_model,
                       int64_t make_vocab_size_divisible_by = kDefaultVocabDivisibleBy);

// The HF class of a model of `family`: "<Family>ForCausalLM", or
// "<Family>ForTokenClassification" for a value model.
std::string hf_architecture(ModelFamily family, bool value_model);
// True for an HF architecture that loads as a value model (…ForTokenClassification).
bool is_value_architecture(const std::string& architecture);

}  // namespace baton::engine
