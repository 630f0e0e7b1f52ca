#include "engine/io/weight_conversion.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "engine/errors.h"

namespace baton::engine {
namespace {

using Shape = std::vector<int64_t>;

// The trunk every family shares; `attention_bias_on_proj` adds Llama's o_proj
// bias (its attention_bias covers q, k, v and o; Qwen2's covers q, k, v
// only), `qk_norm` Qwen3's per-head q and k norms.
std::vector<ConversionRule> trunk_rules(bool attention_bias_on_proj, bool mlp_biases,
                                        bool qk_norm = false) {
  using D = Dim;
  const std::string L = "model.layers.{i}.";
  const std::string E = "decoder.layers.{i}.";
  std::vector<ConversionRule> r = {
      {.engine_name = "embedding.word_embeddings.weight",
       .scope = Scope::kFirstStage,
       .transform = Transform::kSplitRows,
       .hf = {{"model.embed_tokens.weight", {D::kVocab, D::kHidden}}}},
      {.engine_name = E + "self_attention.linear_qkv.layer_norm_weight",
       .hf = {{L + "input_layernorm.weight", {D::kHidden}}}},
      {.engine_name = E + "self_attention.linear_qkv.weight",
       .transform = Transform::kQkv,
       .hf = {{L + "self_attn.q_proj.weight", {D::kQ, D::kHidden}},
              {L + "self_attn.k_proj.weight", {D::kKv, D::kHidden}},
              {L + "self_attn.v_proj.weight", {D::kKv, D::kHidden}}}},
      {.engine_name = E + "self_attention.linear_qkv.bias",
       .condition = Condition::kQkvBias,
       .transform = Transform::kQkv,
       .hf = {{L + "self_attn.q_proj.bias", {D::kQ}},
              {L + "self_attn.k_proj.bias", {D::kKv}},
              {L + "self_attn.v_proj.bias", {D::kKv}}}},
      {.engine_name = E + "self_attention.linear_proj.weight",
       .transform = Transform::kSplitCols,
       .hf = {{L + "self_attn.o_proj.weight", {D::kHidden, D::kQ}}}},
      {.engine_name = E + "mlp.linear_fc1.layer_norm_weight",
       .hf = {{L + "post_attention_layernorm.weight", {D::kHidden}}}},
      {.engine_name = E + "mlp.linear_fc1.weight",
       .condition = Condition::kDenseMlp,
       .transform = Transform::kGateUp,
       .hf = {{L + "mlp.gate_proj.weight", {D::kIntermediate, D::kHidden}},
              {L + "mlp.up_proj.weight", {D::kIntermediate, D::kHidden}}}},
      {.engine_name = E + "mlp.linear_fc2.weight",
       .condition = Condition::kDenseMlp,
       .transform = Transform::kSplitCols,
       .hf = {{L + "mlp.down_proj.weight", {D::kHidden, D::kIntermediate}}}},
      {.engine_name = "decoder.final_layernorm.weight",
       .scope = Scope::kLastStage,
       .hf = {{"model.norm.weight", {D::kHidden}}}},
      {.engine_name = "output_layer.weight",
       .scope = Scope::kLmHead,
       .transform = Transform::kSplitRows,
       .hf = {{"lm_head.weight", {D::kVocab, D::kHidden}}},
       .tied_hf_name = "model.embed_tokens.weight"},
      {.engine_name = "value_head.weight",
       .scope = Scope::kValueHead,
       .hf = {{"score.weight", {D::kOne, D::kHidden}}},
       .optional = true},
      {.engine_name = "value_head.bias",
       .scope = Scope::kValueHead,
       .hf = {{"score.bias", {D::kOne}}},
       .optional = true,
       .zero_fill_on_export = true},
  };
  // Row-parallel biases are added once, after the reduction: replicated.
  if (attention_bias_on_proj)
    r.push_back({.engine_name = E + "self_attention.linear_proj.bias",
                 .condition = Condition::kQkvBias,
                 .hf = {{L + "self_attn.o_proj.bias", {D::kHidden}}}});
  if (qk_norm) {
    r.push_back({.engine_name = E + "self_attention.q_layernorm.weight",
                 .condition = Condition::kQkNorm,
                 .hf = {{L + "self_attn.q_norm.weight", {D::kHeadDim}}}});
    r.push_back({.engine_name = E + "self_attention.k_layernorm.weight",
                 .condition = Condition::kQkNorm,
                 .hf = {{L + "self_attn.k_norm.weight", {D::kHeadDim}}}});
  }
  if (qk_norm) {  // Qwen3-MoE's sparse layers (the rules apply by layer)
    r.push_back({.engine_name = E + "mlp.router.weight",
                 .condition = Condition::kSparseMlp,
                 .hf = {{L + "mlp.gate.weight", {D::kExperts, D::kHidden}}}});
    r.push_back(
        {.engine_name = E + "mlp.experts.linear_fc1.weight",
         .condition = Condition::kSparseMlp,
         .transform = Transform::kExpertsGateUp,
         .hf = {{L + "mlp.experts.{e}.gate_proj.weight", {D::kMoeIntermediate, D::kHidden}},
                {L + "mlp.experts.{e}.up_proj.weight", {D::kMoeIntermediate, D::kHidden}}}});
    r.push_back(
        {.engine_name = E + "mlp.experts.linear_fc2.weight",
         .condition = Condition::kSparseMlp,
         .transform = Transform::kExpertsDown,
         .hf = {{L + "mlp.experts.{e}.down_proj.weight", {D::kHidden, D::kMoeIntermediate}}}});
  }
  if (mlp_biases) {
    r.push_back({.engine_name = E + "mlp.linear_fc1.bias",
                 .condition = Condition::kMlpBias,
                 .transform = Transform::kGateUp,
                 .hf = {{L + "mlp.gate_proj.bias", {D::kIntermediate}},
                        {L + "mlp.up_proj.bias", {D::kIntermediate}}}});
    r.push_back({.engine_name = E + "mlp.linear_fc2.bias",
                 .condition = Condition::kMlpBias,
                 .hf = {{L + "mlp.down_proj.bias", {D::kHidden}}}});
  }
  return r;
}

std::string expand(const std::string& pattern, int64_t layer) {
  std::string out = pattern;
  const std::string id = std::to_string(layer);
  for (size_t pos; (pos = out.find("{i}")) != std::string::npos;) out.replace(pos, 3, id);
  return out;
}

// The engine-name pattern of a rule as a regex whose one group is the layer id.
std::regex engine_regex(const std::string& pattern) {
  std::string re;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern.compare(i, 3, "{i}") == 0) {
      re += R"((\d+))";
      i += 2;
    } else if (std::string("\\^$.|?*+()[]{}").find(pattern[i]) != std::string::npos) {
      re += '\\';
      re += pattern[i];
    } else {
      re += pattern[i];
    }
  }
  return std::regex(re);
}

