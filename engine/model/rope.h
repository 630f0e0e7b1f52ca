// RoPE: the rotary position embedding's tables, for every RoPE type a config
// can name (ModelConfig::rope_scaling: default, linear, dynamic NTK, YaRN,
// Llama 3), computed as HF transformers 5 computes them:
//   - inverse frequencies inv_freq[i] = theta^(-2i/d) in fp32, then
//     linear: / factor;
//     llama3: / factor for wavelengths (2π / inv_freq) above
//       original_max / low_freq_factor, unchanged below original_max /
//       high_freq_factor, a smooth mix in between;
//     yarn: each frequency a mix of itself (extrapolation) and / factor
//       (interpolation), by a linear ramp over the dimensions between the
//       correction range that beta_fast and beta_slow rotations give;
//     dynamic: theta scaled by (factor · L / max_position_embeddings −
//       (factor − 1))^(d / (d − 2)) where L, the call's longest position + 1,
//       exceeds max_position_embeddings;
//   - angles = position × inv_freq (fp32), cos and sin of [angles, angles]
//     (HF's half-split layout), times the attention factor (YaRN's
//     mscale; 1 otherwise), cast to the activation dtype.
// HF's dynamic NTK keeps its largest L across calls; here each call uses its
// own, which is the same within a generation (L only grows) and in any
// fresh model.
//
// Example:
//   RotaryEmbedding rope(config);
//   Rotary r = rope.tables(position_ids, at::kBFloat16);  // cos, sin [B, S, d]
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "engine/io/model_config.h"

namespace baton::engine {

// Rotary tables for given positions: cos and sin, each [B, S, head_dim], in
// HF's layout (the frequency vector repeated twice along the last dim).
struct Rotary {
  at::Tensor cos;
  at::Tensor sin;
};

// The default RoPE's tables (theta^(-2i/d), no scaling).
Rotary rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double theta,
                     at::ScalarType dtype);

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelConfig& config);

  // cos and sin [B, S, head_dim] at `position_ids` [B, S] (int64, on any
  // device: the tables are made there), in `dtype`.
  Rotary tables(const at::Tensor& position_ids, at::ScalarType dtype) const;

  // Whether the tables of a position depend on the call's other positions
  // (dynamic NTK): then a table cached for one call must not serve another.
  bool call_dependent() const { return scaling_.type == RopeType::kDynamic; }

  // inv_freq [head_dim / 2] (fp32, CPU) for a call whose longest sequence is
  // `length` positions, and the cos/sin factor.
  at::Tensor inverse_frequencies(int64_t length) const;
  double attention_factor() const { return attention_factor_; }

 private:
  int64_t head_dim_;
  double theta_;
  int64_t max_positions_;
  RopeScaling scaling_;
  at::Tensor inv_freq_;  // for calls within the original context
  // inv_freq_ on the device of the last call's positions: no host-to-device
  // copy per call (a CUDA graph cannot capture one).
  mutable at::Tensor inv_freq_on_device_;
  double attention_factor_ = 1.0;
};

}  // namespace baton::engine
