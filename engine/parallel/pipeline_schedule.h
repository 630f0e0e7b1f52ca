// Pipeline schedules: one training step's forward and backward over the
// micro-batches of a batch with Megatron's 1F1B order (warm-up forwards,
// alternating one forward / one backward, cool-down backwards), activations
// and their gradients passed between neighbouring stages with c10d send/recv
// on the PP group. With pp = 1 it is plain gradient accumulation.
//
// Every rank of a pipeline calls these with the same micro-batches (token
// ids, positions and masks are known on every stage, so no shapes travel).
// Gradients accumulate into the parameters' .grad(); reducing them over DP and
// stepping is the optimizer's job (optimizer.h).
//
// Example:
//   auto losses = forward_backward(*model, micro_batches,
//       [&](const at::Tensor& logits, const MicroBatch& mb) {
//         return -(next_token_log_probs(logits, mb.input_ids, tp) * mb.extra.at("mask")).sum()
//                / global_tokens;
//       });
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/model/transformer.h"

namespace baton::engine {

struct MicroBatch {
  at::Tensor input_ids;       // [b, S] int64
  at::Tensor position_ids;    // [b, S] int64
  at::Tensor attention_mask;  // [b, S], 1 = real token
  // Dynamic batching: the micro-batch is ONE row (b = 1) holding sequences of
  // these lengths back to back, without padding (Transformer::forward's
  // packed_lengths). Empty: b padded rows.
  std::vector<int64_t> packed_lengths;
  // Packed only: [b, S] int64, where column c of padded row r sits in the
  // packed row (padding columns: the row's first token). What maps per-token
  // outputs back to the padded layout (workers/roles/role_model.h).
  at::Tensor packed_index;
  std::map<std::string, at::Tensor> extra;  // what the loss reads (masks, advantages, ...)
};

// On the last stage: the scalar to differentiate for one micro-batch, from the
// stage's output (logits shard or values). Scale it as the loss aggregation
// wants (e.g. divide by the global token count); gradients are summed.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const MicroBatch& mb)>;
// On the last stage: what to keep from one micro-batch's output (inference).
using OutputFn = std::function<at::Tensor(const at::Tensor& output, const MicroBatch& mb)>;

// Forward and backward of every micro-batch (1F1B). Returns the detached
// losses, one per micro-batch, on the last stage; empty on other stages.
// Collective over the model's TP and PP groups.
std::vector<at::Tensor> forward_backward(Transformer& model, const std::vector<MicroBatch>& mbs,
                                         const LossFn& loss);

// Forward only, without autograd. Returns fn(output) per micro-batch on the
// last stage; empty on other stages. Collective over TP and PP.
std::vector<at::Tensor> forward_only(Transformer& model, const std::vector<MicroBatch>& mbs,
                                     const OutputFn& fn);

}  // namespace baton::engine
