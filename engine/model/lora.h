// LoRA: low-rank adapters on a transformer's linear layers (Hu et al. 2021,
// as PEFT computes them): a targeted layer y = x Wᵀ computes
//   y = x Wᵀ + (alpha / rank) · (x Aᵀ) Bᵀ,   A [rank, in], B [out, rank],
// with W frozen. A starts Kaiming-uniform (PEFT's default), B at zero, so a
// fresh adapter changes nothing. Targets by their HF names: q_proj, k_proj,
// v_proj, o_proj, gate_proj, up_proj, down_proj, or "all-linear" (all of
// them). Under tensor parallelism each adapter is split as its layer is: a
// column-parallel layer's B holds this rank's output rows and its A is
// replicated; a row-parallel layer's A holds this rank's input columns and
// its B is replicated. MoE experts are not targeted.
//
// Example:
//   TransformerOptions o;
//   o.lora = LoraOptions{.rank = 16, .alpha = 32, .targets = {"all-linear"}};
//   auto model = std::make_shared<Transformer>(cfg, ps, o);  // base frozen
//   Optimizer opt(model, ...);                // only the adapters (trainable_params)
//   auto merged = model->merged_params();     // W + (alpha / rank) · B A, for a rollout
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace baton::engine {

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16.0;
  std::vector<std::string> targets;  // HF module names, or {"all-linear"}
  uint64_t seed = 1234;              // A's initialisation (the same on every rank)

  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
  // The HF module names targeted ("all-linear" expanded), in the order
  // kLoraModules lists them. Throws EngineError naming an unknown target.
  std::vector<std::string> modules() const;

  bool operator==(const LoraOptions&) const = default;
};

// Every module LoRA can target, in the layer's order.
inline const std::vector<std::string> kLoraModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};

// Whether a module is row-parallel (o_proj, down_proj: A split over TP, B
// replicated) rather than column-parallel.
inline bool lora_row_parallel(const std::string& module) {
  return module == "o_proj" || module == "down_proj";
}

}  // namespace baton::engine
