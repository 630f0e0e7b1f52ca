// The small files of a trainer checkpoint (trainer_state.h), read and checked
// without its workers: trainer.default_local_dir's
// latest_checkpointed_iteration.txt, and global_step_N/trainer_state.json.
// Its own header so that the checkpoint metadata fuzz target (tests/fuzz/)
// reads them as resume does.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>

#include "data/prompt_loader.h"

namespace baton::trainer {

inline constexpr const char* kLatestTrainerCheckpointFile = "latest_checkpointed_iteration.txt";

// out_dir/global_step_<step>.
std::filesystem::path trainer_checkpoint_dir(const std::filesystem::path& out_dir, int64_t step);

// The checkpoint directory out_dir's latest_checkpointed_iteration.txt names;
// none without that file. baton::Error naming the file when it holds anything
// but a step number or names a directory that does not exist.
std::optional<std::filesystem::path> latest_trainer_checkpoint(
    const std::filesystem::path& out_dir);

struct TrainerStateFile {
  int64_t global_step = 0;
  data::LoaderState loader;
  double kl_coef = 0;
};
// dir/trainer_state.json. baton::Error naming the file when it is missing,
// malformed, incomplete, or holds a negative step or a KL coefficient that is
// not a finite number >= 0; naming the byte range when it does not match the
// checksum manifest of `dir` (base/checksum_manifest.h).
TrainerStateFile read_trainer_state(const std::filesystem::path& dir);

// j[key] as an integer. baton::Error naming `file` and the key when j is not
// an object, or the key is missing or not an integer (a number such as 1e48
// would not convert: undefined behaviour, found by fuzz_checkpoint_meta).
int64_t json_integer(const nlohmann::json& j, const char* key, const std::filesystem::path& file);

}  // namespace baton::trainer
