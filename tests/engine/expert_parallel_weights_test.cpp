// Expert parallelism where weights move, over real Gloo processes, on the
// tiny Qwen3-MoE fixture (4 experts, a dense first layer): training layouts
// with ep = 2 (dp ranks 0 and 1 hold experts {0, 1} and {2, 3}) resharded
// into rollout models holding every expert, sent to separate rollout workers,
// saved to and restored from checkpoints (also under another ep), and
// exported to an HF checkpoint. Every weight must come out bit for bit.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/checkpoint.h"
#include "engine/io/hf_model.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/vocab_parallel.h"
#include "engine/rollout/reshard.h"
#include "engine/rollout/weight_sync.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using test::run_world;

const std::string kMoe = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen3-moe";

c10::intrusive_ptr<c10d::Store> prefixed(const std::string& prefix,
                                         c10::intrusive_ptr<c10d::Store> store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

// Same names, shapes and bits.
void expect_exact(const TensorMap& got, const TensorMap& want, const std::string& what) {
  std::vector<std::string> got_names, want_names;
  for (const auto& [name, t] : got) got_names.push_back(name);
  for (const auto& [name, t] : want) want_names.push_back(name);
  ASSERT_EQ(got_names, want_names) << what;
  for (const auto& [name, t] : got) {
    const at::Tensor& w = want.at(name);
    ASSERT_EQ(t.sizes(), w.sizes()) << what << ": " << name;
    EXPECT_TRUE(at::equal(t, w)) << what << ": " << name << " differs";
  }
}

// A training model of `pc` on rank `ps`, loaded from the fixture (its own
// experts: Transformer::shard_spec carries the EP rank).
std::shared_ptr<Transformer> moe_model(std::shared_ptr<ParallelState> ps) {
  auto cfg = ModelConfig::load(kMoe);
  auto model = std::make_shared<Transformer>(cfg, ps);
  model->load_state_dict(hf_to_shard(read_hf_weights(kMoe), cfg, model->shard_spec()));
  return model;
}

// The fixture as rollout TP rank `rank` of `tp` holds it: every expert.
TensorMap rollout_shard(int64_t rank, int64_t tp) {
  auto cfg = ModelConfig::load(kMoe);
  return hf_to_shard(read_hf_weights(kMoe), cfg,
                     ShardSpec::for_rank(cfg, rank, tp, 0, {cfg.num_layers}));
}

// One AdamW step on seeded tokens, the same micro-batch count on every rank
// (the EP ranks' all-to-alls pair up), different tokens per dp rank.
void train_one_step(const std::shared_ptr<Transformer>& model, Optimizer& opt) {
  const ParallelState& ps = model->parallel();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + ps.coords().dp);
  std::vector<MicroBatch> mbs(2);
  for (auto& mb : mbs) {
    mb.input_ids = at::randint(0, model->config().vocab_size, {2, 8}, gen, at::kLong);
    mb.position_ids = at::arange(8, at::kLong).unsqueeze(0).expand({2, 8}).contiguous();
    mb.attention_mask = at::ones({2, 8}, at::kLong);
  }
  const Group& tp = ps.tp();
  opt.zero_grad();
  forward_backward(*model, mbs, [&](const at::Tensor& logits, const MicroBatch& mb) {
    return -next_token_log_probs(logits, mb.input_ids, tp).sum() / 64.0;
  });
  opt.step();
}

// `model`'s tensors with the experts of every rank of its EP group (each EP
// rank's broadcast over it, joined): collective over the EP group.
TensorMap with_every_expert(const Transformer& model) {
  const Group& ep = model.parallel().ep();
  const TensorMap mine = model.state_dict();  // detached copies
  std::vector<TensorMap> by_ep;
  for (int64_t j = 0; j < ep.size; ++j) {
    TensorMap t = mine;
    for (auto& [name, v] : t) {
      if (!is_expert_tensor(name)) continue;
      v = v.clone();
      std::vector<at::Tensor> ts{v};
      c10d::BroadcastOptions o;
      o.rootRank = static_cast<int>(j);
      ep.pg->broadcast(ts, o)->wait();
    }
    by_ep.push_back(std::move(t));
  }
  return join_expert_shards(by_ep);
}

// A directory every rank of the world names alike (the test process's pid),
// empty and present once this returns; rank 0 makes it.
fs::path shared_dir(const std::string& name, const ParallelState& ps) {
  const fs::path dir = fs::temp_directory_path() / detail::cat(name, "_", ::getppid());
  if (ps.rank() == 0) {
    baton::remove_tree(dir);
    fs::create_directories(dir);
  }
  barrier(ps.world());
  return dir;
}

