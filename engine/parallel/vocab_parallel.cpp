#include "engine/parallel/vocab_parallel.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"

namespace baton::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Want { kLogProbs, kEntropy, kBoth };

bool wants_log_probs(Want w) { return w != Want::kEntropy; }
bool wants_entropy(Want w) { return w != Want::kLogProbs; }

at::ScalarType compute_type(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// For the entropy: a -inf logit (vocabulary padding) counts as the lowest
// finite value. Its probability stays exactly 0, and its p·log p term (and
// that term's gradient) is 0·finite = 0 instead of 0·inf = NaN. Finite values
// are untouched; one in-place pass.
void clamp_minus_infinity(at::Tensor& shifted) {
  shifted.clamp_min_(shifted.scalar_type() == at::kDouble ? std::numeric_limits<double>::lowest()
                                                          : std::numeric_limits<float>::lowest());
}

// Targets that this rank's shard holds, as local column indices (0 where not
// held) and the mask of held positions.
std::pair<at::Tensor, at::Tensor> local_targets(const at::Tensor& targets, int64_t start,
                                                int64_t shard) {
  at::Tensor held = (targets >= start).logical_and_(targets < start + shard);
  at::Tensor index = (targets - start).masked_fill_(held.logical_not(), 0);
  return {index, held};
}

// Outputs, in order: log_probs (if wanted), entropy (if wanted).
struct VocabParallelSoftmax : torch::autograd::Function<VocabParallelSoftmax> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const c10::optional<at::Tensor>& targets, const Group& tp,
                               Want want) {
    const at::Tensor x = logits.to(compute_type(logits));
    const int64_t shard = x.size(-1);
    const int64_t start = tp.rank * shard;

    at::Tensor max = collective::all_reduce(x.amax(-1), tp, c10d::ReduceOp::MAX);
    at::Tensor shifted = x - max.unsqueeze(-1);
    if (wants_entropy(want)) clamp_minus_infinity(shifted);
    const at::Tensor exp = shifted.exp();

    // One all-reduce carries every per-position sum: [k, ..].
    std::vector<at::Tensor> sums{exp.sum(-1)};
    at::Tensor index, held;
    if (wants_log_probs(want)) {
      std::tie(index, held) = local_targets(*targets, start, shard);
      sums.push_back(
          shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill_(held.logical_not(), 0));
    }
    if (wants_entropy(want)) sums.push_back((exp * shifted).sum(-1));
    const at::Tensor reduced = collective::all_reduce(at::stack(sums), tp);

    const at::Tensor sum_exp = reduced[0];
    const at::Tensor log_z = sum_exp.log();
    variable_list outputs;
    int64_t next = 1;
    if (wants_log_probs(want)) outputs.push_back(reduced[next++] - log_z);
    at::Tensor mean_shifted;  // E_p[shifted]
    if (wants_entropy(want)) {
      mean_shifted = reduced[next++] / sum_exp;
      outputs.push_back(log_z - mean_shifted);
    }

    detail::save_group(ctx, tp);
    ctx->saved_data["want"] = static_cast<int64_t>(want);
    ctx->saved_data["start"] = start;
    // The logits are alive anyway (they are our input); the softmax is
    // recomputed from them in backward.
    ctx->save_for_backward({logits, max, log_z, mean_shifted, index, held});
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Want want = static_cast<Want>(ctx->saved_data["want"].toInt());
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &max = saved[1], &log_z = saved[2],
                     &mean_shifted = saved[3], &index = saved[4], &held = saved[5];
    size_t next = 0;
    const at::Tensor grad_lp = wants_log_probs(want) ? grads[next++] : at::Tensor();
    const at::Tensor grad_ent = wants_entropy(want) ? grads[next++] : at::Tensor();
    if (!grad_lp.defined() && !grad_ent.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};

    at::Tensor shifted = logits.to(compute_type(logits)) - max.unsqueeze(-1);
    if (grad_ent.defined()) clamp_minus_infinity(shifted);
    at::Tensor p = (shifted - log_z.unsqueeze(-1)).exp();
    // d/dl of g_lp·log p(t) + g_H·H = g_H·p·(E[s] - s) - g_lp·p + g_lp·onehot(t).
    // p multiplies E[s] - s before g_H does: for a clamped -inf column,
    // E[s] - s is huge but finite and p is 0.
    at::Tensor grad;
    if (grad_ent.defined())
      grad = (mean_shifted.unsqueeze(-1) - shifted).mul_(p).mul_(grad_ent.unsqueeze(-1));
    if (grad_lp.defined()) {
      at::Tensor lp_part = p.mul_(-grad_lp.unsqueeze(-1));  // p is not needed after this
      grad = grad.defined() ? grad.add_(lp_part) : lp_part;
    }
    if (grad_lp.defined())
      grad.scatter_add_(-1, index.unsqueeze(-1),
                        grad_lp.masked_fill(held.logical_not(), 0).unsqueeze(-1).to(grad.dtype()));
    return {grad.to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_logits(const at::Tensor& logits, const Group& tp, const char* fn) {
  if (logits.dim() < 1 || logits.size(-1) == 0)
    throw EngineError(detail::cat(fn, ": expected [.., V/tp] logits, got shape ", logits.sizes()));
  if (!at::isFloatingType(logits.scalar_type()))
    throw EngineError(
        detail::cat(fn, ": logits must be floating point, got ", logits.scalar_type()));
  ENGINE_CHECK(tp.pg && tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, fn, ": invalid group");
}

void check_targets(const at::Tensor& logits, const at::Tensor& targets, const Group& tp,
                   const char* fn) {
  const auto lead = logits.sizes().slice(0, logits.dim() - 1);
  if (targets.scalar_type() != at::kLong || targets.sizes() != lead)
    throw EngineError(detail::cat(fn, ": targets must be int64 of shape ", lead, " (logits ",
                                  logits.sizes(), "), got ", targets.scalar_type(), " of shape ",
                                  targets.sizes()));
  if (targets.numel() == 0) return;
  const int64_t vocab = logits.size(-1) * tp.size;
  const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
  if (lo < 0 || hi >= vocab)
    throw EngineError(detail::cat(fn, ": target id ", lo < 0 ? lo : hi,
                                  " is outside the vocabulary [0, ", vocab, ")"));
}

}  // namespace

at::Tensor vocab_parallel_log_probs(const at::Tensor& logits_shard, const at::Tensor& targets,
                                    const Group& tp) {
  check_logits(logits_shard, tp, "vocab_parallel_log_probs");
  check_targets(logits_shard, targets, tp, "vocab_parallel_log_probs");
  return VocabParallelSoftmax::apply(logits_shard, c10::optional<at::Tensor>(targets), tp,
                                     Want::kLogProbs)[0];
}

at::Tensor vocab_parallel_entropy(const at::Tensor& logits_shard, const Group& tp) {
  check_logits(logits_shard, tp, "vocab_parallel_entropy");
  return VocabParallelSoftmax::apply(logits_shard, c10::optional<at::Tensor>(), tp,
                                     Want::kEntropy)[0];
}

LogProbsEntropy vocab_parallel_log_probs_entropy(const at::Tensor& logits_shard,
                                                 const at::Tensor& targets, const Group& tp) {
  check_logits(logits_shard, tp, "vocab_parallel_log_probs_entropy");
  check_targets(logits_shard, targets, tp, "vocab_parallel_log_probs_entropy");
  auto out = VocabParallelSoftmax::apply(logits_shard, c10::optional<at::Tensor>(targets), tp,
                                         Want::kBoth);
  return {out[0], out[1]};
}

at::Tensor vocab_parallel_sum_pi_squared(const at::Tensor& logits_shard, const Group& tp) {
  check_logits(logits_shard, tp, "vocab_parallel_sum_pi_squared");
  c10::NoGradGuard no_grad;
  const at::Tensor x = logits_shard.detach().to(compute_type(logits_shard));
  const at::Tensor max = collective::all_reduce(x.amax(-1), tp, c10d::ReduceOp::MAX);
  const at::Tensor exp = (x - max.unsqueeze(-1)).exp();
  const at::Tensor sums =
      collective::all_reduce(at::stack({exp.sum(-1), exp.square().sum(-1)}), tp);
  return sums[1] / sums[0].square();
}

}  // namespace baton::engine