int64_t resolve(Dim d, const ModelConfig& cfg) {
  switch (d) {
    case Dim::kOne:
      return 1;
    case Dim::kVocab:
      return cfg.vocab_size;
    case Dim::kHidden:
      return cfg.hidden_size;
    case Dim::kIntermediate:
      return cfg.intermediate_size;
    case Dim::kQ:
      return cfg.q_size();
    case Dim::kKv:
      return cfg.kv_size();
    case Dim::kHeadDim:
      return cfg.head_dim;
    case Dim::kExperts:
      return cfg.moe.num_experts;
    case Dim::kMoeIntermediate:
      return cfg.moe.intermediate_size;
  }
  ENGINE_CHECK(false, "unknown Dim");
}

Shape resolve(const std::vector<Dim>& dims, const ModelConfig& cfg) {
  Shape s;
  for (Dim d : dims) s.push_back(resolve(d, cfg));
  return s;
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string stage_str(int64_t tp_rank, int64_t pp_rank) {
  return detail::cat("shard (tp rank ", tp_rank, ", pp stage ", pp_rank, ")");
}

// Joins up to `limit` items, then says how many were left out.
std::string list_str(const std::vector<std::string>& items, size_t limit = 20) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += detail::cat(" ... and ", items.size() - limit, " more");
  return out;
}

// Whether the rule gives a tensor of layer `layer` (every layer rule but the
// MLP's applies to each layer; those apply to the dense or the sparse ones).
bool applies_to_layer(const ConversionRule& rule, const ModelConfig& cfg, int64_t layer) {
  if (rule.condition == Condition::kDenseMlp) return !cfg.sparse_layer(layer);
  if (rule.condition == Condition::kSparseMlp) return cfg.sparse_layer(layer);
  return true;
}

bool expert_rule(const ConversionRule& rule) {
  return rule.transform == Transform::kExpertsGateUp || rule.transform == Transform::kExpertsDown;
}

