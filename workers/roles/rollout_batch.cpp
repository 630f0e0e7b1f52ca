#include "workers/roles/rollout_batch.h"

#include <algorithm>

#include "base/errors.h"
#include "workers/roles/role_model.h"

namespace baton::workers {
namespace {

int64_t meta_int(const DataProto& d, const char* key, int64_t fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_int();
}
bool meta_bool(const DataProto& d, const char* key, bool fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_bool();
}

}  // namespace

double meta_float(const DataProto& d, const char* key, double fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_float();
}

RolloutRequest rollout_request(const DataProto& prompts, int64_t response_length,
                               const std::string& where) {
  prompts.require_tensors({"input_ids", "attention_mask"}, where);
  RolloutRequest req;
  req.ids = prompts.tensor("input_ids").to(at::kLong);
  req.mask = prompts.tensor("attention_mask").to(at::kLong);
  const int64_t n_prompts = req.ids.size(0);

  engine::SamplingParams& sp = req.params;
  sp.n = meta_int(prompts, "n", 1);
  const bool do_sample = meta_bool(prompts, "do_sample", true);
  sp.temperature = do_sample ? meta_float(prompts, "temperature", 1.0) : 0.0;
  const int64_t top_k = meta_int(prompts, "top_k", -1);
  sp.top_k = top_k < 0 ? 0 : top_k;
  sp.top_p = meta_float(prompts, "top_p", 1.0);
  sp.max_new_tokens = meta_int(prompts, "response_length", response_length);
  req.pad_token_id = meta_int(prompts, "pad_token_id", 0);
  sp.ignore_eos = meta_bool(prompts, "ignore_eos", false);
  if (const Value* stop = prompts.meta_value("stop_token_ids");
      stop != nullptr && !stop->is_none()) {
    for (const Value& s : stop->as_list()) sp.stop_token_ids.push_back(s.as_int());
  }
  if (sp.temperature > 0 && !prompts.has_tensor("request_seed")) {
    throw Error(where +
                ": a sampled batch (do_sample, temperature > 0) needs a "
                "'request_seed' tensor, one int64 per prompt: without it every replica would "
                "draw from the same streams and a run could not repeat");
  }
  if (prompts.has_tensor("request_seed")) {
    at::Tensor s = prompts.tensor("request_seed").to(at::kLong).contiguous();
    for (int64_t i = 0; i < n_prompts; ++i)
      req.seeds.push_back(static_cast<uint64_t>(s[i].item<int64_t>()));
  }
  req.prompts = unpadded_prompts(req.ids, req.mask, where);

  const Value* generated = prompts.meta_value("resume_generated");
  const bool has_generated = generated != nullptr && !generated->is_none();
  if (prompts.has_tensor("resume_sample") != has_generated) {
    throw Error(where +
                ": a resumed batch needs both the 'resume_sample' tensor and the "
                "'resume_generated' meta value; it has only " +
                (has_generated ? "resume_generated" : "resume_sample"));
  }
  if (has_generated) {
    if (sp.n != 1) {
      throw Error(where + ": a resumed batch continues one sample per row; meta n must be 1, got " +
                  std::to_string(sp.n));
    }
    at::Tensor s = prompts.tensor("resume_sample").to(at::kLong).contiguous().cpu();
    if (s.dim() != 1 || s.size(0) != n_prompts) {
      throw Error(where + ": 'resume_sample' must be [" + std::to_string(n_prompts) +
                  "] (one sample per prompt row), got " + std::to_string(s.numel()) +
                  " values in " + std::to_string(s.dim()) + " dimensions");
    }
    req.resume_generated = generated->as_int();
    const int64_t* sample = s.data_ptr<int64_t>();
    for (int64_t i = 0; i < n_prompts; ++i)
      req.continuations.push_back({sample[i], req.resume_generated});
  }
  req.report_finished = meta_bool(prompts, "report_finished", false);
  req.full_response_length = meta_int(prompts, "full_response_length", sp.max_new_tokens);
  if (req.full_response_length < sp.max_new_tokens) {
    throw Error(where + ": full_response_length " + std::to_string(req.full_response_length) +
                " is below response_length " + std::to_string(sp.max_new_tokens) +
                " (this call's budget, counted from the response's start)");
  }
  return req;
}

DataProto rollout_result(const RolloutRequest& req,
                         const std::vector<engine::GeneratedSequence>& seqs) {
  const int64_t N = static_cast<int64_t>(seqs.size());
  const int64_t P = req.ids.size(1), R = req.response_width();
  at::Tensor out_prompts = at::empty({N, P}, at::kLong);
  at::Tensor prompt_mask = at::empty({N, P}, at::kLong);
  at::Tensor responses = at::full({N, R}, req.pad_token_id, at::kLong);
  // valid: the response's tokens; response_mask: those the model generated
  // (multi-turn: not a tool's output or the template's glue).
  at::Tensor valid = at::zeros({N, R}, at::kLong);
  at::Tensor response_mask = at::zeros({N, R}, at::kLong);
  at::Tensor rollout_lp = at::zeros({N, R}, at::kFloat);
  at::Tensor finished = at::zeros({N}, at::kLong);
  auto fin = finished.accessor<int64_t, 1>();
  auto rp = responses.accessor<int64_t, 2>();
  auto rm = response_mask.accessor<int64_t, 2>();
  auto va = valid.accessor<int64_t, 2>();
  auto rl = rollout_lp.accessor<float, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const auto& s = seqs[static_cast<size_t>(i)];
    out_prompts[i].copy_(req.ids[s.request]);
    prompt_mask[i].copy_(req.mask[s.request]);
    const int64_t len = std::min<int64_t>(R, static_cast<int64_t>(s.response.size()));
    for (int64_t t = 0; t < len; ++t) {
      rp[i][t] = s.response[static_cast<size_t>(t)];
      va[i][t] = 1;
      rm[i][t] = s.generated_mask.empty() ? 1 : s.generated_mask[static_cast<size_t>(t)];
      if (static_cast<size_t>(t) < s.log_probs.size())
        rl[i][t] = s.log_probs[static_cast<size_t>(t)];
    }
    const int64_t total = req.resume_generated + static_cast<int64_t>(s.response.size());
    fin[i] = s.finish_reason == "stop" || total >= req.full_response_length ? 1 : 0;
  }
  at::Tensor attention = at::cat({prompt_mask, valid}, 1);
  DataProto out;
  out.set_tensor("prompts", out_prompts);
  out.set_tensor("responses", responses);
  out.set_tensor("input_ids", at::cat({out_prompts, responses}, 1));
  out.set_tensor("attention_mask", attention);
  out.set_tensor("position_ids", (attention.cumsum(1) - 1).clamp_min(0));
  out.set_tensor("response_mask", response_mask);
  out.set_tensor("rollout_log_probs", rollout_lp);
  if (req.report_finished) out.set_tensor("finished", finished);
  return out;
}

}  // namespace baton::workers
