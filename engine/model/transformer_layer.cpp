#include "engine/model/transformer_layer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/errors.h"
#include "engine/kernels/fused_ops.h"
#include "engine/kernels/packed_linear.h"
#include "engine/kernels/paged_attention.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/parallel/tensor_parallel.h"

namespace baton::engine {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (fusable(x) && fusable(weight)) return fused_rms_norm(x, weight, eps);
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor causal_attention_bias(const at::Tensor& attention_mask, at::ScalarType dtype) {
  ENGINE_CHECK(attention_mask.dim() == 2, "attention_mask must be [B, S], got ",
               attention_mask.sizes());
  int64_t s = attention_mask.size(1);
  auto dev = attention_mask.device();
  auto causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(dev)).tril();
  auto keys = attention_mask.to(at::kBool).unsqueeze(1).unsqueeze(1);  // [B, 1, 1, S]
  auto allowed = causal.unsqueeze(0).unsqueeze(0).logical_and(keys);   // [B, 1, S, S]
  auto bias = at::zeros(allowed.sizes(), at::TensorOptions().dtype(dtype).device(dev));
  return bias.masked_fill(allowed.logical_not(), masked_score(dtype));
}

at::Tensor packed_attention_bias(const std::vector<int64_t>& lengths, at::ScalarType dtype,
                                 at::Device device) {
  const auto k = static_cast<int64_t>(lengths.size());
  const at::Tensor counts = at::tensor(lengths, at::kLong);
  const at::Tensor segment =
      at::repeat_interleave(at::arange(k, at::kLong), counts).to(device);  // [S]
  const int64_t s = segment.size(0);
  auto causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(device)).tril();
  auto allowed = causal.logical_and(segment.unsqueeze(1).eq(segment.unsqueeze(0)));
  auto bias = at::zeros({s, s}, at::TensorOptions().dtype(dtype).device(device));
  return bias.masked_fill(allowed.logical_not(), masked_score(dtype)).view({1, 1, s, s});
}

double masked_score(at::ScalarType dtype) {
  return dtype == at::kDouble     ? std::numeric_limits<double>::lowest()
         : dtype == at::kBFloat16 ? -3.38e38
         : dtype == at::kHalf     ? -65504.0
                                  : std::numeric_limits<float>::lowest();
}

