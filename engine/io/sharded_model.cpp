#include "engine/io/sharded_model.h"

#include <nlohmann/json.hpp>

#include <regex>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "engine/io/weight_conversion.h"

namespace baton::engine {
namespace fs = std::filesystem;

namespace {

// The layout with its split filled in, checked against the config.
ShardedLayout checked(const ModelConfig& cfg, ShardedLayout layout, const std::string& where) {
  try {
    if (layout.tp < 1 || layout.pp < 1)
      throw EngineError(detail::cat("tp ", layout.tp, " and pp ", layout.pp, " must be positive"));
    if (layout.layer_split.empty())
      layout.layer_split = even_layer_split(cfg.num_layers, layout.pp);
    if (static_cast<int64_t>(layout.layer_split.size()) != layout.pp)
      throw EngineError(detail::cat("layer split has ", layout.layer_split.size(),
                                    " entries but pp is ", layout.pp));
    validate_layer_split(layout.layer_split, cfg.num_layers);
    validate_tensor_parallel(cfg, layout.tp);
    validate_expert_parallel(cfg, layout.ep);
    layout.padded_vocab_size(cfg);  // throws for a divisor below 1
  } catch (const EngineError& e) {
    throw EngineError(where + ": " + e.what());
  }
  return layout;
}

int64_t json_int(const nlohmann::json& j, const char* key, const fs::path& file) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw EngineError(detail::cat(file.string(), ": \"", key, "\" is missing or not an integer"));
  return j[key].get<int64_t>();
}

}  // namespace

std::string sharded_rank_file(int64_t tp_rank, int64_t pp_rank, int64_t ep_rank, int64_t ep_size) {
  if (ep_size > 1)
    return detail::cat("model-tp", tp_rank, "-pp", pp_rank, "-ep", ep_rank, ".safetensors");
  return detail::cat("model-tp", tp_rank, "-pp", pp_rank, ".safetensors");
}

TensorMap resplit_experts(int64_t saved_ep, int64_t ep_rank, int64_t ep_size,
                          const std::function<TensorMap(int64_t j)>& read) {
  if (ep_size < 1 || ep_rank < 0 || ep_rank >= ep_size)
    throw EngineError(detail::cat("EP rank ", ep_rank, " is outside ep ", ep_size));
  if (saved_ep == ep_size) return read(ep_rank);
  std::vector<TensorMap> saved;
  for (int64_t j = 0; j < saved_ep; ++j) saved.push_back(read(j));
  TensorMap all = join_expert_shards(saved);
  if (ep_size == 1) return all;
  for (auto& [name, t] : all) {
    if (!is_expert_tensor(name)) continue;
    if (t.size(0) % ep_size != 0)
      throw EngineError(
          detail::cat(name, ": its ", t.size(0), " experts do not split over ep ", ep_size));
    const int64_t n = t.size(0) / ep_size;
    t = t.narrow(0, ep_rank * n, n).clone();
  }
  return all;
}

std::vector<std::vector<TensorMap>> shard_all(const TensorMap& hf, const ModelConfig& cfg,
                                              const ShardedLayout& layout_in) {
  auto layout = checked(cfg, layout_in, "shard_all");
  std::vector<std::vector<TensorMap>> shards(layout.pp);
  for (int64_t p = 0; p < layout.pp; ++p)
    for (int64_t k = 0; k < layout.tp; ++k) {
      auto spec = ShardSpec::for_rank(cfg, k, layout.tp, p, layout.layer_split, layout.value_model);
      spec.make_vocab_size_divisible_by = layout.make_vocab_size_divisible_by;
      shards[p].push_back(hf_to_shard(hf, cfg, spec));
    }
  return shards;
}

