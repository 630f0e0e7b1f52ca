#include "engine/io/hf_model.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/weight_conversion.h"

namespace baton::engine {
namespace fs = std::filesystem;

HfModel load_hf_model(const fs::path& dir) {
  HfModel m;
  m.config = ModelConfig::load(dir);
  m.value_model = is_value_architecture(m.config.architecture);
  m.weights = read_hf_weights(dir);
  return m;
}

nlohmann::json read_json_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw EngineError(detail::cat(file.string(), ": cannot open"));
  const std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) throw EngineError(detail::cat(file.string(), ": cannot read"));
  verify_checksums(file, text.data(), text.size());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw EngineError(detail::cat(file.string(), ": malformed JSON: ", e.what()));
  }
}

namespace {

std::string first_architecture(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("architectures")) return "";
  const auto& a = config["architectures"];
  return a.is_array() && !a.empty() && a[0].is_string() ? a[0].get<std::string>() : "";
}

}  // namespace

nlohmann::json hf_config_json(const ModelConfig& cfg, bool value_model,
                              const nlohmann::json* base) {
  nlohmann::json j = base && base->is_object() ? *base : nlohmann::json::object();
  const nlohmann::json own = cfg.to_hf_json(hf_architecture(cfg.family, value_model));
  for (const auto& [key, value] : own.items()) j[key] = value;
  j.erase("num_labels");
  if (value_model) {
    // What HF's save_pretrained writes for num_labels = 1.
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
  } else if (base && is_value_architecture(first_architecture(*base))) {
    j.erase("id2label");
    j.erase("label2id");
  }
  return j;
}

void save_hf_model(const fs::path& dir, const ModelConfig& cfg, const TensorMap& weights,
                   bool value_model, int64_t max_shard_bytes, const nlohmann::json* base_config) {
  ChecksumManifest manifest = write_hf_weights(dir, weights, max_shard_bytes);
  manifest.add("config.json",
               write_file_atomically(dir / "config.json",
                                     hf_config_json(cfg, value_model, base_config).dump(2) + "\n"));
  manifest.write(dir);  // last: the directory is complete
}

}  // namespace baton::engine