namespace {

at::Tensor rotate_half(const at::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor apply_rotary(const at::Tensor& x, const Rotary& r) {
  auto cos = r.cos.unsqueeze(1);  // [B, 1, S, d] against x [B, heads, S, d]
  auto sin = r.sin.unsqueeze(1);
  return x * cos + rotate_half(x) * sin;
}

void require_divisible(int64_t n, int64_t tp, const char* what, const ModelConfig& c) {
  if (n % tp != 0)
    throw EngineError(detail::cat(c.architecture, ": ", what, " ", n,
                                  " is not divisible by the tensor-parallel size ", tp));
}

}  // namespace

std::vector<std::string> LoraOptions::modules() const {
  std::vector<std::string> out;
  for (const std::string& t : targets) {
    if (t != "all-linear" &&
        std::find(kLoraModules.begin(), kLoraModules.end(), t) == kLoraModules.end()) {
      std::string known;
      for (const auto& m : kLoraModules) known += m + ", ";
      throw EngineError("LoRA target \"" + t +
                        "\" is not a module the engine adapts; known: " + known + "all-linear");
    }
  }
  for (const std::string& m : kLoraModules) {
    const bool all = std::find(targets.begin(), targets.end(), "all-linear") != targets.end();
    if (all || std::find(targets.begin(), targets.end(), m) != targets.end()) out.push_back(m);
  }
  return out;
}

TransformerLayer::TransformerLayer(const ModelConfig& config, const Group& tp, const Group& ep,
                                   int64_t layer_id, bool sequence_parallel,
                                   const LoraOptions& lora)
    : config_(config),
      layer_id_(layer_id),
      tp_(tp),
      ep_(ep),
      sequence_parallel_(sequence_parallel) {
  require_divisible(config.num_kv_heads, tp.size, "num_key_value_heads", config);
  require_divisible(config.intermediate_size, tp.size, "intermediate_size", config);
  local_groups_ = config.num_kv_heads / tp.size;
  int64_t h = config.hidden_size;
  input_norm_ = register_parameter("input_norm", at::ones({h}));
  post_norm_ = register_parameter("post_norm", at::ones({h}));
  if (config.qk_norm) {
    q_norm_ = register_parameter("q_norm", at::ones({config.head_dim}));
    k_norm_ = register_parameter("k_norm", at::ones({config.head_dim}));
  }

  ColumnParallelLinearOptions qkv;
  qkv.in_features = h;
  qkv.out_features = config.q_size() + 2 * config.kv_size();
  qkv.bias = config.qkv_bias;
  qkv.sequence_parallel = sequence_parallel;
  qkv_ = register_module("linear_qkv", ColumnParallelLinear(qkv, tp));

  RowParallelLinearOptions proj;
  proj.in_features = config.q_size();
  proj.out_features = h;
  proj.sequence_parallel = sequence_parallel;
  proj_ = register_module("linear_proj", RowParallelLinear(proj, tp));

  if (config.sparse_layer(layer_id)) {
    const MoeConfig& moe = config.moe;
    require_divisible(moe.intermediate_size, tp.size, "moe_intermediate_size", config);
    require_divisible(moe.num_experts, ep.size, "num_experts (over expert parallel ranks)", config);
    const int64_t f = moe.intermediate_size / tp.size, local = moe.num_experts / ep.size;
    // Loaded from a checkpoint (load_state_dict); zeros until then.
    router_ = register_parameter("router", at::zeros({moe.num_experts, h}));
    experts_fc1_ = register_parameter("experts_fc1", at::zeros({local, 2 * f, h}));
    experts_fc2_ = register_parameter("experts_fc2", at::zeros({local, h, f}));
    init_lora(lora);
    return;
  }

  ColumnParallelLinearOptions fc1;
  fc1.in_features = h;
  fc1.out_features = 2 * config.intermediate_size;
  fc1.sequence_parallel = sequence_parallel;
  fc1_ = register_module("linear_fc1", ColumnParallelLinear(fc1, tp));

  RowParallelLinearOptions fc2;
  fc2.in_features = config.intermediate_size;
  fc2.out_features = h;
  fc2.sequence_parallel = sequence_parallel;
  fc2_ = register_module("linear_fc2", RowParallelLinear(fc2, tp));
  init_lora(lora);
}

void TransformerLayer::init_lora(const LoraOptions& lora) {
  if (!lora.enabled()) return;
  if (sequence_parallel_ && tp_.size > 1)
    throw EngineError(config_.architecture +
                      ": LoRA adapters with sequence parallelism are not supported; turn "
                      "sequence_parallel off");
  lora_scale_ = lora.scale();
  const int64_t h = config_.hidden_size, t = tp_.size, f = config_.intermediate_size;
  const std::vector<std::string> modules = lora.modules();
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string& m = modules[i];
    const bool mlp = m == "gate_proj" || m == "up_proj" || m == "down_proj";
    if (mlp && sparse()) continue;  // experts are not adapted
    // The full layer's [out, in].
    const int64_t out = m == "q_proj"                       ? config_.q_size()
                        : m == "k_proj" || m == "v_proj"    ? config_.kv_size()
                        : m == "o_proj" || m == "down_proj" ? h
                                                            : f;
    const int64_t in = m == "o_proj" ? config_.q_size() : m == "down_proj" ? f : h;
    // PEFT's Kaiming-uniform A (a = √5: bound 1/√in) from one seed per
    // layer and module, so every rank draws the same full A.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(lora.seed + 1000 * layer_id_ + i);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    at::Tensor a = at::empty({lora.rank, in}).uniform_(-bound, bound, gen);
    at::Tensor b;
    if (lora_row_parallel(m)) {
      a = a.narrow(1, tp_.rank * in / t, in / t).contiguous();
      b = at::zeros({out, lora.rank});
    } else {
      b = at::zeros({out / t, lora.rank});
    }
    lora_[m] = {register_parameter("lora_" + m + "_A", a),
                register_parameter("lora_" + m + "_B", b)};
  }
}