ChecksumManifest write_sharded_layout(const fs::path& dir, const ModelConfig& cfg,
                                      const ShardedLayout& layout_in,
                                      const nlohmann::json* base_config) {
  auto layout = checked(cfg, layout_in, (dir / "layout.json").string());
  ChecksumManifest written;
  const std::string config = hf_config_json(cfg, layout.value_model, base_config).dump(2) + "\n";
  written.add("config.json", write_file_atomically(dir / "config.json", config));
  nlohmann::json j = {{"format", kShardedFormat},
                      {"tp", layout.tp},
                      {"pp", layout.pp},
                      {"layer_split", layout.layer_split},
                      {"value_model", layout.value_model},
                      {"make_vocab_size_divisible_by", layout.make_vocab_size_divisible_by},
                      {"padded_vocab_size", layout.padded_vocab_size(cfg)}};
  if (layout.ep > 1) j["ep"] = layout.ep;
  written.add("layout.json", write_file_atomically(dir / "layout.json", j.dump(2) + "\n"));
  return written;
}

FileChecksum write_sharded_rank(const fs::path& dir, int64_t tp_rank, int64_t pp_rank,
                                const TensorMap& shard, int64_t ep_rank, int64_t ep_size) {
  std::map<std::string, std::string> metadata = {{"format", kShardedFormat},
                                                 {"tp_rank", std::to_string(tp_rank)},
                                                 {"pp_rank", std::to_string(pp_rank)}};
  if (ep_size > 1) metadata["ep_rank"] = std::to_string(ep_rank);
  return write_safetensors(dir / sharded_rank_file(tp_rank, pp_rank, ep_rank, ep_size), shard,
                           metadata);
}

void save_sharded(const fs::path& dir, const ModelConfig& cfg, const ShardedLayout& layout_in,
                  const std::vector<std::vector<TensorMap>>& shards,
                  const nlohmann::json* base_config) {
  auto layout = checked(cfg, layout_in, dir.string());
  if (static_cast<int64_t>(shards.size()) != layout.pp)
    throw EngineError(
        detail::cat(dir.string(), ": ", shards.size(), " stages of shards for pp ", layout.pp));
  fs::create_directories(dir);
  remove_checksum_manifest(dir);
  ChecksumManifest written;
  for (int64_t p = 0; p < layout.pp; ++p) {
    if (static_cast<int64_t>(shards[p].size()) != layout.tp)
      throw EngineError(detail::cat(dir.string(), ": stage ", p, " has ", shards[p].size(),
                                    " shards for tp ", layout.tp));
    for (int64_t k = 0; k < layout.tp; ++k)
      for (int64_t e = 0; e < layout.ep; ++e) {
        const TensorMap part =
            resplit_experts(1, e, layout.ep, [&](int64_t) { return shards[p][k]; });
        written.add(sharded_rank_file(k, p, e, layout.ep),
                    write_sharded_rank(dir, k, p, part, e, layout.ep));
      }
  }
  written.merge(write_sharded_layout(dir, cfg, layout, base_config));
  static const std::regex rank_file(R"(model-tp\d+-pp\d+(-ep\d+)?\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, rank_file) && !written.find(name)) fs::remove(entry.path());
  }
  written.write(dir);  // last: the directory is complete
}

