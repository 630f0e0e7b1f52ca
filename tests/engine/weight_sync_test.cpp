// Weight sync to separate rollout workers over real Gloo processes: trainer
// layouts TP2 × PP2 and PP2 send to rollout workers (TP1, TP2) that are other
// processes. Received weights must equal hf_to_shard for the rollout rank bit
// for bit, before and after an optimizer step; a rollout model that does not
// match makes both sides fail with a clear error instead of hanging.
#include "engine/rollout/weight_sync.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "base/atomic_file.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::run_world;
using testing::expect_error;

const std::string kFixtures = BATON_FIXTURES_DIR;

c10::intrusive_ptr<c10d::Store> prefixed(const std::string& prefix,
                                         c10::intrusive_ptr<c10d::Store> store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

void expect_exact(const Transformer& model, const TensorMap& expected, const std::string& what) {
  auto got = model.state_dict();
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(expected.count(name)) << what << ": unexpected " << name;
    EXPECT_TRUE(at::equal(t, expected.at(name))) << what << ": " << name << " differs";
  }
}

// The sync group "test" of a trainer and `workers` rollout ranks, as training
// rank `ps` of the first replica or as rollout rank `r` joins it.
c10::intrusive_ptr<c10d::ProcessGroup> trainer_sync(c10::intrusive_ptr<c10d::Store> store,
                                                    const ParallelState& ps, int64_t workers) {
  return make_sync_group(store, "test", trainer_sync_rank(ps), sync_group_size(ps.config(), workers));
}
c10::intrusive_ptr<c10d::ProcessGroup> worker_sync(c10::intrusive_ptr<c10d::Store> store,
                                                   const ParallelConfig& training, int64_t r,
                                                   int64_t workers) {
  return make_sync_group(store, "test", receiver_sync_rank(training, r),
                         sync_group_size(training, workers));
}

// Rollout rank r of a TP2 rollout world: its own process group and model.
std::shared_ptr<Transformer> tp2_rollout(c10::intrusive_ptr<c10d::Store> store, int64_t r,
                                         const ModelConfig& cfg) {
  ParallelConfig pc;
  pc.tp = 2;
  return std::make_shared<Transformer>(cfg, ParallelState::create(prefixed("rollout", store), r, pc));
}

std::shared_ptr<Transformer> trainer_model(const std::string& fixture,
                                           std::shared_ptr<ParallelState> ps) {
  auto dir = kFixtures + "/" + fixture;
  auto cfg = ModelConfig::load(dir);
  auto split = even_layer_split(cfg.num_layers, ps->config().pp);
  auto model = std::make_shared<Transformer>(cfg, ps);
  model->load_state_dict(hf_to_shard(
      read_hf_weights(dir), cfg,
      ShardSpec::for_rank(cfg, ps->coords().tp, ps->config().tp, ps->coords().pp, split)));
  return model;
}

TEST(WeightSync, Tp2Pp2TrainerToSeparateRolloutWorkerBeforeAndAfterAStep) {
  run_world(5, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string fixture = "tiny-qwen2";
    auto cfg = ModelConfig::load(kFixtures + "/" + fixture);
    ParallelConfig training;
    training.tp = 2;
    training.pp = 2;
    WeightSyncOptions options;
    options.bucket_bytes = 8 << 10;
    if (rank < 4) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      auto train = trainer_model(fixture, ps);
      // Every training rank is in the first (only) replica: all four join.
      WeightSender sender(
          train, trainer_sync(store, *ps, 1),
          options);
      auto stats = sender.send(1);
      EXPECT_EQ(stats.version, 1);
      EXPECT_GT(stats.buckets, 2);

      // One step, then the trained shards go to a directory for the worker's
      // check, then the new weights go out.
      std::vector<MicroBatch> mbs(1);
      mbs[0].input_ids =
          at::tensor(std::vector<int64_t>{5, 17, 33, 9, 60, 12}, at::kLong).view({1, 6});
      mbs[0].position_ids = at::arange(6, at::kLong).view({1, 6});
      mbs[0].attention_mask = at::ones({1, 6}, at::kLong);
      const Group& tp = ps->tp();
      Optimizer opt(train, OptimizerOptions().set_lr(1e-2));
      opt.zero_grad();
      forward_backward(*train, mbs, [&](const at::Tensor& logits, const MicroBatch& mb) {
        return -next_token_log_probs(logits, mb.input_ids, tp).mean();
      });
      opt.step();
      if (rank == 0) {
        auto d = std::filesystem::temp_directory_path() /
                 ("baton_weight_sync_" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        write_sharded_layout(
            d, cfg,
            ShardedLayout{.tp = 2, .pp = 2, .layer_split = even_layer_split(cfg.num_layers, 2)});
        std::string s = d.string();
        store->set("trained_dir", std::vector<uint8_t>(s.begin(), s.end()));
      }
      auto bytes = store->get("trained_dir");
      write_sharded_rank(std::string(bytes.begin(), bytes.end()), ps->coords().tp, ps->coords().pp,
                         train->state_dict());
      ps->world().pg->barrier()->wait();
      EXPECT_EQ(sender.send(2).version, 2);
      return;
    }
    // The rollout worker: its own process and model, TP1.
    auto rollout = std::make_shared<Transformer>(cfg, ParallelState::single());
    WeightReceiver receiver(rollout, training,
                            worker_sync(store, training, 0, 1), options);
    auto stats = receiver.receive();
    EXPECT_EQ(stats.version, 1);
    EXPECT_GT(stats.buckets, 2);
    int64_t largest = 0;
    for (const auto& [name, t] : rollout->named_params())
      largest = std::max<int64_t>(largest, t.nbytes());
    EXPECT_LE(stats.peak_buffer_bytes, 2 * (std::max<int64_t>(options.bucket_bytes, largest) + 64));
    auto spec = ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers});
    auto initial = hf_to_shard(read_hf_weights(kFixtures + "/" + fixture), cfg, spec);
    expect_exact(*rollout, initial, "version 1");

    EXPECT_EQ(receiver.receive().version, 2);
    auto bytes = store->get("trained_dir");
    const std::filesystem::path root(std::string(bytes.begin(), bytes.end()));
    auto trained =
        shards_to_hf(load_sharded_all(root), cfg, even_layer_split(cfg.num_layers, 2), false);
    baton::remove_tree(root);
    expect_exact(*rollout, hf_to_shard(trained, cfg, spec), "version 2");
    int64_t changed = 0;
    for (const auto& [name, t] : rollout->state_dict()) changed += !at::equal(t, initial.at(name));
    EXPECT_EQ(changed, static_cast<int64_t>(initial.size())) << "tensors changed by the step";
  });
}

