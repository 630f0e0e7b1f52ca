#include "engine/parallel/fused_lm_head.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"

namespace baton::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kFn = "fused_lm_head_log_probs_entropy";
constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// What the chunk loops need besides the tensors.
struct Plan {
  int64_t rows = 0;       // this rank's vocabulary rows, padding included
  int64_t real_rows = 0;  // the tokens among them: rows [0, real_rows)
  int64_t start = 0;      // global id of this rank's row 0
  int64_t chunk = 1;      // tokens per chunk
  double temperature = 1;
  bool with_entropy = true;
  at::ScalarType compute = at::kFloat;  // of the softmax and the results
};

// Per-token statistics of the scaled logits x = logits / T, compute type, [N].
struct Stats {
  at::Tensor log_probs, entropy;  // the results (entropy: with_entropy only)
  at::Tensor max;                 // max over the whole vocabulary
  at::Tensor log_z;               // log Σ exp(x − max)
  at::Tensor mean_shifted;        // E_p[x − max] (with_entropy only)
};

// Each target as a column of this rank's real rows (0 where it is not one),
// whether it is one, and whether it falls in this rank's padding.
struct LocalTargets {
  at::Tensor index, held, in_padding;
};

LocalTargets local_targets(const at::Tensor& targets, const Plan& plan) {
  at::Tensor local = targets - plan.start;
  at::Tensor held = (local >= 0).logical_and_(local < plan.real_rows);
  at::Tensor in_padding = (local >= plan.real_rows).logical_and_(local < plan.rows);
  return {local.masked_fill_(held.logical_not(), 0), held, in_padding};
}

// One chunk's temporaries, allocated once for the largest chunk; chunk(c)
// views their first c rows (contiguous).
struct ChunkBuffers {
  at::Tensor a, b;  // [chunk, real_rows], compute type
  at::Tensor raw;   // the same in the inputs' dtype, when that is not the compute type

  ChunkBuffers(const at::Tensor& hidden, const Plan& plan) {
    const int64_t c = std::min(plan.chunk, hidden.size(0));
    a = at::empty({c, plan.real_rows}, hidden.options().dtype(plan.compute));
    b = at::empty_like(a);
    if (hidden.scalar_type() != plan.compute)
      raw = at::empty({c, plan.real_rows}, hidden.options());
  }
};

// x = hidden_chunk · w_realᵀ / T into `x` (compute type), through `raw` (the
// GEMM's output in the inputs' dtype) when that is defined.
void chunk_logits(const at::Tensor& h, const at::Tensor& w_real, double temperature, at::Tensor raw,
                  at::Tensor& x) {
  if (raw.defined()) {
    at::mm_out(raw, h, w_real.t());
    x.copy_(raw);
  } else {
    at::mm_out(x, h, w_real.t());
  }
  if (temperature != 1.0) x.div_(temperature);
}

