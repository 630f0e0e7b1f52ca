#include "engine/rollout/weight_stream.h"

#include <algorithm>

#include "engine/errors.h"

namespace baton::engine {

TpSplit tp_split_of(Transform transform) {
  switch (transform) {
    case Transform::kReplicated:
      return {};
    case Transform::kSplitRows:
    case Transform::kQkv:
      return {0, 1};
    case Transform::kSplitCols:
      return {1, 1};
    case Transform::kGateUp:
      return {0, 2};
    case Transform::kExpertsGateUp:  // [E, 2F, H]: each expert's gate and up rows
      return {1, 2};
    case Transform::kExpertsDown:  // [E, H, F]
      return {2, 1};
  }
  ENGINE_CHECK(false, "unknown Transform");
}

void copy_tp_slice(at::Tensor dst, const StreamTensor& t, int64_t t_tp, int64_t r_tp,
                   int64_t r_rank, int64_t k_begin, int64_t k_end,
                   const std::function<at::Tensor(int64_t k)>& shard) {
  if (t.ep > 1) {
    // Each EP rank's block of experts is a tensor of its own, TP-split alike.
    StreamTensor block = t;
    block.full[0] /= t.ep;
    block.bytes /= t.ep;
    block.ep = 1;
    const int64_t n = block.full[0];
    for (int64_t j = 0; j < t.ep; ++j)
      copy_tp_slice(dst.narrow(0, j * n, n), block, t_tp, r_tp, r_rank, k_begin, k_end,
                    [&](int64_t k) { return shard(j * t_tp + k); });
    return;
  }
  const auto& full = t.full;
  const int64_t dim = t.split.dim, blocks = t.split.blocks;
  ENGINE_CHECK(dim >= 0 && dim < dst.dim(), t.name, ": not split over TP");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(full.size()); ++d) inner *= full[d];
  const int64_t block = full[dim] / blocks;  // one sub-block, full size (source padding included)
  // Rows that are real: the vocabulary, or all of them. The two layouts may
  // pad differently, so dst's rows come from dst, not from `full`.
  const int64_t real = t.vocab > 0 ? t.vocab : block;
  const int64_t t_len = block / t_tp, r_len = dst.size(dim) / blocks;
  ENGINE_CHECK(t.vocab > 0 ? r_len * r_tp >= real : r_len * r_tp == block, t.name, ": dst ",
               dst.sizes(), " is not a ", r_tp, "-way slice of ", at::IntArrayRef(full));
  auto out = dst.view({outer, blocks * r_len, inner});
  const int64_t want_lo = r_rank * r_len, want_hi = want_lo + r_len;
  for (int64_t s = 0; s < blocks; ++s) {
    for (int64_t k = k_begin; k < k_end; ++k) {
      const int64_t lo = std::max(want_lo, k * t_len);
      const int64_t hi = std::min({want_hi, (k + 1) * t_len, real});
      if (lo >= hi) continue;
      auto src = shard(k).view({outer, blocks * t_len, inner});
      out.narrow(1, s * r_len + lo - want_lo, hi - lo)
          .copy_(src.narrow(1, s * t_len + lo - k * t_len, hi - lo));
    }
    if (real < want_hi) {  // this layout's padding rows
      const int64_t first = std::max(real, want_lo);
      out.narrow(1, s * r_len + first - want_lo, want_hi - first).zero_();
    }
  }
}

std::vector<int64_t> StreamTensor::shard_shape(int64_t tp) const {
  auto s = full;
  if (!replicated()) s[split.dim] /= tp;
  s[0] /= ep;
  return s;
}

std::vector<int64_t> StreamTensor::shard_shape_in(const ParallelConfig& layout) const {
  auto s = full;
  if (vocab > 0) {
    s[split.dim] = layout.padded_vocab_size(vocab) / layout.tp;
    return s;
  }
  if (!replicated()) s[split.dim] /= layout.tp;
  if (expert) s[0] /= layout.ep;
  return s;
}

std::vector<StreamTensor> stream_tensors(const ModelConfig& cfg, bool value_model,
                                         const ParallelConfig& training, int64_t element_size) {
  std::vector<int64_t> stage_of_layer(cfg.num_layers, 0);
  for (int64_t s = 0; s < training.pp; ++s) {
    auto [begin, end] = stage_layer_range(s, cfg.num_layers, training);
    for (int64_t l = begin; l < end; ++l) stage_of_layer[l] = s;
  }
  validate_expert_parallel(cfg, training.ep);
  std::vector<StreamTensor> out;
  for (auto& t : whole_model_tensors(cfg, value_model)) {
    StreamTensor st;
    switch (t.rule->scope) {
      case Scope::kFirstStage:
        st.stage = 0;
        break;
      case Scope::kLayer:
        st.stage = stage_of_layer[t.layer];
        break;
      case Scope::kLastStage:
      case Scope::kLmHead:
      case Scope::kValueHead:
        st.stage = training.pp - 1;
        break;
    }
    st.split = tp_split_of(t.rule->transform);
    if (cfg.moe.num_experts > 0 && is_expert_tensor(t.engine_name)) {
      st.expert = true;
      st.ep = training.ep;
    }
    if (is_vocab_rule(*t.rule)) {
      st.vocab = t.shape[0];
      t.shape[0] = training.padded_vocab_size(st.vocab);
    }
    if (!st.replicated() && t.shape[st.split.dim] % (st.split.blocks * training.tp) != 0)
      throw EngineError(detail::cat(t.engine_name, " of full size ", t.shape[st.split.dim],
                                    " along dim ", st.split.dim, " does not split into ",
                                    st.split.blocks, " × ", training.tp));
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    st.bytes = numel * element_size;
    st.name = std::move(t.engine_name);
    st.full = std::move(t.shape);
    out.push_back(std::move(st));
  }
  return out;
}

RegionLayout region_layout(const std::vector<const StreamTensor*>& tensors, int64_t regions,
                           int64_t tp) {
  auto align8 = [](int64_t n) { return (n + 7) / 8 * 8; };
  int64_t rows = 1;
  for (const StreamTensor* t : tensors) rows = std::max(rows, t->ep);
  RegionLayout l;
  l.offset.assign(tensors.size(), std::vector<int64_t>(rows * regions, -1));
  int64_t pos = 0;
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t k = 0; k < regions; ++k) {
      l.region_begin.push_back(pos);
      for (size_t i = 0; i < tensors.size(); ++i) {
        if ((tensors[i]->replicated() && k > 0) || (tensors[i]->ep == 1 && j > 0)) continue;
        ENGINE_CHECK(tensors[i]->ep == 1 || tensors[i]->ep == rows, tensors[i]->name,
                     ": expert tensors of different ep in one bucket");
        l.offset[i][j * regions + k] = pos;
        pos += align8(tensors[i]->shard_bytes(tp));
      }
      l.region_bytes.push_back(pos - l.region_begin.back());
    }
  l.total = pos;
  return l;
}

}  // namespace baton::engine
