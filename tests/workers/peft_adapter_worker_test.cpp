// PEFT adapters through the actor worker (verl's lora_adapter_path and the
// export of a LoRA actor) on the tiny Qwen2 fixture: a TP2 actor started from
// an adapter computes what a DP2 one started from it computes, and far from
// the base; after an update, export_hf writes its adapters to <dir>/adapter,
// from which another actor starts with the trained actor's log-probs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <string>

#include "base/atomic_file.h"
#include "dispatch/data_proto.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "runtime/baton.h"
#include "tests/engine/model_tolerance.h"
#include "tests/tolerance.h"
#include "workers/roles/actor_rollout_ref_worker.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;
using test::Tolerance;

const std::string kModel = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen2";

// A PEFT adapter of the fixture (rank 4, all-linear) with random factors
// (B too), written to `dir`; the single-process model that holds it.
std::shared_ptr<engine::Transformer> write_adapter(const fs::path& dir) {
  engine::HfModel hf = engine::load_hf_model(kModel);
  engine::TransformerOptions o;
  o.lora.rank = 4;
  o.lora.alpha = 16;
  o.lora.targets = {"all-linear"};
  auto model = std::make_shared<engine::Transformer>(hf.config, engine::ParallelState::single(), o);
  model->load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model->shard_spec()));
  engine::TensorMap mine;
  {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
    for (const auto& [name, p] : model->lora_params()) {
      p.copy_(at::normal(0.0, 0.1, p.sizes(), gen));
      mine.emplace(name, p.detach());
    }
  }
  engine::PeftAdapter adapter;
  adapter.lora = o.lora;
  adapter.base_model = kModel;
  adapter.weights =
      engine::lora_shards_to_peft({{mine}}, hf.config, o.lora, {hf.config.num_layers});
  engine::save_peft_adapter(dir, adapter);
  return model;
}

// An actor of the fixture in `tp` (over 2 workers), its adapters from `adapter`.
WorkerGroup spawn_actor(int64_t tp, const fs::path& adapter) {
  ActorRolloutRefOptions o;
  o.model.path = kModel;
  o.model.tp = tp;
  if (!adapter.empty()) {
    o.model.lora = engine::read_peft_adapter_config(adapter);
    o.model.lora_adapter_path = adapter.string();
  }
  o.optim.lr = 1e-2;
  o.update.mini_batch_size = 8;
  o.update.micro_batch_size = 2;
  o.rollout.tp = tp;
  o.rollout.response_length = 6;
  o.rollout.log_prob_micro_batch_size = 3;
  o.ref = true;
  ParallelLayout layout;
  layout.tp = tp;
  layout.dp = 2 / tp;
  ResourcePool pool = ResourcePool::cpu(2);
  WorkerGroup g = WorkerGroup::spawn(actor_rollout_ref_worker_class(), pool, {o.to_json()},
                                     WorkerGroupOptions().set_layout(layout));
  g.call("init_model", {}).get();
  return g;
}

DataProto prompts() {
  at::Tensor ids =
      at::tensor({0, 0, 5, 9, 0, 3, 4, 7, 11, 12, 13, 14, 0, 0, 0, 42}, at::kLong).view({4, 4});
  DataProto d;
  d.set_tensor("input_ids", ids);
  d.set_tensor("attention_mask", (ids != 0).to(at::kLong));
  d.set_tensor("request_seed", at::tensor({11, 22, 33, 44}, at::kLong));
  d.set_meta("n", Value(int64_t{2}));
  d.set_meta("temperature", Value(1.0));
  return d;
}

at::Tensor log_probs(WorkerGroup& g, const DataProto& batch) {
  return g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
}

TEST(ActorRolloutRefWorker, StartsFromAPeftAdapterAndExportsItsTrainedAdapters) {
  const fs::path root =
      fs::temp_directory_path() / ("baton_peft_worker_" + std::to_string(::getpid()));
  baton::remove_tree(root);
  auto model = write_adapter(root / "start");

  WorkerGroup tp2 = spawn_actor(2, root / "start");
  DataProto batch = tp2.call("generate_sequences", {prompts()}).get().as<DataProto>();
  batch.set_meta("temperature", Value(1.0));
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  // The tolerance of two layouts' log-probs of the adapted model.
  const at::Tensor ids = batch.tensor("input_ids");
  std::vector<std::vector<int64_t>> seqs;
  const at::Tensor attn = batch.tensor("attention_mask");
  for (int64_t r = 0; r < ids.size(0); ++r) {
    std::vector<int64_t> s;
    for (int64_t c = 0; c < ids.size(1); ++c)
      if (attn[r][c].item<int64_t>() != 0) s.push_back(ids[r][c].item<int64_t>());
    seqs.push_back(s);
  }
  const Tolerance tol = Tolerance::fp32(engine::test::log_prob_terms(model->config(), ids.size(1)) +
                                            4.0 * 4 * model->config().num_layers,
                                        engine::test::max_abs_logit(*model, seqs));

  const at::Tensor tp2_lp = log_probs(tp2, batch);
  {
    WorkerGroup dp2 = spawn_actor(1, root / "start");
    test::expect_close(log_probs(dp2, batch) * mask, tp2_lp * mask, tol,
                       "DP2 vs TP2 actor started from the adapter");
    WorkerGroup base = spawn_actor(1, "");
    EXPECT_GT(((log_probs(base, batch) - tp2_lp) * mask).abs().max().item<double>(), 100 * tol.atol)
        << "the adapter was not loaded";
  }

  // Train, export: <dir>/adapter holds the trained adapters.
  DataProto update = batch;
  at::Tensor adv = at::ones({batch.size(), 1});
  adv.slice(0, 1, batch.size(), 2).fill_(-1.0);
  update.set_tensor("advantages", adv * mask);
  update.set_tensor("old_log_probs", batch.tensor("rollout_log_probs"));
  tp2.call("update_actor", {update}).get();
  const at::Tensor trained = log_probs(tp2, batch);
  tp2.call("export_hf", {(root / "hf").string()}).get();
  const engine::PeftAdapter exported = engine::load_peft_adapter(root / "hf" / "adapter");
  EXPECT_EQ(exported.base_model, kModel);
  EXPECT_EQ(exported.lora.rank, 4);
  const engine::PeftAdapter start = engine::load_peft_adapter(root / "start");
  ASSERT_EQ(exported.weights.size(), start.weights.size());
  int moved = 0;
  for (const auto& [name, t] : start.weights)
    moved += at::equal(exported.weights.at(name), t) ? 0 : 1;
  EXPECT_GT(moved, 0) << "the exported adapter is the untrained one";
  WorkerGroup again = spawn_actor(1, root / "hf" / "adapter");
  test::expect_close(log_probs(again, batch) * mask, trained * mask, tol,
                     "an actor started from the export vs the trained actor");
  baton::remove_tree(root);
}

}  // namespace
}  // namespace baton::workers
