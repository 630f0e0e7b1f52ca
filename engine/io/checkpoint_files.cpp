// A checkpoint's metadata (checkpoint.h): `latest`, checkpoint.json and the
// sharded layout, read without a model. Its own file so that the checkpoint
// metadata fuzz target (tests/fuzz/) links it without the Transformer.
#include "engine/io/checkpoint.h"

#include <cstdio>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"

namespace fs = std::filesystem;

namespace baton::engine {

namespace detail {
std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

nlohmann::json read_checkpoint_json(const fs::path& file) {
  if (!fs::exists(file)) throw EngineError(file.string() + ": missing checkpoint file");
  return read_json_file(file);
}
}  // namespace detail

std::optional<int64_t> latest_checkpoint(const fs::path& root) {
  const fs::path file = root / "latest";
  std::optional<int64_t> step;
  try {
    step = read_step_file(file);
  } catch (const FileError& e) {  // a checkpoint's metadata refused, as the engine refuses it
    throw EngineError(e.what());
  }
  if (step && !fs::is_directory(root / detail::step_dir_name(*step)))
    throw EngineError(detail::cat(file.string(), " names step ", *step, " but ",
                                  (root / detail::step_dir_name(*step)).string(),
                                  " does not exist"));
  return step;
}

SavedCheckpoint find_checkpoint(const fs::path& root, std::optional<int64_t> step) {
  if (!step) step = latest_checkpoint(root);
  if (!step) throw EngineError(root.string() + ": no checkpoint (no 'latest' file)");
  SavedCheckpoint saved;
  saved.step = *step;
  saved.dir = root / detail::step_dir_name(*step);
  // Present and this step's: written last before the rename, so a complete checkpoint.
  const fs::path file = saved.dir / "checkpoint.json";
  const nlohmann::json meta = detail::read_checkpoint_json(file);
  if (!meta.is_object() || meta.value("format", nlohmann::json()) != kCheckpointFormat)
    throw EngineError(
        detail::cat(file.string(), ": \"format\" is not \"", kCheckpointFormat, "\""));
  if (!meta.contains("step") || meta["step"] != nlohmann::json(*step))
    throw EngineError(
        detail::cat(file.string(), ": \"step\" is not ", *step, ", the step of its directory"));
  saved.layout = load_sharded_layout(saved.dir);
  return saved;
}

}  // namespace baton::engine