Stats forward_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                     const Group& tp, const Plan& plan) {
  const int64_t n = hidden.size(0), r = plan.real_rows;
  const auto opts = hidden.options().dtype(plan.compute);
  Stats st;
  st.log_probs = at::empty({n}, opts);
  st.max = at::empty({n}, opts);
  st.log_z = at::empty({n}, opts);
  if (plan.with_entropy) {
    st.entropy = at::empty({n}, opts);
    st.mean_shifted = at::empty({n}, opts);
  }
  const LocalTargets lt = local_targets(targets, plan);
  const at::Tensor w_real = weight.narrow(0, 0, r);
  ChunkBuffers buf(hidden, plan);

  for (int64_t i0 = 0; i0 < n; i0 += plan.chunk) {
    const int64_t c = std::min(plan.chunk, n - i0);
    at::Tensor x = buf.a.narrow(0, 0, c);
    const at::Tensor raw = buf.raw.defined() ? buf.raw.narrow(0, 0, c) : at::Tensor();
    chunk_logits(hidden.narrow(0, i0, c), w_real, plan.temperature, raw, x);

    // A rank holding only padding contributes -inf to the max.
    const at::Tensor local_max = r > 0 ? x.amax(-1) : at::full({c}, kMinusInf, opts);
    const at::Tensor max = collective::all_reduce(local_max, tp, c10d::ReduceOp::MAX);
    x.sub_(max.unsqueeze(-1));  // shifted: x − max
    at::Tensor e = buf.b.narrow(0, 0, c);
    at::exp_out(e, x);

    // One all-reduce carries every per-token sum: [k, c].
    std::vector<at::Tensor> sums{e.sum(-1)};
    const at::Tensor held = lt.held.narrow(0, i0, c);
    at::Tensor target = r > 0 ? x.gather(-1, lt.index.narrow(0, i0, c).unsqueeze(-1)).squeeze(-1)
                              : at::zeros({c}, opts);
    target.masked_fill_(held.logical_not(), 0)
        .masked_fill_(lt.in_padding.narrow(0, i0, c), kMinusInf);
    sums.push_back(target);
    if (plan.with_entropy) sums.push_back(e.mul_(x).sum(-1));
    const at::Tensor reduced = collective::all_reduce(at::stack(sums), tp);

    const at::Tensor log_z = reduced[0].log();
    st.max.narrow(0, i0, c).copy_(max);
    st.log_z.narrow(0, i0, c).copy_(log_z);
    at::Tensor log_probs = st.log_probs.narrow(0, i0, c);
    at::sub_out(log_probs, reduced[1], log_z);
    if (plan.with_entropy) {
      at::Tensor mean = st.mean_shifted.narrow(0, i0, c), entropy = st.entropy.narrow(0, i0, c);
      at::div_out(mean, reduced[2], reduced[0]);
      at::sub_out(entropy, log_z, mean);
    }
  }
  return st;
}

struct Grads {
  at::Tensor hidden, weight;
};

// g_lp, g_ent: the upstream gradients of the log-probs and the entropy
// (either may be undefined: no gradient).
Grads backward_chunks(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                      const Stats& st, const at::Tensor& g_lp, const at::Tensor& g_ent,
                      bool need_hidden, bool need_weight, const Plan& plan) {
  const int64_t n = hidden.size(0), r = plan.real_rows;
  Grads out;
  if (need_hidden) out.hidden = at::empty({n, hidden.size(1)}, hidden.options());
  if (need_weight) out.weight = at::zeros(weight.sizes(), weight.options());
  if (r == 0) {  // only padding here: this rank's logits get no gradient
    if (need_hidden) out.hidden.zero_();
    return out;
  }
  const LocalTargets lt = local_targets(targets, plan);
  const at::Tensor w_real = weight.narrow(0, 0, r);
  at::Tensor grad_w_real = need_weight ? out.weight.narrow(0, 0, r) : at::Tensor();
  // The upstream gradients over T: the logits' gradient is x's over T (x = logits / T).
  auto over_t = [&](const at::Tensor& g) {
    return g.defined() ? g.to(plan.compute).div(plan.temperature) : at::Tensor();
  };
  const at::Tensor lp_up = over_t(g_lp), ent_up = over_t(g_ent);
  // The one-hot term, where this rank holds the target among its real rows.
  const at::Tensor lp_up_held =
      g_lp.defined() ? lp_up.masked_fill(lt.held.logical_not(), 0) : at::Tensor();
  ChunkBuffers buf(hidden, plan);

  for (int64_t i0 = 0; i0 < n; i0 += plan.chunk) {
    const int64_t c = std::min(plan.chunk, n - i0);
    auto col = [&](const at::Tensor& t) { return t.narrow(0, i0, c).unsqueeze(-1); };
    const at::Tensor h = hidden.narrow(0, i0, c);
    at::Tensor s = buf.a.narrow(0, 0, c);
    const at::Tensor raw = buf.raw.defined() ? buf.raw.narrow(0, 0, c) : at::Tensor();
    chunk_logits(h, w_real, plan.temperature, raw, s);
    s.sub_(col(st.max));
    at::Tensor p = buf.b.narrow(0, 0, c);
    at::sub_out(p, s, col(st.log_z)).exp_();

    // d/dx of g_lp·log p(t) + g_H·H = g_H·p·(E[s] − s) − g_lp·p + g_lp·onehot(t),
    // times 1/T (in lp_up and ent_up).
    at::Tensor grad;
    if (g_ent.defined()) {
      grad = s.neg_().add_(col(st.mean_shifted)).mul_(p).mul_(col(ent_up));
      if (g_lp.defined()) grad.addcmul_(p, col(lp_up), -1);
    } else {
      grad = p.mul_(col(lp_up)).neg_();
    }
    if (g_lp.defined()) grad.scatter_add_(-1, col(lt.index), col(lp_up_held));
    const at::Tensor grad_logits = raw.defined() ? raw.copy_(grad) : grad;

    if (need_hidden) {
      at::Tensor grad_h = out.hidden.narrow(0, i0, c);
      at::mm_out(grad_h, grad_logits, w_real);
    }
    if (need_weight) grad_w_real.addmm_(grad_logits.t(), h);
  }
  return out;
}

