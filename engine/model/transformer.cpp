#include "engine/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "engine/errors.h"
#include "engine/kernels/packed_linear.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/parallel/vocab_parallel.h"

namespace baton::engine {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// One layer under full activation recomputation: forward runs without
// autograd and keeps only the layer's input; backward runs the layer again
// with autograd and differentiates it. The layer's parameters are inputs of
// the node so that their gradients flow (they accumulate into .grad()).
// Collectives inside the layer run again in backward, in the same order on
// every TP rank, because every rank recomputes the same layer.
class RecomputedLayer : public torch::autograd::Function<RecomputedLayer> {
 public:
  // Autograd functions take defined tensors only: a packed batch passes an
  // empty `bias` beside its lengths.
  static AttentionMask mask_of(const at::Tensor& bias, std::vector<int64_t> lengths) {
    if (!lengths.empty()) return AttentionMask{at::Tensor(), std::move(lengths)};
    return AttentionMask{bias, {}};
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, TransformerLayer* layer,
                            const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& bias, std::vector<int64_t> lengths,
                            at::TensorList params) {
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    ctx->saved_data["lengths"] = lengths;
    ctx->save_for_backward({x, cos, sin, bias});
    at::AutoGradMode no_grad(false);
    return layer->forward(x, Rotary{cos, sin}, mask_of(bias, std::move(lengths)));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* layer = reinterpret_cast<TransformerLayer*>(ctx->saved_data["layer"].toInt());
    auto saved = ctx->get_saved_variables();
    auto x = saved[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      at::AutoGradMode grad(true);
      out = layer->forward(x, Rotary{saved[1], saved[2]},
                           mask_of(saved[3], ctx->saved_data["lengths"].toIntVector()));
    }
    // Frozen parameters (a LoRA model's base) get no gradient.
    torch::autograd::variable_list inputs{x};
    const std::vector<at::Tensor> params = layer->parameters();
    for (const auto& p : params)
      if (p.requires_grad()) inputs.push_back(p);
    auto grads = torch::autograd::grad({out}, inputs, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    // One gradient per forward input: layer, x, cos, sin, bias, lengths, then
    // params.
    torch::autograd::variable_list result{at::Tensor(), grads[0],     at::Tensor(),
                                          at::Tensor(), at::Tensor(), at::Tensor()};
    size_t next = 1;
    for (const auto& p : params) result.push_back(p.requires_grad() ? grads[next++] : at::Tensor());
    return result;
  }
};

// Identity on the hidden states whose backward also runs the load-balancing
// loss's (already scaled) backward: the loss enters every stage's backward
// without the pipeline schedule knowing of it (as Megatron's
// MoEAuxLossAutoScaler).
class WithAuxLossGradient : public torch::autograd::Function<WithAuxLossGradient> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const at::Tensor& aux) {
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux.scalar_type());
    ctx->saved_data["aux_device"] = aux.device();
    return h.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["aux_dtype"].toInt());
    const at::Device device = ctx->saved_data["aux_device"].toDevice();
    return {grad_out[0], at::ones({}, at::TensorOptions().dtype(dtype).device(device))};
  }
};

// Packed sequences' lengths must tile the one row of a packed batch.
void check_packed_lengths(const std::vector<int64_t>& lengths, int64_t b, int64_t s) {
  int64_t total = 0;
  for (int64_t len : lengths) {
    if (len < 1)
      throw EngineError(detail::cat("Transformer::forward: a packed sequence of ", len, " tokens"));
    total += len;
  }
  if (b != 1 || total != s)
    throw EngineError(detail::cat("Transformer::forward: packed sequences (", lengths.size(),
                                  " of ", total, " tokens) must fill one row, got [", b, ", ", s,
                                  "]"));
}

}  // namespace

