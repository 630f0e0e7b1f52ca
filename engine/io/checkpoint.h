// Sharded training checkpoints: model, optimizer (moments, master weights,
// step — the schedule position), RNG state and a JSON of the caller's own
// (data-loader position, ...), one directory per step:
//
//   root/latest                        "12" (the newest complete checkpoint)
//   root/step_00000012/               a baton-sharded-v1 model directory (so
//                                      baton-convert --to-hf exports it) plus:
//     config.json, layout.json         the model's HF config; tp, pp, layer split,
//                                      vocabulary padding, ep (> 1 only)
//     model-tp{t}-pp{p}.safetensors    engine-named weights (DP rank 0 writes)
//     checkpoint.json                  step, dp, cp
//     optim-tp{t}-pp{p}.safetensors    optimizer state (DP rank 0 writes)
//     rng-{rank}.safetensors           every rank's generator state
//     extra.json                       the caller's JSON
//     baton-checksums.txt              the CRC-32C of every 1 MiB block of every
//                                      file above (base/checksum_manifest.h)
//
// Expert parallelism (a MoE model at ep > 1): dp ranks 0..ep-1 (cp 0) hold
// different experts, and the plain optimizer different state for them; each
// writes model-tp{t}-pp{p}-ep{e}.safetensors and optim-tp{t}-pp{p}-ep{e}
// .safetensors for its EP rank e (sharded_model.h). Loading under another ep
// (one that divides num_experts and the new dp) reshards: the files' experts
// are joined and split again (resplit_experts), model and optimizer state.
//
// Atomic: every rank writes into `step_N.partial/`; after a barrier rank 0
// merges every rank's checksums into the manifest, writes it, renames the
// directory to `step_N` and then rewrites `latest` by rename. A crash at any
// point leaves the previous checkpoint and `latest` intact; a leftover
// `.partial` directory is ignored and replaced by the next save. A save that
// fails (a full disk, a file-size limit) fails on every rank, removes what it
// wrote and leaves `latest` on the previous checkpoint.
//
// Verified: every file a load reads is checked against the manifest
// (verification is on unless BATON_VERIFY_CHECKSUMS=0), so a flipped byte is
// an EngineError naming the file and the byte range. A checkpoint without a
// manifest (saved before baton wrote one) loads unverified, with a warning.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "engine/io/sharded_model.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"

namespace baton::engine {

inline constexpr const char* kCheckpointFormat = "baton-checkpoint-v1";
namespace detail {
// "step_00000012".
std::string step_dir_name(int64_t step);
// One of a checkpoint's JSON files: EngineError "<file>: missing checkpoint
// file" when it is absent, else read_json_file's (hf_model.h).
nlohmann::json read_checkpoint_json(const std::filesystem::path& file);
}  // namespace detail

struct SaveOptions {
  // Test seam: called on every rank at each phase of a save ("files_written"
  // after this rank's files, "before_publish" on rank 0 before the rename).
  // A hook that throws (or kills the process) simulates a crash there.
  std::function<void(const std::string& phase)> on_phase;
};

// Collective over the model's world: every rank calls it with the same
// arguments. Blocks until the checkpoint is complete on disk. When writing
// fails on any rank (ENOSPC, EFBIG, ...), every rank throws EngineError (the
// failing rank's names the file and errno's reason) after rank 0 has removed
// the partial directory; `latest` still names the previous checkpoint.
void save_checkpoint(const std::filesystem::path& root, int64_t step, const Transformer& model,
                     const Optimizer& optimizer, const nlohmann::json& extra = {},
                     const SaveOptions& options = {});

// The newest complete checkpoint's step under `root`, if any. Throws
// EngineError when `latest` holds anything but a step number (whitespace
// around it aside) or names a step whose directory is missing.
std::optional<int64_t> latest_checkpoint(const std::filesystem::path& root);

// A complete checkpoint's metadata, read and checked without a model.
struct SavedCheckpoint {
  int64_t step = 0;
  std::filesystem::path dir;  // root/step_NNNNNNNN
  ShardedLayout layout;       // layout.json, checked against config.json
};
// The checkpoint under `root` at `step` (the latest when empty): its
// checkpoint.json must be this format's and name that step, its layout.json
// and config.json must agree. Throws EngineError naming the file otherwise,
// or when there is no checkpoint.
SavedCheckpoint find_checkpoint(const std::filesystem::path& root,
                                std::optional<int64_t> step = std::nullopt);

// Restores this rank's model, optimizer and RNG from `root` at `step` (the
// latest when empty) and returns the caller's JSON. Throws EngineError when
// there is no checkpoint, a file is missing or corrupt (a byte that does not
// match the checksums: the file and the byte range), or the checkpoint's
// layout (tp, pp, layer split, model kind, padded vocabulary size) differs
// from the model's. A different ep is resharded, not refused.
nlohmann::json load_checkpoint(const std::filesystem::path& root, Transformer& model,
                               Optimizer& optimizer, std::optional<int64_t> step = std::nullopt);

}  // namespace baton::engine
