// ActorRolloutRefWorker and CriticWorker in real worker processes on the tiny
// Qwen2 fixture: generation through the HybridEngine, log-probs, values and
// updates, in the layouts the trainer uses (DP2, TP2, PP2 over 2 workers).
//
// Tolerances: the same log-probs in two layouts sum the same terms in other
// orders (TP partial sums, another batch split), and the training-side
// log-prob of a sampled token recomputes the rollout's (a cached decode
// against a full forward): both are Tolerance::fp32 over the terms behind a
// log-prob (tests/engine/model_tolerance.h) at the logits' magnitude.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/atomic_file.h"
#include "dispatch/data_proto.h"
#include "engine/io/hf_model.h"
#include "engine/io/model_config.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "runtime/baton.h"
#include "tests/engine/model_tolerance.h"
#include "tests/tolerance.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/critic_worker.h"
#include "workers/roles/reward_model_worker.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;
using test::Tolerance;

const std::string kModel = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen2";

ActorRolloutRefOptions actor_options(int64_t tp, int64_t pp, int64_t rollout_tp) {
  ActorRolloutRefOptions o;
  o.model.path = kModel;
  o.model.tp = tp;
  o.model.pp = pp;
  o.optim.lr = 1e-2;
  o.optim.grad_clip = 0;  // the layouts' updates compare exactly the gradient they sum
  o.update.mini_batch_size = 8;
  o.update.micro_batch_size = 2;
  o.rollout.tp = rollout_tp;
  o.rollout.response_length = 6;
  o.rollout.log_prob_micro_batch_size = 3;
  o.ref = true;
  return o;
}

// A critic on the fixture: mini-batches of 8 rows, `micro` per micro-batch.
CriticOptions critic_options(int64_t micro) {
  CriticOptions o;
  o.model.path = kModel;
  o.optim.lr = 5e-3;
  o.update.mini_batch_size = 8;
  o.update.micro_batch_size = micro;
  return o;
}

WorkerGroup spawn(const std::string& cls, const std::string& json, int tp, int pp) {
  ResourcePool pool = ResourcePool::cpu(2);
  ParallelLayout layout;
  layout.tp = tp;
  layout.pp = pp;
  layout.dp = 2 / (tp * pp);
  WorkerGroup g = WorkerGroup::spawn(cls, pool, {json}, WorkerGroupOptions().set_layout(layout));
  g.call("init_model", {}).get();
  return g;
}

// Four left-padded prompts of the fixture's vocabulary (128 ids).
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

// The log-prob tolerance for the sequences of `batch` (input_ids, attention_mask):
// the terms behind a log-prob at the largest |logit| the fixture gives them.
Tolerance log_prob_tolerance(const DataProto& batch) {
  engine::HfModel hf = engine::load_hf_model(kModel);
  engine::Transformer model(hf.config, engine::ParallelState::single());
  model.load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model.shard_spec()));
  const at::Tensor ids = batch.tensor("input_ids"), mask = batch.tensor("attention_mask");
  std::vector<std::vector<int64_t>> seqs;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    std::vector<int64_t> s;
    for (int64_t c = 0; c < ids.size(1); ++c)
      if (mask[r][c].item<int64_t>() != 0) s.push_back(ids[r][c].item<int64_t>());
    seqs.push_back(s);
  }
  return Tolerance::fp32(engine::test::log_prob_terms(hf.config, ids.size(1)),
                         engine::test::max_abs_logit(model, seqs));
}

TEST(ActorRolloutRefWorker, GeneratesNSamplesPerPromptInTheTrainingLayout) {
  WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
  DataProto out = g.call("generate_sequences", {prompts()}).get().as<DataProto>();
  ASSERT_EQ(out.size(), 8);
  EXPECT_EQ(out.tensor("prompts").sizes(), (at::IntArrayRef{8, 4}));
  EXPECT_EQ(out.tensor("responses").sizes(), (at::IntArrayRef{8, 6}));
  EXPECT_EQ(out.tensor("input_ids").sizes(), (at::IntArrayRef{8, 10}));
  // Samples of one prompt are adjacent and carry its prompt.
  EXPECT_TRUE(at::equal(out.tensor("prompts")[0], prompts().tensor("input_ids")[0]));
  EXPECT_TRUE(at::equal(out.tensor("prompts")[7], prompts().tensor("input_ids")[3]));
  // Attention = prompt mask then response mask; responses have >= 1 token.
  const at::Tensor rm = out.tensor("response_mask");
  EXPECT_TRUE(at::equal(out.tensor("attention_mask").slice(1, 4), rm));
  EXPECT_TRUE((rm.sum(1) >= 1).all().item<bool>());
  // The two samples of a prompt come from different streams.
  EXPECT_FALSE(at::equal(out.tensor("responses")[0], out.tensor("responses")[1]) &&
               at::equal(out.tensor("responses")[2], out.tensor("responses")[3]) &&
               at::equal(out.tensor("responses")[4], out.tensor("responses")[5]));
}