at::Tensor TransformerLayer::attention(const at::Tensor& x, const Rotary& rotary,
                                       const AttentionMask& mask) {
  int64_t d = config_.head_dim;
  int64_t r = config_.num_heads / config_.num_kv_heads;
  int64_t g = local_groups_;
  auto qkv = this->qkv(x);  // [B, S, g * (r + 2) * d], full sequence
  int64_t b = qkv.size(0), s = qkv.size(1);
  if (!config_.qk_norm && fusable(qkv) && fusable(rotary.cos) && d % 2 == 0) {
    QkvHeads heads = fused_qkv_rotary(qkv, rotary.cos, rotary.sin, g, r, d);
    return project(attend(heads.q, heads.k, heads.v, mask));
  }
  auto grouped = qkv.view({b, s, g, r + 2, d});
  auto q = grouped.narrow(3, 0, r).reshape({b, s, g * r, d}).transpose(1, 2);
  auto k = grouped.select(3, r).transpose(1, 2);      // [B, g, S, d]
  auto v = grouped.select(3, r + 1).transpose(1, 2);  // [B, g, S, d]
  q = apply_rotary(norm_q(q), rotary);
  k = apply_rotary(norm_k(k), rotary);
  return project(attend(q, k, v, mask));
}

at::Tensor TransformerLayer::attend(const at::Tensor& q, at::Tensor k, at::Tensor v,
                                    const AttentionMask& mask) {
  int64_t d = config_.head_dim;
  int64_t r = config_.num_heads / config_.num_kv_heads;
  if (r > 1) {
    // Each kv head serves r consecutive query heads (repeat_interleave's
    // result, without its index computation).
    auto repeat = [r](const at::Tensor& x) {
      return x.unsqueeze(2)
          .expand({x.size(0), x.size(1), r, x.size(2), x.size(3)})
          .reshape({x.size(0), x.size(1) * r, x.size(2), x.size(3)});
    };
    k = repeat(k);
    v = repeat(v);
  }
  int64_t b = q.size(0), s = q.size(2);
  at::Tensor ctx;
  if (mask.packed()) {
    // Causal attention of each packed sequence over itself alone.
    std::vector<at::Tensor> parts;
    parts.reserve(mask.lengths.size());
    int64_t start = 0;
    for (int64_t len : mask.lengths) {
      parts.push_back(at::scaled_dot_product_attention(
          q.narrow(2, start, len), k.narrow(2, start, len), v.narrow(2, start, len),
          /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true));
      start += len;
    }
    ctx = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
  } else {
    ctx = at::scaled_dot_product_attention(q, k, v, mask.bias);
  }
  return ctx.transpose(1, 2).reshape({b, s, q.size(1) * d});
}

at::Tensor TransformerLayer::cache_step_queries(const at::Tensor& x, const Rotary& rotary,
                                                const at::Tensor& write_slots, at::Tensor& k_cache,
                                                at::Tensor& v_cache) {
  auto normed = rms_norm(x, input_norm_, config_.rms_norm_eps);
  int64_t d = config_.head_dim;
  int64_t r = config_.num_heads / config_.num_kv_heads;
  int64_t g = local_groups_;
  auto qkv = this->qkv(normed);  // [B, Q, g * (r + 2) * d]
  int64_t b = qkv.size(0), s = qkv.size(1);
  auto grouped = qkv.view({b, s, g, r + 2, d});
  auto q = apply_rotary(norm_q(grouped.narrow(3, 0, r).reshape({b, s, g * r, d}).transpose(1, 2)),
                        rotary);
  auto k_new = apply_rotary(norm_k(grouped.select(3, r).transpose(1, 2)), rotary);  // [B, g, Q, d]
  auto v_new = grouped.select(3, r + 1);                                            // [B, Q, g, d]
  k_cache.index_copy_(0, write_slots, k_new.transpose(1, 2).reshape({b * s, g, d}));
  v_cache.index_copy_(0, write_slots, v_new.reshape({b * s, g, d}));
  return q;
}

