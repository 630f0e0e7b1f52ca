#include "workers/roles/critic_worker.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "dispatch/dispatch_modes.h"
#include "engine/io/checkpoint.h"
#include "workers/algos/value_loss.h"
#include "workers/roles/role_update.h"

namespace baton::workers {

CriticWorker::CriticWorker(const List& init_args) {
  if (init_args.size() != 1 || init_args[0].kind() != ValueKind::kString) {
    throw Error("CriticWorker: expected one init argument, CriticOptions::to_json()");
  }
  options_ = CriticOptions::from_json(init_args[0].as_string());
  options_.model.value_model = true;
}

RoleModel& CriticWorker::critic() {
  if (!critic_) throw Error("CriticWorker: init_model was not called");
  return *critic_;
}

void CriticWorker::init_model() {
  critic_ = std::make_unique<RoleModel>(info(), options_.model, "critic", &options_.optim);
  critic_->idle();
}

DataProto CriticWorker::compute_values(const DataProto& batch) {
  batch.require_tensors({"input_ids", "attention_mask", "responses"}, "compute_values");
  OffloadPhase phase(critic(), /*training=*/false);
  at::Tensor values = critic().response_values(
      batch, {options_.forward_micro_batch_size, options_.forward_max_token_len});
  DataProto out;
  if (values.defined()) out.set_tensor("values", values * response_mask_of(batch));
  return out;
}

DataProto CriticWorker::update_critic(const DataProto& batch) {
  RoleModel& c = critic();
  OffloadPhase phase(c, /*training=*/true);
  const std::vector<std::string> keys = {"input_ids", "attention_mask", "position_ids",
                                         "responses", "response_mask",  "values",
                                         "returns"};
  batch.require_tensors(keys, "update_critic");
  engine::ParallelState& ps = c.state();
  const int64_t R = response_width(batch);
  const algos::LossAggMode agg = algos::parse_loss_agg_mode(options_.update.loss_agg_mode);
  MetricLists metrics;
  for (const DataProto& mini : local_mini_batches(batch.select(keys), options_.update,
                                                  ps.config().dp, updates_, "update_critic")) {
    const algos::GlobalBatchInfo global = global_batch_info(mini, ps);
    std::vector<double> sums(3, 0.0);  // vf_loss, clipfrac·tokens, vpred·mask
    c.optimizer().zero_grad();
    engine::forward_backward(
        c.model(),
        make_micro_batches(mini,
                           c.batching_for(mini, {.rows = options_.update.micro_batch_size,
                                                 .max_tokens = options_.update.max_token_len}),
                           {"response_mask", "values", "returns"}, c.model().device()),
        [&](const at::Tensor& out, const engine::MicroBatch& mb) {
          const int64_t S = padded_width(mb);
          at::Tensor vpreds = padded_columns(out.squeeze(-1), mb, S - R - 1, S - 1);
          const at::Tensor mask = mb.extra.at("response_mask").to(at::kFloat);
          auto vl = algos::compute_value_loss(vpreds, mb.extra.at("returns"), mb.extra.at("values"),
                                              mask, options_.cliprange_value, agg, global);
          const double tokens = mask.sum().item<double>();
          sums[0] += vl.loss.item<double>();
          if (tokens > 0) sums[1] += vl.clipfrac * tokens;
          sums[2] += (vpreds.detach() * mask).sum().item<double>();
          return vl.loss;
        });
    const engine::StepStats step = c.optimizer().step();
    if (ps.is_last_stage()) {
      all_reduce_sum(sums, ps.dp(), ps.device());
      const double tokens = global.batch_num_tokens.value_or(0);
      metrics["critic/vf_loss"].push_back(sums[0] / static_cast<double>(ps.config().dp));
      if (tokens > 0) {
        metrics["critic/vf_clipfrac"].push_back(sums[1] / tokens);
        metrics["critic/vpred_mean"].push_back(sums[2] / tokens);
      }
    }
    metrics["critic/grad_norm"].push_back(step.grad_norm);
    metrics["critic/lr"].push_back(step.lr);
  }
  metrics["perf/resident_gb/critic_update"].push_back(gigabytes(c.resident_bytes()));
  return metrics_proto(metrics);
}

void CriticWorker::save_checkpoint(const std::string& dir, int64_t step,
                                   const std::string& extra_json) {
  nlohmann::json extra =
      extra_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra_json);
  OffloadPhase phase(critic(), /*training=*/true);
  engine::save_checkpoint(dir, step, critic().model(), critic().optimizer(), extra);
}

std::string CriticWorker::load_checkpoint(const std::string& dir, int64_t step) {
  OffloadPhase phase(critic(), /*training=*/true);
  return engine::load_checkpoint(dir, critic().model(), critic().optimizer(),
                                 step < 0 ? std::nullopt : std::optional<int64_t>(step))
      .dump();
}

void CriticWorker::export_hf(const std::string& dir) {
  OffloadPhase phase(critic(), /*training=*/false);
  export_hf_model(critic(), dir);
}

void CriticWorker::register_methods(MethodTable<CriticWorker>& t) {
  namespace mode = dispatch_mode;
  t.def("init_model", &CriticWorker::init_model);
  t.def("compute_values", &CriticWorker::compute_values,
        MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  t.def("update_critic", &CriticWorker::update_critic,
        MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  t.def("save_checkpoint", &CriticWorker::save_checkpoint);
  t.def("load_checkpoint", &CriticWorker::load_checkpoint);
  t.def("export_hf", &CriticWorker::export_hf);
}

BATON_WORKER(CriticWorker);

const char* critic_worker_class() { return "CriticWorker"; }

}  // namespace baton::workers
