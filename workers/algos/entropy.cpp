#include "workers/algos/entropy.h"

namespace baton::algos {

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  return at::logsumexp(logits, -1) - (at::softmax(logits, -1) * logits).sum(-1);
}

at::Tensor compute_entropy_loss(const at::Tensor& logits, const at::Tensor& mask, LossAggMode mode,
                                const GlobalBatchInfo& info) {
  return agg_loss(entropy_from_logits(logits), mask, mode, info);
}

}  // namespace baton::algos