at::Tensor TransformerLayer::forward_cached(const at::Tensor& x, const Rotary& rotary,
                                            const CacheStep& step, at::Tensor& k_cache,
                                            at::Tensor& v_cache) {
  auto q = cache_step_queries(x, rotary, step.write_slots, k_cache, v_cache);
  int64_t b = x.size(0), g = local_groups_, d = config_.head_dim;
  int64_t l = step.read_slots.size(1);
  auto slots = step.read_slots.reshape({-1});
  auto k = k_cache.index_select(0, slots).view({b, l, g, d}).transpose(1, 2);
  auto v = v_cache.index_select(0, slots).view({b, l, g, d}).transpose(1, 2);
  auto h = x + project(attend(q, k, v, AttentionMask{step.bias, {}}));
  return h + mlp(rms_norm(h, post_norm_, config_.rms_norm_eps));
}

at::Tensor TransformerLayer::forward_decode(const at::Tensor& x, const Rotary& rotary,
                                            const DecodeAttention& step, at::Tensor& k_cache,
                                            at::Tensor& v_cache) {
  auto q = cache_step_queries(x, rotary, step.write_slots, k_cache, v_cache);  // [B, heads, 1, d]
  const int64_t b = x.size(0), d = config_.head_dim;
  auto ctx = paged_decode_attention(q.squeeze(2), k_cache, v_cache, step.block_tables,
                                    step.context_lens, step.block_size,
                                    1.0 / std::sqrt(static_cast<double>(d)));  // [B, heads, d]
  auto h = x + project(ctx.reshape({b, 1, q.size(1) * d}));
  return h + mlp(rms_norm(h, post_norm_, config_.rms_norm_eps));
}

namespace {

// x · Wᵀ + bias of a column-parallel layer's local shard (no TP
// communication: the input is replicated): into the preallocated `out` by
// mm, or, with packed weights, a new tensor from oneDNN.
at::Tensor column_parallel(at::Tensor out, const at::Tensor& x, const ColumnParallelLinear& layer,
                           const at::Tensor& packed) {
  if (packed.defined()) return packed_linear(x, packed, layer->bias);
  if (layer->bias.defined())
    at::addmm_out(out, layer->bias, x, layer->weight.t());
  else
    at::mm_out(out, x, layer->weight.t());
  return out;
}

// h += reduce_tp(x · Wᵀ) + bias of a row-parallel layer; by mm with one TP
// rank the product accumulates straight into h (BLAS beta = 1).
void add_row_parallel(at::Tensor& h, const at::Tensor& x, const RowParallelLinear& layer,
                      const at::Tensor& packed) {
  const bool one = layer->tp().size == 1;
  if (packed.defined()) {
    at::Tensor y = packed_linear(x, packed, at::Tensor());
    h.add_(one ? y : reduce_from_tp_region(y, layer->tp()));
  } else if (one) {
    h.addmm_(x, layer->weight.t());
  } else {
    h.add_(reduce_from_tp_region(at::mm(x, layer->weight.t()), layer->tp()));
  }
  if (layer->bias.defined()) h.add_(layer->bias);
}

}  // namespace

