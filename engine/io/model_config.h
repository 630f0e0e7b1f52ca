// ModelConfig: the architecture hyper-parameters of a decoder-only transformer
// of the HF Llama/Qwen2 family, read from and written to an HF `config.json`.
//
// Example:
//   auto cfg = baton::engine::ModelConfig::load("models/qwen2-0.5b");
//   cfg.num_layers;      // "num_hidden_layers"
//   cfg.save("out/");    // writes out/config.json that HF transformers reads
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace baton::engine {

// The model families the engine implements. Adding one means adding its
// conversion table (weight_conversion.h) and any layer differences.
enum class ModelFamily { kLlama, kQwen2 };

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM" or "Qwen2ForCausalLM"
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
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: always; Llama: "attention_bias"
  bool mlp_bias = false;  // Llama's "mlp_bias"
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
  // a RoPE other than the default one (rope_type, scaling parameters,
  // partial_rotary_factor), a sliding window in use (Qwen2), attention
  // dropout, or a config whose 4.x and 5.x spellings disagree (rope_theta vs
  // rope_parameters.rope_theta, torch_dtype vs dtype).
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

  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
};

}  // namespace baton::engine
