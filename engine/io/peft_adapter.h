// PEFT LoRA adapters on disk: the directory HF PEFT's save_pretrained writes
// and PeftModel.from_pretrained reads, for the engine's LoRA
// (engine/model/lora.h):
//
//   DIR/adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM",
//                                   "r": R, "lora_alpha": α, "target_modules": [...],
//                                   "base_model_name_or_path": ..., ...}
//   DIR/adapter_model.safetensors  base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
//                                  [R, in] and ….lora_B.weight [out, R]; q/k/v/o_proj
//                                  under self_attn, gate/up/down_proj under mlp
//
// Only plain LoRA is read: use_rslora, use_dora, a bias other than "none",
// lora_bias, fan_in_fan_out, modules_to_save, rank or alpha patterns, a
// layer subset or a target regex are refused by name, as are adapters on
// modules the engine does not adapt (lm_head, embeddings, MoE experts).
// lora_dropout is accepted and not applied (the engine has no dropout).
//
// Example (export every rank's adapters, then load one rank's part):
//   TensorMap peft = lora_shards_to_peft(shards, cfg, lora, layer_split);  // shards[pp][tp]
//   save_peft_adapter(dir, {.lora = lora, .base_model = "models/qwen3", .weights = peft});
//   copy_peft_adapter(load_peft_adapter(dir), cfg, model->options().lora,
//                     model->shard_spec(), model->lora_params());
//
// Errors: EngineError naming the file, the key or tensor and the shapes.
// Blocking: synchronous file I/O. Thread safety: the functions are pure but
// for the files they read and write.
#pragma once

#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/lora.h"

namespace baton::engine {

constexpr const char* kPeftConfigFile = "adapter_config.json";
constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

struct PeftAdapter {
  // r, lora_alpha and the targeted modules (HF names, in kLoraModules'
  // order); `seed` is not part of an adapter.
  LoraOptions lora;
  std::string base_model;  // base_model_name_or_path; "" when unknown
  TensorMap weights;       // PEFT's names, whole (unsharded) tensors
  std::string source;      // the directory it was read from ("" when built in memory)
};

// Reads and checks DIR/adapter_config.json: a plain LoRA adapter of a causal
// LM (see above) whose target modules the engine adapts. Throws EngineError
// naming the file and the key.
LoraOptions read_peft_adapter_config(const std::filesystem::path& dir);

// The config (read_peft_adapter_config) and DIR/adapter_model.safetensors.
// The tensors are checked against a model by peft_to_lora_shard.
PeftAdapter load_peft_adapter(const std::filesystem::path& dir);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (created
// if missing; each file atomically), as PEFT 0.21's save_pretrained does,
// then their checksum manifest (base/checksum_manifest.h), which
// load_peft_adapter checks them against.
void save_peft_adapter(const std::filesystem::path& dir, const PeftAdapter& adapter);

// The whole adapter in PEFT's names from every rank's LoRA tensors
// (Transformer::lora_params' names), `shards[p][k]` being pipeline stage p, TP
// rank k of a layout with `layer_split`; the TP slices are put back together
// (lora.h), replicated factors taken from TP rank 0. Throws EngineError when
// the grid does not match the split, or a shard lacks a tensor, holds an
// unknown one or one of the wrong shape (naming the rank, tensor and shapes).
TensorMap lora_shards_to_peft(const std::vector<std::vector<TensorMap>>& shards,
                              const ModelConfig& cfg, const LoraOptions& lora,
                              const std::vector<int64_t>& layer_split);

// One rank's LoRA tensors (engine names, lora.h's TP slices) of `adapter`.
// The whole adapter is checked against `cfg` and adapter.lora first: every
// tensor those imply present with its shape ([r, in], [out, r]), nothing
// else; errors name adapter.source's weights file, the tensors and shapes.
TensorMap peft_to_lora_shard(const PeftAdapter& adapter, const ModelConfig& cfg,
                             const ShardSpec& spec);

// Copies `adapter` into a model's adapters: `params` are its
// Transformer::lora_params() on the rank `spec` describes, built with `lora`.
// Throws EngineError when the adapter's r, lora_alpha or target modules are
// not `lora`'s (naming both), or its tensors do not fit (peft_to_lora_shard).
void copy_peft_adapter(const PeftAdapter& adapter, const ModelConfig& cfg, const LoraOptions& lora,
                       const ShardSpec& spec,
                       const std::vector<std::pair<std::string, at::Tensor>>& params);

// Moves the LoRA tensors (names holding ".lora.") out of every rank's map
// and returns them in the same grid: shards written with the base model's
// tensors and the adapters side by side (export_hf) split into what
// shards_to_hf and lora_shards_to_peft take.
std::vector<std::vector<TensorMap>> take_lora_tensors(std::vector<std::vector<TensorMap>>& shards);

}  // namespace baton::engine
