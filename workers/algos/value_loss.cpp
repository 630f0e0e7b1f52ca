#include "workers/algos/value_loss.h"

#include <c10/core/GradMode.h>

#include <stdexcept>

#include "base/errors.h"
#include "workers/algos/masked_reductions.h"

namespace baton::algos {

ValueLossResult compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns,
                                   const at::Tensor& values, const at::Tensor& mask,
                                   double cliprange_value, LossAggMode mode,
                                   const GlobalBatchInfo& info) {
  if (returns.sizes() != vpreds.sizes() || values.sizes() != vpreds.sizes() ||
      mask.sizes() != vpreds.sizes())
    throw baton::InvalidArgument(
        "compute_value_loss: vpreds, returns, values and mask must have "
        "one shape; got " +
        c10::str(vpreds.sizes()) + ", " + c10::str(returns.sizes()) + ", " +
        c10::str(values.sizes()) + ", " + c10::str(mask.sizes()));
  const at::Tensor clipped =
      at::maximum(at::minimum(vpreds, values + cliprange_value), values - cliprange_value);
  const at::Tensor unclipped_loss = (vpreds - returns).square();
  const at::Tensor clipped_loss = (clipped - returns).square();
  const at::Tensor loss =
      0.5 * agg_loss(at::maximum(unclipped_loss, clipped_loss), mask, mode, info);
  c10::NoGradGuard no_grad;
  const double clipfrac =
      masked_mean(clipped_loss.gt(unclipped_loss).to(vpreds.scalar_type()), mask).item<double>();
  return {loss, clipfrac};
}

}  // namespace baton::algos
