// clamp with the gradient the algorithms' contract states: 1 on [lo, hi]
// with the bounds included, 0 outside. at::clamp of the LibTorch in use
// (2.15) passes no gradient at the bounds themselves, so a ratio sitting
// exactly on 1 ± ε (e.g. ρ = 1 with ε = 0) would lose its gradient.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace baton::algos {

// The value of at::clamp(x, lo, hi) (an absent bound is open); the gradient
// passes where lo <= x <= hi.
at::Tensor clamp_inclusive(const at::Tensor& x, std::optional<double> lo, std::optional<double> hi);

}  // namespace baton::algos
