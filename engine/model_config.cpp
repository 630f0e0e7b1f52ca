#include "engine/model_config.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "engine/errors.h"

namespace baton::engine {
namespace {

int64_t required_size(const nlohmann::json& json, const char* key, const std::string& where) {
  if (!json.contains(key) || !json[key].is_number_integer())
    throw EngineError(detail::cat(where, ": \"", key, "\" is missing or not an integer"));
  int64_t v = json[key].get<int64_t>();
  if (v <= 0) throw EngineError(detail::cat(where, ": \"", key, "\" must be positive, got ", v));
  return v;
}

template <typename T>
T optional_value(const nlohmann::json& json, const char* key, T fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  return json[key].get<T>();
}

}  // namespace

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw EngineError(where + ": config is not a JSON object");
  ModelConfig c;
  std::string model_type = optional_value<std::string>(json, "model_type", "");
  if (json.contains("architectures") && json["architectures"].is_array() &&
      !json["architectures"].empty())
    c.architecture = json["architectures"][0].get<std::string>();
  if (model_type == "llama" || c.architecture.rfind("Llama", 0) == 0) {
    c.family = ModelFamily::kLlama;
  } else if (model_type == "qwen2" || c.architecture.rfind("Qwen2", 0) == 0) {
    c.family = ModelFamily::kQwen2;
  } else {
    throw EngineError(detail::cat(where, ": unsupported architecture \"", c.architecture,
                                  "\" (model_type \"", model_type,
                                  "\"); supported: LlamaForCausalLM, Qwen2ForCausalLM"));
  }
  if (c.architecture.empty())
    c.architecture = c.family == ModelFamily::kLlama ? "LlamaForCausalLM" : "Qwen2ForCausalLM";

  c.vocab_size = required_size(json, "vocab_size", where);
  c.hidden_size = required_size(json, "hidden_size", where);
  c.intermediate_size = required_size(json, "intermediate_size", where);
  c.num_layers = required_size(json, "num_hidden_layers", where);
  c.num_heads = required_size(json, "num_attention_heads", where);
  c.num_kv_heads = json.contains("num_key_value_heads") && !json["num_key_value_heads"].is_null()
                       ? required_size(json, "num_key_value_heads", where)
                       : c.num_heads;
  if (json.contains("head_dim") && !json["head_dim"].is_null()) {
    c.head_dim = required_size(json, "head_dim", where);
  } else {
    if (c.hidden_size % c.num_heads != 0)
      throw EngineError(detail::cat(where, ": hidden_size ", c.hidden_size,
                                    " is not divisible by num_attention_heads ", c.num_heads));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.num_heads % c.num_kv_heads != 0)
    throw EngineError(detail::cat(where, ": num_attention_heads ", c.num_heads,
                                  " is not divisible by num_key_value_heads ", c.num_kv_heads));
  if (c.head_dim % 2 != 0)
    throw EngineError(
        detail::cat(where, ": head_dim ", c.head_dim, " must be even for rotary embeddings"));
  c.max_position_embeddings = optional_value<int64_t>(json, "max_position_embeddings", 2048);
  c.rms_norm_eps = optional_value<double>(json, "rms_norm_eps", 1e-6);
  c.rope_theta = optional_value<double>(json, "rope_theta", 10000.0);
  if (json.contains("rope_scaling") && !json["rope_scaling"].is_null())
    throw EngineError(where + ": \"rope_scaling\" is not supported yet");
  c.tie_word_embeddings = optional_value<bool>(json, "tie_word_embeddings", false);
  c.qkv_bias =
      c.family == ModelFamily::kQwen2 ? true : optional_value<bool>(json, "attention_bias", false);
  c.mlp_bias = optional_value<bool>(json, "mlp_bias", false);
  c.torch_dtype = optional_value<std::string>(json, "torch_dtype", "float32");
  if (json.contains("eos_token_id") && !json["eos_token_id"].is_null()) {
    const auto& eos = json["eos_token_id"];
    auto add = [&](const nlohmann::json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.vocab_size)
        throw EngineError(detail::cat(where, ": eos_token_id ", v.dump(),
                                      " is not a token id below vocab_size ", c.vocab_size));
      c.eos_token_ids.push_back(v.get<int64_t>());
    };
    if (eos.is_array()) {
      for (const auto& v : eos) add(v);
    } else {
      add(eos);
    }
  }
  std::string act = optional_value<std::string>(json, "hidden_act", "silu");
  if (act != "silu")
    throw EngineError(where + ": hidden_act \"" + act + "\" is not supported (only silu)");
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  auto file = std::filesystem::is_directory(path) ? path / "config.json" : path;
  std::ifstream in(file);
  if (!in) throw EngineError(file.string() + ": cannot open model config");
  nlohmann::json json;
  try {
    in >> json;
  } catch (const nlohmann::json::exception& e) {
    throw EngineError(file.string() + ": malformed JSON: " + e.what());
  }
  return from_hf_json(json, file.string());
}

nlohmann::json ModelConfig::to_hf_json(const std::string& arch) const {
  bool llama = family == ModelFamily::kLlama;
  nlohmann::json j;
  j["architectures"] = {arch.empty() ? architecture : arch};
  j["model_type"] = llama ? "llama" : "qwen2";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  if (llama) {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = mlp_bias;
  }
  return j;
}

void ModelConfig::save(const std::filesystem::path& dir, const std::string& arch) const {
  std::filesystem::create_directories(dir);
  auto tmp = dir / "config.json.tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw EngineError(tmp.string() + ": cannot write model config");
    out << to_hf_json(arch).dump(2) << "\n";
    if (!out) throw EngineError(tmp.string() + ": write failed");
  }
  std::filesystem::rename(tmp, dir / "config.json");
}

}  // namespace baton::engine