// "{e}" in an HF name pattern: the expert id.
std::string expand_expert(const std::string& pattern, int64_t expert) {
  std::string out = pattern;
  const std::string id = std::to_string(expert);
  for (size_t pos; (pos = out.find("{e}")) != std::string::npos;) out.replace(pos, 3, id);
  return out;
}

bool applies(const ConversionRule& rule, const ModelConfig& cfg, bool value_model) {
  switch (rule.condition) {
    case Condition::kAlways:
      break;
    case Condition::kQkvBias:
      if (!cfg.qkv_bias) return false;
      break;
    case Condition::kMlpBias:
      if (!cfg.mlp_bias) return false;
      break;
    case Condition::kQkNorm:
      if (!cfg.qk_norm) return false;
      break;
    case Condition::kDenseMlp:
    case Condition::kSparseMlp:
      break;  // by layer: applies_to_layer
  }
  if (rule.scope == Scope::kLmHead) return !value_model;
  if (rule.scope == Scope::kValueHead) return value_model;
  return true;
}

// One engine tensor of one rank and where it comes from.
struct Planned {
  const ConversionRule* rule;
  std::string engine_name;
  std::vector<std::string> hf_names;  // its sources (for a tied head: the embedding)
  std::vector<Shape> hf_shapes;       // their full shapes
  bool export_ignored = false;        // a tied head's copy: the embedding is exported instead
};

std::vector<Planned> plan_rank(const ModelConfig& cfg, const ShardSpec& spec) {
  std::vector<Planned> out;
  auto add = [&](const ConversionRule& rule, int64_t layer, bool tied) {
    Planned p{&rule, expand(rule.engine_name, layer), {}, {}, false};
    if (tied) {
      p.hf_names = {rule.tied_hf_name};
      p.hf_shapes = {resolve(rule.hf.front().shape, cfg)};
      p.export_ignored = true;
    } else if (expert_rule(rule)) {
      // Expert by expert (this EP rank's), each expert's tensors in the rule's order.
      const int64_t local = cfg.moe.num_experts / spec.ep_size;
      for (int64_t e = spec.ep_rank * local; e < (spec.ep_rank + 1) * local; ++e) {
        for (const auto& h : rule.hf) {
          p.hf_names.push_back(expand_expert(expand(h.name, layer), e));
          p.hf_shapes.push_back(resolve(h.shape, cfg));
        }
      }
    } else {
      for (const auto& h : rule.hf) {
        p.hf_names.push_back(expand(h.name, layer));
        p.hf_shapes.push_back(resolve(h.shape, cfg));
      }
    }
    out.push_back(std::move(p));
  };
  for (const auto& rule : conversion_rules(cfg.family)) {
    if (!applies(rule, cfg, spec.value_model)) continue;
    switch (rule.scope) {
      case Scope::kFirstStage:
        if (spec.first_stage) add(rule, -1, false);
        break;
      case Scope::kLayer:
        for (int64_t i = spec.layer_begin; i < spec.layer_end; ++i)
          if (applies_to_layer(rule, cfg, i)) add(rule, i, false);
        break;
      case Scope::kLastStage:
      case Scope::kValueHead:
        if (spec.last_stage) add(rule, -1, false);
        break;
      case Scope::kLmHead:
        // Tied with one stage: the head is the embedding itself.
        if (spec.last_stage && !(cfg.tie_word_embeddings && spec.first_stage))
          add(rule, -1, cfg.tie_word_embeddings);
        break;
    }
  }
  return out;
}

// The shape TP rank k of t holds of a tensor whose HF sources have `full`
// shapes; vocabulary tensors hold `padded_vocab / t` rows.
Shape rank_shape(const ConversionRule& rule, const std::vector<Shape>& full, int64_t t,
                 int64_t padded_vocab) {
  Shape s = full.front();
  if (is_vocab_rule(rule)) {
    s[0] = padded_vocab / t;
    return s;
  }
  switch (rule.transform) {
    case Transform::kReplicated:
      break;
    case Transform::kSplitRows:
      s[0] /= t;
      break;
    case Transform::kSplitCols:
      s[1] /= t;
      break;
    case Transform::kQkv:
      s[0] = (full[0][0] + full[1][0] + full[2][0]) / t;
      break;
    case Transform::kGateUp:
      s[0] = (full[0][0] + full[1][0]) / t;
      break;
    case Transform::kExpertsGateUp:  // full: [F, H] per gate / up of each expert
      s = {static_cast<int64_t>(full.size()) / 2, 2 * full[0][0] / t, full[0][1]};
      break;
    case Transform::kExpertsDown:  // full: [H, F] per expert
      s = {static_cast<int64_t>(full.size()), full[0][0], full[0][1] / t};
      break;
  }
  return s;
}

