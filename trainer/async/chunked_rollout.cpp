#include "trainer/async/chunked_rollout.h"

#include <algorithm>
#include <string>

#include "base/errors.h"
#include "runtime/future.h"
#include "workers/roles/rollout_batch.h"

namespace baton::trainer {

ChunkedRollout::ChunkedRollout(const DataProto& prompts, int64_t response_length, int64_t chunk,
                               int64_t replicas)
    : prompts_(prompts),
      response_length_(response_length),
      chunk_(chunk),
      replicas_(std::max<int64_t>(1, replicas)) {
  if (chunk < 1) throw Error("ChunkedRollout: chunk " + std::to_string(chunk) + " < 1");
  if (response_length < 1)
    throw Error("ChunkedRollout: response length " + std::to_string(response_length) + " < 1");
  prompts.require_tensors({"input_ids", "attention_mask", "request_seed"}, "ChunkedRollout");
  ids_ = prompts.tensor("input_ids").to(at::kLong).contiguous();
  mask_ = prompts.tensor("attention_mask").to(at::kLong).contiguous();
  seeds_ = prompts.tensor("request_seed").to(at::kLong).contiguous();
  if (const Value* n = prompts.meta_value("n"); n != nullptr && !n->is_none()) n_ = n->as_int();
  pad_token_id_ = static_cast<int64_t>(workers::meta_float(prompts, "pad_token_id", 0));
  const size_t samples = static_cast<size_t>(ids_.size(0) * n_);
  tokens_.resize(samples);
  log_probs_.resize(samples);
  finished_.assign(samples, false);
  first_version_.assign(samples, -1);
  last_version_.assign(samples, -1);
}

bool ChunkedRollout::done() const {
  return generated_ >= response_length_ ||
         std::all_of(finished_.begin(), finished_.end(), [](bool f) { return f; });
}

void ChunkedRollout::step(WorkerGroup& rollout) {
  if (done()) throw Error("ChunkedRollout::step: every sample has finished");
  const int64_t cap = std::min(response_length_, generated_ + chunk_);
  // The samples this call generates for: all of them at first (n per
  // prompt), then the unfinished ones, each a continuation row.
  std::vector<int64_t> samples;
  DataProto call;
  if (generated_ == 0) {
    // extra_info: a multi-turn rollout's per-row tools_kwargs and
    // interaction_kwargs.
    std::vector<std::string> columns;
    if (prompts_.has_column("extra_info")) columns.push_back("extra_info");
    call = prompts_.select({"input_ids", "attention_mask", "request_seed"}, columns);
    for (int64_t s = 0; s < static_cast<int64_t>(finished_.size()); ++s) samples.push_back(s);
  } else {
    for (int64_t s = 0; s < static_cast<int64_t>(finished_.size()); ++s)
      if (!finished_[static_cast<size_t>(s)]) samples.push_back(s);
    const int64_t rows = static_cast<int64_t>(samples.size()), P = ids_.size(1);
    at::Tensor ids = at::empty({rows, P + generated_}, at::kLong);
    at::Tensor mask = at::ones({rows, P + generated_}, at::kLong);
    at::Tensor seeds = at::empty({rows}, at::kLong), sample = at::empty({rows}, at::kLong);
    for (int64_t u = 0; u < rows; ++u) {
      const int64_t s = samples[static_cast<size_t>(u)], p = s / n_;
      ids[u].narrow(0, 0, P).copy_(ids_[p]);
      ids[u].narrow(0, P, generated_).copy_(at::tensor(tokens_[static_cast<size_t>(s)], at::kLong));
      mask[u].narrow(0, 0, P).copy_(mask_[p]);
      seeds[u] = seeds_[p];
      sample[u] = s % n_;
    }
    call = DataProto({{"input_ids", ids},
                      {"attention_mask", mask},
                      {"request_seed", seeds},
                      {"resume_sample", sample}},
                     {}, prompts_.meta());
    call.set_meta("n", Value(int64_t{1}));
    call.set_meta("resume_generated", Value(generated_));
  }
  call.set_meta("response_length", Value(cap));
  call.set_meta("full_response_length", Value(response_length_));
  call.set_meta("report_finished", Value(true));
  auto [padded, pad] = call.pad_to_multiple(replicas_);
  const int64_t per_row = generated_ == 0 ? n_ : 1;
  const DataProto out = rollout.call("generate_sequences", {padded})
                            .get()
                            .as<DataProto>()
                            .unpad(pad * per_row);
  ++calls_;
  const Value* version = out.meta_value("param_version");
  if (version == nullptr) throw Error("ChunkedRollout: generate_sequences returned no param_version");
  out.require_tensors({"responses", "response_mask", "rollout_log_probs", "finished"},
                      "ChunkedRollout (the rollout's result)");
  if (out.size() != static_cast<int64_t>(samples.size())) {
    throw Error("ChunkedRollout: generate_sequences returned " + std::to_string(out.size()) +
                " rows for " + std::to_string(samples.size()) + " samples");
  }
  const at::Tensor responses = out.tensor("responses").to(at::kLong).contiguous();
  // Valid response tokens: the attention mask's, not response_mask, which a
  // multi-turn rollout zeroes on the tokens its turns appended.
  const at::Tensor lengths = out.tensor("attention_mask")
                                 .slice(1, out.tensor("attention_mask").size(1) - responses.size(1))
                                 .to(at::kLong)
                                 .sum(1)
                                 .contiguous();
  const at::Tensor lp = out.tensor("rollout_log_probs").to(at::kFloat).contiguous();
  const at::Tensor finished = out.tensor("finished").to(at::kLong).contiguous();
  auto rp = responses.accessor<int64_t, 2>();
  auto lpa = lp.accessor<float, 2>();
  for (size_t u = 0; u < samples.size(); ++u) {
    const size_t s = static_cast<size_t>(samples[u]);
    const int64_t i = static_cast<int64_t>(u), len = lengths[i].item<int64_t>();
    finished_[s] = finished[i].item<int64_t>() != 0;
    if (!finished_[s] && generated_ + len != cap) {
      throw Error("ChunkedRollout: sample " + std::to_string(s) + " is not finished after " +
                  std::to_string(generated_ + len) + " tokens, short of this call's " +
                  std::to_string(cap));
    }
    for (int64_t t = 0; t < len; ++t) {
      tokens_[s].push_back(rp[i][t]);
      log_probs_[s].push_back(lpa[i][t]);
    }
    if (first_version_[s] < 0) first_version_[s] = version->as_int();
    last_version_[s] = version->as_int();
  }
  // One call did it all: its result is the batch, with what the rollout
  // reported beyond the tokens (a multi-turn rollout's response_mask and
  // multi_turn_* figures).
  if (generated_ == 0 && done()) {
    whole_ = out;
    whole_.pop({"finished"});
  }
  generated_ = cap;
}

DataProto ChunkedRollout::result() const {
  if (!done()) throw Error("ChunkedRollout::result: samples are still unfinished");
  if (calls_ == 1 && whole_.size() > 0) return whole_;
  workers::RolloutRequest req;
  req.ids = ids_;
  req.mask = mask_;
  req.params.max_new_tokens = response_length_;
  req.pad_token_id = pad_token_id_;
  std::vector<engine::GeneratedSequence> seqs(tokens_.size());
  for (size_t s = 0; s < tokens_.size(); ++s) {
    seqs[s].request = static_cast<int64_t>(s) / n_;
    seqs[s].sample = static_cast<int64_t>(s) % n_;
    seqs[s].response = tokens_[s];
    seqs[s].log_probs = log_probs_[s];
  }
  DataProto out = workers::rollout_result(req, seqs);
  int64_t oldest = -1;
  for (int64_t v : first_version_) oldest = oldest < 0 ? v : std::min(oldest, v);
  out.set_meta("param_version", Value(oldest));
  return out;
}

int64_t ChunkedRollout::resumed_samples() const {
  int64_t n = 0;
  for (size_t s = 0; s < first_version_.size(); ++s) n += first_version_[s] != last_version_[s];
  return n;
}

}  // namespace baton::trainer
