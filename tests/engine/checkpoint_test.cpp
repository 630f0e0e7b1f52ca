// Checkpoints, one process: round trip, a crash at each phase of a save
// leaves the previous checkpoint loadable, corrupt files and layout
// mismatches are errors naming what is wrong.
#include "engine/io/checkpoint.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"
#include "tests/file_faults.h"

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

// A checksum of everything a checkpoint restores that the next step reads:
// the parameters' bytes (FNV-1a, in name order) and the optimizer's step.
std::string state_checksum(const Trainer& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& [name, w] : t.model->state_dict()) {
    const at::Tensor c = w.contiguous();
    mix(name.data(), name.size());
    mix(c.data_ptr(), c.nbytes());
  }
  const int64_t steps = t.opt->steps_done();
  mix(&steps, sizeof steps);
  return std::to_string(h);
}

// The child of the kill test (run by it, skipped otherwise): resumes from the
// latest checkpoint under $BATON_KILL_DIR, then trains and saves every step
// until it is killed, writing each step's checksum before its save.
TEST(CheckpointKillChild, TrainsAndSavesUntilKilled) {
  const char* root = std::getenv("BATON_KILL_DIR");
  if (root == nullptr) GTEST_SKIP() << "run by Checkpoint.KilledDuringSaves...";
  Trainer t;
  int64_t step = latest_checkpoint(root).value_or(0);
  if (step > 0) load_checkpoint(root, *t.model, *t.opt);
  for (;;) {
    t.step();
    ++step;
    write_file_atomically(fs::path(root) / ("expected_" + std::to_string(step)), state_checksum(t));
    save_checkpoint(root, step, *t.model, *t.opt);
  }
}

// kill -9 at random moments of a training process that saves every step, 50
// times over the same checkpoint directory: after every kill the latest
// checkpoint loads, holds exactly the state saved at its step, and the next
// process resumes from it (so the chain of resumes never breaks); leftovers
// of interrupted saves are at most one `.partial` directory.
TEST(Checkpoint, KilledDuringSavesEveryResumeFindsTheLatestCompleteCheckpoint) {
  testing::TempDir dir;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string env = "BATON_KILL_DIR=" + dir.path().string();
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=CheckpointKillChild.TrainsAndSavesUntilKilled";
  char* argv[] = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
  std::mt19937 rng(20261127);
  int64_t latest = 0;
  for (int round = 0; round < 50; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execve(self.c_str(), argv, envp.data());
      ::_exit(127);
    }
    // Kill only once this process has saved a new checkpoint, at a random
    // moment of its following saves.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (latest_checkpoint(dir.path()).value_or(0) <= latest &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, 40000)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the child ended by itself";

    const std::optional<int64_t> found = latest_checkpoint(dir.path());
    ASSERT_TRUE(found.has_value()) << "round " << round;
    ASSERT_GT(*found, latest) << "round " << round << ": no progress";
    latest = *found;
    Trainer resumed;
    load_checkpoint(dir.path(), *resumed.model, *resumed.opt);
    std::ifstream want(dir / ("expected_" + std::to_string(latest)));
    std::string expected;
    want >> expected;
    ASSERT_EQ(state_checksum(resumed), expected) << "round " << round << ", step " << latest;
  }
  int partial = 0;
  for (const auto& e : fs::directory_iterator(dir.path()))
    partial += e.path().extension() == ".partial";
  EXPECT_LE(partial, 1);
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

