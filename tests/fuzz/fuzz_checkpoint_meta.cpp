// Fuzzes a checkpoint's metadata as resume reads it, before any weight:
//   the engine's (engine/io/checkpoint.h, find_checkpoint): root/latest, and
//     step_00000003/checkpoint.json, layout.json and config.json;
//   the trainer's (trainer/checkpoint_files.h): latest_checkpointed_iteration.txt,
//     global_step_3/trainer_state.json and the async trainer's
//     global_step_3/rollout_ledger/rollout_ledger.json (its DataProto files,
//     which fuzz_data_proto covers, are absent: a ledger that names one is
//     refused naming it).
// The input is those seven files in that order, separated by "\n====\n" lines; a
// missing part is a missing file. A malformed file must be refused with an
// error naming a file of the checkpoint (engine::EngineError for the engine's,
// baton::Error for the trainer's) and nothing else: no crash, no other
// exception, no allocation the files cannot justify. What is accepted must
// hold together: a layout whose stages cover the model's layers and whose
// padded vocabulary divides by tp.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "base/atomic_file.h"
#include "base/errors.h"
#include "engine/errors.h"
#include "engine/io/checkpoint.h"
#include "trainer/async/rollout_ledger.h"
#include "trainer/checkpoint_files.h"

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSeparator = "\n====\n";

std::vector<std::string_view> parts(std::string_view input) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t at = input.find(kSeparator);
    out.push_back(input.substr(0, at));
    if (at == std::string_view::npos) return out;
    input.remove_prefix(at + kSeparator.size());
  }
}

void write_or_remove(const fs::path& file, const std::vector<std::string_view>& in, size_t i) {
  if (i < in.size()) {
    std::ofstream(file, std::ios::binary | std::ios::trunc)
        .write(in[i].data(), static_cast<std::streamsize>(in[i].size()));
  } else {
    fs::remove(file);
  }
}

void require_names(const std::string& message, const fs::path& under) {
  if (message.find(under.string()) == std::string::npos) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path base =
      fs::temp_directory_path() / ("fuzz_checkpoint_meta_" + std::to_string(getpid()));
  static const fs::path root = base / "actor";
  static const fs::path step_dir = root / "step_00000003";
  static const fs::path out = base / "out";
  static const bool made = fs::create_directories(step_dir) &&
                           fs::create_directories(out / "global_step_3" / "rollout_ledger");
  // Removed when the run ends (remove_tree: see base/atomic_file.h).
  static const struct Cleanup {
    ~Cleanup() { baton::remove_tree(base); }
  } cleanup;
  (void)made;
  (void)cleanup;
  const auto in = parts(std::string_view(reinterpret_cast<const char*>(data), size));
  write_or_remove(root / "latest", in, 0);
  write_or_remove(step_dir / "checkpoint.json", in, 1);
  write_or_remove(step_dir / "layout.json", in, 2);
  write_or_remove(step_dir / "config.json", in, 3);
  write_or_remove(out / baton::trainer::kLatestTrainerCheckpointFile, in, 4);
  write_or_remove(out / "global_step_3" / "trainer_state.json", in, 5);
  write_or_remove(out / "global_step_3" / "rollout_ledger" / "rollout_ledger.json", in, 6);

  try {
    const baton::engine::SavedCheckpoint found = baton::engine::find_checkpoint(root);
    const baton::engine::ShardedLayout& l = found.layout;
    const auto cfg = baton::engine::ModelConfig::load(found.dir);
    if (l.tp < 1 || l.pp < 1 || static_cast<int64_t>(l.layer_split.size()) != l.pp)
      __builtin_trap();
    if (std::accumulate(l.layer_split.begin(), l.layer_split.end(), int64_t{0}) != cfg.num_layers)
      __builtin_trap();
    const int64_t padded = l.padded_vocab_size(cfg);
    if (padded < cfg.vocab_size || padded % l.tp != 0) __builtin_trap();
  } catch (const baton::engine::EngineError& e) {
    require_names(e.what(), root);
  }

  try {
    if (const auto dir = baton::trainer::latest_trainer_checkpoint(out)) {
      const baton::trainer::TrainerStateFile state = baton::trainer::read_trainer_state(*dir);
      if (state.global_step < 0 || !(state.kl_coef >= 0)) __builtin_trap();
      (void)baton::trainer::load_ledger(*dir / "rollout_ledger");
    }
  } catch (const baton::Error& e) {
    require_names(e.what(), out);
  }
  return 0;
}
