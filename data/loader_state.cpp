// LoaderState's JSON (prompt_loader.h): what a checkpoint keeps of the data
// loader. Its own file so that the checkpoint metadata fuzz target
// (tests/fuzz/) reads it without the dataset.
#include "base/errors.h"
#include "data/prompt_loader.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace baton::data {

std::string LoaderState::to_json() const {
  return nlohmann::json{
      {"epoch", epoch},     {"batch", batch},           {"seed", seed},
      {"shuffle", shuffle}, {"batch_size", batch_size}, {"dataset_size", dataset_size}}
      .dump();
}

LoaderState LoaderState::from_json(const std::string& json, const std::string& source) {
  LoaderState s;
  try {
    const auto j = nlohmann::json::parse(json);
    // An integer field holds an integer: nlohmann would convert a float such
    // as 1e48 with undefined behaviour (found by fuzz_checkpoint_meta).
    auto integer = [&](const char* key) -> const nlohmann::json& {
      const nlohmann::json& v = j.at(key);
      if (!v.is_number_integer())
        throw Error(source + ": not a dataloader state: \"" + key +
                                 "\" is not an integer");
      return v;
    };
    s.epoch = integer("epoch").get<int64_t>();
    s.batch = integer("batch").get<int64_t>();
    s.seed = integer("seed").get<uint64_t>();
    s.shuffle = j.at("shuffle").get<bool>();
    s.batch_size = integer("batch_size").get<int64_t>();
    s.dataset_size = integer("dataset_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": not a dataloader state: " + e.what());
  }
  return s;
}

}  // namespace baton::data