TEST(ActorRolloutRefWorker, TrainingLogProbsMatchTheRolloutsAndAgreeAcrossLayouts) {
  DataProto batch, greedy;
  at::Tensor dp2_lp;
  DataProto greedy_prompts = prompts();
  greedy_prompts.set_meta("do_sample", Value(false));
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = g.call("generate_sequences", {prompts()}).get().as<DataProto>();
    batch.set_meta("temperature", Value(1.0));
    greedy = g.call("generate_sequences", {greedy_prompts}).get().as<DataProto>();
    dp2_lp = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    const at::Tensor ref =
        g.call("compute_ref_log_prob", {batch}).get().as<DataProto>().tensor("ref_log_prob");
    const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
    test::expect_close(dp2_lp * mask, batch.tensor("rollout_log_probs") * mask,
                       log_prob_tolerance(batch), "old log-probs vs the rollout's");
    // Before any update the reference is the actor.
    test::expect_close(ref * mask, dp2_lp * mask, Tolerance::exact(), "ref vs actor before update");
  }
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    WorkerGroup g =
        spawn(actor_rollout_ref_worker_class(), actor_options(tp, pp, tp).to_json(), tp, pp);
    const at::Tensor lp =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
    test::expect_close(lp * mask, dp2_lp * mask, log_prob_tolerance(batch),
                       "log-probs tp" + std::to_string(tp) + " pp" + std::to_string(pp));
    // The same seeds sample the same sequences in another rollout layout
    // (greedy, so that a rounding difference cannot flip a draw).
    DataProto here = g.call("generate_sequences", {greedy_prompts}).get().as<DataProto>();
    EXPECT_TRUE(at::equal(here.tensor("responses"), greedy.tensor("responses")))
        << "tp" << tp << " pp" << pp;
  }
}

// Σ_v π(v)² of every response position of `batch` under logits /
// `temperature`, from the fixture's full logits in one process (verl's
// exp(logsumexp(2l) − 2·logsumexp(l)), in double); 0 past a response's end.
at::Tensor reference_sum_pi_squared(const DataProto& batch, double temperature) {
  engine::HfModel hf = engine::load_hf_model(kModel);
  engine::Transformer model(hf.config, engine::ParallelState::single());
  model.load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model.shard_spec()));
  at::NoGradGuard no_grad;
  const at::Tensor ids = batch.tensor("input_ids"), mask = batch.tensor("attention_mask");
  const int64_t R = batch.tensor("responses").size(1), P = ids.size(1) - R;
  at::Tensor out = at::zeros({ids.size(0), R}, at::kDouble);
  for (int64_t r = 0; r < ids.size(0); ++r) {
    const at::Tensor seq = ids[r].masked_select(mask[r].ne(0)).view({1, -1});
    const int64_t n = seq.size(1);
    const int64_t prompt = mask[r].slice(0, 0, P).ne(0).sum().item<int64_t>();
    const at::Tensor x =
        model.forward(seq, at::arange(n, at::kLong).view({1, n}), at::ones({1, n}, at::kLong))[0]
            .to(at::kDouble) /
        temperature;
    for (int64_t t = 0; prompt + t < n; ++t) {
      const at::Tensor l = x[prompt - 1 + t];
      out[r][t] = (at::logsumexp(2 * l, 0) - 2 * at::logsumexp(l, 0)).exp();
    }
  }
  return out;
}

TEST(ActorRolloutRefWorker, SumPiSquaredIsTheSoftmaxSquareSumInEveryLayout) {
  DataProto batch;
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = g.call("generate_sequences", {prompts()}).get().as<DataProto>();
  }
  // The distribution of the log-probs: logits / temperature.
  batch.set_meta("temperature", Value(0.7));
  const at::Tensor expected = reference_sum_pi_squared(batch, 0.7);
  const at::Tensor mask = batch.tensor("response_mask").to(at::kDouble);
  // A logit error δ (the log-prob tolerance's absolute part, / 0.7 here)
  // moves log Σe^{2l} by up to 2δ and 2·log Σe^l by 2δ: Σπ² ≤ 1 moves by at
  // most 4δ.
  const Tolerance tol{4 * log_prob_tolerance(batch).atol / 0.7, 0};
  DataProto asked = batch;
  asked.set_meta("calculate_sum_pi_squared", Value(true));
  for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
    const std::string layout = "tp" + std::to_string(tp) + " pp" + std::to_string(pp);
    WorkerGroup g =
        spawn(actor_rollout_ref_worker_class(), actor_options(tp, pp, tp).to_json(), tp, pp);
    EXPECT_FALSE(
        g.call("compute_log_prob", {batch}).get().as<DataProto>().has_tensor("sum_pi_squared"))
        << layout << ": only when asked";
    const DataProto out = g.call("compute_log_prob", {asked}).get().as<DataProto>();
    test::expect_close(out.tensor("sum_pi_squared").to(at::kDouble) * mask, expected * mask, tol,
                       "sum_pi_squared " + layout);
  }
  // The fused LM head forms no logits: the call fails naming the key to change.
  ActorRolloutRefOptions fused = actor_options(1, 1, 1);
  fused.model.fused_lm_head = true;
  WorkerGroup g = spawn(actor_rollout_ref_worker_class(), fused.to_json(), 1, 1);
  try {
    g.call("compute_log_prob", {asked}).get();
    ADD_FAILURE() << "a fused LM head returned sum_pi_squared";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_fused_kernels=false"), std::string::npos) << e.what();
  }
}

