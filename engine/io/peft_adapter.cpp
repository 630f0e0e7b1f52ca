#include "engine/io/peft_adapter.h"

#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"

namespace baton::engine {
namespace fs = std::filesystem;
namespace {

using nlohmann::json;

bool attention_module(const std::string& m) {
  return m == "q_proj" || m == "k_proj" || m == "v_proj" || m == "o_proj";
}

// One adapter of one layer: the module it adapts and its factors' full shapes.
struct Slot {
  int64_t layer = 0;
  std::string module;
  std::vector<int64_t> a_shape, b_shape;  // [r, in], [out, r]
};

// The adapters of layers [begin, end) of a model with `lora`, layer by layer
// in kLoraModules' order; a sparse layer has none on its MLP (experts are
// not adapted), as TransformerLayer builds them.
std::vector<Slot> slots(const ModelConfig& cfg, const LoraOptions& lora, int64_t begin,
                        int64_t end) {
  const std::vector<std::string> modules = lora.modules();
  const int64_t h = cfg.hidden_size, f = cfg.intermediate_size;
  std::vector<Slot> out;
  for (int64_t i = begin; i < end; ++i) {
    for (const std::string& m : modules) {
      if (!attention_module(m) && cfg.sparse_layer(i)) continue;
      const int64_t rows = m == "q_proj"                       ? cfg.q_size()
                           : m == "k_proj" || m == "v_proj"    ? cfg.kv_size()
                           : m == "o_proj" || m == "down_proj" ? h
                                                               : f;
      const int64_t cols = m == "o_proj" ? cfg.q_size() : m == "down_proj" ? f : h;
      out.push_back({i, m, {lora.rank, cols}, {rows, lora.rank}});
    }
  }
  return out;
}

constexpr char kFactors[] = {'A', 'B'};

const std::vector<int64_t>& full_shape(const Slot& s, char factor) {
  return factor == 'A' ? s.a_shape : s.b_shape;
}

std::string engine_name(const Slot& s, char factor) {
  return detail::cat("decoder.layers.", s.layer, ".lora.", s.module, ".", factor);
}

std::string peft_name(const Slot& s, char factor) {
  return detail::cat("base_model.model.model.layers.", s.layer,
                     attention_module(s.module) ? ".self_attn." : ".mlp.", s.module, ".lora_",
                     factor, ".weight");
}

// The dim TP splits a factor along, -1 when it is replicated (lora.h): a
// column-parallel layer's B rows, a row-parallel layer's A columns.
int64_t split_dim(const std::string& module, char factor) {
  if (lora_row_parallel(module)) return factor == 'A' ? 1 : -1;
  return factor == 'B' ? 0 : -1;
}

std::vector<int64_t> rank_shape(const Slot& s, char factor, int64_t tp) {
  std::vector<int64_t> shape = full_shape(s, factor);
  if (const int64_t d = split_dim(s.module, factor); d >= 0) shape[d] /= tp;
  return shape;
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Joins up to 20 items, then says how many were left out.
std::string list_str(const std::vector<std::string>& items) {
  constexpr size_t kLimit = 20;
  std::string out;
  for (size_t i = 0; i < items.size() && i < kLimit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > kLimit) out += detail::cat(" ... and ", items.size() - kLimit, " more");
  return out;
}

std::string describe(const LoraOptions& lora) {
  std::vector<std::string> modules;
  try {
    modules = lora.modules();
  } catch (const EngineError&) {
    modules = lora.targets;
  }
  return detail::cat("r = ", lora.rank, ", lora_alpha = ", lora.alpha, ", target_modules [",
                     list_str(modules), "]");
}

// `tensors` against the names and shapes `want` (name → shape); EngineError
// starting with `where` listing what is missing, unexpected or misshapen.
void check_tensors(const TensorMap& tensors,
                   const std::map<std::string, std::vector<int64_t>>& want,
                   const std::string& where, const std::string& unexpected_hint) {
  std::vector<std::string> missing, unexpected, wrong_shape;
  for (const auto& [name, shape] : want) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != at::IntArrayRef(shape)) {
      wrong_shape.push_back(detail::cat(name, " expected ", shape_str(shape), " got ",
                                        shape_str(it->second.sizes())));
    }
  }
  for (const auto& [name, t] : tensors)
    if (!want.count(name)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && wrong_shape.empty()) return;
  std::string msg = where;
  if (!missing.empty()) msg += " missing tensors: " + list_str(missing) + ".";
  if (!unexpected.empty())
    msg += " unexpected tensors: " + list_str(unexpected) + " (" + unexpected_hint + ").";
  if (!wrong_shape.empty()) msg += " wrong shapes: " + list_str(wrong_shape) + ".";
  throw EngineError(msg);
}

// Keys of adapter_config.json whose every value but the neutral one (false,
// null, empty) asks for something plain LoRA in the engine does not compute.
struct RefusedKey {
  const char* key;
  const char* why;
};
constexpr RefusedKey kRefusedKeys[] = {
    {"use_rslora", "the engine scales by lora_alpha / r, rsLoRA by lora_alpha / sqrt(r)"},
    {"use_dora", "DoRA's magnitude vectors are not implemented"},
    {"lora_bias", "the engine's lora_B has no bias"},
    {"fan_in_fan_out", "the engine's weights are [out, in] like nn.Linear's, not Conv1D's"},
    {"modules_to_save", "the engine holds adapters, not trained copies of modules"},
    {"rank_pattern", "the engine gives every module the one rank r"},
    {"alpha_pattern", "the engine gives every module the one lora_alpha"},
    {"layers_to_transform", "the engine adapts every layer"},
    {"layer_replication", "the engine does not replicate layers"},
    {"exclude_modules", "the engine adapts every target module of every layer"},
    {"target_parameters", "LoRA on parameters (MoE experts) is not implemented"},
    {"trainable_token_indices", "trainable token embeddings are not implemented"},
    {"use_qalora", "QALoRA is not implemented"},
    {"alora_invocation_tokens", "activated LoRA is not implemented"},
};

bool neutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
         ((v.is_object() || v.is_array() || v.is_string()) && v.empty());
}

