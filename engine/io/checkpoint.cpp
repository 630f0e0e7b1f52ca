#include "engine/io/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "base/log.h"
#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"

namespace fs = std::filesystem;

namespace baton::engine {
namespace {

// A per-rank file's name after its prefix ("optim"): as sharded_rank_file's.
std::string rank_file(const std::string& prefix, const Coords& c, int64_t ep_rank,
                      int64_t ep_size) {
  return detail::cat(prefix, "-tp", c.tp, "-pp", c.pp,
                     ep_size > 1 ? detail::cat("-ep", ep_rank) : std::string(), ".safetensors");
}

ShardedLayout sharded_layout(const Transformer& model) {
  const ParallelConfig& pc = model.parallel().config();
  ShardedLayout l;
  l.tp = pc.tp;
  l.pp = pc.pp;
  l.layer_split =
      pc.layer_split.empty() ? even_layer_split(model.config().num_layers, pc.pp) : pc.layer_split;
  l.value_model = model.options().value_model;
  l.make_vocab_size_divisible_by = pc.make_vocab_size_divisible_by;
  // A dense model's EP ranks hold the same tensors: one file per (tp, pp).
  l.ep = model.config().moe.num_experts > 0 ? pc.ep : 1;
  return l;
}

// This rank's EP rank in `layout` (0 without EP).
int64_t ep_rank_in(const ShardedLayout& layout, const ParallelState& ps) {
  return layout.ep > 1 ? ps.ep_rank() : 0;
}

nlohmann::json checkpoint_json(const Transformer& model, int64_t step) {
  const ParallelConfig& pc = model.parallel().config();
  return {{"format", kCheckpointFormat}, {"step", step}, {"dp", pc.dp}, {"cp", pc.cp}};
}

// The checksums of rank r's files, which rank 0 merges into the manifest.
std::string checksum_fragment(int64_t rank) {
  return detail::cat("baton-checksums-rank", rank, ".txt");
}

// How many ranks of the world report a failure (`failed` is this rank's).
// Collective over the world.
int64_t failed_ranks(const ParallelState& ps, bool failed) {
  if (ps.world().size == 1) return failed ? 1 : 0;
  at::Tensor flag =
      at::full({1}, failed ? 1 : 0, at::TensorOptions().dtype(at::kLong).device(ps.device()));
  std::vector<at::Tensor> ts{flag};
  ps.world().pg->allreduce(ts)->wait();
  return flag.item<int64_t>();
}

// What a save of `step` that failed leaves: its partial directory, a
// previous step directory moved aside (put back), and the step directory
// itself unless `latest` names it (a save that failed writing `latest`).
// Best effort: a leftover is logged, never hides the save's own error.
void remove_failed_save(const fs::path& root, int64_t step) {
  const std::string name = detail::step_dir_name(step);
  const fs::path final_dir = root / name, old = root / (name + ".old");
  try {
    remove_tree(root / (name + ".partial"));
    if (!fs::exists(final_dir) && fs::exists(old)) fs::rename(old, final_dir);
    remove_tree(old);
    std::optional<int64_t> latest;
    try {
      latest = read_step_file(root / "latest");
    } catch (const FileError&) {
    }
    if (latest != step) remove_tree(final_dir);
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, detail::cat("save_checkpoint: cleaning up after the failed save of step ",
                                     step, ": ", e.what()));
  }
}

at::Tensor rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

void set_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void save_checkpoint(const fs::path& root, int64_t step, const Transformer& model,
                     const Optimizer& optimizer, const nlohmann::json& extra,
                     const SaveOptions& options) {
  auto phase = [&](const char* name) {
    if (options.on_phase) options.on_phase(name);
  };
  const ParallelState& ps = model.parallel();
  const std::string name = detail::step_dir_name(step);
  const fs::path final_dir = root / name, partial = root / (name + ".partial");
  const fs::path old = root / (name + ".old");
  // Each phase is tried on every rank, then the world agrees on whether all
  // succeeded (the all-reduce is the barrier): on a failure (a full disk, a
  // file-size limit) rank 0 removes what this save left and every rank
  // throws, none is left waiting for a rank that threw.
  std::string error;
  auto attempt = [&](const std::function<void()>& part) {
    try {
      part();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  auto agree = [&] {
    const int64_t failed = failed_ranks(ps, !error.empty());
    if (failed == 0) return;
    if (ps.rank() == 0) remove_failed_save(root, step);
    throw EngineError(detail::cat(
        "save_checkpoint: the checkpoint of step ", step, " under ", root.string(),
        " failed and what it wrote was removed; ", describe_step_file(root / "latest"), ": ",
        error.empty() ? detail::cat(failed, " other rank(s) failed; their errors are in their logs")
                      : error));
  };

  if (ps.rank() == 0)
    attempt([&] {
      fs::create_directories(root);
      remove_tree(partial);
      fs::create_directories(partial);
    });
  agree();
  const Coords& c = ps.coords();
  const ShardedLayout layout = sharded_layout(model);
  // The ranks holding distinct parts: the first DP replica, under expert
  // parallelism the first ep (dp rank j < ep holds EP rank j's experts, and
  // their optimizer state).
  const bool writes = c.cp == 0 && c.dp < layout.ep;
  ChecksumManifest written;  // this rank's files
  attempt([&] {
    // The distributed optimizer gathers its state over DP: every rank takes part.
    std::map<std::string, at::Tensor> optim_state;
    if (optimizer.options().distributed || writes) optim_state = optimizer.state_dict();
    if (writes) {
      const int64_t e = ep_rank_in(layout, ps);
      written.add(sharded_rank_file(c.tp, c.pp, e, layout.ep),
                  write_sharded_rank(partial, c.tp, c.pp, model.state_dict(), e, layout.ep));
      const std::string optim = rank_file("optim", c, e, layout.ep);
      written.add(optim, write_safetensors(partial / optim, optim_state));
    }
    const std::string rng = detail::cat("rng-", ps.rank(), ".safetensors");
    written.add(rng, write_safetensors(partial / rng, {{"cpu", rng_state()}}));
    if (ps.rank() == 0) {
      written.merge(write_sharded_layout(partial, model.config(), layout));
      written.add("checkpoint.json", write_file_atomically(partial / "checkpoint.json",
                                                           checkpoint_json(model, step).dump(2)));
      written.add("extra.json", write_file_atomically(partial / "extra.json", extra.dump(2)));
    } else {
      written.write(partial, checksum_fragment(ps.rank()));
    }
  });
  phase("files_written");
  agree();  // every rank's files are on disk
  if (ps.rank() == 0) {
    attempt([&] {
      // The manifest, written last: a directory without it is no complete save.
      for (int64_t r = 1; r < ps.world().size; ++r) {
        const std::optional<ChecksumManifest> part =
            ChecksumManifest::read(partial, checksum_fragment(r));
        if (!part)
          throw EngineError(detail::cat((partial / checksum_fragment(r)).string(),
                                        ": missing: rank ", r, "'s checksums"));
        written.merge(*part);
        fs::remove(partial / checksum_fragment(r));
      }
      written.write(partial);
      fsync_directory(partial);
    });
    if (error.empty()) phase("before_publish");
    if (error.empty())
      attempt([&] {
        if (fs::exists(final_dir)) {
          remove_tree(old);
          fs::rename(final_dir, old);
          fs::rename(partial, final_dir);
          remove_tree(old);
        } else {
          fs::rename(partial, final_dir);
        }
        fsync_directory(root);
        write_file_atomically(root / "latest", std::to_string(step) + "\n");
      });
  }
  agree();
}

nlohmann::json load_checkpoint(const fs::path& root, Transformer& model, Optimizer& optimizer,
                               std::optional<int64_t> step) {
  const SavedCheckpoint found = find_checkpoint(root, step);
  const fs::path& dir = found.dir;
  const ParallelState& ps = model.parallel();
  if (ps.rank() == 0 && !fs::exists(dir / kChecksumManifestFile))
    log(LogLevel::kWarn,
        detail::cat(dir.string(), ": no ", kChecksumManifestFile,
                    " (saved before baton checksummed checkpoints); loading it unverified"));
  const ShardedLayout& saved = found.layout;
  ShardedLayout want = sharded_layout(model);
  auto mismatch = [&](const char* key, const std::string& a, const std::string& b) {
    throw EngineError(detail::cat(dir.string(), ": checkpoint ", key, " = ", a,
                                  " but the model has ", b,
                                  "; convert it first (baton-convert --to-hf, then --to-sharded)"));
  };
  auto split_text = [](const std::vector<int64_t>& v) { return nlohmann::json(v).dump(); };
  if (saved.tp != want.tp) mismatch("tp", std::to_string(saved.tp), std::to_string(want.tp));
  if (saved.pp != want.pp) mismatch("pp", std::to_string(saved.pp), std::to_string(want.pp));
  if (saved.layer_split != want.layer_split)
    mismatch("layer_split", split_text(saved.layer_split), split_text(want.layer_split));
  if (saved.value_model != want.value_model)
    mismatch("value_model", saved.value_model ? "true" : "false",
             want.value_model ? "true" : "false");
  // The shards' vocabulary rows (the padded sizes may agree for different divisors).
  const ModelConfig& cfg = model.config();
  if (saved.padded_vocab_size(cfg) != want.padded_vocab_size(cfg))
    mismatch("padded_vocab_size",
             detail::cat(saved.padded_vocab_size(cfg), " (make_vocab_size_divisible_by ",
                         saved.make_vocab_size_divisible_by, ")"),
             detail::cat(want.padded_vocab_size(cfg), " (make_vocab_size_divisible_by ",
                         want.make_vocab_size_divisible_by, ")"));
  const Coords& c = ps.coords();
  // Another ep than the checkpoint's: its experts joined and split again.
  const int64_t e = ep_rank_in(want, ps);
  model.load_state_dict(load_sharded_rank(dir, c.tp, c.pp, e, want.ep));
  optimizer.load_state_dict(resplit_experts(saved.ep, e, want.ep, [&](int64_t j) {
    const fs::path file = dir / rank_file("optim", c, j, saved.ep);
    if (!fs::exists(file)) throw EngineError(file.string() + ": missing optimizer state file");
    return read_safetensors(file);
  }));
  auto rng_file = dir / detail::cat("rng-", ps.rank(), ".safetensors");
  if (fs::exists(rng_file)) {
    auto rng = read_safetensors(rng_file);
    if (rng.count("cpu")) set_rng_state(rng.at("cpu"));
  }
  return detail::read_checkpoint_json(dir / "extra.json");
}

}  // namespace baton::engine