// Trailing dims of `t` after dim 0, prefixed by `lead`.
Shape with_lead(at::IntArrayRef lead, const at::Tensor& t) {
  Shape s(lead.begin(), lead.end());
  for (int64_t i = 1; i < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}

// TP rank k's rows of a vocabulary tensor `full` ([V, ..]) padded to
// `padded` rows: a view when it holds no padding, else a copy ending in zeros.
at::Tensor vocab_rows(const at::Tensor& full, int64_t k, int64_t t, int64_t padded) {
  const VocabShard v = vocab_shard(full.size(0), padded, t, k);
  if (v.padding() == 0) return full.narrow(0, v.begin, v.rows).contiguous();
  at::Tensor out = at::zeros(with_lead({v.rows}, full), full.options());
  if (v.real > 0) out.narrow(0, 0, v.real).copy_(full.narrow(0, v.begin, v.real));
  return out;
}

at::Tensor shard_of(Transform transform, const std::vector<at::Tensor>& src, int64_t k, int64_t t,
                    const ModelConfig& cfg) {
  switch (transform) {
    case Transform::kReplicated:
      return src[0];
    case Transform::kSplitRows: {
      int64_t n = src[0].size(0) / t;
      return src[0].narrow(0, k * n, n).contiguous();
    }
    case Transform::kSplitCols: {
      int64_t n = src[0].size(1) / t;
      return src[0].narrow(1, k * n, n).contiguous();
    }
    case Transform::kQkv: {
      const int64_t d = cfg.head_dim, nkv = cfg.num_kv_heads, r = cfg.num_heads / nkv;
      const int64_t groups = nkv / t;
      auto q = src[0].reshape(with_lead({nkv, r * d}, src[0])).narrow(0, k * groups, groups);
      auto kk = src[1].reshape(with_lead({nkv, d}, src[1])).narrow(0, k * groups, groups);
      auto v = src[2].reshape(with_lead({nkv, d}, src[2])).narrow(0, k * groups, groups);
      return at::cat({q, kk, v}, 1).reshape(with_lead({groups * (r + 2) * d}, src[0]));
    }
    case Transform::kGateUp: {
      int64_t n = src[0].size(0) / t;
      return at::cat({src[0].narrow(0, k * n, n), src[1].narrow(0, k * n, n)}, 0);
    }
    case Transform::kExpertsGateUp: {  // src: gate_0, up_0, gate_1, up_1, ...
      std::vector<at::Tensor> experts;
      for (size_t e = 0; e + 1 < src.size(); e += 2)
        experts.push_back(shard_of(Transform::kGateUp, {src[e], src[e + 1]}, k, t, cfg));
      return at::stack(experts);
    }
    case Transform::kExpertsDown: {
      std::vector<at::Tensor> experts;
      for (const auto& down : src)
        experts.push_back(shard_of(Transform::kSplitCols, {down}, k, t, cfg));
      return at::stack(experts);
    }
  }
  ENGINE_CHECK(false, "unknown Transform");
}

std::vector<at::Tensor> merge(Transform transform, const std::vector<at::Tensor>& parts,
                              const ModelConfig& cfg) {
  switch (transform) {
    case Transform::kReplicated:
      return {parts[0]};
    case Transform::kSplitRows:
      return {at::cat(parts, 0)};
    case Transform::kSplitCols:
      return {at::cat(parts, 1)};
    case Transform::kQkv: {
      const int64_t d = cfg.head_dim, nkv = cfg.num_kv_heads, r = cfg.num_heads / nkv;
      auto fused = at::cat(parts, 0);
      auto grouped = fused.reshape(with_lead({nkv, (r + 2) * d}, fused));
      auto q = grouped.narrow(1, 0, r * d).reshape(with_lead({nkv * r * d}, fused));
      auto k = grouped.narrow(1, r * d, d).reshape(with_lead({nkv * d}, fused));
      auto v = grouped.narrow(1, (r + 1) * d, d).reshape(with_lead({nkv * d}, fused));
      return {q.contiguous(), k.contiguous(), v.contiguous()};
    }
    case Transform::kGateUp: {
      std::vector<at::Tensor> gates, ups;
      for (const auto& p : parts) {
        int64_t n = p.size(0) / 2;
        gates.push_back(p.narrow(0, 0, n));
        ups.push_back(p.narrow(0, n, n));
      }
      return {at::cat(gates, 0), at::cat(ups, 0)};
    }
    case Transform::kExpertsGateUp:
    case Transform::kExpertsDown: {
      // parts: each rank's [E, ...]; per expert, the dense merge of its slices.
      const Transform one =
          transform == Transform::kExpertsGateUp ? Transform::kGateUp : Transform::kSplitCols;
      std::vector<at::Tensor> out;
      for (int64_t e = 0; e < parts.front().size(0); ++e) {
        std::vector<at::Tensor> slices;
        for (const auto& p : parts) slices.push_back(p[e]);
        for (auto& x : merge(one, slices, cfg)) out.push_back(x.contiguous());
      }
      return out;
    }
  }
  ENGINE_CHECK(false, "unknown Transform");
}

// "<architecture>: " for error messages.
std::string where(const ModelConfig& cfg) {
  return cfg.architecture.empty() ? std::string() : cfg.architecture + ": ";
}

}  // namespace