DataProto with_advantages(DataProto batch) {
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  // Rows alternate +1 / -1: half the samples are reinforced.
  at::Tensor adv = at::ones({batch.size(), 1});
  adv.slice(0, 1, batch.size(), 2).fill_(-1.0);
  batch.set_tensor("advantages", adv * mask);
  batch.set_tensor("old_log_probs", batch.tensor("rollout_log_probs"));
  batch.set_meta("temperature", Value(1.0));
  return batch;
}

// The first value of metric `key` in an update's result.
double metric(const DataProto& result, const std::string& key) {
  for (const auto& [k, v] : result.meta_value("metrics")->as_dict())
    if (k == key) return v.as_list().at(0).as_float();
  ADD_FAILURE() << "no metric " << key;
  return 0;
}

TEST(ActorRolloutRefWorker, AnUpdateRaisesReinforcedSamplesAndIsTheSameInEveryLayout) {
  DataProto batch;
  at::Tensor before, after_dp2;
  double grad_norm_dp2 = 0;
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    before = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    const Value* metrics = m.meta_value("metrics");
    ASSERT_NE(metrics, nullptr);
    bool saw_pg_loss = false, saw_grad_norm = false;
    for (const auto& [k, v] : metrics->as_dict()) {
      for (const Value& x : v.as_list()) EXPECT_TRUE(std::isfinite(x.as_float())) << k;
      saw_pg_loss |= k == "actor/pg_loss";
      saw_grad_norm |= k == "actor/grad_norm";
    }
    EXPECT_TRUE(saw_pg_loss && saw_grad_norm);
    grad_norm_dp2 = metric(m, "actor/grad_norm");
    after_dp2 = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
  }
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  const at::Tensor seq_delta = ((after_dp2 - before) * mask).sum(1);
  // +1 rows (even) gain log-probability, -1 rows (odd) lose it.
  EXPECT_GT(seq_delta.slice(0, 0, 8, 2).mean().item<double>(), 0);
  EXPECT_LT(seq_delta.slice(0, 1, 8, 2).mean().item<double>(), 0);

  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}}) {
    WorkerGroup g =
        spawn(actor_rollout_ref_worker_class(), actor_options(tp, pp, tp).to_json(), tp, pp);
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    // The gradient norm (before clipping) is the same whatever the split:
    // the loss is normalised by the global token count and DP averages. A
    // scaling mistake shows here (AdamW's first step would hide it).
    const auto cfg = engine::ModelConfig::load(kModel);
    const double terms =
        engine::test::gradient_terms(cfg, batch.tensor("input_ids").size(1),
                                     batch.tensor("response_mask").sum().item<int64_t>());
    test::expect_near(metric(m, "actor/grad_norm"), grad_norm_dp2,
                      Tolerance::fp32(terms, grad_norm_dp2),
                      "grad norm tp" + std::to_string(tp) + " pp" + std::to_string(pp));
    const at::Tensor after =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    // One AdamW step from the same weights: the update's first step moves each
    // parameter by about lr·sign(grad), so layouts agree to the log-prob
    // tolerance scaled by how far the weights moved (lr 1e-2 on weights of
    // scale 0.02 is a large relative step; allow the gradient's rounding to
    // flip signs of near-zero gradients only).
    const at::Tensor diff = ((after - after_dp2) * mask).abs().max();
    const at::Tensor moved = ((after_dp2 - before) * mask).abs().max();
    EXPECT_LT(diff.item<double>(), 0.05 * moved.item<double>() + 1e-4) << "tp" << tp << " pp" << pp;
  }
}

// Without old_log_probs an update is on-policy: the old log-probs are its own
// forward pass's, detached. The gradient is then the one computed against a
// separate pass's log-probs (the ratio is 1 either way, to fp32 rounding),
// and an update of several mini-batches without them is refused.
TEST(ActorRolloutRefWorker, AnOnPolicyUpdateWithoutOldLogProbsUsesItsOwnPass) {
  double with_old = 0;
  DataProto batch;
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    batch.set_tensor(
        "old_log_probs",
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs"));
    with_old = metric(g.call("update_actor", {batch}).get().as<DataProto>(), "actor/grad_norm");
  }
  DataProto fresh = batch.select(
      {"input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages"});
  fresh.set_meta("temperature", Value(1.0));
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    DataProto m = g.call("update_actor", {fresh}).get().as<DataProto>();
    const auto cfg = engine::ModelConfig::load(kModel);
    const double terms =
        engine::test::gradient_terms(cfg, batch.tensor("input_ids").size(1),
                                     batch.tensor("response_mask").sum().item<int64_t>());
    test::expect_near(metric(m, "actor/grad_norm"), with_old, Tolerance::fp32(terms, with_old),
                      "on-policy grad norm");
    EXPECT_EQ(metric(m, "actor/pg_clipfrac"), 0.0);
  }
  ActorRolloutRefOptions two = actor_options(1, 1, 1);
  two.update.mini_batch_size = 4;
  WorkerGroup g = spawn(actor_rollout_ref_worker_class(), two.to_json(), 1, 1);
  try {
    g.call("update_actor", {fresh}).get();
    ADD_FAILURE() << "an update of 2 mini-batches without old_log_probs ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no old_log_probs"), std::string::npos) << e.what();
  }
}