Transformer::Transformer(ModelConfig config, std::shared_ptr<ParallelState> state,
                         TransformerOptions options)
    : config_(std::move(config)), state_(std::move(state)), options_(options), rope_(config_) {
  if (config_.family == ModelFamily::kLlama && (config_.qkv_bias || config_.mlp_bias))
    throw EngineError(config_.architecture +
                      ": attention_bias / mlp_bias are not supported for Llama models");
  if (config_.family == ModelFamily::kQwen3 && config_.qkv_bias)
    throw EngineError(config_.architecture +
                      ": \"attention_bias\" is true; the engine supports Qwen3 without biases");
  const Group& tp = state_->tp();
  int64_t h = config_.hidden_size;
  padded_vocab_ = state_->config().padded_vocab_size(config_.vocab_size);
  vocab_shard_ = engine::vocab_shard(config_.vocab_size, padded_vocab_, tp.size, tp.rank);
  // Padding rows start as zeros (checkpoints and exports are deterministic);
  // they stay so, since their gradients are zero (vocab_padding.h).
  auto zero_padding = [&](const at::Tensor& w) {
    at::NoGradGuard no_grad;
    if (vocab_shard_.padding() > 0) w.narrow(0, vocab_shard_.real, vocab_shard_.padding()).zero_();
  };
  if (first_stage()) {
    VocabParallelEmbeddingOptions emb;
    emb.vocab_size = padded_vocab_;
    emb.hidden_size = h;
    emb.sequence_parallel = options_.sequence_parallel;
    embedding_ = register_module("embedding", VocabParallelEmbedding(emb, tp));
    zero_padding(embedding_->weight);
  }
  auto [begin, end] = stage_layer_range(state_->coords().pp, config_.num_layers, state_->config());
  for (int64_t id = begin; id < end; ++id) {
    auto layer = std::make_shared<TransformerLayer>(config_, tp, state_->ep(), id,
                                                    options_.sequence_parallel, options_.lora);
    layers_.push_back(register_module("layer" + std::to_string(id), layer));
  }
  if (last_stage()) {
    final_norm_ = register_parameter("final_norm", at::ones({h}));
    if (options_.value_model) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.value_head_seed);
      value_head_ = register_parameter("value_head", at::normal(0.0, 0.02, {1, h}, gen));
      value_bias_ = register_parameter("value_bias", at::zeros({1}));
    } else if (!(config_.tie_word_embeddings && first_stage())) {
      output_weight_ =
          register_parameter("output_layer", at::normal(0.0, 0.02, {vocab_shard_.rows, h}));
      zero_padding(output_weight_);
    }
  }
  if (options_.lora.enabled()) {
    // Only the adapters train: the base gets no gradient and no optimizer state.
    for (auto& [name, p] : named_params()) p.requires_grad_(false);
  }
}

bool Transformer::first_stage() const { return state_->is_first_stage(); }
bool Transformer::last_stage() const { return state_->is_last_stage(); }

at::Device Transformer::device() const {
  // Every parameter lives on one device: the first one found says which
  // (without building named_params(), as forward asks on every call).
  if (embedding_) return embedding_->weight.device();
  if (final_norm_.defined()) return final_norm_.device();
  auto params = named_params();
  return params.empty() ? at::Device(at::kCPU) : params.front().second.device();
}

ShardSpec Transformer::shard_spec() const {
  const ParallelConfig& pc = state_->config();
  auto split =
      pc.layer_split.empty() ? even_layer_split(config_.num_layers, pc.pp) : pc.layer_split;
  auto spec = ShardSpec::for_rank(config_, state_->coords().tp, pc.tp, state_->coords().pp, split,
                                  options_.value_model);
  spec.make_vocab_size_divisible_by = pc.make_vocab_size_divisible_by;
  spec.ep_rank = state_->ep_rank();
  spec.ep_size = pc.ep;
  return spec;
}

void Transformer::check_token_ids(const at::Tensor& ids, const char* who) const {
  // The embedding checks against its padded rows; padding rows are no tokens.
  if (padded_vocab_ == config_.vocab_size || ids.numel() == 0) return;
  const int64_t hi = ids.max().item<int64_t>();
  if (hi >= config_.vocab_size)
    throw EngineError(detail::cat(who, ": token id ", hi, " is outside the vocabulary [0, ",
                                  config_.vocab_size, ")"));
}