const std::vector<ConversionRule>& conversion_rules(ModelFamily family) {
  static const std::vector<ConversionRule> llama = trunk_rules(true, true);
  static const std::vector<ConversionRule> qwen2 = trunk_rules(false, false);
  // Qwen3's rules carry the MoE ones too: they apply to sparse layers only.
  static const std::vector<ConversionRule> qwen3 = trunk_rules(true, false, /*qk_norm=*/true);
  switch (family) {
    case ModelFamily::kLlama:
    case ModelFamily::kMistral:  // Llama's names; its biases never apply
      return llama;
    case ModelFamily::kQwen2:
      return qwen2;
    case ModelFamily::kQwen3:
    case ModelFamily::kQwen3Moe:
      return qwen3;
  }
  ENGINE_CHECK(false, "unknown ModelFamily");
}

std::vector<int64_t> even_layer_split(int64_t num_layers, int64_t pp) {
  if (pp < 1) throw EngineError(detail::cat("pipeline size must be positive, got ", pp));
  if (num_layers < pp)
    throw EngineError(detail::cat("cannot split ", num_layers, " layers over ", pp,
                                  " pipeline stages: every stage needs at least one layer"));
  std::vector<int64_t> split(pp, num_layers / pp);
  for (int64_t p = 0; p < num_layers % pp; ++p) ++split[p];
  return split;
}

void validate_layer_split(const std::vector<int64_t>& split, int64_t num_layers) {
  if (split.empty()) throw EngineError("layer split is empty: it needs one count per stage");
  std::string shown = shape_str(split);
  for (int64_t n : split)
    if (n <= 0)
      throw EngineError(
          detail::cat("layer split ", shown, ": every stage needs a positive layer count"));
  int64_t sum = std::accumulate(split.begin(), split.end(), int64_t{0});
  if (sum != num_layers)
    throw EngineError(detail::cat("layer split ", shown, " sums to ", sum, " but the model has ",
                                  num_layers, " layers"));
}

bool is_vocab_rule(const ConversionRule& rule) {
  return rule.transform == Transform::kSplitRows && !rule.hf.empty() &&
         !rule.hf.front().shape.empty() && rule.hf.front().shape.front() == Dim::kVocab;
}

void validate_tensor_parallel(const ModelConfig& cfg, int64_t tp_size) {
  if (tp_size < 1)
    throw EngineError(detail::cat("tensor parallel size must be positive, got ", tp_size));
  auto require = [&](int64_t n, const char* what) {
    if (n % tp_size != 0)
      throw EngineError(detail::cat(where(cfg), "tensor parallel size ", tp_size,
                                    " does not divide ", what, " ", n));
  };
  require(cfg.num_kv_heads, "num_key_value_heads");
  require(cfg.intermediate_size, "intermediate_size");
  if (cfg.moe.num_experts > 0) require(cfg.moe.intermediate_size, "moe_intermediate_size");
}