TEST(ActorRolloutRefWorker, AnExportThatFailsOnOneRankFailsOnAllAndLeavesTheGroupUsable) {
  // DP 2: rank 0 alone prepares the folder; here it cannot (its parent is a
  // file). Every rank reports the failure at once, instead of rank 1 waiting
  // at a barrier for the group timeout, and the group still works after it.
  const fs::path tmp =
      fs::temp_directory_path() / ("baton_export_fail_" + std::to_string(::getpid()));
  baton::remove_tree(tmp);
  fs::create_directories(tmp);
  { std::ofstream(tmp / "a_file") << "x"; }
  WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
  try {
    g.call("export_hf", {(tmp / "a_file" / "hf").string()}).get();
    ADD_FAILURE() << "an export under a regular file succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a_file"), std::string::npos) << e.what();
  }
  g.call("export_hf", {(tmp / "hf").string()}).get();
  EXPECT_TRUE(fs::exists(tmp / "hf" / "config.json"));
  baton::remove_tree(tmp);
}

TEST(CriticWorker, ValuesComeFromAFreshHeadAndUpdatesFitTheReturns) {
  CriticOptions o = critic_options(4);
  o.update.epochs = 4;
  DataProto batch;
  {
    WorkerGroup a = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = a.call("generate_sequences", {prompts()}).get().as<DataProto>();
  }
  WorkerGroup g = spawn(critic_worker_class(), o.to_json(), 1, 1);
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  const at::Tensor v0 = g.call("compute_values", {batch}).get().as<DataProto>().tensor("values");
  ASSERT_EQ(v0.sizes(), mask.sizes());
  EXPECT_TRUE(at::equal(v0 * (1 - mask), at::zeros_like(v0)));
  batch.set_tensor("values", v0);
  batch.set_tensor("returns", mask * 1.0);
  const auto err = [&](const at::Tensor& v) {
    return (((v - 1.0) * mask).pow(2).sum() / mask.sum()).item<double>();
  };
  const double before = err(v0);
  g.call("update_critic", {batch}).get();
  const at::Tensor v1 = g.call("compute_values", {batch}).get().as<DataProto>().tensor("values");
  EXPECT_LT(err(v1), 0.5 * before);
}

// Offload (param_offload, grad_offload, optimizer_offload; the reference's
// param_offload): between phases the role's memory leaves (a spill file on
// the CPU) and comes back bit for bit, so two updates, their log-probs and
// the reference's are exactly those of the run that keeps everything; the
// role's resident bytes drop to nothing while it is idle.
TEST(ActorRolloutRefWorker, OffloadBetweenPhasesTrainsBitIdenticallyAndFreesTheRole) {
  DataProto batch;
  std::vector<at::Tensor> results[2];
  std::vector<double> grad_norms[2];
  MetricLists offloaded_metrics;
  for (int offload : {0, 1}) {
    ActorRolloutRefOptions o = actor_options(1, 1, 1);
    o.model.offload =
        OffloadOptions{.params = offload == 1, .grads = offload == 1, .optimizer = offload == 1};
    o.ref_param_offload = offload == 1;
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), o.to_json(), 1, 1);
    if (offload == 0) {
      batch = with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    } else {
      // The rollout runs from offloaded parameters too (they come back for it).
      EXPECT_TRUE(at::equal(
          g.call("generate_sequences", {prompts()}).get().as<DataProto>().tensor("responses"),
          batch.tensor("responses")));
    }
    for (int step = 0; step < 2; ++step) {
      DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
      grad_norms[offload].push_back(metric(m, "actor/grad_norm"));
      if (offload == 1) {
        for (const auto& [k, v] : m.meta_value("metrics")->as_dict())
          for (const Value& x : v.as_list()) offloaded_metrics[k].push_back(x.as_float());
      }
      results[offload].push_back(
          g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs"));
    }
    results[offload].push_back(
        g.call("compute_ref_log_prob", {batch}).get().as<DataProto>().tensor("ref_log_prob"));
  }
  for (size_t i = 0; i < results[0].size(); ++i)
    EXPECT_TRUE(at::equal(results[1][i], results[0][i])) << "result " << i;
  EXPECT_EQ(grad_norms[1], grad_norms[0]);
  // During the update: parameters, gradients and AdamW state (each DP rank's
  // half of the two moments): three parameter-sized parts. Idle: only the
  // gradient buffer, which the distributed optimizer keeps in the DP ranks'
  // shared-memory segment (not this process's allocator's to free): a third.
  const auto& update = offloaded_metrics["perf/resident_gb/actor_update"];
  const auto& idle = offloaded_metrics["perf/resident_gb/actor_idle"];
  ASSERT_EQ(update.size(), 4u);  // 2 ranks × 2 updates
  ASSERT_EQ(idle.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(update[i], 0.0);
    EXPECT_LT(idle[i], 0.4 * update[i]) << "update " << update[i];
  }
}

