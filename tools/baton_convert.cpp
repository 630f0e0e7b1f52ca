// baton-convert: HF checkpoints ⇄ baton's sharded layout (sharded_model.h).
//
//   baton-convert --to-sharded --hf DIR --out DIR --tp N --pp M [--layer-split 2,2]
//                 [--value-model] [--make-vocab-size-divisible-by D]
//   baton-convert --to-hf --sharded DIR --out DIR [--max-shard-bytes N]
//
// The sharded embedding and LM head are padded with zero rows to a multiple
// of D × N (D = 128 by default, Megatron's make_vocab_size_divisible_by;
// layout.json records it), so any vocabulary converts to any N; --to-hf drops
// the padding, so HF → sharded → HF is bit-exact.
//
// A ...ForTokenClassification checkpoint converts as a value model; --value-model
// converts a causal LM as one (its lm_head is dropped, the value head is left for
// the trainer to initialise). Exit status: 0 on success, 1 when the conversion
// fails (the reason on stderr), 2 for a usage error.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/errors.h"
#include "engine/io/hf_model.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"

namespace fs = std::filesystem;
using namespace baton::engine;

namespace {

constexpr const char* kUsage =
    "usage:\n"
    "  baton-convert --to-sharded --hf DIR --out DIR --tp N --pp M [--layer-split A,B,...]\n"
    "                [--value-model] [--make-vocab-size-divisible-by D]\n"
    "  baton-convert --to-hf --sharded DIR --out DIR [--max-shard-bytes N]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t parse_int(std::string_view text, const std::string& flag) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(flag + " expects an integer, got \"" + std::string(text) + "\"");
  return v;
}

std::vector<int64_t> parse_list(std::string_view text, const std::string& flag) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    out.push_back(parse_int(text.substr(start, comma - start), flag));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

struct Args {
  std::string mode;                           // "--to-sharded" or "--to-hf"
  std::map<std::string, std::string> values;  // --flag VALUE
  bool value_model = false;

  std::optional<std::string> get(const std::string& flag) const {
    auto it = values.find(flag);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
  std::string require(const std::string& flag) const {
    auto v = get(flag);
    if (!v) throw UsageError(mode + " needs " + flag);
    return *v;
  }
};

Args parse_args(int argc, char** argv) {
  static const std::map<std::string, std::vector<std::string>> kFlags = {
      {"--to-sharded",
       {"--hf", "--out", "--tp", "--pp", "--layer-split", "--make-vocab-size-divisible-by"}},
      {"--to-hf", {"--sharded", "--out", "--max-shard-bytes"}},
  };
  Args a;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") throw UsageError("");
    if (kFlags.count(arg)) {
      if (!a.mode.empty()) throw UsageError("give one of --to-sharded and --to-hf");
      a.mode = arg;
    } else if (arg == "--value-model") {
      a.value_model = true;
    } else if (arg.starts_with("--")) {
      if (i + 1 >= args.size()) throw UsageError(arg + " needs a value");
      a.values[arg] = args[++i];
    } else {
      throw UsageError("unexpected argument \"" + arg + "\"");
    }
  }
  if (a.mode.empty()) throw UsageError("give one of --to-sharded and --to-hf");
  const auto& allowed = kFlags.at(a.mode);
  for (const auto& [flag, value] : a.values)
    if (std::find(allowed.begin(), allowed.end(), flag) == allowed.end())
      throw UsageError("unknown option " + flag + " for " + a.mode);
  if (a.value_model && a.mode != "--to-sharded")
    throw UsageError("--value-model only applies to --to-sharded");
  return a;
}

void refuse_same_dir(const fs::path& in, const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out) && fs::equivalent(in, out, ec))
    throw EngineError(out.string() + ": the output directory must differ from the input");
}

int to_sharded(const Args& a) {
  const fs::path hf_dir = a.require("--hf"), out = a.require("--out");
  ShardedLayout layout;
  layout.tp = parse_int(a.require("--tp"), "--tp");
  layout.pp = parse_int(a.require("--pp"), "--pp");
  if (auto split = a.get("--layer-split")) layout.layer_split = parse_list(*split, "--layer-split");
  if (auto d = a.get("--make-vocab-size-divisible-by"))
    layout.make_vocab_size_divisible_by = parse_int(*d, "--make-vocab-size-divisible-by");
  if (layout.make_vocab_size_divisible_by < 1)
    throw UsageError("--make-vocab-size-divisible-by must be positive");
  if (!fs::is_directory(hf_dir)) throw EngineError(hf_dir.string() + ": no such directory");
  refuse_same_dir(hf_dir, out);

  const auto cfg = ModelConfig::load(hf_dir);
  const auto base_config = read_json_file(hf_dir / "config.json");
  layout.value_model = a.value_model || is_value_architecture(cfg.architecture);
  const TensorMap hf = read_hf_weights(hf_dir);
  std::vector<std::vector<TensorMap>> shards;
  try {
    shards = shard_all(hf, cfg, layout);
  } catch (const EngineError& e) {
    throw EngineError(hf_dir.string() + ": " + e.what());
  }
  save_sharded(out, cfg, layout, shards, &base_config);

  const auto saved = load_sharded_layout(out);
  std::cout << "baton-convert: wrote " << out.string() << " (tp " << saved.tp << " x pp "
            << saved.pp << ", layer split " << nlohmann::json(saved.layer_split).dump()
            << ", vocabulary " << cfg.vocab_size << " padded to "
            << saved.padded_vocab_size(cfg) << " rows"
            << (saved.value_model ? ", value model" : "") << ")\n";
  if (saved.value_model && !hf.count("score.weight"))
    std::cout << "baton-convert: note: " << hf_dir.string()
              << " has no score.weight; the value head is left for the trainer to initialise\n";
  return 0;
}

int to_hf(const Args& a) {
  const fs::path in = a.require("--sharded"), out = a.require("--out");
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  if (auto v = a.get("--max-shard-bytes")) max_shard_bytes = parse_int(*v, "--max-shard-bytes");
  if (max_shard_bytes <= 0) throw UsageError("--max-shard-bytes must be positive");
  if (!fs::is_directory(in)) throw EngineError(in.string() + ": no such directory");
  refuse_same_dir(in, out);

  const auto cfg = ModelConfig::load(in);
  const auto base_config = read_json_file(in / "config.json");
  const auto layout = load_sharded_layout(in);
  TensorMap hf;
  try {
    hf = shards_to_hf(load_sharded_all(in), cfg, layout.layer_split, layout.value_model,
                      layout.make_vocab_size_divisible_by);
  } catch (const EngineError& e) {
    throw EngineError(in.string() + ": " + e.what());
  }
  save_hf_model(out, cfg, hf, layout.value_model, max_shard_bytes, &base_config);
  std::cout << "baton-convert: wrote " << out.string() << " (" << hf.size() << " tensors, "
            << hf_architecture(cfg.family, layout.value_model) << ")\n";
  if (layout.value_model && !hf.count("score.weight"))
    std::cout << "baton-convert: note: the shards hold no value head; HF will initialise "
                 "score.weight randomly\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const UsageError& e) {
    if (!*e.what()) {  // --help
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "baton-convert: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    return args.mode == "--to-sharded" ? to_sharded(args) : to_hf(args);
  } catch (const UsageError& e) {
    std::cerr << "baton-convert: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "baton-convert: error: " << e.what() << "\n";
    return 1;
  }
}