std::vector<ModelTensor> whole_model_tensors(const ModelConfig& cfg, bool value_model) {
  const auto& rules = conversion_rules(cfg.family);
  std::vector<ModelTensor> out;
  auto add = [&](const ConversionRule& r, int64_t layer) {
    ModelTensor t{expand(r.engine_name, layer), &r, layer, resolve(r.hf[0].shape, cfg)};
    // Fused tensors stack their HF parts along dim 0; experts along a new dim 0.
    for (size_t i = 1; i < r.hf.size(); ++i) t.shape[0] += resolve(r.hf[i].shape[0], cfg);
    if (expert_rule(r)) t.shape.insert(t.shape.begin(), cfg.moe.num_experts);
    out.push_back(std::move(t));
  };
  auto scope = [&](Scope s) {
    for (const auto& r : rules)
      if (r.scope == s && applies(r, cfg, value_model)) add(r, -1);
  };
  scope(Scope::kFirstStage);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const auto& r : rules)
      if (r.scope == Scope::kLayer && applies(r, cfg, value_model) && applies_to_layer(r, cfg, l))
        add(r, l);
  scope(Scope::kLastStage);
  if (!cfg.tie_word_embeddings) scope(Scope::kLmHead);
  scope(Scope::kValueHead);
  return out;
}

const ConversionRule* find_rule(ModelFamily family, const std::string& engine_name,
                                int64_t* layer) {
  struct Compiled {
    std::vector<std::regex> patterns;
    explicit Compiled(const std::vector<ConversionRule>& rules) {
      for (const auto& r : rules) patterns.push_back(engine_regex(r.engine_name));
    }
  };
  static const Compiled llama(conversion_rules(ModelFamily::kLlama));
  static const Compiled qwen2(conversion_rules(ModelFamily::kQwen2));
  static const Compiled qwen3(conversion_rules(ModelFamily::kQwen3));
  const auto& rules = conversion_rules(family);
  const auto& compiled = family == ModelFamily::kQwen2 ? qwen2
                         : family == ModelFamily::kQwen3 || family == ModelFamily::kQwen3Moe
                             ? qwen3
                             : llama;
  std::smatch m;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (!std::regex_match(engine_name, m, compiled.patterns[i])) continue;
    if (layer) *layer = m.size() > 1 ? std::stoll(m[1].str()) : -1;
    return &rules[i];
  }
  return nullptr;
}

ShardSpec ShardSpec::for_rank(const ModelConfig& cfg, int64_t tp_rank, int64_t tp_size,
                              int64_t pp_rank, const std::vector<int64_t>& layer_split,
                              bool value_model) {
  validate_layer_split(layer_split, cfg.num_layers);
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    throw EngineError(detail::cat("tp rank ", tp_rank, " is out of range for tp size ", tp_size));
  const auto pp = static_cast<int64_t>(layer_split.size());
  if (pp_rank < 0 || pp_rank >= pp)
    throw EngineError(detail::cat("pp rank ", pp_rank, " is out of range for ", pp, " stages"));
  ShardSpec s;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.layer_begin = std::accumulate(layer_split.begin(), layer_split.begin() + pp_rank, int64_t{0});
  s.layer_end = s.layer_begin + layer_split[pp_rank];
  s.first_stage = pp_rank == 0;
  s.last_stage = pp_rank == pp - 1;
  s.value_model = value_model;
  return s;
}

void validate_expert_parallel(const ModelConfig& cfg, int64_t ep_size) {
  if (ep_size < 1)
    throw EngineError(detail::cat(where(cfg), "expert parallel size ", ep_size, " must be >= 1"));
  if (cfg.moe.num_experts > 0 && cfg.moe.num_experts % ep_size != 0)
    throw EngineError(detail::cat(where(cfg), "expert parallel size ", ep_size,
                                  " does not divide num_experts = ", cfg.moe.num_experts));
}

bool is_expert_tensor(const std::string& engine_name) {
  return engine_name.find(".mlp.experts.") != std::string::npos;
}

TensorMap join_expert_shards(const std::vector<TensorMap>& by_ep_rank) {
  ENGINE_CHECK(!by_ep_rank.empty(), "join_expert_shards: no shards");
  TensorMap out;
  for (const auto& [name, t] : by_ep_rank.front()) {
    if (!is_expert_tensor(name)) {
      out.emplace(name, t);
      continue;
    }
    std::vector<at::Tensor> parts;
    for (size_t r = 0; r < by_ep_rank.size(); ++r) {
      auto it = by_ep_rank[r].find(name);
      if (it == by_ep_rank[r].end())
        throw EngineError(
            detail::cat("join_expert_shards: EP rank ", r, " has no ", name, " (EP rank 0 has)"));
      parts.push_back(it->second);
    }
    out.emplace(name, at::cat(parts, 0));
  }
  for (size_t r = 1; r < by_ep_rank.size(); ++r)
    if (by_ep_rank[r].size() != by_ep_rank.front().size())
      throw EngineError(detail::cat("join_expert_shards: EP rank ", r, " holds ",
                                    by_ep_rank[r].size(), " tensors, EP rank 0 ",
                                    by_ep_rank.front().size()));
  return out;
}

