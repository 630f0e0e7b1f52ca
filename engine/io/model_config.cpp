#include "engine/io/model_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
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

// The parameters each RoPE type takes besides rope_type / type, rope_theta
// and partial_rotary_factor (HF 5's validation lists the same).
const std::vector<std::string>& rope_keys(RopeType type) {
  static const std::vector<std::string> none;
  static const std::vector<std::string> factor = {"factor"};
  // HF's dynamic NTK ignores original_max_position_embeddings (it scales
  // from max_position_embeddings), but configs carry it: accepted.
  static const std::vector<std::string> dynamic = {"factor", "original_max_position_embeddings"};
  static const std::vector<std::string> yarn = {
      "factor",           "original_max_position_embeddings",
      "attention_factor", "beta_fast",
      "beta_slow",        "mscale",
      "mscale_all_dim",   "truncate"};
  static const std::vector<std::string> llama3 = {"factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"};
  switch (type) {
    case RopeType::kDefault:
      return none;
    case RopeType::kLinear:
      return factor;
    case RopeType::kDynamic:
      return dynamic;
    case RopeType::kYarn:
      return yarn;
    case RopeType::kLlama3:
      return llama3;
  }
  return none;
}

// RoPE's base and scaling, from any of the places HF configs keep them:
//   transformers 4: top-level "rope_theta", scaling in "rope_scaling";
//   transformers 5: "rope_parameters": {"rope_type", "rope_theta", ...} (and it
//   still reads a legacy "rope_scaling" as rope_parameters).
// The places that give a value must agree (4.x reads the top-level theta and
// rope_scaling, 5.x rope_parameters: a config where they differ means
// different models to the two versions). RoPE over part of the head
// (partial_rotary_factor < 1) and types other than RopeType's are refused.
void read_rope(const nlohmann::json& json, const std::string& where, ModelConfig& c) {
  // Every value as written, by its key without the dict's prefix, with the
  // first full key that gave it.
  std::map<std::string, std::pair<std::string, nlohmann::json>> given;
  auto give = [&](const std::string& key, const std::string& full, const nlohmann::json& value) {
    auto [it, fresh] = given.try_emplace(key, full, value);
    if (fresh || it->second.second == value) return;
    const bool numbers = value.is_number() && it->second.second.is_number();
    if (numbers && value.get<double>() == it->second.second.get<double>()) return;
    throw EngineError(where + ": " + quoted(it->second.first, it->second.second) + " but " +
                      quoted(full, value) + "; transformers 4 and 5 would read different RoPEs");
  };
  if (present(json, "rope_theta")) give("rope_theta", "rope_theta", json["rope_theta"]);
  if (present(json, "partial_rotary_factor"))
    give("partial_rotary_factor", "partial_rotary_factor", json["partial_rotary_factor"]);
  for (const char* dict : {"rope_parameters", "rope_scaling"}) {
    if (!present(json, dict)) continue;
    const auto& rope = json[dict];
    if (!rope.is_object())
      throw EngineError(where + ": " + quoted(dict, rope) + ", expected an object or null");
    for (const auto& [key, value] : rope.items()) {
      if (value.is_null()) continue;
      // "type": the pre-4.45 spelling of rope_type; rope_type wins when both are there.
      if (key == "type" && rope.contains("rope_type")) continue;
      give(key == "type" ? "rope_type" : key, std::string(dict) + "." + key, value);
    }
  }
  auto value_of = [&](const std::string& key) -> const nlohmann::json* {
    auto it = given.find(key);
    return it == given.end() ? nullptr : &it->second.second;
  };
  auto number = [&](const std::string& key) {
    const auto& [full, value] = given.at(key);
    return number_at(value, full, where);
  };

  RopeScaling& r = c.rope_scaling;
  if (const auto* type = value_of("rope_type")) {
    const std::string& full = given.at("rope_type").first;
    if (!type->is_string())
      throw EngineError(where + ": " + quoted(full, *type) + ", expected a RoPE type name");
    const std::string name = type->get<std::string>();
    bool known = false;
    for (RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic, RopeType::kYarn,
                       RopeType::kLlama3}) {
      if (name == rope_type_name(t)) {
        r.type = t;
        known = true;
      }
    }
    if (!known)
      throw EngineError(where + ": " + quoted(full, *type) +
                        " is not supported; supported RoPE types: default, linear, dynamic, "
                        "yarn, llama3");
  }
  const std::vector<std::string>& allowed = rope_keys(r.type);
  for (const auto& [key, entry] : given) {
    if (key == "rope_type" || key == "rope_theta") continue;
    if (key == "partial_rotary_factor") {
      if (number(key) != 1.0)
        throw EngineError(where + ": " + quoted(entry.first, entry.second) +
                          "; the engine rotates the whole head (partial_rotary_factor 1)");
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      throw EngineError(where + ": " + quoted(entry.first, entry.second) +
                        " is not understood with rope_type \"" + rope_type_name(r.type) + "\"" +
                        (allowed.empty() ? std::string("; it takes no parameter but rope_theta")
                                         : "; it takes rope_theta and " + [&] {
                                             std::string keys;
                                             for (const auto& k : allowed)
                                               keys += (keys.empty() ? "" : ", ") + k;
                                             return keys;
                                           }()));
  }

  c.rope_theta = value_of("rope_theta") ? number("rope_theta") : 10000.0;  // HF's default
  if (!(c.rope_theta > 0))
    throw EngineError(where + ": " +
                      quoted(given.at("rope_theta").first, given.at("rope_theta").second) +
                      ", not positive");
  if (r.type == RopeType::kDefault) return;

  auto positive = [&](const std::string& key) {
    const double v = number(key);
    if (!(v > 0))
      throw EngineError(where + ": " + quoted(given.at(key).first, given.at(key).second) +
                        ", not positive");
    return v;
  };
  auto required = [&](const std::string& key) {
    if (!value_of(key))
      throw EngineError(detail::cat(where, ": rope_type \"", rope_type_name(r.type), "\" needs \"",
                                    key, "\" in rope_parameters"));
    return positive(key);
  };
  // llama3 and yarn: the pre-training context; HF takes a top-level
  // original_max_position_embeddings, else max_position_embeddings.
  if (r.type == RopeType::kLlama3 || r.type == RopeType::kYarn) {
    if (present(json, "original_max_position_embeddings"))
      r.original_max_position_embeddings =
          required_size(json, "original_max_position_embeddings", where);
    else if (value_of("original_max_position_embeddings"))
      r.original_max_position_embeddings =
          static_cast<int64_t>(positive("original_max_position_embeddings"));
    else
      r.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (r.type == RopeType::kYarn && !value_of("factor")) {
    r.factor = static_cast<double>(c.max_position_embeddings) /
               static_cast<double>(r.original_max_position_embeddings);
  } else {
    r.factor = required("factor");
  }
  if (r.type == RopeType::kLlama3) {
    r.low_freq_factor = required("low_freq_factor");
    r.high_freq_factor = required("high_freq_factor");
    if (r.high_freq_factor <= r.low_freq_factor)
      throw EngineError(detail::cat(where, ": rope_parameters.high_freq_factor ",
                                    r.high_freq_factor, " must exceed low_freq_factor ",
                                    r.low_freq_factor));
  }
  if (r.type == RopeType::kYarn) {
    if (value_of("beta_fast")) r.beta_fast = positive("beta_fast");
    if (value_of("beta_slow")) r.beta_slow = positive("beta_slow");
    if (value_of("attention_factor")) r.attention_factor = positive("attention_factor");
    if (value_of("mscale")) r.mscale = number("mscale");
    if (value_of("mscale_all_dim")) r.mscale_all_dim = number("mscale_all_dim");
    if (const auto* t = value_of("truncate")) {
      if (!t->is_boolean())
        throw EngineError(where + ": " + quoted(given.at("truncate").first, *t) +
                          ", not true or false");
      r.truncate = t->get<bool>();
    }
  }
}

// Qwen3-MoE's expert keys (MoeConfig). transformers 5 writes the expert
// count as "num_local_experts", 4 as "num_experts": both present must agree.
void read_moe(const nlohmann::json& json, const std::string& where, ModelConfig& c) {
  MoeConfig& m = c.moe;
  for (const char* key : {"num_experts", "num_local_experts"}) {
    if (!present(json, key)) continue;
    const int64_t n = required_size(json, key, where);
    if (m.num_experts != 0 && m.num_experts != n)
      throw EngineError(detail::cat(where, ": \"num_experts\" is ", m.num_experts,
                                    " but \"num_local_experts\" is ", n));
    m.num_experts = n;
  }
  if (m.num_experts == 0) m.num_experts = 128;  // Qwen3MoeConfig's default
  m.top_k =
      present(json, "num_experts_per_tok") ? required_size(json, "num_experts_per_tok", where) : 8;
  m.intermediate_size = present(json, "moe_intermediate_size")
                            ? required_size(json, "moe_intermediate_size", where)
                            : 768;
  if (m.top_k > m.num_experts)
    throw EngineError(detail::cat(where, ": \"num_experts_per_tok\" ", m.top_k, " exceeds the ",
                                  m.num_experts, " experts"));
  m.norm_topk_prob = optional_value<bool>(json, "norm_topk_prob", false);
  m.decoder_sparse_step =
      present(json, "decoder_sparse_step") ? required_size(json, "decoder_sparse_step", where) : 1;
  if (present(json, "mlp_only_layers")) {
    const auto& layers = json["mlp_only_layers"];
    if (!layers.is_array())
      throw EngineError(where + ": " + quoted("mlp_only_layers", layers) +
                        ", expected a list of layer ids");
    for (const auto& l : layers) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.num_layers)
        throw EngineError(
            where + ": " + quoted("mlp_only_layers", layers) +
            detail::cat(" holds ", l.dump(), ", not a layer id below ", c.num_layers));
      m.mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  m.router_aux_loss_coef = optional_value<double>(json, "router_aux_loss_coef", 0.001);
  if (m.router_aux_loss_coef < 0)
    throw EngineError(where + ": " + quoted("router_aux_loss_coef", json["router_aux_loss_coef"]) +
                      ", negative");
}

// The RoPE keys of the HF form (ModelConfig::to_hf_json).
nlohmann::json rope_json(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  nlohmann::json j = {{"rope_type", rope_type_name(r.type)}, {"rope_theta", c.rope_theta}};
  if (r.type == RopeType::kDefault) return j;
  j["factor"] = r.factor;
  if (r.type == RopeType::kLlama3 || r.type == RopeType::kYarn)
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.type == RopeType::kLlama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == RopeType::kYarn) {
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    j["truncate"] = r.truncate;
    if (r.attention_factor) j["attention_factor"] = *r.attention_factor;
    if (r.mscale) j["mscale"] = *r.mscale;
    if (r.mscale_all_dim) j["mscale_all_dim"] = *r.mscale_all_dim;
  }
  return j;
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

const char* family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen3Moe:
      return "qwen3_moe";
  }
  return "?";
}