void TransformerLayer::forward_paged(at::Tensor& h, const cpu::PagedAttention& attention,
                                     PagedWorkspace& ws) {
  const int64_t t = h.size(0), hidden = h.size(1);
  auto normed = ws.normed.narrow(0, 0, t);
  auto ctx = ws.ctx.narrow(0, 0, t);
  auto act = ws.act.narrow(0, 0, t);
  // The kernels show in LibTorch's profiler traces under these names.
  {
    RECORD_FUNCTION("baton::rms_norm", std::vector<c10::IValue>());
    cpu::rms_norm(h.data_ptr<float>(), input_norm_.data_ptr<float>(), normed.data_ptr<float>(), t,
                  hidden, config_.rms_norm_eps);
  }
  at::Tensor qkv = column_parallel(ws.qkv.narrow(0, 0, t), normed, qkv_, packed_.qkv);
  if (config_.qk_norm) {
    // Each token's query heads and key heads normed in place, before the
    // kernel rotates them.
    const int64_t g = local_groups_, r = config_.num_heads / config_.num_kv_heads;
    auto heads = qkv.view({t, g, r + 2, config_.head_dim});
    auto q = heads.narrow(2, 0, r);
    auto k = heads.narrow(2, r, 1);
    q.copy_(norm_q(q));
    k.copy_(norm_k(k));
  }
  {
    RECORD_FUNCTION("baton::paged_attention", std::vector<c10::IValue>());
    attention.rotate_and_store(qkv.data_ptr<float>(), t);
    attention.attend(qkv.data_ptr<float>(), t, ctx.data_ptr<float>());
  }
  add_row_parallel(h, ctx, proj_, packed_.proj);
  {
    RECORD_FUNCTION("baton::rms_norm", std::vector<c10::IValue>());
    cpu::rms_norm(h.data_ptr<float>(), post_norm_.data_ptr<float>(), normed.data_ptr<float>(), t,
                  hidden, config_.rms_norm_eps);
  }
  if (sparse()) {
    h.add_(moe(normed));
    return;
  }
  at::Tensor gate_up = column_parallel(ws.gate_up.narrow(0, 0, t), normed, fc1_, packed_.fc1);
  {
    RECORD_FUNCTION("baton::silu_mul", std::vector<c10::IValue>());
    cpu::silu_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), t, act.size(1));
  }
  add_row_parallel(h, act, fc2_, packed_.fc2);
}

void TransformerLayer::pack_paged_weights() {
  packed_ = {pack_linear_weight(qkv_->weight), pack_linear_weight(proj_->weight),
             sparse() ? at::Tensor() : pack_linear_weight(fc1_->weight),
             sparse() ? at::Tensor() : pack_linear_weight(fc2_->weight)};
}

void TransformerLayer::drop_paged_weights() { packed_ = {}; }

void TransformerLayer::reserve(PagedWorkspace& ws, int64_t tokens) const {
  const int64_t g = local_groups_, r = config_.num_heads / config_.num_kv_heads;
  const int64_t d = config_.head_dim;
  auto fit = [tokens](at::Tensor& buf, int64_t width) {
    if (buf.defined() && buf.size(0) >= tokens && buf.size(1) == width) return;
    buf = at::empty({std::max<int64_t>(tokens, buf.defined() ? 2 * buf.size(0) : 0), width},
                    at::kFloat);
  };
  fit(ws.normed, config_.hidden_size);
  fit(ws.qkv, g * (r + 2) * d);
  fit(ws.ctx, g * r * d);
  if (sparse()) return;  // its experts allocate their own (moe)
  const int64_t fc1 = fc1_->weight.size(0);
  fit(ws.gate_up, fc1);
  fit(ws.act, fc1 / 2);
}

at::Tensor TransformerLayer::norm_q(const at::Tensor& q) const {
  return q_norm_.defined() ? rms_norm(q, q_norm_, config_.rms_norm_eps) : q;
}

at::Tensor TransformerLayer::norm_k(const at::Tensor& k) const {
  return k_norm_.defined() ? rms_norm(k, k_norm_, config_.rms_norm_eps) : k;
}