TensorMap hf_to_shard(const TensorMap& hf, const ModelConfig& cfg, const ShardSpec& spec) {
  validate_tensor_parallel(cfg, spec.tp_size);
  validate_expert_parallel(cfg, spec.ep_size);
  if (spec.ep_rank < 0 || spec.ep_rank >= spec.ep_size)
    throw EngineError(
        detail::cat("ep rank ", spec.ep_rank, " is out of range for ep size ", spec.ep_size));
  if (spec.tp_rank < 0 || spec.tp_rank >= spec.tp_size)
    throw EngineError(
        detail::cat("tp rank ", spec.tp_rank, " is out of range for tp size ", spec.tp_size));
  if (spec.layer_begin < 0 || spec.layer_begin >= spec.layer_end || spec.layer_end > cfg.num_layers)
    throw EngineError(detail::cat("layer range [", spec.layer_begin, ", ", spec.layer_end,
                                  ") is not a non-empty part of the model's ", cfg.num_layers,
                                  " layers"));

  // Check the whole checkpoint against the whole model, so every rank agrees.
  ShardSpec whole;
  whole.tp_size = spec.tp_size;
  whole.layer_end = cfg.num_layers;
  whole.value_model = spec.value_model;
  std::map<std::string, Shape> known;  // every HF name a rule may consume, with its shape
  std::set<std::string> required;
  for (const auto& p : plan_rank(cfg, whole)) {
    for (size_t j = 0; j < p.hf_names.size(); ++j) {
      known.emplace(p.hf_names[j], p.hf_shapes[j]);
      if (!p.rule->optional) required.insert(p.hf_names[j]);
    }
  }
  std::vector<std::string> missing, unexpected, wrong_shape;
  for (const auto& name : required)
    if (!hf.count(name)) missing.push_back(name);
  for (const auto& [name, t] : hf) {
    auto it = known.find(name);
    if (it == known.end()) {
      bool ignored = name.ends_with("rotary_emb.inv_freq") ||
                     (name == "lm_head.weight" && (spec.value_model || cfg.tie_word_embeddings));
      if (!ignored) unexpected.push_back(name);
    } else if (t.sizes() != at::IntArrayRef(it->second)) {
      wrong_shape.push_back(
          detail::cat(name, " expected ", shape_str(it->second), " got ", shape_str(t.sizes())));
    }
  }
  if (!missing.empty() || !unexpected.empty() || !wrong_shape.empty()) {
    std::string msg = where(cfg) + "HF checkpoint does not match the model config:";
    if (!missing.empty()) msg += " missing tensors: " + list_str(missing) + ".";
    if (!unexpected.empty()) msg += " unexpected tensors: " + list_str(unexpected) + ".";
    if (!wrong_shape.empty()) msg += " wrong shapes: " + list_str(wrong_shape) + ".";
    throw EngineError(msg);
  }

  const int64_t padded_vocab = spec.padded_vocab_size(cfg);
  TensorMap out;
  for (const auto& p : plan_rank(cfg, spec)) {
    std::vector<at::Tensor> src;
    for (const auto& name : p.hf_names) {
      auto it = hf.find(name);
      if (it != hf.end()) src.push_back(it->second);
    }
    if (src.size() != p.hf_names.size()) continue;  // an optional tensor that is absent
    out.emplace(p.engine_name,
                is_vocab_rule(*p.rule)
                    ? vocab_rows(src[0], spec.tp_rank, spec.tp_size, padded_vocab)
                    : shard_of(p.rule->transform, src, spec.tp_rank, spec.tp_size, cfg));
  }
  return out;
}

