#include "engine/io/model_config.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <utility>
#include <vector>

#include "engine/errors.h"
#include "engine/io/hf_model.h"

namespace baton::engine {
namespace {

// "eos_token_id" of an HF config or generation config: one id or a list,
// each below vocab_size (absent or null: none).
std::vector<int64_t> eos_ids(const nlohmann::json& json, int64_t vocab_size,
                             const std::string& where) {
  std::vector<int64_t> ids;
  if (!json.contains("eos_token_id") || json["eos_token_id"].is_null()) return ids;
  const auto& eos = json["eos_token_id"];
  auto add = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
      throw EngineError(detail::cat(where, ": eos_token_id ", v.dump(),
                                    " is not a token id below vocab_size ", vocab_size));
    ids.push_back(v.get<int64_t>());
  };
  if (eos.is_array()) {
    for (const auto& v : eos) add(v);
  } else {
    add(eos);
  }
  return ids;
}

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

bool present(const nlohmann::json& json, const char* key) {
  return json.contains(key) && !json[key].is_null();
}

// `"key" is <value as written>`: how errors name what they refuse.
std::string quoted(const std::string& key, const nlohmann::json& value) {
  return detail::cat("\"", key, "\" is ", value.dump());
}

double number_at(const nlohmann::json& value, const std::string& key, const std::string& where) {
  if (!value.is_number()) throw EngineError(where + ": " + quoted(key, value) + ", not a number");
  return value.get<double>();
}

// RoPE's base, from any of the places HF configs keep it:
//   transformers 4: top-level "rope_theta", scaling in "rope_scaling";
//   transformers 5: "rope_parameters": {"rope_type", "rope_theta", ...} (and it
//   still reads a legacy "rope_scaling" as rope_parameters).
// The engine implements only the default RoPE over the whole head, so a
// rope_type other than "default", any scaling parameter or a partial rotary
// factor is refused, and the places that give a theta must agree (4.x reads
// the top-level one, 5.x the one in rope_parameters: a config where they
// differ means different models to the two versions).
double read_rope_theta(const nlohmann::json& json, const std::string& where) {
  std::vector<std::pair<std::string, nlohmann::json>> thetas;  // (key, value as written)
  auto add_theta = [&](const std::string& key, const nlohmann::json& value) {
    number_at(value, key, where);
    thetas.emplace_back(key, value);
  };
  if (present(json, "rope_theta")) add_theta("rope_theta", json["rope_theta"]);
  auto check_factor = [&](const nlohmann::json& value, const std::string& key) {
    if (number_at(value, key, where) != 1.0)
      throw EngineError(where + ": " + quoted(key, value) +
                        "; the engine rotates the whole head (partial_rotary_factor 1)");
  };
  if (present(json, "partial_rotary_factor"))
    check_factor(json["partial_rotary_factor"], "partial_rotary_factor");
  for (const char* dict : {"rope_parameters", "rope_scaling"}) {
    if (!present(json, dict)) continue;
    const auto& rope = json[dict];
    if (!rope.is_object())
      throw EngineError(where + ": " + quoted(dict, rope) + ", expected an object or null");
    // The type first: its parameters are only "not understood" for a default RoPE.
    for (const char* key : {"rope_type", "type"}) {  // "type": the pre-4.45 spelling
      if (rope.contains(key) && rope[key] != "default")
        throw EngineError(where + ": " + quoted(std::string(dict) + "." + key, rope[key]) +
                          "; only the default RoPE (\"rope_type\": \"default\", no scaling) is "
                          "supported");
    }
    for (const auto& [key, value] : rope.items()) {
      std::string name = std::string(dict) + "." + key;
      if (key == "rope_type" || key == "type") {
        continue;
      } else if (key == "rope_theta") {
        add_theta(name, value);
      } else if (key == "partial_rotary_factor") {
        check_factor(value, name);
      } else {
        throw EngineError(where + ": " + quoted(name, value) +
                          " is not understood; the engine implements the default RoPE, whose "
                          "only parameter is rope_theta");
      }
    }
  }
  if (thetas.empty()) return 10000.0;  // HF's default in both versions
  const auto& [first_key, first_value] = thetas.front();
  double theta = first_value.get<double>();
  for (const auto& [key, value] : thetas) {
    if (value.get<double>() != theta)
      throw EngineError(where + ": " + quoted(first_key, first_value) + " but " +
                        quoted(key, value) +
                        "; transformers 4 and 5 would read different RoPE bases");
  }
  if (!(theta > 0))
    throw EngineError(where + ": " + quoted(first_key, first_value) + ", not positive");
  return theta;
}

// "torch_dtype" (transformers 4) or "dtype" (transformers 5; 5 reads both and
// prefers "dtype"). Both present and different: refused.
std::string read_dtype(const nlohmann::json& json, const std::string& where) {
  std::string dtype = "float32";
  const char* found = nullptr;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!present(json, key)) continue;
    const auto& value = json[key];
    if (!value.is_string())
      throw EngineError(where + ": " + quoted(key, value) + ", expected a dtype name");
    if (found && value.get<std::string>() != dtype)
      throw EngineError(detail::cat(where, ": \"", found, "\" is \"", dtype, "\" but ",
                                    quoted(key, value),
                                    "; transformers 4 and 5 would load different "
                                    "dtypes"));
    dtype = value.get<std::string>();
    found = key;
  }
  return dtype;
}