at::Tensor Transformer::forward(const at::Tensor& input_arg, const at::Tensor& position_ids_arg,
                                const at::Tensor& attention_mask_arg,
                                const std::vector<int64_t>& packed_lengths) {
  // Inputs on another device (a host batch for a GPU model) are moved to the
  // parameters' device; on the same device this copies nothing.
  const at::Device dev = device();
  const at::Tensor input = input_arg.to(dev);
  const at::Tensor position_ids = position_ids_arg.to(dev);
  const at::Tensor attention_mask = attention_mask_arg.to(dev);
  if (position_ids.dim() != 2 || attention_mask.sizes() != position_ids.sizes())
    throw EngineError("Transformer::forward: position_ids " + shape_of(position_ids) +
                      " and attention_mask " + shape_of(attention_mask) + " must both be [B, S]");
  int64_t b = position_ids.size(0), s = position_ids.size(1);
  if (!packed_lengths.empty()) check_packed_lengths(packed_lengths, b, s);
  int64_t tp = state_->tp().size;
  if (options_.sequence_parallel && s % tp != 0)
    throw EngineError(detail::cat("Transformer::forward: sequence length ", s,
                                  " is not divisible by tp ", tp, " (sequence parallelism)"));
  at::Tensor h;
  if (first_stage()) {
    if (input.dim() != 2 || input.size(0) != b || input.size(1) != s ||
        input.scalar_type() != at::kLong)
      throw EngineError("Transformer::forward: input_ids must be int64 [" + std::to_string(b) +
                        ", " + std::to_string(s) + "], got " + shape_of(input));
    check_token_ids(input, "Transformer::forward");
    h = embedding_->forward(input);
  } else {
    int64_t local_s = options_.sequence_parallel ? s / tp : s;
    if (input.dim() != 3 || input.size(0) != b || input.size(1) != local_s ||
        input.size(2) != config_.hidden_size)
      throw EngineError(detail::cat("Transformer::forward: stage ", state_->coords().pp,
                                    " expects hidden states [", b, ", ", local_s, ", ",
                                    config_.hidden_size, "], got ", shape_of(input)));
    h = input;
  }
  if (config_.sliding_window && s > *config_.sliding_window)
    check_window(packed_lengths.empty()
                     ? attention_mask.sum(-1).max().item<int64_t>()
                     : *std::max_element(packed_lengths.begin(), packed_lengths.end()),
                 "Transformer::forward");
  auto rotary = rope_.tables(position_ids, h.scalar_type());
  AttentionMask mask;
  const bool dense = options_.packed_attention == PackedAttention::kDenseBias ||
                     (options_.packed_attention == PackedAttention::kAuto &&
                      s <= (dev.is_cuda() ? kDenseBiasMaxTokens : kDenseBiasMaxTokensCpu));
  if (packed_lengths.empty()) {
    mask.bias = causal_attention_bias(attention_mask, h.scalar_type());
  } else if (dense) {
    mask.bias = packed_attention_bias(packed_lengths, h.scalar_type(), dev);
  } else {
    mask.lengths = packed_lengths;
  }
  bool recompute = options_.recompute_activations && at::GradMode::is_enabled();
  for (auto& layer : layers_) {
    if (recompute) {
      // As a TensorList, so that autograd sees each parameter as an input.
      auto params = layer->parameters();
      const at::Tensor bias = mask.packed() ? at::empty({0}, h.options()) : mask.bias;
      h = RecomputedLayer::apply(layer.get(), h, rotary.cos, rotary.sin, bias, mask.lengths,
                                 at::TensorList(params));
    } else {
      h = layer->forward(h, rotary, mask);
    }
  }
  if (has_sparse_layers() && !recompute && at::GradMode::is_enabled()) {
    const at::Tensor aux = router_aux_loss(packed_lengths.empty() ? attention_mask : at::Tensor());
    last_aux_loss_ = aux.detach().item<double>();
    if (aux_loss_scale_ > 0) h = WithAuxLossGradient::apply(h, aux * aux_loss_scale_);
  }
  if (!last_stage()) return h;
  h = rms_norm(h, final_norm_, config_.rms_norm_eps);
  if (options_.value_model) return value_head(h);
  return output_head_input_ ? lm_head_input(h) : lm_head(h);
}

bool Transformer::has_sparse_layers() const {
  for (const auto& layer : layers_)
    if (layer->sparse()) return true;
  return false;
}

at::Tensor Transformer::router_aux_loss(const at::Tensor& attention_mask) const {
  const MoeConfig& m = config_.moe;
  const Group& tp = state_->tp();
  const bool split = options_.sequence_parallel && tp.size > 1;
  at::Tensor tokens_per_expert, prob_sum, rows;
  for (const auto& layer : layers_) {
    if (!layer->sparse()) continue;
    at::Tensor logits = layer->router_logits();
    if (!logits.defined())
      throw EngineError(
          "Transformer::router_aux_loss: no router logits (the last forward ran without "
          "gradients)");
    if (split) {
      // Each rank routed its part of the sequence: the loss is over all of it.
      const int64_t b = attention_mask.defined() ? attention_mask.size(0) : 1;
      logits = gather_from_sequence_region(logits.view({b, -1, m.num_experts}), tp)
                   .reshape({-1, m.num_experts});
    }
    // As HF's load_balancing_loss_func: per layer, the masked tokens' top-k
    // picks and router probabilities summed per expert.
    const at::Tensor probs = at::softmax(logits, -1).to(at::kFloat);
    const at::Tensor picks = std::get<1>(at::topk(probs, m.top_k, -1)).reshape({-1});
    const at::Tensor mask = attention_mask.defined()
                                ? attention_mask.reshape({-1}).to(probs.options())
                                : at::ones({probs.size(0)}, probs.options());
    at::Tensor counts = at::zeros({m.num_experts}, probs.options())
                            .scatter_add_(0, picks, mask.repeat_interleave(m.top_k));
    at::Tensor probs_sum = (probs * mask.unsqueeze(-1)).sum(0);
    tokens_per_expert = tokens_per_expert.defined() ? tokens_per_expert + counts : counts;
    prob_sum = prob_sum.defined() ? prob_sum + probs_sum : probs_sum;
    rows = rows.defined() ? rows + mask.sum() : mask.sum();
  }
  ENGINE_CHECK(tokens_per_expert.defined(), "router_aux_loss: this stage has no sparse layer");
  const at::Tensor loss =
      (tokens_per_expert / rows * (prob_sum / rows)).sum() * static_cast<double>(m.num_experts);
  if (!split) return loss;
  // Every TP rank computed the same loss from the gathered logits, whose
  // backward sums the ranks' gradients: each contributes 1/tp of it.
  const at::Tensor share = loss / static_cast<double>(tp.size);
  return share + (loss - share).detach();
}