TensorMap shards_to_hf(const std::vector<std::vector<TensorMap>>& shards, const ModelConfig& cfg,
                       const std::vector<int64_t>& layer_split, bool value_model,
                       int64_t make_vocab_size_divisible_by) {
  validate_layer_split(layer_split, cfg.num_layers);
  if (shards.size() != layer_split.size())
    throw EngineError(detail::cat("shards_to_hf: ", shards.size(), " pipeline stages of shards",
                                  " but layer split ", shape_str(layer_split), " has ",
                                  layer_split.size()));
  const auto t = static_cast<int64_t>(shards.front().size());
  for (size_t p = 0; p < shards.size(); ++p)
    if (static_cast<int64_t>(shards[p].size()) != t || t == 0)
      throw EngineError(detail::cat("shards_to_hf: pp stage ", p, " has ", shards[p].size(),
                                    " tp shards, stage 0 has ", t));
  validate_tensor_parallel(cfg, t);
  const int64_t padded_vocab = padded_vocab_size(cfg.vocab_size, t, make_vocab_size_divisible_by);

  TensorMap hf;
  for (size_t p = 0; p < shards.size(); ++p) {
    const auto pp_rank = static_cast<int64_t>(p);
    const auto plan = ShardSpec::for_rank(cfg, 0, t, pp_rank, layer_split, value_model);
    const auto planned = plan_rank(cfg, plan);

    // Check every rank's names and shapes before merging anything.
    for (int64_t k = 0; k < t; ++k) {
      const TensorMap& shard = shards[p][k];
      std::vector<std::string> missing, unexpected, wrong_shape;
      std::set<std::string> expected;
      for (const auto& e : planned) {
        expected.insert(e.engine_name);
        auto it = shard.find(e.engine_name);
        if (it == shard.end()) {
          if (!e.rule->optional) missing.push_back(e.engine_name);
          continue;
        }
        Shape want = rank_shape(*e.rule, e.hf_shapes, t, padded_vocab);
        if (it->second.sizes() != at::IntArrayRef(want))
          wrong_shape.push_back(detail::cat(
              e.engine_name, " expected ", shape_str(want), " got ", shape_str(it->second.sizes()),
              is_vocab_rule(*e.rule)
                  ? detail::cat(" (vocab_size ", cfg.vocab_size, " padded to ", padded_vocab,
                                " rows by make_vocab_size_divisible_by ",
                                make_vocab_size_divisible_by, " x tp ", t, ")")
                  : std::string()));
      }
      for (const auto& entry : shard)
        if (!expected.count(entry.first)) unexpected.push_back(entry.first);
      if (!missing.empty() || !unexpected.empty() || !wrong_shape.empty()) {
        std::string msg = where(cfg) + stage_str(k, pp_rank) + " does not match the layout:";
        if (!missing.empty()) msg += " missing tensors: " + list_str(missing) + ".";
        if (!unexpected.empty()) msg += " unexpected tensors: " + list_str(unexpected) + ".";
        if (!wrong_shape.empty()) msg += " wrong shapes: " + list_str(wrong_shape) + ".";
        throw EngineError(msg);
      }
    }

    for (const auto& e : planned) {
      if (e.export_ignored) continue;
      std::vector<at::Tensor> parts;
      for (int64_t k = 0; k < t; ++k) {
        auto it = shards[p][k].find(e.engine_name);
        if (it != shards[p][k].end()) parts.push_back(it->second);
      }
      if (parts.empty()) {
        if (!e.rule->zero_fill_on_export) continue;
        // A head without its bias (freshly initialised from an LM checkpoint):
        // HF's head has one, so export a zero bias when the rest of the scope is there.
        at::Tensor sibling;
        for (const auto& other : planned)
          if (other.rule->scope == e.rule->scope && &other != &e &&
              shards[p][0].count(other.engine_name))
            sibling = shards[p][0].at(other.engine_name);
        if (sibling.defined())
          hf.emplace(e.hf_names.front(), at::zeros(e.hf_shapes.front(), sibling.options()));
        continue;
      }
      if (static_cast<int64_t>(parts.size()) != t)
        throw EngineError(detail::cat(where(cfg), "pp stage ", p, ": ", e.engine_name,
                                      " is held by ", parts.size(), " of ", t, " tp ranks"));
      auto merged = merge(e.rule->transform, parts, cfg);
      // Vocabulary tensors: the padding rows are not part of the HF model.
      if (is_vocab_rule(*e.rule) && padded_vocab != cfg.vocab_size)
        merged[0] = merged[0].narrow(0, 0, cfg.vocab_size);
      for (size_t j = 0; j < merged.size(); ++j) {
        bool inserted = hf.emplace(e.hf_names[j], merged[j]).second;
        ENGINE_CHECK(inserted, "HF tensor ", e.hf_names[j], " produced twice");
      }
    }
  }
  return hf;
}

std::string hf_architecture(ModelFamily family, bool value_model) {
  const char* bases[] = {"Llama", "Qwen2", "Qwen3", "Mistral", "Qwen3Moe"};
  const std::string base = bases[static_cast<int>(family)];
  return base + (value_model ? "ForTokenClassification" : "ForCausalLM");
}

bool is_value_architecture(const std::string& architecture) {
  return architecture.ends_with("ForTokenClassification");
}

}  // namespace baton::engine
