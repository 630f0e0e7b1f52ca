// ChunkedRollout: one batch of the fully-async rollouter generated in calls
// of at most `chunk` new tokens each (async_training.partial_rollout), so
// that a weight sync issued meanwhile runs between two calls instead of after
// the whole batch. After the first call, the samples that have not finished
// resume from their prefix (prompt + the tokens so far) with whatever weights
// the rollout group holds by then: generate_sequences' continuation rows
// (workers/roles/rollout_batch.h), which draw from the same random stream
// position, so that with unchanged weights the chunked batch is the one-call
// batch. Each token's rollout log-prob is the one of the weights that drew it
// (what truncated IS corrects with), and the batch's version is the oldest
// that drew any of its tokens.
//
// With chunk >= the response length it is one call, the plain rollout.
//
// Example (the rollouter):
//   ChunkedRollout g(prompts, /*response_length=*/512, /*chunk=*/64, replicas);
//   while (!g.done()) g.step(rollout);        // a sync may run between steps
//   DataProto out = g.result();                // as generate_sequences returns it
//
// Not thread-safe (the rollouter's).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "dispatch/data_proto.h"
#include "runtime/worker_group.h"

namespace baton::trainer {

class ChunkedRollout {
 public:
  // `prompts`: input_ids and attention_mask [N, P] (left-padded),
  // request_seed [N] and generate_sequences' sampling meta (n, temperature,
  // ..., pad_token_id). Calls are padded to a multiple of `replicas` (the
  // rollout group's data-parallel size). baton::Error for chunk < 1 or
  // response_length < 1.
  ChunkedRollout(const DataProto& prompts, int64_t response_length, int64_t chunk,
                 int64_t replicas);

  // Every sample finished (a stop token or the response length).
  bool done() const;
  // One generate_sequences call on `rollout`: the first chunk of every
  // sample, then the next chunk of the unfinished ones. REQUIRES: !done().
  void step(WorkerGroup& rollout);
  // N·n rows as generate_sequences returns them, meta `param_version` the
  // oldest version that drew a token. REQUIRES: done().
  DataProto result() const;

  int64_t calls() const { return calls_; }
  // Samples whose tokens were drawn by more than one weights version.
  int64_t resumed_samples() const;

 private:
  DataProto prompts_;
  at::Tensor ids_, mask_, seeds_;  // [N, P], [N, P], [N]
  int64_t n_ = 1, response_length_ = 0, chunk_ = 0, replicas_ = 1;
  int64_t generated_ = 0;  // tokens every unfinished sample has
  int64_t calls_ = 0;
  int64_t pad_token_id_ = 0;
  std::vector<std::vector<int64_t>> tokens_;  // per sample (prompt-major)
  DataProto whole_;  // the first call's result when it finished every sample
  std::vector<std::vector<float>> log_probs_;
  std::vector<bool> finished_;
  std::vector<int64_t> first_version_, last_version_;
};

}  // namespace baton::trainer
