// TransformerLayer: one decoder block of the Llama / Qwen2 / Qwen3 / Mistral
// families, tensor parallel. Pre-norm residual block:
//   h = x + linear_proj(attention(rope(qk_norm(linear_qkv(rmsnorm(x))))))
//   y = h + linear_fc2(silu(gate) * up),  [gate; up] = linear_fc1(rmsnorm(h))
// Attention is causal with grouped-query heads; the fused QKV rows of one TP
// rank are its kv groups, each `r` query heads then one key and one value head
// (docs/engine.md). A sparse layer (ModelConfig::sparse_layer, Qwen3-MoE)
// replaces the MLP with experts: a router [E, H] replicated on every TP rank
// and E SwiGLU experts split over TP as the dense MLP is (each rank holds
// every expert's share of the intermediate dim); tokens go to their top-k
// experts, whose outputs are summed with the router's weights and reduced
// over TP once. Under expert parallelism (ParallelConfig::ep) the layer
// holds E/ep of the experts and its tokens travel to the EP ranks holding
// theirs and back by all-to-all (expert_parallel.h). qk_norm (Qwen3, ModelConfig::qk_norm) is an
// RMSNorm of each query and key head, one weight [head_dim] for the queries and one for the keys,
// on every TP rank. With sequence parallelism `x` and `y` are [B, S/tp, H].
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/kernels/decode_kernels.h"
#include "engine/model/lora.h"
#include "engine/model/rope.h"
#include "engine/parallel/parallel_linear.h"
#include "engine/parallel/parallel_state.h"

namespace baton::engine {

// x * rsqrt(mean(x^2) + eps) * weight, computed in fp32 as HF does.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The additive bias of a masked-out attention score: the dtype's lowest
// finite value (a fully masked row then stays finite, never NaN).
double masked_score(at::ScalarType dtype);

// The additive attention bias [B, 1, S, S]: 0 where query i may see key j
// (j <= i and key j is not padding), the dtype's lowest value elsewhere.
at::Tensor causal_attention_bias(const at::Tensor& attention_mask, at::ScalarType dtype);

// The additive bias [1, 1, S, S] of one packed row of sequences of `lengths`
// (summing to S): 0 where query i may see key j (j <= i, the same sequence),
// the dtype's lowest value elsewhere.
at::Tensor packed_attention_bias(const std::vector<int64_t>& lengths, at::ScalarType dtype,
                                 at::Device device);

// Which keys each query of TransformerLayer::forward sees. Padded rows: the
// dense additive `bias` above, [B, 1, S, S]. One packed row (B = 1, dynamic
// batching): `lengths` of the sequences laid back to back in it (summing to
// S); each attends causally within itself and never to another, computed
// sequence by sequence (no S × S bias: the cost is the sum of the squared
// lengths, not the square of their sum).
struct AttentionMask {
  at::Tensor bias;
  std::vector<int64_t> lengths;

