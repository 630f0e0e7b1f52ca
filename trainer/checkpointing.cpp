// Save and resume of the PPO trainer (trainer_state.h).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "base/log.h"
#include "trainer/checkpoint_files.h"
#include "trainer/trainer_state.h"

namespace baton::trainer {
namespace fs = std::filesystem;

namespace {

// What a failed save of global_step_`step` wrote, unless the latest-step file
// names it (a re-save of that step). Best effort: a leftover is logged, never
// hides the save's own error.
void remove_failed_trainer_checkpoint(const fs::path& out_dir, int64_t step) {
  try {
    std::optional<int64_t> latest;
    try {
      latest = read_step_file(out_dir / kLatestTrainerCheckpointFile);
    } catch (const FileError&) {
    }
    if (latest != step) remove_tree(trainer_checkpoint_dir(out_dir, step));
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, "trainer: cleaning up after the failed checkpoint of step " +
                             std::to_string(step) + ": " + e.what());
  }
}

void write_trainer_checkpoint(PpoTrainer::State& st, const std::function<LedgerSnapshot()>& ledger,
                              const fs::path& dir) {
  const int64_t step = st.global_step;
  fs::create_directories(dir);
  remove_checksum_manifest(dir);
  st.actor->call("save_checkpoint", {(dir / "actor").string(), step, std::string("{}")}).get();
  if (st.s.use_critic) {
    st.critic_role()
        .call("save_checkpoint", {(dir / "critic").string(), step, std::string("{}")})
        .get();
  }
  std::string loader_state;
  if (ledger) {
    // The async rollouter draws prompts while this runs: the loader's
    // position is the one past the ledger's entries, read with them.
    const LedgerSnapshot snap = ledger();
    loader_state = snap.loader_state;
    save_ledger(snap.entries, dir / "rollout_ledger");
  } else {
    loader_state = st.loader->state().to_json();
  }
  nlohmann::json state = {{"global_step", step},
                          {"loader", nlohmann::json::parse(loader_state)},
                          {"kl_coef", st.kl_ctrl->value}};
  ChecksumManifest manifest;  // the workers' and the ledger's directories carry their own
  manifest.add("trainer_state.json",
               baton::write_file_atomically(dir / "trainer_state.json", state.dump(2)));
  manifest.write(dir);
  baton::write_file_atomically(fs::path(st.s.out_dir) / kLatestTrainerCheckpointFile,
                               std::to_string(step));
}

}  // namespace

void save_trainer_checkpoint(PpoTrainer::State& st, const std::function<LedgerSnapshot()>& ledger) {
  const int64_t step = st.global_step;
  const fs::path out_dir = st.s.out_dir;
  const fs::path dir = trainer_checkpoint_dir(out_dir, step);
  try {
    write_trainer_checkpoint(st, ledger, dir);
  } catch (const std::exception& e) {
    // A full disk, a file-size limit: the run stops here, with the previous
    // checkpoint intact, rather than train on with nothing to resume from.
    remove_failed_trainer_checkpoint(out_dir, step);
    const std::string message = "trainer: the checkpoint of step " + std::to_string(step) + " (" +
                                dir.string() + ") failed and was removed; " +
                                describe_step_file(out_dir / kLatestTrainerCheckpointFile) +
                                "; stopping: " + e.what();
    log(LogLevel::kError, message);
    throw Error(message);
  }
}

bool has_trainer_checkpoint(const std::string& out_dir) {
  return fs::exists(fs::path(out_dir) / kLatestTrainerCheckpointFile);
}

bool resume_trainer_checkpoint(PpoTrainer::State& st) {
  const std::string& mode = st.s.resume_mode;
  fs::path dir;
  if (mode == "disable") return false;
  if (mode == "auto") {
    const std::optional<fs::path> latest = latest_trainer_checkpoint(st.s.out_dir);
    if (!latest) return false;
    dir = *latest;
  } else if (mode == "resume_path") {
    if (!st.s.resume_from_path)
      throw ConfigError("trainer.resume_mode = resume_path needs trainer.resume_from_path");
    dir = *st.s.resume_from_path;
  } else {
    throw ConfigError("trainer.resume_mode = '" + mode + "' is not one of: auto, disable, resume_path");
  }
  const TrainerStateFile state = read_trainer_state(dir);
  st.actor->call("load_checkpoint", {(dir / "actor").string(), state.global_step}).get();
  if (st.s.use_critic)
    st.critic_role().call("load_checkpoint", {(dir / "critic").string(), state.global_step}).get();
  st.loader->restore(state.loader);
  st.kl_ctrl->value = state.kl_coef;
  st.global_step = state.global_step;
  st.restored_ledger = load_ledger(dir / "rollout_ledger");
  log(LogLevel::kInfo, "resumed from " + dir.string() + " (step " + std::to_string(st.global_step) + ")");
  if (!st.restored_ledger.empty() && !st.s.async.enable) {
    log(LogLevel::kWarn,
        "resume: the checkpoint holds the async rollouter's " +
            describe_ledger(st.restored_ledger) +
            "; the synchronous trainer does not train them (set async_training.enable=true to)");
  }
  return true;
}

}  // namespace baton::trainer