at::Tensor TransformerLayer::moe(const at::Tensor& x) {
  const MoeConfig& m = config_.moe;
  const int64_t h = x.size(-1), k = m.top_k;
  const bool split = sequence_parallel_ && tp_.size > 1;
  // Routing, as HF: softmax in fp32, the top k, renormalised if asked, in
  // the activations' dtype. On this rank's tokens (all of them without SP).
  const at::Tensor logits = at::linear(x.reshape({-1, h}), router_);  // [n, E]
  router_logits_ = at::GradMode::is_enabled() ? logits : at::Tensor();
  auto [top, idx] = at::topk(at::softmax(logits, -1, at::kFloat), k, -1);
  if (m.norm_topk_prob) top = top / top.sum(-1, /*keepdim=*/true);
  top = top.to(logits.scalar_type());
  // Every TP rank computes its share of each expert for every token: the
  // input and the weights enter the TP region (their gradients are summed
  // over it), the partial sums leave it reduced.
  at::Tensor input, weights, experts;
  if (split) {
    const at::IntArrayRef local = x.sizes();  // [B, S/tp, H]
    input = gather_from_sequence_region(x, tp_);
    weights = gather_from_sequence_region(top.view({local[0], local[1], k}), tp_);
    experts = collective::all_gather(idx.view({local[0], local[1], k}), 1, tp_);
  } else {
    input = copy_to_tp_region(x, tp_);
    weights = copy_to_tp_region(top, tp_);
    experts = idx;
  }
  const at::Tensor xf = input.reshape({-1, h});
  // The (token, slot) assignments sorted by expert, stably: each expert's
  // rows are one run, its tokens in order, and so are each EP rank's.
  const at::Tensor order = at::argsort(experts.reshape({-1}), /*stable=*/true);
  const at::Tensor token_of = at::floor_divide(order, k);
  const at::Tensor per_expert_dev = at::bincount(experts.reshape({-1}), {}, m.num_experts);
  const at::Tensor per_expert_host = per_expert_dev.cpu();  // the one host sync
  const std::vector<int64_t> per_expert(per_expert_host.data_ptr<int64_t>(),
                                        per_expert_host.data_ptr<int64_t>() + m.num_experts);
  at::Tensor rows = xf.index_select(0, token_of);  // [n·k, H] in expert order
  const int64_t local = experts_fc1_.size(0);
  // Rows per local expert, and (under EP) how to undo the exchange.
  std::vector<int64_t> counts(per_expert.begin() + ep_.rank * local,
                              per_expert.begin() + (ep_.rank + 1) * local);
  std::vector<int64_t> send, recv;
  at::Tensor regroup;  // received rows → expert order
  if (ep_.size > 1) {
    for (int64_t j = 0; j < ep_.size; ++j)
      send.push_back(std::accumulate(per_expert.begin() + j * local,
                                     per_expert.begin() + (j + 1) * local, int64_t{0}));
    // [source rank][local expert] counts of the rows this rank receives.
    const std::vector<int64_t> from = exchange_counts(per_expert, ep_);
    std::vector<int64_t> expert_of;
    counts.assign(local, 0);
    recv.assign(ep_.size, 0);
    for (int64_t j = 0; j < ep_.size; ++j)
      for (int64_t e = 0; e < local; ++e) {
        const int64_t c = from[j * local + e];
        recv[j] += c;
        counts[e] += c;
        expert_of.insert(expert_of.end(), c, e);
      }
    rows = all_to_all(rows, send, recv, ep_);
    regroup = at::argsort(at::tensor(expert_of, at::kLong).to(rows.device()), /*stable=*/true);
    rows = rows.index_select(0, regroup);
  }
  // Each local expert on its run of rows, in expert id order.
  const int64_t f = experts_fc2_.size(2);
  std::vector<at::Tensor> outs;
  int64_t begin = 0;
  for (int64_t e = 0; e < local; ++e) {
    if (counts[e] == 0) continue;
    const at::Tensor run = rows.narrow(0, begin, counts[e]);
    begin += counts[e];
    const at::Tensor gate_up = at::linear(run, experts_fc1_[e]);
    const at::Tensor act = at::silu(gate_up.narrow(1, 0, f)) * gate_up.narrow(1, f, f);
    outs.push_back(at::linear(act, experts_fc2_[e]));
  }
  // No rows at all: an empty result that still depends on the rows and the
  // expert weights, so this rank's backward runs the same all-to-alls as its
  // EP peers' and every expert weight gets a (zero) gradient.
  at::Tensor y =
      outs.empty() ? rows.new_zeros({0, h}) +
                         0 * (experts_fc1_.sum() + experts_fc2_.sum() + rows.sum()).to(rows.dtype())
                   : at::cat(outs, 0);
  if (ep_.size > 1) {
    y = at::empty_like(y).index_copy(0, regroup, y);  // back to the received order
    y = all_to_all(y, recv, send, ep_);
  }
  // Weighted by the router and summed per token in expert order, as HF sums them.
  const at::Tensor w = weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  at::Tensor out = at::zeros_like(xf).index_add(0, token_of, (y * w).to(xf.scalar_type()));
  out = out.view(input.sizes());
  return split ? reduce_scatter_to_sequence_region(out, tp_) : reduce_from_tp_region(out, tp_);
}

