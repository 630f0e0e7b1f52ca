// Expert parallelism through the actor worker on the tiny Qwen3-MoE fixture
// (4 experts; 2 workers, dp 2, expert_model_parallel_size 2: each worker
// holds 2 experts): export_hf joins both workers' experts into the HF
// checkpoint, and a separate RolloutWorker, holding every expert, receives
// the trained weights of both EP ranks through weight sync.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <string>

#include "base/atomic_file.h"
#include "dispatch/data_proto.h"
#include "engine/io/hf_model.h"
#include "engine/io/safetensors.h"
#include "runtime/baton.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/rollout_worker.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;

const std::string kMoe = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen3-moe";

ActorRolloutRefOptions ep_actor_options() {
  ActorRolloutRefOptions o;
  o.model.path = kMoe;
  o.model.ep = 2;
  o.optim.lr = 5e-2;
  o.optim.grad_clip = 0;
  o.optim.distributed = false;  // the distributed optimizer refuses EP
  o.update.mini_batch_size = 4;
  o.update.micro_batch_size = 2;
  o.rollout.response_length = 6;
  o.rollout.log_prob_micro_batch_size = 2;
  return o;
}

// Two prompts of the fixture's vocabulary (128 ids), 2 samples each.
DataProto prompts() {
  at::Tensor ids = at::tensor({5, 9, 17, 33, 60, 12, 7, 101}, at::kLong).view({2, 4});
  DataProto d;
  d.set_tensor("input_ids", ids);
  d.set_tensor("attention_mask", at::ones_like(ids));
  d.set_tensor("request_seed", at::tensor({3, 4}, at::kLong));
  d.set_meta("n", Value(int64_t{2}));
  d.set_meta("temperature", Value(1.0));
  return d;
}

TEST(ExpertParallelWorker, ExportJoinsBothEpRanksAndARolloutWorkerGetsTheirTrainedExperts) {
  const ActorRolloutRefOptions o = ep_actor_options();
  ResourcePool actor_pool = ResourcePool::cpu(2), rollout_pool = ResourcePool::cpu(1);
  ParallelLayout layout;
  layout.dp = 2;
  WorkerGroup actor = WorkerGroup::spawn(actor_rollout_ref_worker_class(), actor_pool,
                                         {o.to_json()}, WorkerGroupOptions().set_layout(layout));
  WorkerGroup rollout =
      WorkerGroup::spawn(rollout_worker_class(), rollout_pool, {o.to_json(), int64_t{2}});
  actor.call("init_model", {}).get();
  rollout.call("init_model", {}).get();

  // The untrained export is the fixture, bit for bit: both EP ranks' experts.
  const fs::path dir =
      fs::temp_directory_path() / ("baton_ep_export_" + std::to_string(::getpid()));
  baton::remove_tree(dir);
  actor.call("export_hf", {dir.string()}).get();
  const engine::TensorMap exported = engine::read_hf_weights(dir),
                          fixture = engine::read_hf_weights(kMoe);
  ASSERT_EQ(exported.size(), fixture.size());
  for (const auto& [name, t] : fixture) {
    ASSERT_TRUE(exported.count(name)) << name;
    EXPECT_TRUE(at::equal(exported.at(name), t)) << name;
  }
  EXPECT_EQ(engine::ModelConfig::load(dir).moe.num_experts, 4);
  baton::remove_tree(dir);

  const Value endpoints = rollout.call("weight_sync_endpoint", {}).get();
  const std::string endpoint = endpoints.as_list().at(0).as_string();
  Future<Value> sender = actor.call("init_weight_sync", {endpoint, std::string("ep"), int64_t{1}});
  rollout.call("init_weight_sync", {endpoint, std::string("ep")}).get();
  sender.get();

  // One update moves the actor (both EP ranks' experts) off the fixture.
  auto log_probs = [&](const DataProto& batch) {
    return actor.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
  };
  DataProto batch = actor.call("generate_sequences", {prompts()}).get().as<DataProto>();
  batch.set_meta("temperature", Value(1.0));
  batch.set_tensor("old_log_probs", log_probs(batch));
  batch.set_tensor("advantages",
                   at::tensor({1.0f, -1.0f, -1.0f, 1.0f}).view({4, 1}).expand({4, 6}).contiguous());
  actor.call("update_actor", {batch}).get();

  auto generate = [&] {
    DataProto out = rollout.call("generate_sequences", {prompts()}).get().as<DataProto>();
    out.set_meta("temperature", Value(1.0));
    return out;
  };
  auto gap = [&](const DataProto& out) {  // |actor's log-probs − the rollout's| on its samples
    const at::Tensor mask = out.tensor("response_mask").to(at::kFloat);
    return ((log_probs(out) - out.tensor("rollout_log_probs")) * mask).abs().max().item<double>();
  };
  const double stale = gap(generate());
  EXPECT_GT(stale, 1e-2) << "the update did not move the actor";

  Future<Value> sent = actor.call("send_weights", {int64_t{1}});
  EXPECT_EQ(rollout.call("receive_weights", {}).get().as_list().at(0).as_int(), 1);
  sent.get();
  const DataProto synced = generate();
  EXPECT_EQ(synced.meta_value("param_version")->as_int(), 1);
  EXPECT_LT(gap(synced), 1e-4) << "the rollout generates with the trained experts (stale: " << stale
                               << ")";
}

}  // namespace
}  // namespace baton::workers