// LoRA (ModelOptions::lora, rank 4 on every linear layer), as verl uses it:
// an update trains the adapters only, so the reference log-probs (the
// actor's own model with its adapters off, no second copy) stay those of the
// untrained model bit for bit while the actor's move; and the rollout
// generates with the adapters, both where it shares the actor's weights (DP2)
// and where they are resharded into a rollout model (TP2, merged there), as
// does the HF model export_hf writes.
TEST(ActorRolloutRefWorker, ALoraActorTrainsItsAdaptersOnlyAndTheRolloutGeneratesWithThem) {
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp" + std::to_string(tp));
    ActorRolloutRefOptions o = actor_options(tp, 1, tp);
    o.model.lora.rank = 4;
    o.model.lora.alpha = 16;
    o.model.lora.targets = {"all-linear"};
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), o.to_json(), tp, 1);
    auto log_probs = [&](const DataProto& batch) {
      return g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    };
    auto ref_log_probs = [&](const DataProto& batch) {
      return g.call("compute_ref_log_prob", {batch}).get().as<DataProto>().tensor("ref_log_prob");
    };
    const DataProto batch =
        with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
    const at::Tensor untrained = log_probs(batch), ref_before = ref_log_probs(batch);
    // A fresh adapter adds zeros: the reference is the untrained actor.
    EXPECT_TRUE(at::equal(ref_before, untrained));
    g.call("update_actor", {batch}).get();
    // (a) The base did not move: the reference is still the untrained model.
    EXPECT_TRUE(at::equal(ref_log_probs(batch), untrained));
    // (b) The adapters did.
    EXPECT_GT(((log_probs(batch) - untrained) * mask).abs().max().item<double>(), 1e-2);
    // (c) The rollout samples with the adapters: its log-probs are the
    // trained actor's, and far from the base's.
    const DataProto after =
        with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    const at::Tensor after_mask = after.tensor("response_mask").to(at::kFloat);
    const at::Tensor rollout = after.tensor("rollout_log_probs") * after_mask;
    const Tolerance tol = log_prob_tolerance(after);
    test::expect_close(log_probs(after) * after_mask, rollout, tol,
                       "the LoRA actor's log-probs vs its rollout's");
    EXPECT_GT((ref_log_probs(after) * after_mask - rollout).abs().max().item<double>(),
              100 * tol.atol)
        << "the rollout generated with the base weights";
    // export_hf writes the merged weights: a plain model loaded from them
    // computes the adapted log-probs (W + s·B A rounded once more).
    const fs::path dir =
        fs::temp_directory_path() /
        ("baton_lora_export_" + std::to_string(::getpid()) + "_tp" + std::to_string(tp));
    baton::remove_tree(dir);
    g.call("export_hf", {dir.string()}).get();
    ActorRolloutRefOptions plain = actor_options(1, 1, 1);
    plain.model.path = dir.string();
    WorkerGroup merged = spawn(actor_rollout_ref_worker_class(), plain.to_json(), 1, 1);
    const at::Tensor from_export =
        merged.call("compute_log_prob", {after}).get().as<DataProto>().tensor("old_log_probs");
    test::expect_close(from_export * after_mask, log_probs(after) * after_mask,
                       Tolerance{2 * tol.atol, 2 * tol.rtol}, "the merged export's log-probs");
    baton::remove_tree(dir);
  }
}

// Rows of 3, 5, 2 and 4 real tokens in a padded width of 6 (left-padded),
// token ids 1.. by position.
DataProto four_rows() {
  at::Tensor mask = at::tensor({0, 0, 0, 1, 1, 1,  //
                                0, 1, 1, 1, 1, 1,  //
                                0, 0, 0, 0, 1, 1,  //
                                0, 0, 1, 1, 1, 1},
                               at::kLong)
                        .view({4, 6});
  DataProto batch;
  batch.set_tensor("input_ids", (at::arange(24, at::kLong).view({4, 6}) + 1) * mask);
  batch.set_tensor("attention_mask", mask);
  return batch;
}

// Dynamic batch size: micro-batches hold whole sequences up to a token
// budget, packed into one row without padding.
TEST(MakeMicroBatches, PacksWholeRowsUpToTheTokenBudgetAndMapsColumnsBack) {
  DataProto batch = four_rows();
  const at::Tensor ids = batch.tensor("input_ids");
  const at::Tensor mask = batch.tensor("attention_mask");
  batch.set_tensor("advantages", at::arange(4, at::kFloat).view({4, 1}));
  const auto mbs =
      make_micro_batches(batch, {.rows = 1, .max_tokens = 8}, {"advantages"}, at::Device(at::kCPU));
  // In order: {3, 5} = 8, then {2, 4} = 6.
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[0].packed_lengths, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(mbs[1].packed_lengths, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(
      at::equal(mbs[0].input_ids, at::tensor({4, 5, 6, 8, 9, 10, 11, 12}, at::kLong).view({1, 8})));
  // Positions restart at each sequence.
  EXPECT_TRUE(
      at::equal(mbs[1].position_ids, at::tensor({0, 1, 0, 1, 2, 3}, at::kLong).view({1, 6})));
  EXPECT_TRUE(at::equal(mbs[1].extra.at("advantages"), at::tensor({2.0f, 3.0f}).view({2, 1})));
  // Columns map back: the last two columns of rows 2 and 3.
  const at::Tensor back = padded_columns(mbs[1].input_ids, mbs[1], 4, 6);
  EXPECT_TRUE(at::equal(back, ids.slice(0, 2, 4).slice(1, 4, 6)));
  EXPECT_EQ(padded_width(mbs[1]), 6);

  // A row longer than the budget is named; so is an empty one.
  try {
    make_micro_batches(batch, {.rows = 1, .max_tokens = 4}, {}, at::Device(at::kCPU));
    ADD_FAILURE() << "no error for a 5-token row in a budget of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 has 5 tokens"), std::string::npos) << e.what();
  }
  batch.set_tensor("attention_mask", mask * (at::arange(4).view({4, 1}) != 2).to(at::kLong));
  EXPECT_THROW(make_micro_batches(batch, {.rows = 1, .max_tokens = 8}, {}, at::Device(at::kCPU)),
               Error);
}