bool ModelConfig::sparse_layer(int64_t layer) const {
  if (moe.num_experts == 0 || (layer + 1) % moe.decoder_sparse_step != 0) return false;
  return std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) ==
         moe.mlp_only_layers.end();
}

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLlama3:
      return "llama3";
  }
  return "?";
}

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw EngineError(where + ": config is not a JSON object");
  ModelConfig c;
  std::string model_type = optional_value<std::string>(json, "model_type", "");
  if (json.contains("architectures") && json["architectures"].is_array() &&
      !json["architectures"].empty())
    c.architecture = json["architectures"][0].get<std::string>();
  // By model_type when there is one (Qwen2's and Qwen3's class names share a
  // prefix with others: Qwen2Moe, Qwen3Moe), else by the class.
  struct Known {
    ModelFamily family;
    const char* class_prefix;  // the causal LM's class is <prefix>ForCausalLM
  };
  const Known known[] = {{ModelFamily::kLlama, "Llama"},
                         {ModelFamily::kQwen2, "Qwen2"},
                         {ModelFamily::kQwen3, "Qwen3"},
                         {ModelFamily::kMistral, "Mistral"},
                         {ModelFamily::kQwen3Moe, "Qwen3Moe"}};
  bool found = false;
  for (const Known& k : known) {
    const std::string prefix = k.class_prefix;
    const bool by_type = !model_type.empty() && model_type == family_name(k.family);
    const bool by_class =
        model_type.empty() && (c.architecture == prefix + "ForCausalLM" ||
                               c.architecture == prefix + "ForTokenClassification");
    if (by_type || by_class) {
      c.family = k.family;
      found = true;
      if (c.architecture.empty()) c.architecture = prefix + "ForCausalLM";
    }
  }
  if (!found)
    throw EngineError(detail::cat(
        where, ": unsupported architecture \"", c.architecture, "\" (model_type \"", model_type,
        "\"); supported model_types: llama, qwen2, qwen3, mistral, qwen3_moe"));

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
  } else if (c.family == ModelFamily::kQwen3 || c.family == ModelFamily::kQwen3Moe) {
    c.head_dim = 128;  // Qwen3Config's default, not hidden / heads
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
  read_rope(json, where, c);
  if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3 ||
      c.family == ModelFamily::kQwen3Moe)
    check_no_sliding_window(json, c.num_layers, where);
  if (c.family == ModelFamily::kQwen3Moe) read_moe(json, where, c);
  if (c.family == ModelFamily::kMistral) {
    // MistralConfig's default when the key is absent; null turns it off.
    c.sliding_window = 4096;
    if (json.contains("sliding_window"))
      c.sliding_window = json["sliding_window"].is_null()
                             ? std::nullopt
                             : std::optional<int64_t>(required_size(json, "sliding_window", where));
  }
  if (present(json, "attention_dropout") &&
      number_at(json["attention_dropout"], "attention_dropout", where) != 0.0)
    throw EngineError(where + ": " + quoted("attention_dropout", json["attention_dropout"]) +
                      "; the engine has no dropout (HF applies it in training mode)");
  c.tie_word_embeddings = optional_value<bool>(json, "tie_word_embeddings", false);
  // Qwen2's q/k/v always have biases; Llama's and Qwen3's attention_bias
  // covers q, k, v and o; Mistral has none.
  c.qkv_bias = c.family == ModelFamily::kQwen2 ? true
               : c.family == ModelFamily::kMistral
                   ? false
                   : optional_value<bool>(json, "attention_bias", false);
  c.qk_norm = c.family == ModelFamily::kQwen3 || c.family == ModelFamily::kQwen3Moe;
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
  nlohmann::json j;
  j["architectures"] = {arch.empty() ? architecture : arch};
  j["model_type"] = family_name(family);
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
  j["rope_parameters"] = rope_json(*this);
  // transformers 4 reads a scaled RoPE from rope_scaling (5 prefers it too
  // when present); the default one needs none.
  j["rope_scaling"] =
      rope_scaling.type == RopeType::kDefault ? nlohmann::json(nullptr) : rope_json(*this);
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  if (family == ModelFamily::kLlama || family == ModelFamily::kQwen3 ||
      family == ModelFamily::kQwen3Moe)
    j["attention_bias"] = qkv_bias;
  if (family == ModelFamily::kQwen3Moe) {
    j["num_experts"] = moe.num_experts;        // transformers 4's name
    j["num_local_experts"] = moe.num_experts;  // 5's
    j["num_experts_per_tok"] = moe.top_k;
    j["moe_intermediate_size"] = moe.intermediate_size;
    j["norm_topk_prob"] = moe.norm_topk_prob;
    j["decoder_sparse_step"] = moe.decoder_sparse_step;
    j["mlp_only_layers"] = moe.mlp_only_layers;
    j["router_aux_loss_coef"] = moe.router_aux_loss_coef;
  }
  if (family == ModelFamily::kLlama) j["mlp_bias"] = mlp_bias;
  if (family == ModelFamily::kMistral)
    j["sliding_window"] =
        sliding_window ? nlohmann::json(*sliding_window) : nlohmann::json(nullptr);
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