struct ParsedConfig {
  LoraOptions lora;
  std::string base_model;
};

ParsedConfig parse_config(const fs::path& dir) {
  const fs::path file = dir / kPeftConfigFile;
  if (!fs::exists(file))
    throw EngineError(detail::cat(file.string(),
                                  ": missing; not a PEFT adapter directory (PEFT's save_pretrained "
                                  "writes adapter_config.json and adapter_model.safetensors)"));
  const json j = read_json_file(file);
  const std::string where = file.string() + ": ";
  if (!j.is_object()) throw EngineError(where + "not a JSON object");
  auto get = [&](const char* key) -> const json* {
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };

  const json* type = get("peft_type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "LORA")
    throw EngineError(where + "\"peft_type\" is " + (type ? type->dump() : "missing") +
                      "; only LORA adapters are supported");
  if (const json* task = get("task_type");
      task != nullptr && !task->is_null() && *task != "CAUSAL_LM")
    throw EngineError(where + "\"task_type\" is " + task->dump() +
                      "; only a causal LM's adapter (CAUSAL_LM) is supported");
  std::vector<std::string> refused;
  if (const json* bias = get("bias"); bias != nullptr && *bias != "none")
    refused.push_back("\"bias\": " + bias->dump() +
                      " (only \"none\": the engine trains no biases)");
  for (const RefusedKey& r : kRefusedKeys)
    if (const json* v = get(r.key); v != nullptr && !neutral(*v))
      refused.push_back(detail::cat("\"", r.key, "\": ", v->dump(), " (", r.why, ")"));
  if (!refused.empty()) throw EngineError(where + "not supported: " + list_str(refused));

  ParsedConfig out;
  const json* r = get("r");
  if (r == nullptr || !r->is_number_integer() || r->get<int64_t>() < 1)
    throw EngineError(where + "\"r\" is " + (r ? r->dump() : "missing") +
                      "; it must be a positive integer");
  out.lora.rank = r->get<int64_t>();
  const json* alpha = get("lora_alpha");
  if (alpha == nullptr || !alpha->is_number() || !(alpha->get<double>() > 0))
    throw EngineError(where + "\"lora_alpha\" is " + (alpha ? alpha->dump() : "missing") +
                      "; it must be a number > 0");
  out.lora.alpha = alpha->get<double>();

  const json* targets = get("target_modules");
  if (targets != nullptr && targets->is_string() && *targets == "all-linear") {
    out.lora.targets = {"all-linear"};
  } else if (targets != nullptr && targets->is_array() && !targets->empty()) {
    for (const json& t : *targets) {
      if (!t.is_string())
        throw EngineError(where + "\"target_modules\" holds " + t.dump() + ", not a module name");
      out.lora.targets.push_back(t.get<std::string>());
    }
  } else if (targets != nullptr && targets->is_string()) {
    throw EngineError(where + "\"target_modules\" is the regular expression " + targets->dump() +
                      ", which is not supported; list the module names");
  } else {
    throw EngineError(where + "\"target_modules\" is " + (targets ? targets->dump() : "missing") +
                      "; it must list module names (or be \"all-linear\")");
  }
  try {
    out.lora.targets = out.lora.modules();
  } catch (const EngineError& e) {
    throw EngineError(where + "\"target_modules\": " + e.what() +
                      " (the engine does not adapt embeddings, lm_head or MoE experts)");
  }

  if (const json* base = get("base_model_name_or_path"); base != nullptr && base->is_string())
    out.base_model = base->get<std::string>();
  return out;
}

}  // namespace