at::Tensor TransformerLayer::mlp(const at::Tensor& x) {
  if (sparse()) return moe(x);
  auto gate_up = fc1_->forward(x);
  if (const at::Tensor d = lora_gate_up(x); d.defined()) gate_up = gate_up + d;
  at::Tensor act;
  if (fusable(gate_up)) {
    act = fused_silu_mul(gate_up);
  } else {
    auto parts = gate_up.chunk(2, -1);
    act = at::silu(parts[0]) * parts[1];
  }
  at::Tensor out = fc2_->forward(act);
  if (const at::Tensor d = lora_row("down_proj", act); d.defined()) out = out + d;
  return out;
}

at::Tensor TransformerLayer::qkv(const at::Tensor& x) {
  at::Tensor out = qkv_->forward(x);
  if (const at::Tensor d = lora_qkv(x); d.defined()) out = out + d;
  return out;
}

at::Tensor TransformerLayer::project(const at::Tensor& ctx) {
  at::Tensor out = proj_->forward(ctx);
  if (const at::Tensor d = lora_row("o_proj", ctx); d.defined()) out = out + d;
  return out;
}

namespace {

// (x Aᵀ) Bᵀ of a column-parallel adapter: A is replicated, so x Aᵀ enters
// the TP region (its gradient is summed over the ranks' B shards).
at::Tensor column_lora(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b,
                       const Group& tp) {
  return at::linear(copy_to_tp_region(at::linear(x, a), tp), b);
}

}  // namespace

at::Tensor TransformerLayer::lora_qkv(const at::Tensor& x) const {
  if (!lora_on_ || lora_.empty()) return {};
  const auto q = lora_.find("q_proj"), k = lora_.find("k_proj"), v = lora_.find("v_proj");
  if (q == lora_.end() && k == lora_.end() && v == lora_.end()) return {};
  const int64_t g = local_groups_, r = config_.num_heads / config_.num_kv_heads;
  const int64_t d = config_.head_dim;
  std::vector<int64_t> lead(x.sizes().begin(), x.sizes().end() - 1);
  // Each part in the fused layout's groups: r query heads, a key head, a value head.
  auto part = [&](auto it, int64_t width) {
    std::vector<int64_t> shape = lead;
    shape.push_back(g);
    shape.push_back(width);
    if (it == lora_.end()) return at::zeros(shape, x.options());
    return column_lora(x, it->second.a, it->second.b, tp_).view(shape);
  };
  at::Tensor fused = at::cat({part(q, r * d), part(k, d), part(v, d)}, -1);
  std::vector<int64_t> shape = lead;
  shape.push_back(g * (r + 2) * d);
  return fused.reshape(shape) * lora_scale_;
}

at::Tensor TransformerLayer::lora_gate_up(const at::Tensor& x) const {
  if (!lora_on_ || lora_.empty()) return {};
  const auto gate = lora_.find("gate_proj"), up = lora_.find("up_proj");
  if (gate == lora_.end() && up == lora_.end()) return {};
  const int64_t f = config_.intermediate_size / tp_.size;
  auto part = [&](auto it) {
    if (it == lora_.end()) {
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
      shape.push_back(f);
      return at::zeros(shape, x.options());
    }
    return column_lora(x, it->second.a, it->second.b, tp_);
  };
  return at::cat({part(gate), part(up)}, -1) * lora_scale_;
}

at::Tensor TransformerLayer::lora_row(const std::string& module, const at::Tensor& x) const {
  if (!lora_on_) return {};
  const auto it = lora_.find(module);
  if (it == lora_.end()) return {};
  // This rank's input columns: x Aᵀ is a partial sum, reduced before B.
  return at::linear(reduce_from_tp_region(at::linear(x, it->second.a), tp_), it->second.b) *
         lora_scale_;
}

