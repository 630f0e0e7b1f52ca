// The engine on GPUs over NCCL, two processes on two GPUs: TP2 logits and
// log-probs, PP2 training steps (1F1B over NCCL, whose sends and receives with
// one peer share a stream), the HybridEngine resharding a GPU training model
// into a GPU rollout model, and weight sync from a GPU trainer to a GPU
// rollout worker. Each test skips, saying why, without two CUDA devices; none
// has run yet (the project has no GPU), they compile and link in every build.
// Tolerances as in parallel_model_test.cpp: another device sums the same
// terms in other orders, so a comparison allows the rounding of the chain
// behind the value (model_tolerance.h); copies are compared bit for bit.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if defined(BATON_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/rollout/hybrid_engine.h"
#include "engine/rollout/weight_sync.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::expect_near;
using test::max_abs;
using test::run_world;
using test::Tolerance;

const std::string kFixtures = BATON_FIXTURES_DIR;

int64_t cuda_devices() { return at::hasCUDA() ? static_cast<int64_t>(at::getNumGPUs()) : 0; }

#define REQUIRE_GPUS(n)     \
  if (cuda_devices() < (n)) \
  GTEST_SKIP() << "needs " << (n) << " CUDA devices, this machine has " << cuda_devices()

// This rank's GPU, made the current device before anything is allocated.
at::Device bind_gpu(int64_t index) {
#if defined(BATON_CUDA)
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#endif
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::shared_ptr<ParallelState> nccl_state(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                          const ParallelConfig& pc) {
  return ParallelState::create(std::move(store), rank, pc, std::chrono::minutes(2),
                               CollectiveBackend::kNccl);
}

// `fixture`'s weights in `ps`'s layout (built on the CPU in fp32, as always).
std::shared_ptr<Transformer> load(const std::string& fixture, std::shared_ptr<ParallelState> ps) {
  auto dir = kFixtures + "/" + fixture;
  auto cfg = ModelConfig::load(dir);
  ps->set_num_layers(cfg.num_layers);
  const auto& pc = ps->config();
  auto split = pc.layer_split.empty() ? even_layer_split(cfg.num_layers, pc.pp) : pc.layer_split;
  auto model = std::make_shared<Transformer>(cfg, ps);
  auto spec = ShardSpec::for_rank(cfg, ps->coords().tp, pc.tp, ps->coords().pp, split);
  spec.make_vocab_size_divisible_by = pc.make_vocab_size_divisible_by;
  model->load_state_dict(hf_to_shard(read_hf_weights(dir), cfg, spec));
  return model;
}

TEST(Nccl, Tp2LogitsAndLogProbsOnTwoGpusMatchTheSingleProcessModel_CUDA) {
  REQUIRE_GPUS(2);
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const at::Device gpu = bind_gpu(rank);
    ParallelConfig pc;
    pc.tp = 2;
    pc.make_vocab_size_divisible_by = 1;  // 128 rows: 64 real ones on each rank
    auto ps = nccl_state(store, rank, pc);
    auto model = load("tiny-llama", ps);
    model->to(gpu);
    ASSERT_EQ(model->device(), gpu);
    auto dense = load("tiny-llama", ParallelState::single());
    const ModelConfig& cfg = dense->config();
    auto ref = read_safetensors(kFixtures + "/tiny-llama/reference.safetensors");
    const at::Tensor ids = ref.at("input_ids"), pos = ref.at("position_ids"),
                     mask = ref.at("attention_mask");
    at::NoGradGuard no_grad;
    const at::Tensor shard = model->forward(ids.to(gpu), pos.to(gpu), mask.to(gpu));
    const at::Tensor log_probs = next_token_log_probs(shard, ids.to(gpu), ps->tp()).cpu();
    const at::Tensor full = dense->forward(ids, pos, mask);
    const VocabShard v = model->vocab_shard();
    ASSERT_GT(v.real, 0);
    expect_close(shard.cpu().narrow(2, 0, v.real), full.narrow(2, v.begin, v.real),
                 Tolerance::fp32(test::logit_terms(cfg, ids.size(1)), max_abs(full, mask)),
                 "logits of rank " + std::to_string(rank), mask);
    const at::Tensor want = next_token_log_probs(full, ids, dense->parallel().tp());
    const at::Tensor where = mask.narrow(1, 1, ids.size(1) - 1);
    expect_close(log_probs, want,
                 Tolerance::fp32(test::log_prob_terms(cfg, ids.size(1)), max_abs(full, mask)),
                 "log-probs on rank " + std::to_string(rank), where);
  });
}