// Expert parallelism: the EP ranks agree on a micro-batch count and each
// cuts its rows into exactly that many (fixed rows as evenly as possible,
// packed groups split at their widest); too few rows is an error.
TEST(MakeMicroBatches, CutsExactlyTheAgreedCount) {
  const DataProto batch = four_rows();
  const at::Device cpu(at::kCPU);
  EXPECT_EQ(natural_micro_batches(batch, {.rows = 4}), 1);
  EXPECT_EQ(natural_micro_batches(batch, {.rows = 1, .max_tokens = 8}), 2);

  const auto rows = make_micro_batches(batch, {.rows = 4, .count = 3}, {}, cpu);
  ASSERT_EQ(rows.size(), 3u);
  std::vector<int64_t> sizes;
  for (const auto& mb : rows) sizes.push_back(mb.input_ids.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_TRUE(at::equal(rows[2].input_ids, batch.tensor("input_ids").slice(0, 3, 4)));

  // {3, 5} and {2, 4} → {3}, {5}, {2, 4}: the first widest group split.
  const auto packed = make_micro_batches(batch, {.rows = 1, .max_tokens = 8, .count = 3}, {}, cpu);
  ASSERT_EQ(packed.size(), 3u);
  EXPECT_EQ(packed[0].packed_lengths, (std::vector<int64_t>{3}));
  EXPECT_EQ(packed[1].packed_lengths, (std::vector<int64_t>{5}));
  EXPECT_EQ(packed[2].packed_lengths, (std::vector<int64_t>{2, 4}));

  try {
    make_micro_batches(batch, {.rows = 1, .count = 5}, {}, cpu);
    ADD_FAILURE() << "4 rows were cut into 5 micro-batches";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 rows cannot make the 5 micro-batches"),
              std::string::npos)
        << e.what();
  }
}

