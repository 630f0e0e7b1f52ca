#include "trainer/checkpoint_files.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "engine/errors.h"

namespace baton::trainer {

namespace fs = std::filesystem;

int64_t json_integer(const nlohmann::json& j, const char* key, const fs::path& file) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer())
    throw Error("resume: " + file.string() + ": \"" + key + "\" is missing or not an integer");
  return j[key].get<int64_t>();
}

fs::path trainer_checkpoint_dir(const fs::path& out_dir, int64_t step) {
  return out_dir / ("global_step_" + std::to_string(step));
}

std::optional<fs::path> latest_trainer_checkpoint(const fs::path& out_dir) {
  const fs::path file = out_dir / kLatestTrainerCheckpointFile;
  std::optional<int64_t> step;
  try {
    step = baton::read_step_file(file);
  } catch (const FileError& e) {
    throw Error(std::string("resume: ") + e.what());
  }
  if (!step) return std::nullopt;
  fs::path dir = trainer_checkpoint_dir(out_dir, *step);
  if (!fs::is_directory(dir))
    throw Error("resume: " + file.string() + " names step " + std::to_string(*step) + " but " +
                dir.string() + " does not exist");
  return dir;
}

TrainerStateFile read_trainer_state(const fs::path& dir) {
  const fs::path file = dir / "trainer_state.json";
  std::ifstream in(file);
  if (!in) {
    throw Error("resume: " + file.string() + " does not exist (not a global_step_N checkpoint?)");
  }
  TrainerStateFile state;
  const std::string text(std::istreambuf_iterator<char>(in), {});
  try {
    verify_file_bytes(file, text.data(), text.size());  // its directory's checksum manifest
  } catch (const FileError& e) {
    throw Error(std::string("resume: ") + e.what());
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    state.global_step = json_integer(j, "global_step", file);
    state.loader = data::LoaderState::from_json(j.at("loader").dump(), file.string());
    state.kl_coef = j.at("kl_coef").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error("resume: " + file.string() + ": " + e.what());
  } catch (const Error&) {
    throw;                                 // json_integer's, complete as it is
  } catch (const std::runtime_error& e) {  // the loader's state
    throw Error(std::string("resume: ") + e.what());
  }
  if (state.global_step < 0)
    throw Error("resume: " + file.string() + ": global_step " + std::to_string(state.global_step) +
                " is negative");
  if (!(state.kl_coef >= 0))
    throw Error("resume: " + file.string() + ": kl_coef " + std::to_string(state.kl_coef) +
                " is not a number >= 0");
  return state;
}

}  // namespace baton::trainer
