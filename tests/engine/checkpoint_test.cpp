// Checkpoints, one process: round trip, a crash at each phase of a save
// leaves the previous checkpoint loadable, corrupt files and layout
// mismatches are errors naming what is wrong.
#include "engine/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/errors.h"
#include "engine/pipeline_schedule.h"
#include "engine/safetensors.h"
#include "engine/sharded_model.h"
#include "engine/weight_conversion.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = BATON_FIXTURES_DIR;

struct Trainer {
  ModelConfig cfg = ModelConfig::load(kFixtures / "tiny-llama");
  std::shared_ptr<Transformer> model;
  std::unique_ptr<Optimizer> opt;
  MicroBatch mb;

  Trainer() {
    model = std::make_shared<Transformer>(cfg, ParallelState::single());
    model->load_state_dict(hf_to_shard(read_hf_weights(kFixtures / "tiny-llama"), cfg,
                                       ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers})));
    opt = std::make_unique<Optimizer>(model, OptimizerOptions().set_lr(1e-3));
    auto ref = read_safetensors(kFixtures / "tiny-llama" / "reference.safetensors");
    mb.input_ids = ref.at("input_ids");
    mb.position_ids = ref.at("position_ids");
    mb.attention_mask = ref.at("attention_mask");
    mb.extra["mask"] = ref.at("response_mask").to(at::kFloat);
  }
  double step() {
    opt->zero_grad();
    const Group& tp = model->parallel().tp();
    auto losses =
        forward_backward(*model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
          auto lp = next_token_log_probs(logits, m.input_ids, tp);
          return -(lp * m.extra.at("mask")).sum() / m.extra.at("mask").sum();
        });
    opt->step();
    return losses.at(0).item<double>();
  }
};

TEST(Checkpoint, ResumeContinuesExactlyAsAnUninterruptedRun) {
  testing::TempDir dir;
  Trainer straight;
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) want.push_back(straight.step());

  {
    Trainer first;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(first.step(), want[i]);
    save_checkpoint(dir.path(), 3, *first.model, *first.opt, {{"epoch", 1}});
    // The step directory is a sharded model directory: it exports to HF.
    auto exported = shards_to_hf(load_sharded_all(dir / "step_00000003"), first.cfg,
                                 {first.cfg.num_layers}, false);
    auto live =
        shards_to_hf({{first.model->state_dict()}}, first.cfg, {first.cfg.num_layers}, false);
    ASSERT_EQ(exported.size(), live.size());
    for (const auto& [name, t] : live) EXPECT_TRUE(at::equal(exported.at(name), t)) << name;
  }
  Trainer resumed;  // fresh weights and optimizer, then the checkpoint
  auto extra = load_checkpoint(dir.path(), *resumed.model, *resumed.opt);
  EXPECT_EQ(extra.at("epoch"), 1);
  EXPECT_EQ(resumed.opt->steps_done(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(resumed.step(), want[i]) << "step " << i;
}

TEST(Checkpoint, ACrashAtAnyPhaseLeavesThePreviousCheckpoint) {
  for (std::string crash_at : {"files_written", "before_publish"}) {
    testing::TempDir dir;
    Trainer t;
    t.step();
    save_checkpoint(dir.path(), 1, *t.model, *t.opt);
    auto saved = t.model->state_dict();
    t.step();
    SaveOptions crash;
    crash.on_phase = [&](const std::string& phase) {
      if (phase == crash_at) throw std::runtime_error("simulated crash");
    };
    EXPECT_THROW(save_checkpoint(dir.path(), 2, *t.model, *t.opt, {}, crash), std::runtime_error);
    EXPECT_EQ(latest_checkpoint(dir.path()), 1) << crash_at;

    Trainer fresh;
    load_checkpoint(dir.path(), *fresh.model, *fresh.opt);
    for (const auto& [name, w] : fresh.model->state_dict())
      EXPECT_TRUE(at::equal(w, saved.at(name))) << crash_at << " " << name;
    // The next save replaces the leftover partial directory.
    save_checkpoint(dir.path(), 2, *t.model, *t.opt);
    EXPECT_EQ(latest_checkpoint(dir.path()), 2);
    EXPECT_FALSE(fs::exists(dir / "step_00000002.partial"));
  }
}

TEST(Checkpoint, CorruptFilesAndMismatchedLayoutsAreErrorsNamingTheFile) {
  testing::TempDir dir;
  Trainer t;
  save_checkpoint(dir.path(), 5, *t.model, *t.opt);
  auto model_file = dir / "step_00000005" / "model-tp0-pp0.safetensors";
  fs::resize_file(model_file, fs::file_size(model_file) - 100);
  Trainer other;
  try {
    load_checkpoint(dir.path(), *other.model, *other.opt);
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("model-tp0-pp0.safetensors"), std::string::npos)
        << e.what();
  }

  testing::TempDir dir2;
  save_checkpoint(dir2.path(), 1, *t.model, *t.opt);
  auto cfg = t.cfg;
  auto value = std::make_shared<Transformer>(cfg, ParallelState::single(),
                                             TransformerOptions().set_value_model(true));
  Optimizer value_opt(value, OptimizerOptions());
  try {
    load_checkpoint(dir2.path(), *value, value_opt);
    FAIL() << "expected EngineError";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("value_model"), std::string::npos) << e.what();
  }

  testing::TempDir empty;
  EXPECT_THROW(load_checkpoint(empty.path(), *t.model, *t.opt), EngineError);
  std::ofstream(empty / "latest") << "garbage";
  EXPECT_THROW(latest_checkpoint(empty.path()), EngineError);
}

}  // namespace
}  // namespace baton::engine