void Transformer::set_router_aux_loss_scale(double scale) {
  if (scale < 0)
    throw EngineError(detail::cat("set_router_aux_loss_scale: ", scale, " is negative"));
  if (scale > 0 && options_.recompute_activations)
    throw EngineError(
        "Transformer: the router's load-balancing loss needs the router logits' graph, which "
        "activation recompute drops; turn one of them off (router_aux_loss_coef 0 or no "
        "recompute)");
  aux_loss_scale_ = scale;
}

std::unique_ptr<KvCache> Transformer::make_kv_cache(const KvCacheOptions& options) const {
  auto tensors = final_norm_.defined() ? final_norm_.options() : at::TensorOptions();
  return std::make_unique<KvCache>(config_, static_cast<int64_t>(layers_.size()),
                                   config_.num_kv_heads / state_->tp().size,
                                   tensors.requires_grad(false), options);
}

at::Tensor Transformer::forward_cached(const at::Tensor& ids, const at::Tensor& position_ids,
                                       const CacheStep& step, KvCache& cache,
                                       const at::Tensor& last) {
  if (!first_stage() || !last_stage() || options_.value_model || options_.sequence_parallel)
    throw EngineError(
        "Transformer::forward_cached: generation needs the whole model on one stage (pp = 1), "
        "an LM head and no sequence parallelism");
  if (ids.dim() != 2 || ids.scalar_type() != at::kLong || position_ids.sizes() != ids.sizes())
    throw EngineError("Transformer::forward_cached: ids " + shape_of(ids) + " and position_ids " +
                      shape_of(position_ids) + " must both be int64 [B, Q]");
  ENGINE_CHECK(cache.awake(), "Transformer::forward_cached: the KV cache is asleep");
  const int64_t b = ids.size(0), q = ids.size(1);
  const int64_t l = step.read_slots.dim() == 2 ? step.read_slots.size(1) : -1;
  if (step.write_slots.dim() != 1 || step.write_slots.size(0) != b * q ||
      step.read_slots.dim() != 2 || step.read_slots.size(0) != b || step.bias.dim() != 4 ||
      step.bias.size(0) != b || step.bias.size(1) != 1 || step.bias.size(2) != q ||
      step.bias.size(3) != l || last.dim() != 1 || last.size(0) != b)
    throw EngineError(detail::cat("Transformer::forward_cached: for ids [", b, ", ", q,
                                  "] the step needs write_slots [", b * q, "], read_slots [", b,
                                  ", L], bias [", b, ", 1, ", q, ", L] and last [", b, "]; got ",
                                  shape_of(step.write_slots), ", ", shape_of(step.read_slots), ", ",
                                  shape_of(step.bias), " and ", shape_of(last)));
  const int64_t slots = cache.keys(0).size(0);
  auto out_of_range = [](const at::Tensor& t, int64_t end) {
    return t.numel() > 0 && (t.min().item<int64_t>() < 0 || t.max().item<int64_t>() >= end);
  };
  if (out_of_range(step.write_slots, slots) || out_of_range(step.read_slots, slots) ||
      out_of_range(last, q))
    throw EngineError(detail::cat("Transformer::forward_cached: a cache slot outside [0, ", slots,
                                  ") or a last index outside [0, ", q, ")"));
  check_token_ids(ids, "Transformer::forward_cached");
  if (config_.sliding_window && l > *config_.sliding_window)
    check_window(position_ids.max().item<int64_t>() + 1, "Transformer::forward_cached");
  at::NoGradGuard no_grad;
  auto h = embedding_->forward(ids);
  auto rotary = rope_.tables(position_ids, h.scalar_type());
  for (size_t i = 0; i < layers_.size(); ++i)
    h = layers_[i]->forward_cached(h, rotary, step, cache.keys(static_cast<int64_t>(i)),
                                   cache.values(static_cast<int64_t>(i)));
  auto flat = at::arange(b, last.options()) * q + last;
  h = h.reshape({b * q, h.size(2)}).index_select(0, flat);  // [B, H]: the sampled-from tokens
  h = rms_norm(h, final_norm_, config_.rms_norm_eps);
  auto logits = gather_from_tp_region(lm_head(h), state_->tp());
  return padded_vocab_ == config_.vocab_size ? logits : logits.narrow(1, 0, config_.vocab_size);
}