// Four micro-batches on two stages: the steady 1F1B phase posts a gradient's
// receive before the activation's send on both neighbours (the order NCCL
// needs). Losses, the gradient norm and a second step's losses match one CPU
// process; a hang fails the test by run_world's timeout.
TEST(Nccl, Pp2TrainingStepsOnTwoGpusMatchTheSingleProcessModel_CUDA) {
  REQUIRE_GPUS(2);
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const at::Device gpu = bind_gpu(rank);
    ParallelConfig pc;
    pc.pp = 2;
    auto ps = nccl_state(store, rank, pc);
    auto model = load("tiny-qwen2", ps);
    model->to(gpu);
    auto dense = load("tiny-qwen2", ParallelState::single());
    const ModelConfig& cfg = dense->config();
    auto ref = read_safetensors(kFixtures + "/tiny-qwen2/reference.safetensors");
    const at::Tensor ids = ref.at("input_ids"), pos = ref.at("position_ids"),
                     mask = ref.at("attention_mask");
    // Four one-row micro-batches (the fixture's rows, twice).
    std::vector<MicroBatch> mbs, gpu_mbs;
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t r = i % ids.size(0);
      MicroBatch mb;
      mb.input_ids = ids.narrow(0, r, 1);
      mb.position_ids = pos.narrow(0, r, 1);
      mb.attention_mask = mask.narrow(0, r, 1);
      mb.extra["mask"] = mb.attention_mask.narrow(1, 1, ids.size(1) - 1).to(at::kFloat);
      mbs.push_back(mb);
      MicroBatch g;
      g.input_ids = mb.input_ids.to(gpu);
      g.position_ids = mb.position_ids.to(gpu);
      g.attention_mask = mb.attention_mask.to(gpu);
      g.extra["mask"] = mb.extra.at("mask").to(gpu);
      gpu_mbs.push_back(g);
    }
    double tokens = 0;
    for (const auto& mb : mbs) tokens += mb.extra.at("mask").sum().item<double>();
    auto loss_fn = [tokens](const Group& tp) {
      return [tokens, tp](const at::Tensor& logits, const MicroBatch& mb) {
        return -(next_token_log_probs(logits, mb.input_ids, tp) * mb.extra.at("mask")).sum() /
               tokens;
      };
    };
    OptimizerOptions oo;
    oo.lr = 1e-3;
    Optimizer opt(model, oo), dense_opt(dense, oo);
    const int64_t seq = ids.size(1);
    const double grad_terms = test::gradient_terms(cfg, seq, static_cast<int64_t>(tokens));
    double params = 0;
    for (const auto& [name, p] : dense->named_params()) params += static_cast<double>(p.numel());
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      dense_opt.zero_grad();
      auto losses = forward_backward(*model, gpu_mbs, loss_fn(ps->tp()));
      auto dense_losses = forward_backward(*dense, mbs, loss_fn(dense->parallel().tp()));
      double got = 0, want = 0;
      for (const auto& l : losses) got += l.item<double>();
      for (const auto& l : dense_losses) want += l.item<double>();
      double logit_scale;
      {
        at::NoGradGuard no_grad;
        logit_scale = max_abs(dense->forward(ids, pos, mask), mask);
      }
      if (ps->is_last_stage())
        expect_near(got, want,
                    Tolerance::fp32(test::log_prob_terms(cfg, seq) + tokens, logit_scale),
                    "loss of step " + std::to_string(step));
      const auto stats = opt.step();
      const auto dense_stats = dense_opt.step();
      expect_near(stats.grad_norm, dense_stats.grad_norm,
                  Tolerance::fp32(grad_terms + params, dense_stats.grad_norm),
                  "gradient norm of step " + std::to_string(step));
    }
  });
}

