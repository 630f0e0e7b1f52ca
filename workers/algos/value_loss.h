// The critic's clipped value loss (PPO): the new value prediction may move at
// most cliprange_value from the old one before the loss stops rewarding it.
//
// Example:
//   ValueLossResult v = compute_value_loss(vpreds, returns, old_values, mask, 0.5,
//                                          LossAggMode::TokenMean, info);
//   v.loss.backward();
#pragma once

#include <ATen/ATen.h>

#include "workers/algos/agg_loss.h"

namespace baton::algos {

struct ValueLossResult {
  at::Tensor loss;  // 0-dim
  double clipfrac;  // critic/vf_clipfrac
};

// With ε = cliprange_value and R = returns:
// vc = max(min(vpreds, values + ε), values − ε),
// L = max((vpreds − R)², (vc − R)²), loss = 0.5·agg_loss(L, mask, mode, info);
// clipfrac = masked_mean((vc − R)² > (vpreds − R)²). values (the old
// predictions) and returns are data; vpreds carries the gradient.
ValueLossResult compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns,
                                   const at::Tensor& values, const at::Tensor& mask,
                                   double cliprange_value, LossAggMode mode,
                                   const GlobalBatchInfo& info = {});

}  // namespace baton::algos