at::Tensor Transformer::forward_decode(const DecodeStep& step, KvCache& cache) {
  if (!first_stage() || !last_stage() || options_.value_model || options_.sequence_parallel)
    throw EngineError(
        "Transformer::forward_decode: generation needs the whole model on one stage (pp = 1), "
        "an LM head and no sequence parallelism");
  const int64_t b = step.ids.dim() == 1 ? step.ids.size(0) : -1;
  if (b < 0 || step.ids.scalar_type() != at::kLong || step.positions.sizes() != step.ids.sizes() ||
      step.limits.sizes() != step.ids.sizes() || step.block_tables.dim() != 2 ||
      step.block_tables.size(0) != b)
    throw EngineError(
        detail::cat("Transformer::forward_decode: ids, positions and limits must be int64 [B] and "
                    "block_tables [B, W]; got ",
                    shape_of(step.ids), ", ", shape_of(step.positions), ", ", shape_of(step.limits),
                    " and ", shape_of(step.block_tables)));
  ENGINE_CHECK(cache.awake(), "Transformer::forward_decode: the KV cache is asleep");
  at::NoGradGuard no_grad;
  const int64_t bs = cache.block_size();
  // A row past its limit reads as if at it and writes to the scratch slot.
  auto pos = at::minimum(step.positions, step.limits);
  auto block = step.block_tables.gather(1, at::floor_divide(pos, bs).unsqueeze(1)).squeeze(1);
  auto slot = block * bs + pos.remainder(bs);
  DecodeAttention attention{at::where(step.positions.le(step.limits), slot, at::zeros_like(slot)),
                            step.block_tables, pos + 1, bs};
  auto h = embedding_->forward(step.ids.unsqueeze(1), /*check_range=*/false);  // [B, 1, H]
  auto rotary = rope_.tables(pos.unsqueeze(1), h.scalar_type());
  for (size_t i = 0; i < layers_.size(); ++i)
    h = layers_[i]->forward_decode(h, rotary, attention, cache.keys(static_cast<int64_t>(i)),
                                   cache.values(static_cast<int64_t>(i)));
  h = rms_norm(h.squeeze(1), final_norm_, config_.rms_norm_eps);
  auto logits = gather_from_tp_region(lm_head(h), state_->tp());
  return padded_vocab_ == config_.vocab_size ? logits : logits.narrow(1, 0, config_.vocab_size);
}

bool Transformer::supports_graph_capture() const {
  return !has_sparse_layers() && state_->tp().size == 1 && !rope_.call_dependent();
}

namespace {

// The whole LM on this stage, without sequence parallelism: the layouts a
// packed step can run (supports_paged_step adds fp32 host parameters).
bool whole_lm_without_sp(const Transformer& m) {
  return m.first_stage() && m.last_stage() && !m.options().value_model &&
         !m.options().sequence_parallel;
}

}  // namespace

bool Transformer::supports_paged_step() const {
  // The packed kernels multiply by the base weights alone.
  if (!whole_lm_without_sp(*this) || lora_enabled()) return false;
  for (const auto& [name, t] : named_params())
    if (!t.device().is_cpu() || t.scalar_type() != at::kFloat) return false;
  return true;
}