// A flipped byte anywhere in a checkpoint (a safetensors header, the middle of
// a tensor, a metadata file, the manifest itself) is refused on load naming
// the file and the byte range; flipped back, the checkpoint loads again.
TEST(Checkpoint, AFlippedByteAnywhereIsRefusedNamingTheFileAndTheByteRange) {
  testing::TempDir dir;
  Trainer t;
  t.step();
  save_checkpoint(dir.path(), 4, *t.model, *t.opt, {{"epoch", 2}});
  const fs::path step = dir / "step_00000004";
  ASSERT_TRUE(fs::exists(step / kChecksumManifestFile));
  const ChecksumManifest manifest = *ChecksumManifest::read(step);
  for (const char* name :
       {"model-tp0-pp0.safetensors", "optim-tp0-pp0.safetensors", "rng-0.safetensors",
        "config.json", "layout.json", "checkpoint.json", "extra.json"})
    EXPECT_NE(manifest.find(name), nullptr) << name;

  struct Damage {
    std::string file;
    uint64_t offset;
  };
  const uint64_t model_size = fs::file_size(step / "model-tp0-pp0.safetensors");
  const uint64_t optim_size = fs::file_size(step / "optim-tp0-pp0.safetensors");
  ASSERT_GT(optim_size, kChecksumBlockBytes);  // a second block to name
  const std::vector<Damage> damages = {
      {"model-tp0-pp0.safetensors", 3},               // the header length
      {"model-tp0-pp0.safetensors", 100},             // the JSON header
      {"model-tp0-pp0.safetensors", model_size / 2},  // a weight
      {"optim-tp0-pp0.safetensors", optim_size - 5},  // a moment, in the last block
      {"rng-0.safetensors", 200},
      {"checkpoint.json", 5},
      {"layout.json", 10},
      {"config.json", 20},
      {"extra.json", 4},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.file + " at " + std::to_string(d.offset));
    const fs::path file = step / d.file;
    baton::testing::flip_byte(file, d.offset);
    Trainer fresh;
    testing::expect_error(
        [&] { load_checkpoint(dir.path(), *fresh.model, *fresh.opt); },
        {file.string(),
         baton::testing::block_range(d.offset, fs::file_size(file), kChecksumBlockBytes),
         "do not match", (step / kChecksumManifestFile).string()});
    baton::testing::flip_byte(file, d.offset);
  }
  const fs::path manifest_file = step / kChecksumManifestFile;
  for (uint64_t offset : {uint64_t{2}, fs::file_size(manifest_file) / 2}) {
    baton::testing::flip_byte(manifest_file, offset);
    Trainer fresh;
    testing::expect_error([&] { load_checkpoint(dir.path(), *fresh.model, *fresh.opt); },
                          {manifest_file.string(), "bytes ["});
    baton::testing::flip_byte(manifest_file, offset);
  }
  Trainer fresh;
  EXPECT_EQ(load_checkpoint(dir.path(), *fresh.model, *fresh.opt).at("epoch"), 2);
  for (const auto& [name, w] : fresh.model->state_dict())
    EXPECT_TRUE(at::equal(w, t.model->state_dict().at(name))) << name;
}

// BATON_VERIFY_CHECKSUMS=0 reads a damaged file as it is (for a file edited
// on purpose); a checkpoint saved before manifests existed loads unverified.
TEST(Checkpoint, VerificationCanBeTurnedOffAndOldCheckpointsLoadUnverified) {
  testing::TempDir dir;
  Trainer t;
  save_checkpoint(dir.path(), 1, *t.model, *t.opt, {{"epoch", 1}});
  const fs::path extra = dir / "step_00000001" / "extra.json";
  std::ofstream(extra, std::ios::trunc) << R"({"epoch": 7})";
  Trainer fresh;
  EXPECT_THROW(load_checkpoint(dir.path(), *fresh.model, *fresh.opt), EngineError);
  ::setenv("BATON_VERIFY_CHECKSUMS", "0", 1);
  EXPECT_EQ(load_checkpoint(dir.path(), *fresh.model, *fresh.opt).at("epoch"), 7);
  ::unsetenv("BATON_VERIFY_CHECKSUMS");
  remove_checksum_manifest(dir / "step_00000001");  // as an old checkpoint
  EXPECT_EQ(load_checkpoint(dir.path(), *fresh.model, *fresh.opt).at("epoch"), 7);
}

