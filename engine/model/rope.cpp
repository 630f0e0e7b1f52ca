#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/errors.h"

namespace baton::engine {
namespace {

// theta^(-2i/d) for i < d/2, in fp32 from integer exponents (HF's order of
// operations: the exponent in fp32, the power in fp32, then its reciprocal).
at::Tensor base_inverse_frequencies(double theta, int64_t d) {
  auto exponents = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  return at::pow(theta, exponents).reciprocal();
}

// Llama 3: wavelengths beyond the original context / low_freq_factor are
// interpolated by `factor`, those below it / high_freq_factor kept, and the
// band between mixed smoothly.
at::Tensor llama3_frequencies(const at::Tensor& inv_freq, const RopeScaling& r) {
  const double old = static_cast<double>(r.original_max_position_embeddings);
  const double low_wavelen = old / r.low_freq_factor, high_wavelen = old / r.high_freq_factor;
  const at::Tensor wavelen = (2 * std::numbers::pi) / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// YaRN's mscale: 0.1 · m · ln(s) + 1 for s > 1.
double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// YaRN: the frequencies that rotate fewer than beta_slow times over the
// original context are interpolated, those above beta_fast kept, a linear
// ramp between. Returns inv_freq and sets the cos/sin factor.
at::Tensor yarn_frequencies(double theta, int64_t d, const RopeScaling& r,
                            double* attention_factor) {
  if (r.attention_factor) {
    *attention_factor = *r.attention_factor;
  } else if (r.mscale && r.mscale_all_dim && *r.mscale != 0 && *r.mscale_all_dim != 0) {
    *attention_factor = yarn_mscale(r.factor, *r.mscale) / yarn_mscale(r.factor, *r.mscale_all_dim);
  } else {
    *attention_factor = yarn_mscale(r.factor, 1.0);
  }
  const double original = static_cast<double>(r.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(d) * std::log(original / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(theta));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
  const at::Tensor pos_freqs =
      at::pow(theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  const at::Tensor extrapolation = 1.0 / pos_freqs;
  const at::Tensor interpolation = 1.0 / (r.factor * pos_freqs);
  const at::Tensor ramp = ((at::arange(d / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  const at::Tensor keep = 1 - ramp;  // the extrapolation's share
  return interpolation * (1 - keep) + extrapolation * keep;
}

// cos and sin of [angles, angles] (angles = position × inv_freq, fp32),
// times `factor`, in `dtype`.
Rotary tables_of(const at::Tensor& position_ids, const at::Tensor& inv_freq, double factor,
                 at::ScalarType dtype) {
  auto angles = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq.to(position_ids.device());
  auto emb = at::cat({angles, angles}, -1);  // [B, S, d]
  if (factor == 1.0) return {emb.cos().to(dtype), emb.sin().to(dtype)};
  return {(emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)};
}

}  // namespace

Rotary rotary_tables(const at::Tensor& position_ids, int64_t head_dim, double theta,
                     at::ScalarType dtype) {
  return tables_of(position_ids, base_inverse_frequencies(theta, head_dim), 1.0, dtype);
}

RotaryEmbedding::RotaryEmbedding(const ModelConfig& config)
    : head_dim_(config.head_dim),
      theta_(config.rope_theta),
      max_positions_(config.max_position_embeddings),
      scaling_(config.rope_scaling) {
  at::Tensor base = base_inverse_frequencies(theta_, head_dim_);
  switch (scaling_.type) {
    case RopeType::kDefault:
    case RopeType::kDynamic:  // scaled per call, beyond the original context
      inv_freq_ = base;
      break;
    case RopeType::kLinear:
      inv_freq_ = base / scaling_.factor;
      break;
    case RopeType::kLlama3:
      inv_freq_ = llama3_frequencies(base, scaling_);
      break;
    case RopeType::kYarn:
      inv_freq_ = yarn_frequencies(theta_, head_dim_, scaling_, &attention_factor_);
      break;
  }
}

at::Tensor RotaryEmbedding::inverse_frequencies(int64_t length) const {
  if (scaling_.type != RopeType::kDynamic || length <= max_positions_) return inv_freq_;
  const double d = static_cast<double>(head_dim_);
  const double grown =
      scaling_.factor * static_cast<double>(length) / static_cast<double>(max_positions_) -
      (scaling_.factor - 1);
  return base_inverse_frequencies(theta_ * std::pow(grown, d / (d - 2)), head_dim_);
}

Rotary RotaryEmbedding::tables(const at::Tensor& position_ids, at::ScalarType dtype) const {
  // Dynamic NTK reads the call's longest position: one host sync, only then.
  const int64_t length = call_dependent() ? position_ids.max().item<int64_t>() + 1 : 0;
  if (length > max_positions_)
    return tables_of(position_ids, inverse_frequencies(length), attention_factor_, dtype);
  if (!inv_freq_on_device_.defined() || inv_freq_on_device_.device() != position_ids.device())
    inv_freq_on_device_ = inv_freq_.to(position_ids.device());
  return tables_of(position_ids, inv_freq_on_device_, attention_factor_, dtype);
}

}  // namespace baton::engine