ShardedLayout load_sharded_layout(const fs::path& dir) {
  const fs::path file = dir / "layout.json";
  if (!fs::exists(file))
    throw EngineError(detail::cat(file.string(), ": missing; not a baton sharded model"));
  nlohmann::json j = read_json_file(file);
  if (!j.is_object() || !j.contains("format") || j["format"] != kShardedFormat)
    throw EngineError(detail::cat(file.string(), ": \"format\" is not \"", kShardedFormat, "\""));
  ShardedLayout layout;
  layout.tp = json_int(j, "tp", file);
  layout.pp = json_int(j, "pp", file);
  if (!j.contains("layer_split") || !j["layer_split"].is_array())
    throw EngineError(detail::cat(file.string(), ": \"layer_split\" is missing or not a list"));
  for (const auto& n : j["layer_split"]) {
    if (!n.is_number_integer())
      throw EngineError(detail::cat(file.string(), ": \"layer_split\" holds a non-integer"));
    layout.layer_split.push_back(n.get<int64_t>());
  }
  if (!j.contains("value_model") || !j["value_model"].is_boolean())
    throw EngineError(detail::cat(file.string(), ": \"value_model\" is missing or not a bool"));
  layout.value_model = j["value_model"].get<bool>();
  // Written before vocabulary padding existed: the vocabulary divided tp.
  layout.make_vocab_size_divisible_by = j.contains("make_vocab_size_divisible_by")
                                            ? json_int(j, "make_vocab_size_divisible_by", file)
                                            : 1;
  layout.ep = j.contains("ep") ? json_int(j, "ep", file) : 1;
  const auto cfg = ModelConfig::load(dir);
  layout = checked(cfg, layout, file.string());
  if (j.contains("padded_vocab_size") &&
      json_int(j, "padded_vocab_size", file) != layout.padded_vocab_size(cfg))
    throw EngineError(detail::cat(file.string(), ": \"padded_vocab_size\" ",
                                  json_int(j, "padded_vocab_size", file), " is not vocab_size ",
                                  cfg.vocab_size, " padded by make_vocab_size_divisible_by ",
                                  layout.make_vocab_size_divisible_by, " x tp ", layout.tp, " (",
                                  layout.padded_vocab_size(cfg), ")"));
  return layout;
}

namespace {

// The file of rank (tp, pp, EP rank e) of the layout.
TensorMap load_file(const fs::path& dir, const ShardedLayout& layout, int64_t tp_rank,
                    int64_t pp_rank, int64_t e) {
  const fs::path file = dir / sharded_rank_file(tp_rank, pp_rank, e, layout.ep);
  if (!fs::exists(file)) throw EngineError(detail::cat(file.string(), ": missing rank file"));
  std::map<std::string, std::string> metadata;
  TensorMap shard = read_safetensors(file, &metadata);
  const std::string ep_rank = layout.ep > 1 ? std::to_string(e) : "";
  if (metadata.count("tp_rank") &&
      (metadata["tp_rank"] != std::to_string(tp_rank) ||
       metadata["pp_rank"] != std::to_string(pp_rank) || metadata["ep_rank"] != ep_rank))
    throw EngineError(detail::cat(file.string(), ": holds rank (tp ", metadata["tp_rank"], ", pp ",
                                  metadata["pp_rank"],
                                  metadata["ep_rank"].empty() ? "" : ", ep " + metadata["ep_rank"],
                                  "), not the one its name says"));
  return shard;
}

TensorMap load_rank(const fs::path& dir, const ShardedLayout& layout, int64_t tp_rank,
                    int64_t pp_rank, int64_t ep_rank, int64_t ep_size) {
  if (tp_rank < 0 || tp_rank >= layout.tp || pp_rank < 0 || pp_rank >= layout.pp)
    throw EngineError(detail::cat(dir.string(), ": rank (tp ", tp_rank, ", pp ", pp_rank,
                                  ") is outside the layout tp ", layout.tp, " x pp ", layout.pp));
  return resplit_experts(layout.ep, ep_rank, ep_size,
                         [&](int64_t e) { return load_file(dir, layout, tp_rank, pp_rank, e); });
}

}  // namespace

TensorMap load_sharded_rank(const fs::path& dir, int64_t tp_rank, int64_t pp_rank, int64_t ep_rank,
                            int64_t ep_size) {
  return load_rank(dir, load_sharded_layout(dir), tp_rank, pp_rank, ep_rank, ep_size);
}

std::vector<std::vector<TensorMap>> load_sharded_all(const fs::path& dir) {
  const auto layout = load_sharded_layout(dir);
  std::vector<std::vector<TensorMap>> shards(layout.pp);
  for (int64_t p = 0; p < layout.pp; ++p)
    for (int64_t k = 0; k < layout.tp; ++k) shards[p].push_back(load_rank(dir, layout, k, p, 0, 1));
  return shards;
}

}  // namespace baton::engine