std::vector<std::pair<std::string, at::Tensor>> TransformerLayer::lora_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string p = "decoder.layers." + std::to_string(layer_id_) + ".lora.";
  for (const std::string& m : kLoraModules) {
    const auto it = lora_.find(m);
    if (it == lora_.end()) continue;
    out.emplace_back(p + m + ".A", it->second.a);
    out.emplace_back(p + m + ".B", it->second.b);
  }
  return out;
}

at::Tensor TransformerLayer::lora_delta(const std::string& name) const {
  if (lora_.empty()) return {};
  const std::string p = "decoder.layers." + std::to_string(layer_id_) + ".";
  at::NoGradGuard no_grad;
  auto product = [&](const std::string& m) -> at::Tensor {
    const auto it = lora_.find(m);
    return it == lora_.end() ? at::Tensor() : at::mm(it->second.b, it->second.a);
  };
  if (name == p + "self_attention.linear_qkv.weight") {
    const at::Tensor q = product("q_proj"), k = product("k_proj"), v = product("v_proj");
    if (!q.defined() && !k.defined() && !v.defined()) return {};
    const int64_t g = local_groups_, r = config_.num_heads / config_.num_kv_heads;
    const int64_t d = config_.head_dim, h = config_.hidden_size;
    auto part = [&](const at::Tensor& w, int64_t rows) {
      return w.defined() ? w.view({g, rows, h}) : at::zeros({g, rows, h}, qkv_->weight.options());
    };
    return at::cat({part(q, r * d), part(k, d), part(v, d)}, 1).view({-1, h}) * lora_scale_;
  }
  if (name == p + "self_attention.linear_proj.weight") {
    const at::Tensor o = product("o_proj");
    return o.defined() ? o * lora_scale_ : o;
  }
  if (name == p + "mlp.linear_fc1.weight") {
    const at::Tensor gate = product("gate_proj"), up = product("up_proj");
    if (!gate.defined() && !up.defined()) return {};
    const at::Tensor& like = gate.defined() ? gate : up;
    return at::cat({gate.defined() ? gate : at::zeros_like(like),
                    up.defined() ? up : at::zeros_like(like)}) *
           lora_scale_;
  }
  if (name == p + "mlp.linear_fc2.weight") {
    const at::Tensor down = product("down_proj");
    return down.defined() ? down * lora_scale_ : down;
  }
  return {};
}

at::Tensor TransformerLayer::forward(const at::Tensor& x, const Rotary& rotary,
                                     const AttentionMask& mask) {
  auto h = x + attention(rms_norm(x, input_norm_, config_.rms_norm_eps), rotary, mask);
  return h + mlp(rms_norm(h, post_norm_, config_.rms_norm_eps));
}

std::vector<std::pair<std::string, at::Tensor>> TransformerLayer::named_params() const {
  std::string p = "decoder.layers." + std::to_string(layer_id_) + ".";
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.emplace_back(p + "self_attention.linear_qkv.layer_norm_weight", input_norm_);
  out.emplace_back(p + "self_attention.linear_qkv.weight", qkv_->weight);
  if (qkv_->bias.defined()) out.emplace_back(p + "self_attention.linear_qkv.bias", qkv_->bias);
  if (q_norm_.defined()) {
    out.emplace_back(p + "self_attention.q_layernorm.weight", q_norm_);
    out.emplace_back(p + "self_attention.k_layernorm.weight", k_norm_);
  }
  out.emplace_back(p + "self_attention.linear_proj.weight", proj_->weight);
  out.emplace_back(p + "mlp.linear_fc1.layer_norm_weight", post_norm_);
  if (sparse()) {
    out.emplace_back(p + "mlp.router.weight", router_);
    out.emplace_back(p + "mlp.experts.linear_fc1.weight", experts_fc1_);
    out.emplace_back(p + "mlp.experts.linear_fc2.weight", experts_fc2_);
    return out;
  }
  out.emplace_back(p + "mlp.linear_fc1.weight", fc1_->weight);
  out.emplace_back(p + "mlp.linear_fc2.weight", fc2_->weight);
  return out;
}

}  // namespace baton::engine