at::Tensor Transformer::forward_paged(const PagedStep& step, KvCache& cache) {
  const char* who = "Transformer::forward_paged";
  if (!whole_lm_without_sp(*this) || !final_norm_.device().is_cpu() ||
      final_norm_.scalar_type() != at::kFloat)
    throw EngineError(std::string(who) +
                      ": the packed step needs the whole LM on one stage, without sequence "
                      "parallelism, with fp32 parameters on the CPU");
  ENGINE_CHECK(cache.awake(), who, ": the KV cache is asleep");
  auto host_long = [](const at::Tensor& x, int64_t dim) {
    return x.defined() && x.dim() == dim && x.scalar_type() == at::kLong && x.device().is_cpu() &&
           x.is_contiguous();
  };
  const int64_t t = step.ids.defined() ? step.ids.numel() : 0;
  const int64_t b = step.last.defined() ? step.last.numel() : 0;
  for (const at::Tensor* x : {&step.ids, &step.positions, &step.write_slots, &step.rows})
    if (!host_long(*x, 1) || x->numel() != t)
      throw EngineError(detail::cat(who, ": ids, positions, write_slots and rows must be int64 [",
                                    t, "] on the host, got ", shape_of(*x)));
  if (!host_long(step.last, 1) || !host_long(step.block_tables, 2) ||
      step.block_tables.size(0) != b || t == 0 || b == 0)
    throw EngineError(detail::cat(who, ": for ", t, " tokens of ", b,
                                  " sequences the step needs last [B] and block_tables [B, M] "
                                  "(int64, host, B >= 1); got ",
                                  shape_of(step.last), " and ", shape_of(step.block_tables)));
  const at::Tensor& k0 = cache.keys(0);
  ENGINE_CHECK(k0.scalar_type() == at::kFloat && k0.device().is_cpu(), who,
               ": the KV cache must be fp32 on the host");
  const int64_t slots = k0.size(0), bs = cache.block_size(), blocks = slots / bs;
  const int64_t width = step.block_tables.size(1);
  const int64_t* ids = step.ids.data_ptr<int64_t>();
  const int64_t* pos = step.positions.data_ptr<int64_t>();
  const int64_t* write = step.write_slots.data_ptr<int64_t>();
  const int64_t* rows = step.rows.data_ptr<int64_t>();
  const int64_t* tables = step.block_tables.data_ptr<int64_t>();
  const int64_t* last = step.last.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < t; ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw EngineError(detail::cat(who, ": token id ", ids[i], " is outside the vocabulary [0, ",
                                    config_.vocab_size, ")"));
    if (pos[i] < 0 || pos[i] >= width * bs || rows[i] < 0 || rows[i] >= b || write[i] < 0 ||
        write[i] >= slots)
      throw EngineError(detail::cat(who, ": token ", i, " has position ", pos[i], ", row ", rows[i],
                                    " and write slot ", write[i], "; positions must be in [0, ",
                                    width * bs, "), rows in [0, ", b, "), slots in [0, ", slots,
                                    ")"));
    longest = std::max(longest, pos[i] + 1);
  }
  for (int64_t i = 0; i < b * width; ++i)
    if (tables[i] < 0 || tables[i] >= blocks)
      throw EngineError(detail::cat(who, ": block id ", tables[i], " outside [0, ", blocks, ")"));
  for (int64_t i = 0; i < b; ++i)
    if (last[i] < 0 || last[i] >= t)
      throw EngineError(detail::cat(who, ": last token index ", last[i], " outside [0, ", t, ")"));

  check_window(longest, who);

  at::NoGradGuard no_grad;
  const int64_t d = config_.head_dim;
  // The rotary rows of positions [0, n), grown on demand; a dynamic RoPE's
  // depend on the step's longest sequence, so they are made for each step.
  if (rope_.call_dependent() || !paged_rotary_.cos.defined() ||
      paged_rotary_.cos.size(0) < longest) {
    int64_t n =
        rope_.call_dependent()
            ? longest
            : std::max<int64_t>(
                  {longest, 256, paged_rotary_.cos.defined() ? 2 * paged_rotary_.cos.size(0) : 0});
    auto r = rope_.tables(at::arange(n, at::kLong).view({1, n}), at::kFloat);
    paged_rotary_ = {r.cos.view({n, d}).contiguous(), r.sin.view({n, d}).contiguous()};
  }
  for (const auto& layer : layers_) layer->reserve(paged_ws_, t);
  // The residual stream, in a reused buffer; with one TP rank the embedding
  // is a copy of rows (LibTorch's index_select of a few thousand rows costs
  // milliseconds), otherwise the vocabulary-parallel lookup and its all-reduce.
  const int64_t hidden = config_.hidden_size;
  if (!paged_hidden_.defined() || paged_hidden_.size(0) < t)
    paged_hidden_ = at::empty(
        {std::max<int64_t>(t, 2 * (paged_hidden_.defined() ? paged_hidden_.size(0) : 0)), hidden},
        at::kFloat);
  auto h = paged_hidden_.narrow(0, 0, t);
  if (state_->tp().size == 1) {
    const float* table = embedding_->weight.data_ptr<float>();
    float* out = h.data_ptr<float>();
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(out + i * hidden, table + ids[i] * hidden, hidden * sizeof(float));
  } else {
    h.copy_(embedding_->forward(step.ids.view({1, t})).view({t, hidden}));
  }
  cpu::PagedAttention a;
  a.groups = layers_.front()->local_kv_heads();
  a.ratio = config_.num_heads / config_.num_kv_heads;
  a.head_dim = d;
  a.block_size = bs;
  a.cos = paged_rotary_.cos.data_ptr<float>();
  a.sin = paged_rotary_.sin.data_ptr<float>();
  a.positions = pos;
  a.write_slots = write;
  a.rows = rows;
  a.block_tables = tables;
  a.table_stride = width;
  for (size_t i = 0; i < layers_.size(); ++i) {
    a.k_cache = cache.keys(static_cast<int64_t>(i)).data_ptr<float>();
    a.v_cache = cache.values(static_cast<int64_t>(i)).data_ptr<float>();
    layers_[i]->forward_paged(h, a, paged_ws_);
  }
  auto hl = rms_norm(h.index_select(0, step.last), final_norm_, config_.rms_norm_eps);
  auto logits = gather_from_tp_region(lm_head(hl, packed_lm_head_), state_->tp());
  return padded_vocab_ == config_.vocab_size ? logits : logits.narrow(1, 0, config_.vocab_size);
}