TEST(WeightSync, Pp2TrainerToTp2RolloutWorkers) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string fixture = "tiny-llama";
    auto cfg = ModelConfig::load(kFixtures + "/" + fixture);
    ParallelConfig training;
    training.pp = 2;
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      WeightSender(trainer_model(fixture, ps), trainer_sync(store, *ps, 2)).send(7);
      return;
    }
    auto rollout = tp2_rollout(store, rank - 2, cfg);
    WeightReceiver receiver(rollout, training, worker_sync(store, training, rank - 2, 2));
    EXPECT_EQ(receiver.receive().version, 7);
    auto spec = ShardSpec::for_rank(cfg, rank - 2, 2, 0, {cfg.num_layers});
    expect_exact(*rollout, hf_to_shard(read_hf_weights(kFixtures + "/" + fixture), cfg, spec),
                 "tp2 rollout");
  });
}

// TP2 trainer to TP2 rollout workers: each worker takes only its own shards
// (its parameters' bytes, nothing of the other rank's), straight into its
// parameters, and the trainers send each shard once, to the worker holding
// it. Two exceptions, both counted below: replicated tensors (the norms) go
// from TP rank 0 to both workers, and the 128-token vocabulary pads to 256
// rows at TP2, so rank 1's embedding rows are padding only: nothing of them
// travels (the worker zeroes its own).
// A vocabulary shard whose rows all lie past the real vocabulary.
bool padding_only(const std::string& name, int64_t tp_rank, const at::Tensor& p,
                  const ModelConfig& cfg) {
  const bool vocab = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
  return vocab && tp_rank * p.size(0) >= cfg.vocab_size;
}

TEST(WeightSync, Tp2TrainerToTp2WorkersSendsEachOnlyItsSlice) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string fixture = "tiny-qwen2";
    auto cfg = ModelConfig::load(kFixtures + "/" + fixture);
    ParallelConfig training;
    training.tp = 2;
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      auto train = trainer_model(fixture, ps);
      auto stats = WeightSender(train, trainer_sync(store, *ps, 2)).send(5);
      int64_t sent = 0;
      for (const auto& [name, p] : train->named_params()) {
        const auto bytes = static_cast<int64_t>(p.nbytes());
        if (Transformer::tp_replicated(name))
          sent += rank == 0 ? 2 * bytes : 0;
        else if (!(padding_only(name, rank, p, cfg)))
          sent += bytes;
      }
      EXPECT_EQ(stats.transferred_bytes, sent) << "each shard to the one worker that holds it";
      return;
    }
    auto rollout = tp2_rollout(store, rank - 2, cfg);
    WeightReceiver receiver(rollout, training, worker_sync(store, training, rank - 2, 2));
    auto stats = receiver.receive();
    EXPECT_EQ(stats.version, 5);
    int64_t own = 0;
    for (const auto& [name, p] : rollout->named_params())
      if (!padding_only(name, rank - 2, p, cfg)) own += static_cast<int64_t>(p.nbytes());
    EXPECT_EQ(stats.transferred_bytes, own);
    EXPECT_EQ(stats.peak_buffer_bytes, 0) << "every shard lands in its parameter";
    auto spec = ShardSpec::for_rank(cfg, rank - 2, 2, 0, {cfg.num_layers});
    expect_exact(*rollout, hf_to_shard(read_hf_weights(kFixtures + "/" + fixture), cfg, spec),
                 "tp2 rollout");
  });
}

