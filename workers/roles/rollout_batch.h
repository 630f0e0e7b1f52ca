// What a rollout's generate_sequences reads from its prompts and what it
// returns, shared by the colocated rollout (ActorRolloutRefWorker) and the
// separate one (RolloutWorker), so that both answer the same batch the same way.
//
// The prompts: `input_ids` and `attention_mask` [N, P] (left-padded) and
// `request_seed` [N] int64 (required when sampling); meta `n`,
// `temperature`, `top_k`, `top_p`, `do_sample`, optional
// `response_length`, `pad_token_id`, `stop_token_ids`. The result: N·n rows
// in (prompt, sample) order, prompts repeated: `prompts` [.., P],
// `responses` [.., R] (padded with pad_token_id), `input_ids`,
// `attention_mask`, `position_ids`, `response_mask`, `rollout_log_probs`.
//
// Example (inside a worker's generate_sequences):
//   RolloutRequest req = rollout_request(prompts, options.response_length, "generate_sequences");
//   auto seqs = engine.generate(req.prompts, req.params, req.seeds);
//   return rollout_result(req, seqs);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "engine/generation.h"

namespace baton::workers {

// A batch's meta value `key` as a number, or `fallback` when it is absent
// or null (what a sender left to the worker's default).
double meta_float(const DataProto& d, const char* key, double fallback);

struct RolloutRequest {
  at::Tensor ids, mask;                       // the prompts as given, [N, P] int64
  std::vector<std::vector<int64_t>> prompts;  // without their padding
  engine::SamplingParams params;              // max_new_tokens = the response width R
  std::vector<uint64_t> seeds;                // one per prompt, or none (greedy)
  int64_t pad_token_id = 0;
};

// Reads `prompts` as above; `response_length` is R when the meta has none.
// Throws baton::Error naming `where` for a missing tensor, an empty prompt
// row, or a sampled batch without request_seed.
RolloutRequest rollout_request(const DataProto& prompts, int64_t response_length,
                               const std::string& where);

// The result rows of `seqs` (what a GenerationEngine made for `req`), at
// fixed widths P and R so that replicas' results concatenate.
DataProto rollout_result(const RolloutRequest& req,
                         const std::vector<engine::GeneratedSequence>& seqs);

}  // namespace baton::workers