bool Transformer::pack_paged_weights() {
  if (!supports_paged_step() || !packed_linear_available()) return false;
  at::NoGradGuard no_grad;  // copies, not part of any graph
  try {
    for (const auto& layer : layers_) layer->pack_paged_weights();
    packed_lm_head_ =
        pack_linear_weight(output_weight_.defined() ? output_weight_ : embedding_->weight);
  } catch (...) {
    drop_paged_weights();
    throw;
  }
  return true;
}

void Transformer::drop_paged_weights() {
  for (const auto& layer : layers_) layer->drop_paged_weights();
  packed_lm_head_ = at::Tensor();
}

at::Tensor Transformer::lm_head_input(const at::Tensor& h) const {
  const Group& tp = state_->tp();
  return options_.sequence_parallel ? gather_from_sequence_region(h, tp) : copy_to_tp_region(h, tp);
}

const at::Tensor& Transformer::lm_head_weight() const {
  if (options_.value_model || !last_stage())
    throw EngineError("Transformer::lm_head_weight: only an LM's last stage has an LM head");
  return output_weight_.defined() ? output_weight_ : embedding_->weight;
}

at::Tensor Transformer::lm_head(const at::Tensor& h, const at::Tensor& packed) {
  auto x = lm_head_input(h);
  const at::Tensor& w = lm_head_weight();
  at::Tensor logits =
      packed.defined() ? packed_linear(x.contiguous(), packed, at::Tensor()) : at::linear(x, w);
  // Padded columns can never win: probability exactly 0 in any softmax, never
  // a max or argmax, and (the fill's backward) zero gradient.
  if (vocab_shard_.padding() > 0)
    logits.narrow(-1, vocab_shard_.real, vocab_shard_.padding())
        .fill_(-std::numeric_limits<double>::infinity());
  return logits;
}

at::Tensor Transformer::value_head(const at::Tensor& h) {
  auto v = at::linear(h, value_head_, value_bias_);  // [B, S(/tp), 1]
  if (!options_.sequence_parallel) return v;
  // Values of the local sequence part, gathered along the sequence; the
  // backward keeps each rank's own part (no sum: every rank computed its own).
  return gather_from_tp_region(v.transpose(1, 2), state_->tp()).transpose(1, 2);
}

int64_t Transformer::param_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, p] : named_params()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::named_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (embedding_) out.emplace_back("embedding.word_embeddings.weight", embedding_->weight);
  for (const auto& layer : layers_) {
    auto p = layer->named_params();
    out.insert(out.end(), p.begin(), p.end());
  }
  if (final_norm_.defined()) out.emplace_back("decoder.final_layernorm.weight", final_norm_);
  if (output_weight_.defined()) out.emplace_back("output_layer.weight", output_weight_);
  if (value_head_.defined()) {
    out.emplace_back("value_head.weight", value_head_);
    out.emplace_back("value_head.bias", value_bias_);
  }
  return out;
}

std::vector<std::string> Transformer::tp_partial_grad_params() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : named_params())
    if (tp_partial_grad(name)) out.push_back(name);
  return out;
}

bool Transformer::tp_replicated(const std::string& name) {
  if (const size_t lora = name.find(".lora."); lora != std::string::npos) {
    // A column-parallel layer's A, a row-parallel layer's B (lora.h).
    const std::string module = name.substr(lora + 6, name.rfind('.') - lora - 6);
    return name.ends_with(lora_row_parallel(module) ? ".B" : ".A");
  }
  return name.find("layer_norm_weight") != std::string::npos || is_head_norm(name) ||
         name.ends_with("mlp.router.weight") || name == "decoder.final_layernorm.weight" ||
         name.rfind("value_head.", 0) == 0;
}