// TP2 training on two GPUs, rollout TP1: every rank gathers the full weights
// over NCCL into a rollout model on its own GPU, in the training dtype, equal
// to hf_to_shard's bit for bit, and generates from it.
TEST(Nccl, HybridEngineReshardsATp2GpuModelIntoATp1GpuRolloutModel_CUDA) {
  REQUIRE_GPUS(2);
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const at::Device gpu = bind_gpu(rank);
    ParallelConfig pc;
    pc.tp = 2;
    auto ps = nccl_state(c10::make_intrusive<c10d::PrefixStore>("train", store), rank, pc);
    auto train = load("tiny-llama", ps);
    train->to(gpu);
    HybridEngine hybrid(train, store, HybridEngineOptions().set_rollout_tp(1));
    hybrid.enter_rollout();
    Transformer& rollout = hybrid.rollout_model();
    EXPECT_EQ(rollout.device(), gpu);
    EXPECT_EQ(rollout.parallel().backend(), CollectiveBackend::kNccl);
    const ModelConfig& cfg = rollout.config();
    auto expected = hf_to_shard(read_hf_weights(kFixtures + "/tiny-llama"), cfg,
                                ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}));
    for (const auto& [name, t] : rollout.state_dict()) {
      ASSERT_TRUE(expected.count(name)) << name;
      EXPECT_TRUE(at::equal(t.cpu(), expected.at(name))) << name << " differs";
    }
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 4;
    greedy.ignore_eos = true;
    auto seqs = hybrid.generate({{5, 17, 33, 9}, {60}}, greedy);
    ASSERT_EQ(seqs.size(), 2u);
    for (const auto& s : seqs) EXPECT_EQ(s.response.size(), 4u);
    hybrid.exit_rollout();
  });
}

// A TP2 trainer on two GPUs (NCCL) sends to a rollout worker in a third
// process on GPU 0: the bucket goes through pinned host memory over the Gloo
// sync group and lands in the worker's GPU model bit for bit.
TEST(Nccl, WeightSyncFromATp2GpuTrainerToAGpuRolloutWorker_CUDA) {
  REQUIRE_GPUS(2);
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig training;
    training.tp = 2;
    WeightSyncOptions options;
    options.bucket_bytes = 8 << 10;
    const at::Device gpu = bind_gpu(rank < 2 ? rank : 0);
    if (rank < 2) {
      auto ps = nccl_state(c10::make_intrusive<c10d::PrefixStore>("train", store), rank, training);
      auto train = load("tiny-llama", ps);
      train->to(gpu);
      WeightSender sender(
          train, make_sync_group(store, "gpu", trainer_sync_rank(*ps), sync_group_size(training, 1)),
          options);
      EXPECT_EQ(sender.send(1).version, 1);
      return;
    }
    auto cfg = ModelConfig::load(kFixtures + "/tiny-llama");
    auto rollout = std::make_shared<Transformer>(cfg, ParallelState::single());
    rollout->to(gpu);
    WeightReceiver receiver(rollout, training,
                            make_sync_group(store, "gpu", receiver_sync_rank(training, 0),
                                            sync_group_size(training, 1)),
                            options);
    EXPECT_EQ(receiver.receive().version, 1);
    auto expected = hf_to_shard(read_hf_weights(kFixtures + "/tiny-llama"), cfg,
                                ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}));
    for (const auto& [name, t] : rollout->named_params()) {
      EXPECT_EQ(t.device(), gpu) << name;
      EXPECT_TRUE(at::equal(t.detach().cpu(), expected.at(name))) << name << " differs";
    }
  });
}

}  // namespace
}  // namespace baton::engine
