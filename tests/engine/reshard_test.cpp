// reshard_weights over real Gloo processes: training layouts TP2, PP2 (uneven
// split), TP2 × PP2 and PP2 × DP2 into rollout layouts TP1 and TP2, on tiny-llama and
// tiny-qwen2 (tied embeddings, q/k/v biases) and the tiny-qwen2 value model.
// Every rollout parameter must equal, bit for bit, what hf_to_shard gives for
// its rollout TP rank; after an optimizer step, what hf_to_shard gives of the
// trained shards reassembled. Each world builds both rollout models, so a test
// starts one set of processes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/rollout/reshard.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::run_world;
using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

struct Fixture {
  std::string name;
  bool value_model = false;
};

const std::vector<Fixture> kAllFixtures = {
    {"tiny-llama"}, {"tiny-qwen2"}, {"tiny-qwen2-value", true}};

// Every parameter of `model` equals `expected` exactly, and nothing is missing.
void expect_exact(const Transformer& model, const TensorMap& expected, const std::string& what) {
  auto got = model.state_dict();
  std::vector<std::string> got_names, want_names;
  for (const auto& [name, t] : got) got_names.push_back(name);
  for (const auto& [name, t] : expected) want_names.push_back(name);
  ASSERT_EQ(got_names, want_names) << what;
  for (const auto& [name, t] : got) {
    const auto& want = expected.at(name);
    ASSERT_EQ(t.sizes(), want.sizes()) << what << " " << name;
    EXPECT_TRUE(at::equal(t, want.to(t.scalar_type()))) << what << " " << name << " differs";
  }
}

// The largest full tensor of the model, in bytes (its whole-model shards).
int64_t largest_tensor_bytes(const TensorMap& whole_model) {
  int64_t most = 0;
  for (const auto& [name, t] : whole_model) most = std::max<int64_t>(most, t.nbytes());
  return most;
}

// On every rank of a tp × pp (× dp) training world: for each fixture, a training
// model loaded from HF, resharded into a TP1 rollout with small buckets (many
// of them) and into a TP2 rollout with one big bucket; both must equal
// hf_to_shard for their rollout TP rank exactly.
void check_reshard_from(int64_t tp, int64_t pp, std::vector<int64_t> split, int64_t dp = 1) {
  run_world(tp * pp * dp, [=](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.tp = tp;
    pc.pp = pp;
    pc.dp = dp;
    pc.layer_split = split;
    auto ps = ParallelState::create(store, rank, pc);
    auto r1 = make_rollout_state(store, rank, pc, 1);
    auto r2 = make_rollout_state(store, rank, pc, 2);
    for (const Fixture& f : kAllFixtures) {
      const std::string dir = kFixtures + "/" + f.name;
      auto cfg = ModelConfig::load(dir);
      auto hf = read_hf_weights(dir);
      auto opts = TransformerOptions().set_value_model(f.value_model);
      auto layers = split.empty() ? even_layer_split(cfg.num_layers, pp) : split;
      Transformer train(cfg, ps, opts);
      train.load_state_dict(hf_to_shard(
          hf, cfg,
          ShardSpec::for_rank(cfg, ps->coords().tp, tp, ps->coords().pp, layers, f.value_model)));

      Transformer tp1(cfg, r1, opts), tp2(cfg, r2, opts);
      auto whole =
          hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}, f.value_model));
      const int64_t largest = largest_tensor_bytes(whole);

      ReshardOptions small;
      small.bucket_bytes = 4 << 10;
      auto s1 = reshard_weights(train, tp1, small);
      const std::string what1 = detail::cat(f.name, " tp", tp, " pp", pp, " -> tp1, rank ", rank);
      expect_exact(tp1, whole, what1);
      EXPECT_GT(s1.buckets, 1) << what1;
      EXPECT_LE(s1.peak_buffer_bytes, 2 * std::max(small.bucket_bytes, largest)) << what1;
      int64_t model_bytes = 0;
      for (const auto& [name, t] : whole) model_bytes += static_cast<int64_t>(t.nbytes());
      EXPECT_EQ(s1.model_bytes, model_bytes) << what1;

      ReshardOptions big;
      big.bucket_bytes = 64 << 20;
      auto s2 = reshard_weights(train, tp2, big);
      const std::string what2 = detail::cat(f.name, " tp", tp, " pp", pp, " -> tp2, rank ", rank);
      expect_exact(
          tp2,
          hf_to_shard(hf, cfg,
                      ShardSpec::for_rank(cfg, rank % 2, 2, 0, {cfg.num_layers}, f.value_model)),
          what2);
      EXPECT_EQ(s2.buckets, pp) << what2;  // one per owning stage
      EXPECT_LE(s2.peak_buffer_bytes, 2 * std::max(big.bucket_bytes, largest)) << what2;
      EXPECT_EQ(s2.model_bytes, model_bytes) << what2;
    }
  });
}

TEST(Reshard, Tp2IntoTp1AndTp2MatchesHfShardsExactly) { check_reshard_from(2, 1, {}); }

TEST(Reshard, UnevenPp2IntoTp1AndTp2MatchesHfShardsExactly) { check_reshard_from(1, 2, {3, 1}); }

TEST(Reshard, Tp2Pp2IntoTp1AndTp2MatchesHfShardsExactly) { check_reshard_from(2, 2, {}); }

// Each DP replica streams over its own pipeline groups.
TEST(Reshard, Pp2Dp2IntoTp1AndTp2MatchesHfShardsExactly) { check_reshard_from(1, 2, {}, 2); }