// A save that runs out of space fails with an error naming the file, removes
// its partial directory and leaves `latest` on the previous checkpoint, which
// still loads; once there is room again the same save succeeds.
TEST(Checkpoint, ASaveIntoAFullDiskFailsCleanlyAndKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  Trainer t;
  t.step();
  save_checkpoint(dir.path(), 1, *t.model, *t.opt);
  const auto saved = t.model->state_dict();
  t.step();
  // The first file fails (the model's), or a later one (the optimizer's).
  const rlim_t model_size = fs::file_size(dir / "step_00000001" / "model-tp0-pp0.safetensors");
  ASSERT_LT(model_size + 4096, fs::file_size(dir / "step_00000001" / "optim-tp0-pp0.safetensors"));
  for (rlim_t limit : {rlim_t{4096}, model_size + 4096}) {
    SCOPED_TRACE(limit);
    {
      baton::testing::FileSizeLimit full(limit);
      testing::expect_error([&] { save_checkpoint(dir.path(), 2, *t.model, *t.opt); },
                            {"save_checkpoint: the checkpoint of step 2", "step_00000002.partial/",
                             ".safetensors: write failed at byte", std::strerror(EFBIG),
                             (dir / "latest").string() + " still names step 1"});
    }
    EXPECT_FALSE(fs::exists(dir / "step_00000002.partial"));
    EXPECT_FALSE(fs::exists(dir / "step_00000002"));
    EXPECT_EQ(latest_checkpoint(dir.path()), 1);
    Trainer fresh;
    load_checkpoint(dir.path(), *fresh.model, *fresh.opt);
    for (const auto& [name, w] : fresh.model->state_dict())
      EXPECT_TRUE(at::equal(w, saved.at(name))) << name;
  }
  {  // nothing saved yet: the message says so
    testing::TempDir empty;
    baton::testing::FileSizeLimit full(4096);
    testing::expect_error([&] { save_checkpoint(empty.path(), 1, *t.model, *t.opt); },
                          {"there is no " + (empty / "latest").string() + " yet"});
    EXPECT_FALSE(fs::exists(empty / "step_00000001.partial"));
    EXPECT_FALSE(fs::exists(empty / "latest"));
  }
  save_checkpoint(dir.path(), 2, *t.model, *t.opt);
  EXPECT_EQ(latest_checkpoint(dir.path()), 2);
}

// What resume reads before any weight: `latest` holds a step number and
// nothing else, checkpoint.json is this format's and its directory's step,
// and each refusal names its file.
TEST(Checkpoint, TheMetadataIsCheckedFileByFileWithoutAModel) {
  testing::TempDir dir;
  Trainer t;
  save_checkpoint(dir.path(), 3, *t.model, *t.opt);
  SavedCheckpoint found = find_checkpoint(dir.path());
  EXPECT_EQ(found.step, 3);
  EXPECT_EQ(found.dir, dir / "step_00000003");
  EXPECT_EQ(found.layout.tp, 1);
  EXPECT_FALSE(found.layout.value_model);
  std::ofstream(dir / "latest", std::ios::trunc) << "  3\n\n";  // an editor's newline
  EXPECT_EQ(latest_checkpoint(dir.path()), 3);
  auto refused = [&](const std::string& file, const std::string& what) {
    testing::expect_error([&] { find_checkpoint(dir.path()); }, {file, what});
  };
  for (const char* text : {"3x", "-3", "", "9999999999999999999999", "0x3"}) {
    std::ofstream(dir / "latest", std::ios::trunc) << text;
    refused((dir / "latest").string(), "expected a step number");
  }
  std::ofstream(dir / "latest", std::ios::trunc) << "3";
  // The files below are edited by hand: their checks, not the checksums, are
  // under test (Checkpoint.AFlippedByte... tests those).
  remove_checksum_manifest(dir / "step_00000003");
  const fs::path meta = dir / "step_00000003" / "checkpoint.json";
  std::ofstream(meta, std::ios::trunc) << R"({"format": "baton-checkpoint-v1", "step": 4})";
  refused(meta.string(), "\"step\" is not 3");
  std::ofstream(meta, std::ios::trunc) << R"({"format": "other", "step": 3})";
  refused(meta.string(), "\"format\"");
  std::ofstream(meta, std::ios::trunc) << "{";
  refused(meta.string(), "malformed JSON");
  fs::remove(meta);
  refused(meta.string(), "missing");
  // A field of the wrong type is refused naming its file, not as nlohmann's
  // type_error (found by fuzz_checkpoint_meta).
  std::ofstream(meta, std::ios::trunc) << R"({"format": "baton-checkpoint-v1", "step": 3})";
  const fs::path layout = dir / "step_00000003" / "layout.json";
  std::ofstream(layout, std::ios::trunc) << R"({"format": 3})";
  refused(layout.string(), "\"format\"");
  const fs::path config = dir / "step_00000003" / "config.json";
  std::ofstream(layout, std::ios::trunc)
      << R"({"format": "baton-sharded-v1", "tp": 1, "pp": 1, "layer_split": [2], "value_model": false})";
  std::ofstream(config, std::ios::trunc) << R"({"vocab_size": "many"})";
  refused(config.string(), "");
}

}  // namespace
}  // namespace baton::engine