struct FusedLmHead : torch::autograd::Function<FusedLmHead> {
  // Outputs: log_probs, then entropy (with_entropy only).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const at::Tensor& targets, const Group& tp,
                               const Plan& plan) {
    Stats st = forward_chunks(hidden, weight, targets, tp, plan);
    ctx->saved_data["rows"] = plan.rows;
    ctx->saved_data["real_rows"] = plan.real_rows;
    ctx->saved_data["start"] = plan.start;
    ctx->saved_data["chunk"] = plan.chunk;
    ctx->saved_data["temperature"] = plan.temperature;
    ctx->saved_data["with_entropy"] = plan.with_entropy;
    ctx->saved_data["compute"] = static_cast<int64_t>(plan.compute);
    ctx->save_for_backward({hidden, weight, targets, st.max, st.log_z, st.mean_shifted});
    ctx->set_materialize_grads(false);
    if (plan.with_entropy) return {st.log_probs, st.entropy};
    return {st.log_probs};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Plan plan;
    plan.rows = ctx->saved_data["rows"].toInt();
    plan.real_rows = ctx->saved_data["real_rows"].toInt();
    plan.start = ctx->saved_data["start"].toInt();
    plan.chunk = ctx->saved_data["chunk"].toInt();
    plan.temperature = ctx->saved_data["temperature"].toDouble();
    plan.with_entropy = ctx->saved_data["with_entropy"].toBool();
    plan.compute = static_cast<at::ScalarType>(ctx->saved_data["compute"].toInt());
    const variable_list saved = ctx->get_saved_variables();
    Stats st;
    st.max = saved[3];
    st.log_z = saved[4];
    st.mean_shifted = saved[5];
    const at::Tensor g_lp = grads[0];
    const at::Tensor g_ent = plan.with_entropy ? grads[1] : at::Tensor();
    const bool need_hidden = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1);
    if ((!g_lp.defined() && !g_ent.defined()) || (!need_hidden && !need_weight))
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    Grads g = backward_chunks(saved[0], saved[1], saved[2], st, g_lp, g_ent, need_hidden,
                              need_weight, plan);
    return {g.hidden, g.weight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Plan check_and_plan(const at::Tensor& hidden, const at::Tensor& weight, int64_t real_rows,
                    const at::Tensor& targets, const Group& tp, const FusedLmHeadOptions& o) {
  ENGINE_CHECK(tp.pg && tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, kFn, ": invalid group");
  if (!hidden.defined() || !weight.defined() || !targets.defined())
    throw EngineError(detail::cat(kFn, ": hidden, weight_shard and targets must be defined"));
  if (hidden.dim() != 2)
    throw EngineError(detail::cat(kFn, ": hidden must be [N, H], got shape ", hidden.sizes()));
  if (weight.dim() != 2 || weight.size(1) != hidden.size(1) || weight.size(0) == 0)
    throw EngineError(
        detail::cat(kFn, ": weight_shard must be [rows, H] with rows >= 1 and H = ", hidden.size(1),
                    " (hidden ", hidden.sizes(), "), got shape ", weight.sizes()));
  if (!at::isFloatingType(hidden.scalar_type()) || weight.scalar_type() != hidden.scalar_type())
    throw EngineError(detail::cat(kFn,
                                  ": hidden and weight_shard must share a floating dtype, got ",
                                  hidden.scalar_type(), " and ", weight.scalar_type()));
  if (weight.device() != hidden.device() || targets.device() != hidden.device())
    throw EngineError(
        detail::cat(kFn, ": hidden, weight_shard and targets must be on one device, got ",
                    hidden.device(), ", ", weight.device(), " and ", targets.device()));
  if (targets.scalar_type() != at::kLong || targets.dim() != 1 || targets.size(0) != hidden.size(0))
    throw EngineError(detail::cat(kFn, ": targets must be int64 of shape [", hidden.size(0),
                                  "] (hidden ", hidden.sizes(), "), got ", targets.scalar_type(),
                                  " of shape ", targets.sizes()));
  const int64_t rows = weight.size(0);
  if (real_rows < 0 || real_rows > rows)
    throw EngineError(detail::cat(kFn, ": real_rows ", real_rows,
                                  " is outside [0, rows] for weight_shard of shape ",
                                  weight.sizes()));
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw EngineError(
        detail::cat(kFn, ": temperature must be finite and > 0, got ", o.temperature));
  if (o.chunk_tokens < 0 || (o.chunk_tokens == 0 && o.chunk_bytes <= 0))
    throw EngineError(detail::cat(kFn, ": chunk_tokens must be >= 0 (got ", o.chunk_tokens,
                                  ") and, when 0, chunk_bytes > 0 (got ", o.chunk_bytes, ")"));
  if (targets.numel() > 0) {
    const int64_t vocab = rows * tp.size;
    const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
    if (lo < 0 || hi >= vocab)
      throw EngineError(detail::cat(kFn, ": target id ", lo < 0 ? lo : hi,
                                    " is outside the vocabulary [0, ", vocab, ")"));
  }

  Plan plan;
  plan.rows = rows;
  plan.real_rows = real_rows;
  plan.start = tp.rank * rows;
  plan.temperature = o.temperature;
  plan.with_entropy = o.with_entropy;
  plan.compute = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (o.chunk_tokens > 0) {
    plan.chunk = o.chunk_tokens;
  } else {
    // Two compute-type buffers, and one in the inputs' dtype if that differs.
    // From rows, not real_rows: every rank must run the same chunks.
    int64_t per_token = 2 * rows * static_cast<int64_t>(c10::elementSize(plan.compute));
    if (hidden.scalar_type() != plan.compute)
      per_token += rows * static_cast<int64_t>(hidden.element_size());
    plan.chunk = std::max<int64_t>(1, o.chunk_bytes / std::max<int64_t>(1, per_token));
  }
  plan.chunk = std::max<int64_t>(1, std::min(plan.chunk, hidden.size(0)));
  return plan;
}

}  // namespace

LogProbsEntropy fused_lm_head_log_probs_entropy(const at::Tensor& hidden,
                                                const at::Tensor& weight_shard, int64_t real_rows,
                                                const at::Tensor& targets, const Group& tp,
                                                const FusedLmHeadOptions& options) {
  const Plan plan = check_and_plan(hidden, weight_shard, real_rows, targets, tp, options);
  const bool differentiable =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight_shard.requires_grad());
  if (!differentiable) {
    at::NoGradGuard no_grad;
    Stats st = forward_chunks(hidden, weight_shard, targets, tp, plan);
    return {st.log_probs, st.entropy};
  }
  variable_list out = FusedLmHead::apply(hidden, weight_shard, targets, tp, plan);
  return {out[0], plan.with_entropy ? out[1] : at::Tensor()};
}

}  // namespace baton::engine