// Sequence parallelism needs the sequence to divide by tp: padded rows get
// masked columns on the left, a packed row a padding sequence at its end;
// the columns counted from a row's end are the same.
TEST(MakeMicroBatches, PadsTheSequenceToAMultipleAndKeepsTheColumnsFromTheEnd) {
  at::Tensor mask = at::tensor({0, 0, 0, 1, 1, 1,  //
                                0, 1, 1, 1, 1, 1,  //
                                0, 0, 0, 0, 1, 1},
                               at::kLong)
                        .view({3, 6});
  at::Tensor ids = (at::arange(18, at::kLong).view({3, 6}) + 1) * mask;
  DataProto batch;
  batch.set_tensor("input_ids", ids);
  batch.set_tensor("attention_mask", mask);
  const at::Device cpu(at::kCPU);

  const auto padded = make_micro_batches(batch, {.rows = 2, .sequence_multiple = 4}, {}, cpu);
  ASSERT_EQ(padded.size(), 2u);
  for (const auto& mb : padded) {
    ASSERT_EQ(mb.input_ids.size(1), 8);
    EXPECT_EQ(padded_width(mb), 8);
    EXPECT_EQ(mb.attention_mask.slice(1, 0, 2).abs().sum().item<int64_t>(), 0);
  }
  EXPECT_TRUE(at::equal(padded_columns(padded[0].input_ids, padded[0], 3, 8),
                        ids.slice(0, 0, 2).slice(1, 1, 6)));
  EXPECT_TRUE(at::equal(padded[1].attention_mask.slice(1, 2), mask.slice(0, 2, 3)));
  EXPECT_TRUE(at::equal(padded[0].position_ids.slice(1, 2),
                        (mask.slice(0, 0, 2).cumsum(1) - 1).clamp_min(0)));
  // Already a multiple: nothing added.
  EXPECT_EQ(
      make_micro_batches(batch, {.rows = 3, .sequence_multiple = 3}, {}, cpu)[0].input_ids.size(1),
      6);

  // Packed: {3, 5} = 8 tokens stays, {2} becomes {2, 2}.
  const auto packed =
      make_micro_batches(batch, {.rows = 1, .max_tokens = 8, .sequence_multiple = 4}, {}, cpu);
  ASSERT_EQ(packed.size(), 2u);
  EXPECT_EQ(packed[0].packed_lengths, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(packed[1].packed_lengths, (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(packed[1].position_ids, at::tensor({0, 1, 0, 1}, at::kLong).view({1, 4})));
  EXPECT_EQ(packed[1].attention_mask.sum().item<int64_t>(), 4);
  EXPECT_EQ(padded_width(packed[1]), 6);
  EXPECT_TRUE(at::equal(padded_columns(packed[1].input_ids, packed[1], 4, 6),
                        ids.slice(0, 2, 3).slice(1, 4, 6)));

  EXPECT_THROW(make_micro_batches(batch, {.rows = 1, .sequence_multiple = 0}, {}, cpu), Error);
}

// enable_gradient_checkpointing (full recomputation) and Megatron sequence
// parallelism change what a rank keeps in memory, not what it computes: the
// log-probs (the reference's too), the loss, the gradient norm and the
// updated policy are the DP2 run's, to the rounding of the layouts' sums.
// At tp 2 the packed log-prob forwards (budget 15) have odd lengths, which
// the role pads for sequence parallelism; generation runs without it.
TEST(ActorRolloutRefWorker, RecomputeAndSequenceParallelismGiveTheSameLogProbsAndUpdate) {
  DataProto batch;
  at::Tensor lp_plain, after_plain;
  double grad_norm_plain = 0, pg_loss_plain = 0;
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    lp_plain = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    grad_norm_plain = metric(m, "actor/grad_norm");
    pg_loss_plain = metric(m, "actor/pg_loss");
    after_plain = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
  }
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  const auto cfg = engine::ModelConfig::load(kModel);
  const double terms = engine::test::gradient_terms(cfg, batch.tensor("input_ids").size(1),
                                                    mask.sum().item<int64_t>());
  struct Case {
    int64_t tp;
    bool recompute, sequence_parallel;
  };
  for (const Case k : {Case{1, true, false}, Case{2, false, true}, Case{2, true, true}}) {
    ActorRolloutRefOptions o = actor_options(k.tp, 1, k.tp);
    o.model.recompute_activations = k.recompute;
    o.model.sequence_parallel = k.sequence_parallel;
    if (k.sequence_parallel) {
      o.rollout.log_prob_max_token_len = 15;
      o.ref_log_prob_max_token_len = 15;
    }
    const std::string where = "tp" + std::to_string(k.tp) + (k.recompute ? " recompute" : "") +
                              (k.sequence_parallel ? " sp" : "");
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), o.to_json(), static_cast<int>(k.tp), 1);
    if (k.sequence_parallel) {
      DataProto gen = g.call("generate_sequences", {prompts()}).get().as<DataProto>();
      EXPECT_EQ(gen.tensor("responses").sizes(), (at::IntArrayRef{8, 6})) << where;
    }
    const at::Tensor lp =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    test::expect_close(lp * mask, lp_plain * mask, log_prob_tolerance(batch), where + " log-probs");
    const at::Tensor ref =
        g.call("compute_ref_log_prob", {batch}).get().as<DataProto>().tensor("ref_log_prob");
    test::expect_close(ref * mask, lp * mask, Tolerance::exact(), where + " ref log-probs");
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    test::expect_near(metric(m, "actor/grad_norm"), grad_norm_plain,
                      Tolerance::fp32(terms, grad_norm_plain), where + " grad norm");
    test::expect_near(metric(m, "actor/pg_loss"), pg_loss_plain, Tolerance::fp32(terms, 1.0),
                      where + " pg loss");
    const at::Tensor after =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    const at::Tensor diff = ((after - after_plain) * mask).abs().max();
    const at::Tensor moved = ((after_plain - lp_plain) * mask).abs().max();
    EXPECT_LT(diff.item<double>(), 0.05 * moved.item<double>() + 1e-4) << where;
  }
}

