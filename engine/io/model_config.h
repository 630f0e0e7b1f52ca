// ModelConfig: the architecture hyper-parameters of a decoder-only transformer
// of the HF Llama / Qwen2 / Qwen3 / Mistral families, read from and written to
// an HF `config.json`.
//
// Example:
//   auto cfg = baton::engine::ModelConfig::load("models/qwen2-0.5b");
//   cfg.num_layers;      // "num_hidden_layers"
//   cfg.save("out/");    // writes out/config.json that HF transformers reads
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace baton::engine {

// The model families the engine implements. Adding one means adding its
// conversion table (weight_conversion.h) and any layer differences. What
// sets them apart is a feature of ModelConfig (qkv_bias, qk_norm, ...), not
// the family: the layer code never asks which family it runs.
enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral, kQwen3Moe };

// HF's model_type of a family: "llama", "qwen2", "qwen3", "mistral",
// "qwen3_moe".
const char* family_name(ModelFamily family);

// How RoPE's frequencies are scaled beyond the pre-training context: HF's
// rope_parameters.rope_type (transformers 5; rope_scaling in 4.x) and the
// parameters of that type (engine/model/rope.h computes them as HF does).
enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLlama3 };

// HF's name of a RoPE type ("default", "linear", "dynamic", "yarn", "llama3").
const char* rope_type_name(RopeType type);

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;  // linear, dynamic, yarn, llama3
  // llama3 and yarn: the pre-training context. (dynamic uses
  // max_position_embeddings, as HF does.)
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  // yarn: the correction range's rotations, whether its ends are rounded
  // outwards, and the cos/sin scale (absent: derived from factor and the
  // mscales, as HF does).
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  std::optional<double> attention_factor, mscale, mscale_all_dim;

  bool operator==(const RopeScaling&) const = default;
};

// Mixture of experts (Qwen3-MoE): a sparse layer's MLP is `num_experts`
// SwiGLU experts of width `intermediate_size`, each token sent to the
// `top_k` its router (a linear map hidden → experts, softmax in fp32) scores
// highest and their outputs summed with those probabilities (renormalised
// over the top k when norm_topk_prob). Layer i is sparse unless it is in
// mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step.
struct MoeConfig {
  int64_t num_experts = 0;        // 0: every layer dense
  int64_t top_k = 0;              // "num_experts_per_tok"
  int64_t intermediate_size = 0;  // "moe_intermediate_size"
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // The load-balancing loss's weight in the training loss (HF adds it when
  // the config asks for router logits; the trainer adds it when > 0).
  double router_aux_loss_coef = 0.0;

  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", "Qwen3ForCausalLM", ...
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // "num_hidden_layers"
  int64_t num_heads = 0;     // "num_attention_heads"
  int64_t num_kv_heads = 0;  // "num_key_value_heads" (defaults to num_heads)
  int64_t head_dim = 0;      // "head_dim" (defaults to hidden / heads)
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  // "rope_theta" (transformers 4) or "rope_parameters": {"rope_theta"} (5).
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // the default RoPE unless the config scales it
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: always; Llama: "attention_bias"
  bool mlp_bias = false;  // Llama's "mlp_bias"
  // Qwen3: an RMSNorm over each query and key head (weights [head_dim],
  // shared by the heads) before RoPE, with rms_norm_eps.
  bool qk_norm = false;
  // Mistral's "sliding_window": a query sees the last `sliding_window` keys.
  // The engine attends over the whole causal prefix, so a sequence longer
  // than the window is refused where it reaches the model (EngineError
  // naming the key); shorter ones are computed exactly. Unset: no window.
  std::optional<int64_t> sliding_window;
  MoeConfig moe;  // Qwen3-MoE; no experts otherwise
  // "torch_dtype" (transformers 4) or "dtype" (5).
  std::string torch_dtype = "float32";
  // "eos_token_id": one id or a list (absent: none).
  std::vector<int64_t> eos_token_ids;
  // generation_config.json's "eos_token_id" (one id or a list), read by
  // load(dir) when the model directory has that file; empty otherwise. As in HF
  // `generate`, it replaces config.json's ids as the stop set: an instruct
  // checkpoint lists its end-of-turn tokens there (Qwen2.5's <|im_end|> and
  // <|endoftext|>, Llama-3.1's three), often more than config.json has.
  // Never written to config.json (the file travels beside it).
  std::vector<int64_t> generation_eos_token_ids;

  // The ids generation stops on: generation_eos_token_ids when set, else
  // eos_token_ids.
  const std::vector<int64_t>& stop_token_ids() const {
    return generation_eos_token_ids.empty() ? eos_token_ids : generation_eos_token_ids;
  }

  // Parses an HF config as transformers 4 or 5 writes it. `where` names the
  // source in errors (a path). Throws EngineError for an unsupported
  // architecture, a missing or non-positive size, sizes that do not fit
  // together (heads not dividing), and for keys that would make HF compute
  // something the engine does not, each error naming the key and its value:
  // a RoPE type the engine lacks (longrope, ...), a scaling parameter that
  // type does not take, partial_rotary_factor, a sliding window in use
  // (Qwen2, Qwen3), attention dropout, or a config whose 4.x and 5.x
  // spellings disagree (rope_theta vs rope_parameters.rope_theta,
  // torch_dtype vs dtype).
  static ModelConfig from_hf_json(const nlohmann::json& json, const std::string& where);
  // Reads `dir/config.json` (or `path` itself when it is a file).
  static ModelConfig load(const std::filesystem::path& path);

  // The HF form: every key above under its HF name (rope_theta and dtype
  // under both the transformers 4 and the 5 names), plus `architectures` and
  // `model_type`. `architecture` overrides the class (e.g. a value model's
  // "Qwen2ForTokenClassification").
  nlohmann::json to_hf_json(const std::string& architecture = "") const;
  // Writes `dir/config.json` (created if missing), atomically.
  void save(const std::filesystem::path& dir, const std::string& architecture = "") const;

  // Whether layer `layer` (global id) has experts instead of a dense MLP.
  bool sparse_layer(int64_t layer) const;
  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
};

}  // namespace baton::engine