  bool packed() const { return !lengths.empty(); }
};

// One generation step over a paged KV cache (engine/rollout/kv_cache.h): which cache
// slots the step's B×Q input tokens write their keys and values to, and which
// slots each row reads back as its context, in position order.
struct CacheStep {
  at::Tensor write_slots;  // [B·Q] int64; padding tokens write to a scratch slot
  at::Tensor read_slots;   // [B, L] int64; slot of position j of row b
  at::Tensor bias;         // [B, 1, Q, L] additive: 0 where query may see key
};

// One decode step of the device decode loop (Transformer::forward_decode):
// one new token per row, every tensor on the model's device, no host
// synchronisation. Keys and values are read in place through the block
// tables (engine/kernels/paged_attention.h).
struct DecodeAttention {
  at::Tensor write_slots;   // [B] int64: the cache slot of each row's new token
  at::Tensor block_tables;  // [B, W] int64
  at::Tensor context_lens;  // [B] int64: positions 0 .. len - 1 are visible
  int64_t block_size = 0;
};

// The input of Transformer::forward_decode, every tensor on the model's
// device: row b feeds ids[b] at positions[b]. A row whose position is past
// limits[b] (the device decode loop runs k steps before the host sees a
// stop) writes to the scratch slot and attends over positions 0..limits[b];
// its logits are to be discarded. block_tables must cover positions
// 0..limits[b] (a padding row: limit 0, a table of scratch block 0).
struct DecodeStep {
  at::Tensor ids;           // [B] int64
  at::Tensor positions;     // [B] int64
  at::Tensor limits;        // [B] int64
  at::Tensor block_tables;  // [B, W] int64
};

// One generation step in packed form (the CPU fp32 path of the generation
// engine, Transformer::forward_paged): the step's T new tokens of B
// sequences back to back, without padding. Keys and values are read from the
// cache through each sequence's block table. All int64 on the host.
struct PagedStep {
  at::Tensor ids;           // [T] token ids
  at::Tensor positions;     // [T] each token's position in its sequence
  at::Tensor write_slots;   // [T] the cache slot of that position
  at::Tensor rows;          // [T] the token's sequence: a row of block_tables
  at::Tensor block_tables;  // [B, max blocks] cache block ids (unused entries 0)
  at::Tensor last;          // [B] the index in [0, T) of each sequence's last new token
};

// Step buffers of forward_paged, reused from step to step (grown on demand)
// so that a decode step allocates nothing per layer.
struct PagedWorkspace {
  at::Tensor normed, qkv, ctx, gate_up, act;  // [capacity, width] fp32
};

class TransformerLayer : public torch::nn::Module {
 public:
  // `layer_id` is the global layer index (names and nothing else). `lora`:
  // adapters on the targeted linear layers (lora.h); none when its rank is 0.
  // `ep`: the expert-parallel group (a sparse layer holds experts
  // [ep.rank · E / ep.size, ...)); the rank alone for no EP.
  TransformerLayer(const ModelConfig& config, const Group& tp, const Group& ep, int64_t layer_id,
                   bool sequence_parallel, const LoraOptions& lora = {});

  // x: [B, S(/tp), H]; rotary and mask as built above for the full sequence.
  at::Tensor forward(const at::Tensor& x, const Rotary& rotary, const AttentionMask& mask);

  // Generation (no autograd): x [B, Q, H] are the step's new tokens. Their
  // keys and values go into `k_cache` / `v_cache` ([slots, kv heads/tp, d])
  // at step.write_slots before attention reads step.read_slots, so a token
  // sees itself. Collective over the TP group like forward().
  at::Tensor forward_cached(const at::Tensor& x, const Rotary& rotary, const CacheStep& step,
                            at::Tensor& k_cache, at::Tensor& v_cache);

  // The device decode loop's step (no autograd): x [B, 1, H], one new token
  // per row; its key and value go to step.write_slots, then attention reads
  // each row's context through its block table. No host synchronisation
  // (a dense layer; a sparse one syncs its expert counts). Collective over
  // the TP group.
  at::Tensor forward_decode(const at::Tensor& x, const Rotary& rotary, const DecodeAttention& step,
                            at::Tensor& k_cache, at::Tensor& v_cache);

  // The packed CPU step (fp32, no autograd): `h` [T, H] is updated in place
  // (both residual adds); the new tokens' keys and values go into the
  // layer's cache, whose pointers, with the step's, are in `attention`.
  // `ws` holds at least T rows. Collective over the TP group.
  void forward_paged(at::Tensor& h, const cpu::PagedAttention& attention, PagedWorkspace& ws);
  // Grows `ws` to hold `tokens` rows of this layer's buffers.
  void reserve(PagedWorkspace& ws, int64_t tokens) const;
  // forward_paged's weights packed for oneDNN (engine/kernels/packed_linear.h), a
  // copy taken now: until dropped, forward_paged multiplies by them and not
  // by the parameters. REQUIRES packed_linear_available().
  void pack_paged_weights();
  void drop_paged_weights();

  // Kv heads this rank holds (num_key_value_heads / tp).
  int64_t local_kv_heads() const { return local_groups_; }
  bool sparse() const { return router_.defined(); }
  // The router's logits [tokens, E] of this rank's tokens in the last
  // forward that recorded gradients (undefined otherwise, and for a dense
  // layer): what the load-balancing loss is computed from.
  const at::Tensor& router_logits() const { return router_logits_; }