// After an AdamW step on a TP2 × PP2 tiny-qwen2 (tied embeddings: the last
// stage's output_layer copy is skipped, the embedding comes from stage 0), the
// next reshard carries the trained weights: the rollout equals hf_to_shard of
// the training shards, gathered through a sharded checkpoint directory.
TEST(Reshard, CarriesTheWeightsOfAnOptimizerStep) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string dir = kFixtures + "/tiny-qwen2";
    auto cfg = ModelConfig::load(dir);
    auto hf = read_hf_weights(dir);
    ParallelConfig pc;
    pc.tp = 2;
    pc.pp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto r1 = make_rollout_state(store, rank, pc, 1);
    auto r2 = make_rollout_state(store, rank, pc, 2);
    const auto split = even_layer_split(cfg.num_layers, 2);
    auto train = std::make_shared<Transformer>(cfg, ps);
    train->load_state_dict(
        hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, ps->coords().tp, 2, ps->coords().pp, split)));
    Transformer tp1(cfg, r1), tp2(cfg, r2);
    reshard_weights(*train, tp1);  // the initial weights first, as a trainer would

    // One step on seeded random tokens.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<MicroBatch> mbs(2);
    for (auto& mb : mbs) {
      mb.input_ids = at::randint(0, cfg.vocab_size, {1, 8}, gen, at::kLong);
      mb.position_ids = at::arange(8, at::kLong).unsqueeze(0);
      mb.attention_mask = at::ones({1, 8}, at::kLong);
    }
    const Group& tp_group = ps->tp();
    auto loss = [&](const at::Tensor& logits, const MicroBatch& mb) {
      return -next_token_log_probs(logits, mb.input_ids, tp_group).sum() / 14.0;
    };
    Optimizer opt(train, OptimizerOptions().set_lr(1e-2));
    opt.zero_grad();
    forward_backward(*train, mbs, loss);
    opt.step();

    ReshardOptions small;
    small.bucket_bytes = 8 << 10;
    reshard_weights(*train, tp1, small);
    reshard_weights(*train, tp2, small);

    // Every rank's trained shard, through a directory rank 0 names.
    if (rank == 0) {
      auto d =
          std::filesystem::temp_directory_path() / ("baton_reshard_" + std::to_string(::getpid()));
      std::filesystem::create_directories(d);
      write_sharded_layout(d, cfg, ShardedLayout{.tp = 2, .pp = 2, .layer_split = split});
      std::string s = d.string();
      store->set("trained_dir", std::vector<uint8_t>(s.begin(), s.end()));
    }
    auto bytes = store->get("trained_dir");
    const std::filesystem::path root(std::string(bytes.begin(), bytes.end()));
    write_sharded_rank(root, ps->coords().tp, ps->coords().pp, train->state_dict());
    ps->world().pg->barrier()->wait();
    auto trained = shards_to_hf(load_sharded_all(root), cfg, split, false);
    ps->world().pg->barrier()->wait();
    if (rank == 0) baton::remove_tree(root);

    auto want1 = hf_to_shard(trained, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}));
    auto want2 =
        hf_to_shard(trained, cfg, ShardSpec::for_rank(cfg, rank % 2, 2, 0, {cfg.num_layers}));
    expect_exact(tp1, want1, detail::cat("trained -> tp1, rank ", rank));
    expect_exact(tp2, want2, detail::cat("trained -> tp2, rank ", rank));

    // The step changed the weights (else the comparison above proves little).
    auto before = hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}));
    int64_t changed = 0;
    for (const auto& [name, t] : tp1.state_dict()) changed += !at::equal(t, before.at(name));
    EXPECT_EQ(changed, static_cast<int64_t>(before.size())) << "tensors changed by the step";
  });
}

// Validation happens before any communication, so one process shows it.
TEST(Reshard, RejectsModelsThatDisagree) {
  auto llama = ModelConfig::load(kFixtures + "/tiny-llama");
  auto qwen2 = ModelConfig::load(kFixtures + "/tiny-qwen2");
  Transformer train(llama, ParallelState::single());

  Transformer other_family(qwen2, ParallelState::single());
  expect_error([&] { reshard_weights(train, other_family); },
               {"differ", "architecture", "LlamaForCausalLM", "Qwen2ForCausalLM"});

  auto narrower = llama;
  narrower.intermediate_size = 64;
  Transformer narrow(narrower, ParallelState::single());
  expect_error([&] { reshard_weights(train, narrow); }, {"intermediate_size", "128", "64"});

  Transformer critic(llama, ParallelState::single(), TransformerOptions().set_value_model(true));
  expect_error([&] { reshard_weights(train, critic); }, {"value model"});

  expect_error([&] { reshard_weights(train, train, ReshardOptions{.bucket_bytes = 0}); },
               {"bucket_bytes", "0"});
}

TEST(Reshard, RejectsARolloutTpThatDoesNotDivideTheWorld) {
  ParallelConfig pc;
  pc.tp = 2;
  pc.pp = 2;
  auto store = c10::make_intrusive<c10d::HashStore>();
  expect_error([&] { make_rollout_state(store, 0, pc, 3); },
               {"rollout tp 3", "4 ranks", "tp=2 cp=1 dp=1 pp=2"});
  expect_error([&] { make_rollout_state(store, 0, pc, 0); }, {"rollout tp 0"});
}

}  // namespace
}  // namespace baton::engine