LoraOptions read_peft_adapter_config(const fs::path& dir) { return parse_config(dir).lora; }

PeftAdapter load_peft_adapter(const fs::path& dir) {
  ParsedConfig config = parse_config(dir);
  const fs::path file = dir / kPeftWeightsFile;
  if (!fs::exists(file)) {
    const bool bin = fs::exists(dir / "adapter_model.bin");
    throw EngineError(
        detail::cat(file.string(), ": missing",
                    bin ? "; only adapter_model.bin (a pickle) is there: save the adapter with "
                          "safe_serialization=True"
                        : ""));
  }
  PeftAdapter out;
  out.lora = std::move(config.lora);
  out.base_model = std::move(config.base_model);
  out.weights = read_safetensors(file);
  out.source = dir.string();
  return out;
}

void save_peft_adapter(const fs::path& dir, const PeftAdapter& adapter) {
  fs::create_directories(dir);
  const LoraOptions& lora = adapter.lora;
  if (!lora.enabled())
    throw EngineError(
        detail::cat(dir.string(), ": a PEFT adapter needs a LoRA rank > 0, got ", lora.rank));
  remove_checksum_manifest(dir);
  ChecksumManifest written;
  written.add(kPeftWeightsFile,
              write_safetensors(dir / kPeftWeightsFile, adapter.weights, {{"format", "pt"}}));
  // An integral alpha as an integer, as PEFT writes LoraConfig's default.
  const json alpha = lora.alpha == std::floor(lora.alpha) ? json(static_cast<int64_t>(lora.alpha))
                                                          : json(lora.alpha);
  const json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path",
       adapter.base_model.empty() ? json(nullptr) : json(adapter.base_model)},
      {"revision", nullptr},
      {"inference_mode", true},
      {"r", lora.rank},
      {"lora_alpha", alpha},
      {"target_modules", lora.modules()},
      {"exclude_modules", nullptr},
      {"lora_dropout", 0.0},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"use_dora", false},
      {"lora_bias", false},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"target_parameters", nullptr},
  };
  written.add(kPeftConfigFile, write_file_atomically(dir / kPeftConfigFile, config.dump(2) + "\n"));
  written.write(dir);  // last: the adapter is complete
}

TensorMap lora_shards_to_peft(const std::vector<std::vector<TensorMap>>& shards,
                              const ModelConfig& cfg, const LoraOptions& lora,
                              const std::vector<int64_t>& layer_split) {
  validate_layer_split(layer_split, cfg.num_layers);
  if (shards.size() != layer_split.size())
    throw EngineError(detail::cat("lora_shards_to_peft: ", shards.size(),
                                  " pipeline stages of shards but layer split ",
                                  shape_str(layer_split), " has ", layer_split.size()));
  const auto t = static_cast<int64_t>(shards.front().size());
  for (size_t p = 0; p < shards.size(); ++p)
    if (static_cast<int64_t>(shards[p].size()) != t || t == 0)
      throw EngineError(detail::cat("lora_shards_to_peft: pp stage ", p, " has ", shards[p].size(),
                                    " tp shards, stage 0 has ", t));
  validate_tensor_parallel(cfg, t);
  TensorMap out;
  int64_t begin = 0;
  for (size_t p = 0; p < shards.size(); ++p) {
    const int64_t end = begin + layer_split[p];
    const std::vector<Slot> stage = slots(cfg, lora, begin, end);
    std::map<std::string, std::vector<int64_t>> want;
    for (const Slot& s : stage)
      for (char f : kFactors) want.emplace(engine_name(s, f), rank_shape(s, f, t));
    for (int64_t k = 0; k < t; ++k)
      check_tensors(shards[p][k], want,
                    detail::cat("lora_shards_to_peft: shard (tp rank ", k, ", pp stage ", p,
                                ") does not match LoRA ", describe(lora), ":"),
                    "not an adapter of this stage's layers");
    for (const Slot& s : stage) {
      for (char f : kFactors) {
        const std::string name = engine_name(s, f);
        const int64_t dim = split_dim(s.module, f);
        at::Tensor whole;
        if (dim < 0 || t == 1) {
          whole = shards[p][0].at(name);
        } else {
          std::vector<at::Tensor> parts;
          for (int64_t k = 0; k < t; ++k) parts.push_back(shards[p][k].at(name));
          whole = at::cat(parts, dim);
        }
        out.emplace(peft_name(s, f), whole.contiguous());
      }
    }
    begin = end;
  }
  return out;
}