// (a) Reshard: a tp × pp × dp training world with ep = 2 into rollout TP1
// and TP2 (small buckets, then one big one): every rollout rank holds every
// expert, equal to hf_to_shard of the fixture for its rollout TP rank.
void check_reshard(int64_t tp, int64_t pp, int64_t dp) {
  run_world(tp * pp * dp, [=](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.tp = tp;
    pc.pp = pp;
    pc.dp = dp;
    pc.ep = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto r1 = make_rollout_state(store, rank, pc, 1);
    auto r2 = make_rollout_state(store, rank, pc, 2);
    auto train = moe_model(ps);
    const auto cfg = train->config();
    Transformer tp1(cfg, r1), tp2(cfg, r2);
    const std::string what = detail::cat(pc.to_string(), ", rank ", rank);
    auto s1 = reshard_weights(*train, tp1, ReshardOptions{.bucket_bytes = 4 << 10});
    EXPECT_GT(s1.buckets, 4) << what;
    expect_exact(tp1.state_dict(), rollout_shard(0, 1), what + " -> tp1");
    reshard_weights(*train, tp2);
    expect_exact(tp2.state_dict(), rollout_shard(rank % 2, 2), what + " -> tp2");
  });
}

TEST(ExpertParallelWeights, ReshardDp2Ep2IntoTp1AndTp2MatchesHfShardsExactly) {
  check_reshard(1, 1, 2);
}

TEST(ExpertParallelWeights, ReshardTp2Dp2Ep2IntoTp1AndTp2MatchesHfShardsExactly) {
  check_reshard(2, 1, 2);
}

TEST(ExpertParallelWeights, ReshardPp2Dp2Ep2IntoTp1AndTp2MatchesHfShardsExactly) {
  check_reshard(1, 2, 2);
}

// (a) after a step: the trained experts of both EP ranks reach the rollout.
TEST(ExpertParallelWeights, ReshardCarriesBothEpRanksTrainedExperts) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.dp = 2;
    pc.ep = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto rs = make_rollout_state(store, rank, pc, 1);
    auto train = moe_model(ps);
    Optimizer opt(train, OptimizerOptions().set_lr(1e-2));
    train_one_step(train, opt);
    Transformer rollout(train->config(), rs);
    reshard_weights(*train, rollout, ReshardOptions{.bucket_bytes = 8 << 10});
    // Both EP ranks' trained experts (at tp 1 the rollout's layout).
    const TensorMap got = rollout.state_dict();
    expect_exact(got, with_every_expert(*train), "trained -> tp1");
    // Each EP rank's block moved: the comparison above proves something.
    const TensorMap before = rollout_shard(0, 1);
    int64_t experts = 0;
    for (const auto& [name, t] : got) {
      if (!is_expert_tensor(name)) continue;
      ++experts;
      const int64_t n = t.size(0) / 2;
      for (int64_t j = 0; j < 2; ++j)
        EXPECT_FALSE(at::equal(t.narrow(0, j * n, n), before.at(name).narrow(0, j * n, n)))
            << name << " block " << j;
    }
    EXPECT_EQ(experts, 6);  // layers 1..3, two stacked tensors each
  });
}

// (b) A checkpoint of a dp2 ep2 model after a step: one model and one
// optimizer file per EP rank, ep in layout.json; loading with the same
// layout restores model and optimizer state bit for bit, loading at ep 1
// (dp 2) reshards: each rank then holds every expert, the saved ones.
TEST(ExpertParallelWeights, CheckpointRoundTripsExactlyAndReshardsToAnotherEp) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.dp = 2;
    pc.ep = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto train = moe_model(ps);
    Optimizer opt(train, OptimizerOptions().set_lr(1e-2));
    train_one_step(train, opt);
    const fs::path root = shared_dir("baton_ep_checkpoint", *ps);
    save_checkpoint(root, 1, *train, opt, {{"note", "ep"}});
    const fs::path step = root / detail::step_dir_name(1);
    for (const char* f : {"model-tp0-pp0-ep0.safetensors", "model-tp0-pp0-ep1.safetensors",
                          "optim-tp0-pp0-ep0.safetensors", "optim-tp0-pp0-ep1.safetensors"})
      EXPECT_TRUE(fs::exists(step / f)) << f;
    EXPECT_FALSE(fs::exists(step / "model-tp0-pp0.safetensors"));
    EXPECT_EQ(load_sharded_layout(step).ep, 2);

    const TensorMap model_state = train->state_dict();
    const auto optim_state = opt.state_dict();
    {
      auto fresh = std::make_shared<Transformer>(train->config(), ps);
      Optimizer fresh_opt(fresh, OptimizerOptions().set_lr(1e-2));
      EXPECT_EQ(load_checkpoint(root, *fresh, fresh_opt)["note"], "ep");
      expect_exact(fresh->state_dict(), model_state, "model, same layout");
      expect_exact(fresh_opt.state_dict(), optim_state, "optimizer, same layout");
    }
    // ep 1: every rank every expert, EP rank j's from file ep{j}.
    ParallelConfig dense_pc;
    dense_pc.dp = 2;
    auto dense_ps = ParallelState::create(prefixed("ep1", store), rank, dense_pc);
    auto dense = std::make_shared<Transformer>(train->config(), dense_ps);
    Optimizer dense_opt(dense, OptimizerOptions().set_lr(1e-2));
    load_checkpoint(root, *dense, dense_opt);
    auto block = [&](const std::string& name, const at::Tensor& all) {
      if (!is_expert_tensor(name)) return all;
      const int64_t n = all.size(0) / 2;
      return all.narrow(0, ps->ep_rank() * n, n);
    };
    for (const auto& [name, t] : dense->state_dict())
      EXPECT_TRUE(at::equal(block(name, t), model_state.at(name))) << "ep1 model " << name;
    for (const auto& [name, t] : dense_opt.state_dict())
      EXPECT_TRUE(at::equal(block(name, t), optim_state.at(name))) << "ep1 optimizer " << name;
    barrier(ps->world());
    if (rank == 0) baton::remove_tree(root);
  });
}

