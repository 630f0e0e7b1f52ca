#include "workers/algos/masked_reductions.h"

#include <stdexcept>
#include <string>

#include "base/errors.h"

namespace baton::algos {

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask,
                      std::optional<int64_t> dim) {
  const at::Tensor kept = at::where(mask.ne(0), values, at::zeros({}, values.options()));
  return dim ? kept.sum(*dim) : kept.sum();
}

at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask,
                       std::optional<int64_t> dim) {
  // Counted exactly, then in at least fp32 (a bf16 count would round past 256).
  const at::Tensor valid = mask.ne(0);
  const at::Tensor count =
      (dim ? valid.sum(*dim) : valid.sum()).to(at::promote_types(values.scalar_type(), at::kFloat));
  return masked_sum(values, mask, dim) / (count + 1e-8);
}

at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  const at::Tensor mean = masked_mean(values, mask);
  at::Tensor var = masked_mean((values - mean).square(), mask);
  if (unbiased) {
    const double count = mask.ne(0).sum().item<double>();
    if (count == 0)
      throw baton::InvalidArgument(
          "masked_var: the mask has no valid element (the unbiased "
          "variance needs at least 2)");
    if (count == 1)
      throw baton::InvalidArgument(
          "masked_var: the mask has only 1 valid element (the unbiased "
          "variance needs at least 2)");
    var = var * (count / (count - 1));
  }
  return var;
}

at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean) {
  const at::Tensor mean = masked_mean(values, mask);
  const at::Tensor var = masked_var(values, mask, /*unbiased=*/true);
  at::Tensor whitened = (values - mean) * at::rsqrt(var + 1e-8);
  if (!shift_mean) whitened = whitened + mean;
  return whitened;
}

}  // namespace baton::algos
