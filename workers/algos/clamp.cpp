#include "workers/algos/clamp.h"

namespace baton::algos {

at::Tensor clamp_inclusive(const at::Tensor& x, std::optional<double> lo,
                           std::optional<double> hi) {
  at::Tensor outside = at::zeros_like(x, at::kBool);
  if (lo) outside = outside.logical_or(x.lt(*lo));
  if (hi) outside = outside.logical_or(x.gt(*hi));
  // Inside (bounds included) the value is x itself, so the gradient is 1.
  return at::where(outside, at::clamp(x.detach(), lo, hi), x);
}

}  // namespace baton::algos