// (c) Export: the EP ranks' files of a checkpoint (what export_hf writes and
// baton-convert --to-hf reads) joined into one HF checkpoint, written and
// read back: the fixture's tensors, bit for bit.
TEST(ExpertParallelWeights, ExportJoinsTheEpRanksIntoTheHfCheckpoint) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.dp = 2;
    pc.ep = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto model = moe_model(ps);
    Optimizer opt(model, OptimizerOptions());
    const fs::path root = shared_dir("baton_ep_export", *ps);
    save_checkpoint(root, 0, *model, opt);
    if (rank == 0) {
      const fs::path dir = root / detail::step_dir_name(0);
      const auto layout = load_sharded_layout(dir);
      const auto& cfg = model->config();
      auto hf = shards_to_hf(load_sharded_all(dir), cfg, layout.layer_split, layout.value_model,
                             layout.make_vocab_size_divisible_by);
      save_hf_model(root / "hf", cfg, hf, false);
      expect_exact(read_hf_weights(root / "hf"), read_hf_weights(kMoe), "exported HF weights");
      baton::remove_tree(root);
    }
    barrier(ps->world());
  });
}

// (d) Weight sync from a dp2 ep2 trainer (dp ranks 0 and 1 both send: their
// experts differ) to a TP1 rollout worker (EP blocks straight into its
// parameters) and to two TP2 workers (through the bucket buffer), before and
// after a step.
TEST(ExpertParallelWeights, WeightSyncFromBothEpRanksToSeparateWorkers) {
  run_world(5, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig training;
    training.dp = 2;
    training.ep = 2;
    EXPECT_EQ(sync_group_size(training, 1), 3);
    WeightSyncOptions options;
    options.bucket_bytes = 8 << 10;
    const auto cfg = ModelConfig::load(kMoe);
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      EXPECT_EQ(trainer_sync_rank(*ps), rank);
      auto train = moe_model(ps);
      WeightSender one(train, make_sync_group(store, "one", rank, sync_group_size(training, 1)),
                       options);
      WeightSender two(train, make_sync_group(store, "two", rank, sync_group_size(training, 2)),
                       options);
      one.send(1);
      two.send(1);
      Optimizer opt(train, OptimizerOptions().set_lr(1e-2));
      train_one_step(train, opt);
      // The trained model, every expert, for the workers to check.
      const TensorMap trained = with_every_expert(*train);
      const fs::path root = shared_dir("baton_ep_sync", *ps);
      if (rank == 0)
        save_hf_model(root, cfg, shards_to_hf({{trained}}, cfg, {cfg.num_layers}, false), false);
      barrier(ps->world());
      EXPECT_EQ(one.send(2).version, 2);
      EXPECT_EQ(two.send(2).version, 2);
      if (rank == 0) {
        store->wait({"checked2", "checked3", "checked4"});
        baton::remove_tree(root);
      }
      return;
    }
    const bool tp1 = rank == 2;
    const int64_t workers = tp1 ? 1 : 2, r = tp1 ? 0 : rank - 3;
    std::shared_ptr<Transformer> rollout;
    if (tp1) {
      rollout = std::make_shared<Transformer>(cfg, ParallelState::single());
    } else {
      ParallelConfig pc;
      pc.tp = 2;
      rollout = std::make_shared<Transformer>(
          cfg, ParallelState::create(prefixed("rollout", store), r, pc));
    }
    WeightReceiver receiver(
        rollout, training,
        make_sync_group(store, tp1 ? "one" : "two", receiver_sync_rank(training, r),
                        sync_group_size(training, workers)),
        options);
    EXPECT_EQ(receiver.receive().version, 1);
    expect_exact(rollout->state_dict(), rollout_shard(r, workers), "version 1");
    EXPECT_EQ(receiver.receive().version, 2);
    const fs::path root = fs::temp_directory_path() / detail::cat("baton_ep_sync_", ::getppid());
    const TensorMap trained = read_hf_weights(root);
    expect_exact(
        rollout->state_dict(),
        hf_to_shard(trained, cfg, ShardSpec::for_rank(cfg, r, workers, 0, {cfg.num_layers})),
        "version 2");
    const std::string down = "decoder.layers.1.mlp.experts.linear_fc2.weight";
    EXPECT_FALSE(at::equal(rollout->state_dict().at(down), rollout_shard(r, workers).at(down)))
        << "the step moved the experts";
    store->set(detail::cat("checked", rank), std::vector<uint8_t>{1});
  });
}

}  // namespace
}  // namespace baton::engine