// Qwen2's sliding-window attention. HF 4.49 windows layer i when
// use_sliding_window && sliding_window != null && i >= max_window_layers
// (default 28); HF 5 sets sliding_window to null unless use_sliding_window and
// windows the layers that "layer_types" marks "sliding_attention" (derived by
// the same rule when absent). The engine attends over the whole causal prefix,
// so either form of an active window is refused, whatever its size (sequences
// are not limited to max_position_embeddings). A window that is set but off
// (Qwen2.5's `"sliding_window": 131072, "use_sliding_window": false`) is
// accepted: HF 5, and 4.49 with flash attention, attend fully. (4.49's eager
// and sdpa masks apply such a window to every layer anyway, a bug fixed in 5;
// it changes only sequences longer than the window.) Llama has no window: HF's Llama ignores
// these keys, and so does the engine.
void check_no_sliding_window(const nlohmann::json& json, int64_t num_layers,
                             const std::string& where) {
  if (present(json, "use_sliding_window") && !json["use_sliding_window"].is_boolean())
    throw EngineError(where + ": " + quoted("use_sliding_window", json["use_sliding_window"]) +
                      ", not true or false");
  bool use = optional_value<bool>(json, "use_sliding_window", false);
  if (use && present(json, "sliding_window")) {
    int64_t first = 28;  // HF Qwen2Config's default in 4.x and 5.x
    if (present(json, "max_window_layers")) {
      const auto& value = json["max_window_layers"];
      if (!value.is_number_integer())
        throw EngineError(where + ": " + quoted("max_window_layers", value) + ", not an integer");
      first = value.get<int64_t>();
    }
    if (first < num_layers)
      throw EngineError(
          detail::cat(where, ": sliding-window attention is on (\"use_sliding_window\" is true, ",
                      quoted("sliding_window", json["sliding_window"]), ", ",
                      quoted("max_window_layers", first), " < num_hidden_layers ", num_layers,
                      "); the engine implements full causal attention only"));
  }
  if (present(json, "layer_types")) {
    const auto& types = json["layer_types"];
    if (!types.is_array())
      throw EngineError(where + ": " + quoted("layer_types", types) + ", expected a list");
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention")
        throw EngineError(where + ": " + quoted(detail::cat("layer_types[", i, "]"), types[i]) +
                          "; the engine implements \"full_attention\" layers only");
    }
  }
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
  // An integer when present: a float such as 9.2e20 would not convert to
  // int64 (undefined behaviour; found by fuzz_checkpoint_meta).
  c.max_position_embeddings = present(json, "max_position_embeddings")
                                  ? required_size(json, "max_position_embeddings", where)
                                  : 2048;
  c.rms_norm_eps = optional_value<double>(json, "rms_norm_eps", 1e-6);
  c.rope_theta = read_rope_theta(json, where);
  if (c.family == ModelFamily::kQwen2) check_no_sliding_window(json, c.num_layers, where);
  if (present(json, "attention_dropout") &&
      number_at(json["attention_dropout"], "attention_dropout", where) != 0.0)
    throw EngineError(where + ": " + quoted("attention_dropout", json["attention_dropout"]) +
                      "; the engine has no dropout (HF applies it in training mode)");
  c.tie_word_embeddings = optional_value<bool>(json, "tie_word_embeddings", false);
  c.qkv_bias =
      c.family == ModelFamily::kQwen2 ? true : optional_value<bool>(json, "attention_bias", false);
  c.mlp_bias = optional_value<bool>(json, "mlp_bias", false);
  c.torch_dtype = read_dtype(json, where);
  c.eos_token_ids = eos_ids(json, c.vocab_size, where);
  std::string act = optional_value<std::string>(json, "hidden_act", "silu");
  if (act != "silu")
    throw EngineError(where + ": hidden_act \"" + act + "\" is not supported (only silu)");
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  const bool dir = std::filesystem::is_directory(path);
  auto file = dir ? path / "config.json" : path;
  ModelConfig c;
  try {
    c = from_hf_json(read_json_file(file), file.string());
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    throw EngineError(detail::cat(file.string(), ": ", e.what()));
  }
  const auto generation = path / "generation_config.json";
  if (dir && std::filesystem::exists(generation)) {
    const nlohmann::json g = read_json_file(generation);
    if (!g.is_object()) throw EngineError(generation.string() + ": not a JSON object");
    try {
      c.generation_eos_token_ids = eos_ids(g, c.vocab_size, generation.string());
    } catch (const nlohmann::json::exception& e) {
      throw EngineError(detail::cat(generation.string(), ": ", e.what()));
    }
  }
  return c;
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
  // Both spellings (transformers 4 reads the top-level keys, 5 prefers
  // rope_parameters and dtype), so a base config's 5.x keys that
  // hf_config_json overlays are replaced, never left disagreeing.
  j["rope_theta"] = rope_theta;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
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