// Log-probs, values, losses and gradients of packed micro-batches equal the
// padded path's (to the rounding of another attention length), in the DP2
// and PP2 layouts; budgets of 12 and 15 tokens put one or two of the
// 10-column sequences in each micro-batch.
TEST(ActorRolloutRefWorker, DynamicBatchSizeGivesThePaddedPathsLogProbsAndUpdate) {
  DataProto batch;
  at::Tensor lp_padded, after_padded, values_padded;
  double grad_norm_padded = 0, pg_loss_padded = 0;
  {
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = with_advantages(g.call("generate_sequences", {prompts()}).get().as<DataProto>());
    // A multi-turn trajectory's hole: the second response token of each row
    // with three or more stands for a tool turn's appended token (attended,
    // not trained): the packed paths must mask it as the padded one does.
    at::Tensor holes = batch.tensor("response_mask").clone();
    holes.select(1, 1).mul_(1 - holes.select(1, 2));
    batch.set_tensor("response_mask", holes);
    lp_padded = g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    grad_norm_padded = metric(m, "actor/grad_norm");
    pg_loss_padded = metric(m, "actor/pg_loss");
    after_padded =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
  }
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  const auto cfg = engine::ModelConfig::load(kModel);
  const double terms = engine::test::gradient_terms(cfg, batch.tensor("input_ids").size(1),
                                                    mask.sum().item<int64_t>());
  for (auto [tp, pp] : {std::pair{1, 1}, std::pair{1, 2}}) {
    ActorRolloutRefOptions o = actor_options(tp, pp, tp);
    o.update.max_token_len = 12;
    o.rollout.log_prob_max_token_len = 15;
    o.ref_log_prob_max_token_len = 15;
    const std::string where = "packed pp" + std::to_string(pp);
    WorkerGroup g = spawn(actor_rollout_ref_worker_class(), o.to_json(), tp, pp);
    const at::Tensor lp =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    test::expect_close(lp * mask, lp_padded * mask, log_prob_tolerance(batch),
                       where + " log-probs");
    const at::Tensor ref =
        g.call("compute_ref_log_prob", {batch}).get().as<DataProto>().tensor("ref_log_prob");
    test::expect_close(ref * mask, lp * mask, Tolerance::exact(), where + " ref log-probs");
    DataProto m = g.call("update_actor", {batch}).get().as<DataProto>();
    // The loss sums ratio·advantage terms of magnitude 1 (advantages ±1,
    // ratios near 1) that nearly cancel: its tolerance is theirs.
    test::expect_near(metric(m, "actor/grad_norm"), grad_norm_padded,
                      Tolerance::fp32(terms, grad_norm_padded), where + " grad norm");
    test::expect_near(metric(m, "actor/pg_loss"), pg_loss_padded, Tolerance::fp32(terms, 1.0),
                      where + " pg loss");
    const at::Tensor after =
        g.call("compute_log_prob", {batch}).get().as<DataProto>().tensor("old_log_probs");
    const at::Tensor diff = ((after - after_padded) * mask).abs().max();
    const at::Tensor moved = ((after_padded - lp_padded) * mask).abs().max();
    EXPECT_LT(diff.item<double>(), 0.05 * moved.item<double>() + 1e-4) << where;
  }

  // The critic: values and a value-loss update, padded against packed.
  CriticOptions c = critic_options(2);
  c.optim.grad_clip = 0;
  std::vector<at::Tensor> values, updated;
  for (int64_t budget : {0, 12}) {
    c.update.max_token_len = budget;
    c.forward_max_token_len = budget;
    WorkerGroup g = spawn(critic_worker_class(), c.to_json(), 1, 1);
    values.push_back(g.call("compute_values", {batch}).get().as<DataProto>().tensor("values"));
    DataProto b = batch;
    b.set_tensor("values", values.front());
    b.set_tensor("returns", mask * 1.0);
    g.call("update_critic", {b}).get();
    updated.push_back(g.call("compute_values", {batch}).get().as<DataProto>().tensor("values"));
  }
  const double vm = std::max(1.0, values[0].abs().max().item<double>());
  test::expect_close(
      values[1], values[0],
      Tolerance::fp32(engine::test::logit_terms(cfg, batch.tensor("input_ids").size(1)), vm),
      "packed values");
  const double moved = (updated[0] - values[0]).abs().max().item<double>();
  EXPECT_LT((updated[1] - updated[0]).abs().max().item<double>(), 0.05 * moved + 1e-4)
      << "packed critic update";
}

}  // namespace
}  // namespace baton::workers

namespace baton::workers {
namespace {

TEST(RewardModelWorker, ScoresEachResponseAtItsLastTokenInEveryLayout) {
  const std::string value_model = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen2-value";
  DataProto batch;
  {
    WorkerGroup a = spawn(actor_rollout_ref_worker_class(), actor_options(1, 1, 1).to_json(), 1, 1);
    batch = a.call("generate_sequences", {prompts()}).get().as<DataProto>();
  }
  // The reference: the whole value model in this process, each row's value at
  // its last valid token (position P + length - 1).
  engine::HfModel hf = engine::load_hf_model(value_model);
  engine::Transformer model(hf.config, engine::ParallelState::single(),
                            engine::TransformerOptions().set_value_model(true));
  model.load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model.shard_spec()));
  at::Tensor values;
  {
    at::NoGradGuard no_grad;
    values = model
                 .forward(batch.tensor("input_ids"), batch.tensor("position_ids"),
                          batch.tensor("attention_mask"))
                 .squeeze(-1);
  }
  const at::Tensor mask = batch.tensor("response_mask");
  const int64_t P = batch.tensor("prompts").size(1), R = mask.size(1);
  at::Tensor expected = at::zeros({batch.size(), R});
  for (int64_t i = 0; i < batch.size(); ++i) {
    const int64_t len = mask[i].sum().item<int64_t>();
    if (len > 0) expected[i][len - 1] = values[i][P + len - 1];
  }
  const Tolerance tol =
      Tolerance::fp32(engine::test::logit_terms(hf.config, batch.tensor("input_ids").size(1)),
                      std::max(1.0, values.abs().max().item<double>()));

  RewardModelOptions o;
  o.model.path = value_model;
  o.micro_batch_size = 3;
  for (auto [tp, pp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
    o.model.tp = tp;
    o.model.pp = pp;
    WorkerGroup g = spawn(reward_model_worker_class(), o.to_json(), tp, pp);
    const at::Tensor scores =
        g.call("compute_rm_score", {batch}).get().as<DataProto>().tensor("rm_scores");
    test::expect_close(scores, expected, tol,
                       "rm_scores tp" + std::to_string(tp) + " pp" + std::to_string(pp));
    // Nothing but the last token carries a score.
    EXPECT_EQ((scores != 0).sum(1).le(1).all().item<bool>(), true);
  }
}

TEST(RewardModelWorker, LastTokenScoresSkipEmptyResponses) {
  const at::Tensor values = at::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}).view({2, 3});
  const at::Tensor mask = at::tensor({1, 1, 0, 0, 0, 0}, at::kLong).view({2, 3});
  EXPECT_TRUE(at::equal(last_token_scores(values, mask),
                        at::tensor({0.f, 2.f, 0.f, 0.f, 0.f, 0.f}).view({2, 3})));
}

}  // namespace
}  // namespace baton::workers