  // Parameters under their engine names ("decoder.layers.{id}.…"): the
  // base model's, without the LoRA adapters.
  std::vector<std::pair<std::string, at::Tensor>> named_params() const;
  // The LoRA adapters: "decoder.layers.{id}.lora.<module>.A" and ".B".
  std::vector<std::pair<std::string, at::Tensor>> lora_params() const;
  // scale · B A of the adapters on base parameter `name` (one of
  // named_params'), in its layout on this rank; undefined when none targets
  // it. W + lora_delta(name) is the merged weight.
  at::Tensor lora_delta(const std::string& name) const;
  // Adapters off: the layer computes its base (a LoRA model's reference policy).
  void set_lora_enabled(bool on) { lora_on_ = on; }

 private:
  at::Tensor attention(const at::Tensor& x, const Rotary& rotary, const AttentionMask& mask);
  // Scaled dot-product attention of q [B, g·r, Q, d] over k, v [B, g, L, d].
  at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, const AttentionMask& mask);
  at::Tensor mlp(const at::Tensor& x);
  // A cached step's queries [B, g·r, Q, d] (rotated, normed), after writing
  // its keys and values to `write_slots` of the layer's cache.
  at::Tensor cache_step_queries(const at::Tensor& x, const Rotary& rotary,
                                const at::Tensor& write_slots, at::Tensor& k_cache,
                                at::Tensor& v_cache);
  // LoRA's addition to a column-parallel output (q/k/v fused in the group
  // layout, or gate/up) and to a row-parallel one (reduced over TP), for
  // input x; undefined when no adapter applies.
  at::Tensor lora_qkv(const at::Tensor& x) const;
  at::Tensor lora_gate_up(const at::Tensor& x) const;
  at::Tensor lora_row(const std::string& module, const at::Tensor& x) const;
  // x Wᵀ (+ bias) of qkv_, proj_, fc1_, fc2_ with their adapters.
  at::Tensor qkv(const at::Tensor& x);
  at::Tensor project(const at::Tensor& ctx);
  void init_lora(const LoraOptions& lora);
  // The experts' output for x [.., H] (a sparse layer's MLP), reduced over TP
  // (reduce-scattered over the sequence with sequence parallelism).
  at::Tensor moe(const at::Tensor& x);
  // q [.., g·r heads, .., d] and k [.., g heads, .., d] normed per head
  // when the config has qk_norm; unchanged otherwise.
  at::Tensor norm_q(const at::Tensor& q) const;
  at::Tensor norm_k(const at::Tensor& k) const;

  ModelConfig config_;
  int64_t layer_id_;
  int64_t local_groups_;  // kv heads on this TP rank
  at::Tensor input_norm_;
  at::Tensor post_norm_;
  at::Tensor q_norm_, k_norm_;  // [head_dim]; undefined without qk_norm
  // A sparse layer's MLP (undefined in a dense one, whose fc1_ / fc2_ are null).
  Group tp_;
  Group ep_;
  bool sequence_parallel_ = false;
  at::Tensor router_;       // [E, H], replicated over TP
  at::Tensor experts_fc1_;  // [E/ep, 2F/tp, H]: each expert's gate rows, then its up rows
  at::Tensor experts_fc2_;  // [E/ep, H, F/tp]
  at::Tensor router_logits_;
  // LoRA adapters by HF module name; empty without LoRA.
  struct Adapter {
    at::Tensor a, b;  // this rank's A [r, in(/tp)] and B [out(/tp), r]
  };
  std::map<std::string, Adapter> lora_;
  double lora_scale_ = 0;
  bool lora_on_ = true;
  ColumnParallelLinear qkv_{nullptr};
  RowParallelLinear proj_{nullptr};
  ColumnParallelLinear fc1_{nullptr};
  RowParallelLinear fc2_{nullptr};
  struct PackedWeights {
    at::Tensor qkv, proj, fc1, fc2;  // undefined: forward_paged uses mm
  } packed_;
};

}  // namespace baton::engine