bool Transformer::is_head_norm(const std::string& name) {
  return name.ends_with("self_attention.q_layernorm.weight") ||
         name.ends_with("self_attention.k_layernorm.weight");
}

bool Transformer::tp_partial_grad(const std::string& name) const {
  if (state_->tp().size == 1 || !tp_replicated(name)) return false;
  return options_.sequence_parallel || is_head_norm(name);
}

void Transformer::check_window(int64_t longest, const char* who) const {
  if (!config_.sliding_window || longest <= *config_.sliding_window) return;
  throw EngineError(detail::cat(
      who, ": a sequence of ", longest, " tokens is longer than ", config_.architecture,
      "'s \"sliding_window\" ", *config_.sliding_window,
      "; the engine attends over the whole prefix, which HF does not past the window (shorten "
      "the sequences, or set sliding_window to null in config.json if the model was trained "
      "without one)"));
}

std::map<std::string, at::Tensor> Transformer::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : named_params()) out.emplace(name, t.detach().clone());
  for (const auto& [name, t] : lora_params()) out.emplace(name, t.detach().clone());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::lora_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& layer : layers_)
    for (auto& entry : layer->lora_params()) out.push_back(std::move(entry));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::trainable_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& entry : named_params())
    if (entry.second.requires_grad()) out.push_back(std::move(entry));
  for (auto& entry : lora_params()) out.push_back(std::move(entry));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Transformer::merged_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out = named_params();
  if (!options_.lora.enabled()) return out;
  at::NoGradGuard no_grad;
  for (auto& [name, t] : out) {
    for (const auto& layer : layers_) {
      if (const at::Tensor d = layer->lora_delta(name); d.defined()) {
        t = t + d.to(t.scalar_type());
        break;
      }
    }
  }
  return out;
}

void Transformer::set_lora_enabled(bool on) {
  lora_on_ = on;
  for (const auto& layer : layers_) layer->set_lora_enabled(on);
}

void Transformer::load_state_dict(const std::map<std::string, at::Tensor>& weights) {
  std::vector<std::string> missing, mismatched;
  std::set<std::string> known;
  std::vector<std::pair<std::string, at::Tensor>> params = named_params();
  const std::vector<std::pair<std::string, at::Tensor>> adapters = lora_params();
  params.insert(params.end(), adapters.begin(), adapters.end());
  for (const auto& [name, param] : params) {
    known.insert(name);
    auto it = weights.find(name);
    if (it == weights.end()) {
      if (name.find(".lora.") != std::string::npos) continue;  // a base checkpoint
      if (name.rfind("value_head.", 0) == 0) {
        std::fprintf(stderr,
                     "[baton] [info] value model: no %s in the checkpoint (a causal-LM "
                     "checkpoint?); it keeps its fresh initialisation\n",
                     name.c_str());
        continue;
      }
      missing.push_back(name);
      continue;
    }
    if (it->second.sizes() != param.sizes()) {
      std::string hint;
      if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight")
        hint = detail::cat("; this layout pads vocab_size ", config_.vocab_size, " to ",
                           padded_vocab_, " rows (make_vocab_size_divisible_by ",
                           state_->config().make_vocab_size_divisible_by, " x tp ",
                           state_->tp().size, ")");
      mismatched.push_back(name + " (checkpoint " + shape_of(it->second) + ", model " +
                           shape_of(param) + hint + ")");
      continue;
    }
    at::NoGradGuard no_grad;
    param.copy_(it->second);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : weights)
    if (!known.count(name)) unexpected.push_back(name);
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return;
  std::string msg = detail::cat("Transformer::load_state_dict (tp rank ", state_->coords().tp,
                                ", pp stage ", state_->coords().pp, "):");
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg += std::string(" ") + what + ":";
    for (const auto& n : names) msg += " " + n;
    msg += ";";
  };
  list("missing", missing);
  list("wrong shape", mismatched);
  list("unexpected", unexpected);
  throw EngineError(msg);
}

at::Tensor next_token_log_probs(const at::Tensor& logits_shard, const at::Tensor& input_ids,
                                const Group& tp) {
  int64_t s = input_ids.size(1);
  if (logits_shard.dim() != 3 || logits_shard.size(1) != s)
    throw EngineError("next_token_log_probs: logits " + shape_of(logits_shard) +
                      " do not match input_ids " + shape_of(input_ids));
  auto logits = logits_shard.narrow(1, 0, s - 1);
  auto targets = input_ids.narrow(1, 1, s - 1);
  return vocab_parallel_log_probs(logits, targets, tp);
}

}  // namespace baton::engine