TensorMap peft_to_lora_shard(const PeftAdapter& adapter, const ModelConfig& cfg,
                             const ShardSpec& spec) {
  const std::string file = adapter.source.empty()
                               ? std::string("PEFT adapter")
                               : (fs::path(adapter.source) / kPeftWeightsFile).string();
  validate_tensor_parallel(cfg, spec.tp_size);
  if (spec.layer_begin < 0 || spec.layer_begin >= spec.layer_end || spec.layer_end > cfg.num_layers)
    throw EngineError(detail::cat("peft_to_lora_shard: layer range [", spec.layer_begin, ", ",
                                  spec.layer_end, ") is not a non-empty part of the model's ",
                                  cfg.num_layers, " layers"));
  // The whole adapter against the whole model, so that every rank agrees.
  std::map<std::string, std::vector<int64_t>> want;
  for (const Slot& s : slots(cfg, adapter.lora, 0, cfg.num_layers))
    for (char f : kFactors) want.emplace(peft_name(s, f), full_shape(s, f));
  check_tensors(adapter.weights, want,
                detail::cat(file, ": the adapter does not fit ", cfg.architecture, " with LoRA ",
                            describe(adapter.lora), ":"),
                "the engine adapts lora_A and lora_B of the target modules of every decoder "
                "layer; not embeddings, lm_head or MoE experts");
  TensorMap out;
  const int64_t t = spec.tp_size, k = spec.tp_rank;
  for (const Slot& s : slots(cfg, adapter.lora, spec.layer_begin, spec.layer_end)) {
    for (char f : kFactors) {
      const at::Tensor& whole = adapter.weights.at(peft_name(s, f));
      const int64_t dim = split_dim(s.module, f);
      if (dim < 0 || t == 1) {
        out.emplace(engine_name(s, f), whole);
      } else {
        const int64_t n = whole.size(dim) / t;
        out.emplace(engine_name(s, f), whole.narrow(dim, k * n, n).contiguous());
      }
    }
  }
  return out;
}

void copy_peft_adapter(const PeftAdapter& adapter, const ModelConfig& cfg, const LoraOptions& lora,
                       const ShardSpec& spec,
                       const std::vector<std::pair<std::string, at::Tensor>>& params) {
  const std::string where = adapter.source.empty() ? std::string("PEFT adapter") : adapter.source;
  if (!lora.enabled() || adapter.lora.rank != lora.rank || adapter.lora.alpha != lora.alpha ||
      adapter.lora.modules() != lora.modules())
    throw EngineError(where + ": the adapter has " + describe(adapter.lora) +
                      " but the model's LoRA is " + describe(lora) +
                      "; build the model with the adapter's (read_peft_adapter_config)");
  const TensorMap shard = peft_to_lora_shard(adapter, cfg, spec);
  std::set<std::string> copied;
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    const auto it = shard.find(name);
    if (it == shard.end() || it->second.sizes() != param.sizes())
      throw EngineError(
          detail::cat(where, ": the model's adapter ", name, " ", shape_str(param.sizes()), " has ",
                      it == shard.end() ? std::string("no tensor") : shape_str(it->second.sizes()),
                      " in the adapter (tp rank ", spec.tp_rank, " of ", spec.tp_size, ", layers [",
                      spec.layer_begin, ", ", spec.layer_end, "))"));
    param.copy_(it->second);
    copied.insert(name);
  }
  std::vector<std::string> left;
  for (const auto& [name, t] : shard)
    if (!copied.count(name)) left.push_back(name);
  if (!left.empty()) throw EngineError(where + ": the model has no adapter for " + list_str(left));
}

std::vector<std::vector<TensorMap>> take_lora_tensors(std::vector<std::vector<TensorMap>>& shards) {
  std::vector<std::vector<TensorMap>> out(shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    for (TensorMap& shard : shards[p]) {
      TensorMap lora;
      for (auto it = shard.begin(); it != shard.end();) {
        if (it->first.find(".lora.") != std::string::npos) {
          lora.insert(shard.extract(it++));
        } else {
          ++it;
        }
      }
      out[p].push_back(std::move(lora));
    }
  }
  return out;
}

}  // namespace baton::engine
