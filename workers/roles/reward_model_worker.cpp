#include "workers/roles/reward_model_worker.h"

#include <ATen/ATen.h>

#include "base/errors.h"
#include "dispatch/dispatch_modes.h"

namespace baton::workers {

RewardModelWorker::RewardModelWorker(const List& init_args) {
  if (init_args.size() != 1 || init_args[0].kind() != ValueKind::kString) {
    throw Error("RewardModelWorker: expected one init argument, RewardModelOptions::to_json()");
  }
  options_ = RewardModelOptions::from_json(init_args[0].as_string());
  options_.model.value_model = true;
}

void RewardModelWorker::init_model() {
  model_ = std::make_unique<RoleModel>(info(), options_.model, "reward_model", nullptr);
  model_->idle();
}

DataProto RewardModelWorker::compute_rm_score(const DataProto& batch) {
  if (!model_) throw Error("RewardModelWorker: init_model was not called");
  batch.require_tensors({"input_ids", "attention_mask", "responses", "response_mask"},
                        "compute_rm_score");
  OffloadPhase phase(*model_, /*training=*/false);
  at::Tensor values = model_->response_values(
      batch, {options_.micro_batch_size, options_.max_token_len}, /*at_tokens=*/true);
  DataProto out;
  if (values.defined())
    out.set_tensor("rm_scores", last_token_scores(values, batch.tensor("response_mask")));
  return out;
}

at::Tensor last_token_scores(const at::Tensor& values, const at::Tensor& response_mask) {
  const at::Tensor mask = response_mask.to(at::kLong);
  const at::Tensor length = mask.sum(1);                           // [N]
  const at::Tensor last = (length - 1).clamp_min(0).unsqueeze(1);  // [N, 1]
  at::Tensor out = at::zeros(values.sizes(), values.options().dtype(at::kFloat));
  const at::Tensor picked = values.to(at::kFloat).gather(1, last) * (length > 0).unsqueeze(1);
  return out.scatter_(1, last, picked);
}

int64_t RewardModelWorker::param_bytes() {
  if (!model_) throw Error("RewardModelWorker: init_model was not called");
  return model_->model().param_bytes();
}

void RewardModelWorker::register_methods(MethodTable<RewardModelWorker>& t) {
  t.def("init_model", &RewardModelWorker::init_model);
  t.def("param_bytes", &RewardModelWorker::param_bytes);
  t.def("compute_rm_score", &RewardModelWorker::compute_rm_score,
        MethodOptions().set_dispatch_mode(dispatch_mode::kMegatronComputeProto));
}

BATON_WORKER(RewardModelWorker);

const char* reward_model_worker_class() { return "RewardModelWorker"; }

}  // namespace baton::workers
