// What a rollout's generate_sequences reads from its prompts and what it
// returns, shared by the colocated rollout (ActorRolloutRefWorker) and the
// separate one (RolloutWorker), so that both answer the same batch the same way.
//
// The prompts: `input_ids` and `attention_mask` [N, P] (left-padded) and
// `request_seed` [N] int64 (required when sampling); meta `n`,
// `temperature`, `top_k`, `top_p`, `do_sample`, optional
// `response_length`, `pad_token_id`, `stop_token_ids`, `ignore_eos` (do not
// stop at the model's EOS ids: benchmarks). The result: N·n rows
// in (prompt, sample) order, prompts repeated: `prompts` [.., P],
// `responses` [.., R] (padded with pad_token_id), `input_ids`,
// `attention_mask`, `position_ids`, `response_mask`, `rollout_log_probs`.
//
// Partial rollout (a response generated in chunks, new weights possibly
// loaded between them: the fully-async trainer; see engine::Continuation).
// `response_length` always counts from the response's start: it is the most
// tokens the response has after this call (the caller passes
// min(full length, tokens so far + chunk)). A batch resumes responses when it
// carries `resume_sample` [N] int64 (the sample each row continues) and meta
// `resume_generated` G (how many response tokens every row's input_ids
// already end with), both or neither, with meta n = 1 and `request_seed`
// holding the seeds of the requests being resumed. Each row then draws
// where sample resume_sample of its seed stopped, at most
// response_length - G new tokens (so with unchanged weights the chunks give
// the tokens of one call). The result has N rows: `prompts` are the rows as
// given (their G response tokens included); `responses`, `response_mask`
// and `rollout_log_probs` hold only the new tokens, width response_length - G.
// Meta `report_finished` true adds `finished` [rows] int64: 1 when the
// row's response is complete (it ended with a stop token, or G + its new
// tokens reached meta `full_response_length`, the whole response's budget,
// response_length when absent), 0 when only this call's budget stopped it
// and it is to be resumed.
//
// Example (inside a worker's generate_sequences):
//   RolloutRequest req = rollout_request(prompts, options.response_length, "generate_sequences");
//   auto seqs = engine.generate(req.prompts, req.params, req.seeds, req.continuations);
//   return rollout_result(req, seqs);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "engine/rollout/generation.h"

namespace baton::workers {

// A batch's meta value `key` as a number, or `fallback` when it is absent
// or null (what a sender left to the worker's default).
double meta_float(const DataProto& d, const char* key, double fallback);

struct RolloutRequest {
  at::Tensor ids, mask;                       // the prompts as given, [N, P] int64
  std::vector<std::vector<int64_t>> prompts;  // without their padding
  engine::SamplingParams params;  // max_new_tokens = response_length, from the response's start
  std::vector<uint64_t> seeds;    // one per prompt, or none (greedy)
  std::vector<engine::Continuation> continuations;  // one per prompt when resuming, else none
  int64_t pad_token_id = 0;
  int64_t resume_generated = 0;      // G: response tokens each prompt row already ends with
  bool report_finished = false;      // the result gets `finished`
  int64_t full_response_length = 0;  // the whole response's budget, >= max_new_tokens

  // The result's response width: max_new_tokens - resume_generated.
  int64_t response_width() const { return params.max_new_tokens - resume_generated; }
};

// Reads `prompts` as above; `response_length` is the response budget when
// the meta has none. Throws baton::Error naming `where` for a missing
// tensor, an empty prompt row, a sampled batch without request_seed,
// resume_sample without resume_generated or the other way round, a
// resume_sample of the wrong size, a resumed batch with n != 1, or a
// full_response_length below response_length. (The engine checks each
// continuation against its row: G below response_length and the row's length.)
RolloutRequest rollout_request(const DataProto& prompts, int64_t response_length,
                               const std::string& where);

// The result rows of `seqs` (what a GenerationEngine made for `req`), at
// fixed widths P and req.response_width() so that replicas' results
// concatenate; with `finished` when req.report_finished.
DataProto rollout_result(const RolloutRequest& req,
                         const std::vector<engine::GeneratedSequence>& seqs);

}  // namespace baton::workers