// DP2 trainer: only the first replica joins the sync group and sends; the
// other replica takes part in the handshake over the training world.
TEST(WeightSync, Dp2TrainerSendsFromTheFirstReplicaOnly) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string fixture = "tiny-llama";
    ParallelConfig training;
    training.dp = 2;
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      auto train = trainer_model(fixture, ps);
      const int64_t me = trainer_sync_rank(*ps);
      EXPECT_EQ(me, ps->coords().dp == 0 ? 0 : -1);
      c10::intrusive_ptr<c10d::ProcessGroup> sync;
      if (me >= 0) {
        expect_error([&] { WeightSender(train, nullptr); }, {"first data-parallel replica"});
        sync = trainer_sync(store, *ps, 1);
      }
      EXPECT_EQ(WeightSender(train, sync).send(3).version, 3);
      return;
    }
    auto cfg = ModelConfig::load(kFixtures + "/" + fixture);
    auto rollout = std::make_shared<Transformer>(cfg, ParallelState::single());
    WeightReceiver receiver(rollout, training, worker_sync(store, training, 0, 1));
    EXPECT_EQ(receiver.receive().version, 3);
    expect_exact(*rollout,
                 hf_to_shard(read_hf_weights(kFixtures + "/" + fixture), cfg,
                             ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})),
                 "from the first replica");
  });
}

TEST(WeightSync, AMismatchedRolloutModelFailsBothSides) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig training;
    if (rank == 0) {
      auto ps = ParallelState::create(prefixed("train", store), 0, training);
      WeightSender sender(trainer_model("tiny-llama", ps), make_sync_group(store, "test", 0, 2));
      expect_error([&] { sender.send(1); }, {"1 rollout rank(s) rejected"});
      return;
    }
    auto qwen = std::make_shared<Transformer>(ModelConfig::load(kFixtures + "/tiny-qwen2"),
                                              ParallelState::single());
    WeightReceiver receiver(qwen, training, make_sync_group(store, "test", 1, 2));
    expect_error([&] { receiver.receive(); }, {"does not fit", "tensors"});
  });
}

// The receiver is told the wrong layer split: every header count matches, the
// digest does not, and both sides fail instead of streaming mismatched buckets.
TEST(WeightSync, ALayerSplitMismatchFailsBothSides) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig training;
    training.pp = 2;
    training.layer_split = {3, 1};
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      ps->set_num_layers(4);
      auto sync = trainer_sync(store, *ps, 1);
      auto cfg = ModelConfig::load(kFixtures + "/tiny-llama");
      auto model = std::make_shared<Transformer>(cfg, ps);
      model->load_state_dict(hf_to_shard(read_hf_weights(kFixtures + "/tiny-llama"), cfg,
                                         ShardSpec::for_rank(cfg, 0, 1, rank, {3, 1})));
      WeightSender sender(model, sync);
      expect_error([&] { sender.send(1); }, {"1 rollout rank(s) rejected"});
      return;
    }
    ParallelConfig told = training;
    told.layer_split = {};  // even: [2, 2]
    auto rollout = std::make_shared<Transformer>(ModelConfig::load(kFixtures + "/tiny-llama"),
                                                 ParallelState::single());
    WeightReceiver receiver(rollout, told, worker_sync(store, training, 0, 1));
    expect_error([&] { receiver.receive(); }, {"layer split", "digests differ"});
  });
}

// A rollout worker that joined the sync group but never receives: the
// trainer's send fails within the deadline instead of waiting, naming the
// sync group, the operation and the receiver's sync rank.
TEST(WeightSync, AReceiverThatNeverArrivesFailsTheSenderNamingIt) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    constexpr std::chrono::milliseconds kDeadline{1000};
    ParallelConfig training;
    if (rank == 0) {
      auto ps = ParallelState::create(prefixed("train", store), 0, training, kDeadline);
      WeightSender sender(trainer_model("tiny-llama", ps),
                          make_sync_group(store, "late", 0, 2, kDeadline));
      const auto t0 = std::chrono::steady_clock::now();
      expect_error([&] { sender.send(1); },
                   {"group weight_sync:late (ranks 0, 1)", "on rank 0", "rank 1 did not arrive",
                    "collective deadline 1000 ms"});
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 2 * kDeadline + std::chrono::seconds(5));
      store->set("released", std::vector<uint8_t>{1});
      return;
    }
    auto rollout = std::make_shared<Transformer>(ModelConfig::load(kFixtures + "/tiny-llama"),
                                                 ParallelState::single());
    WeightReceiver receiver(rollout, training, make_sync_group(store, "late", 1, 2, kDeadline));
    // Alive and in the group, but never calls receive(), until the sender has failed.
    store->wait({"released"}, std::chrono::seconds(60));
  });
}

}  // namespace
}  // namespace baton::engine
