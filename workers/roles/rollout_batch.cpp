#include "workers/roles/rollout_batch.h"

#include <algorithm>

#include "runtime/errors.h"
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
  return req;
}

DataProto rollout_result(const RolloutRequest& req,
                         const std::vector<engine::GeneratedSequence>& seqs) {
  const int64_t N = static_cast<int64_t>(seqs.size());
  const int64_t P = req.ids.size(1), R = req.params.max_new_tokens;
  at::Tensor out_prompts = at::empty({N, P}, at::kLong);
  at::Tensor prompt_mask = at::empty({N, P}, at::kLong);
  at::Tensor responses = at::full({N, R}, req.pad_token_id, at::kLong);
  at::Tensor response_mask = at::zeros({N, R}, at::kLong);
  at::Tensor rollout_lp = at::zeros({N, R}, at::kFloat);
  auto rp = responses.accessor<int64_t, 2>();
  auto rm = response_mask.accessor<int64_t, 2>();
  auto rl = rollout_lp.accessor<float, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const auto& s = seqs[static_cast<size_t>(i)];
    out_prompts[i].copy_(req.ids[s.request]);
    prompt_mask[i].copy_(req.mask[s.request]);
    const int64_t len = std::min<int64_t>(R, static_cast<int64_t>(s.response.size()));
    for (int64_t t = 0; t < len; ++t) {
      rp[i][t] = s.response[static_cast<size_t>(t)];
      rm[i][t] = 1;
      if (static_cast<size_t>(t) < s.log_probs.size())
        rl[i][t] = s.log_probs[static_cast<size_t>(t)];
    }
  }
  at::Tensor attention = at::cat({prompt_mask, response_mask}, 1);
  DataProto out;
  out.set_tensor("prompts", out_prompts);
  out.set_tensor("responses", responses);
  out.set_tensor("input_ids", at::cat({out_prompts, responses}, 1));
  out.set_tensor("attention_mask", attention);
  out.set_tensor("position_ids", (attention.cumsum(1) - 1).clamp_min(0));
  out.set_tensor("response_mask", response_mask);
  out.set_tensor("rollout_log_probs", rollout_lp);
  return out;
}

}  // namespace baton::workers
