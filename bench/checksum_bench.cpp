// checksum_bench: what baton's file checksums cost. Two parts:
//
//   build/bench/checksum_bench [--mb 256] [--iters 5] [--hidden 768] [--layers 6]
//                              [--vocab 32000] [--dir DIR]
//
// 1. Throughput, GB/s (10^9 bytes per second, best of --iters), of one pass
//    over --mb MiB of random bytes in memory, on one thread:
//      crc32c_sse42     what baton uses (base/checksum.h: SSE4.2's crc32, three
//                       interleaved streams)
//      crc32c_software  its portable fallback (slicing-by-8)
//      xxh64            xxHash's XXH64, the other candidate, in the reference
//                       algorithm below (scalar, as libxxhash's XXH64 is)
//      block_checksums  BlockChecksummer: crc32c per 1 MiB block, what a save
//                       computes while it writes
// 2. A checkpoint of a Llama of --hidden, --layers and --vocab (fp32 weights
//    and AdamW moments: 12 bytes a parameter) saved under DIR (a fresh temp
//    directory when not given), then load_checkpoint timed with verification
//    on and off (BATON_VERIFY_CHECKSUMS), alternating, median of --iters each,
//    after one untimed load: the files are in the page cache, so the figure is
//    the load's own work, not the disk's. verify_seconds_per_gb is the
//    difference per 10^9 bytes of checkpoint.
//
// Prints one JSON line.
#include <ATen/ATen.h>
#include <stdlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "base/checksum.h"
#include "engine/io/checkpoint.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "tools/cli.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// XXH64 (github.com/Cyan4973/xxHash, doc/xxhash_spec.md), for the comparison.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL,
                   kP3 = 0x165667B19E3779F9ULL, kP4 = 0x85EBCA77C2B2AE63ULL,
                   kP5 = 0x27D4EB2F165667C5ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint64_t xxh_round(uint64_t acc, uint64_t input) { return rotl(acc + input * kP2, 31) * kP1; }
uint64_t xxh_merge(uint64_t acc, uint64_t v) { return (acc ^ xxh_round(0, v)) * kP1 + kP4; }

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0) {
  const auto* p = static_cast<const uint8_t*>(data);
  const uint8_t* end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    for (; p + 32 <= end; p += 32) {
      v1 = xxh_round(v1, read64(p));
      v2 = xxh_round(v2, read64(p + 8));
      v3 = xxh_round(v3, read64(p + 16));
      v4 = xxh_round(v4, read64(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + kP5;
  }
  h += size;
  for (; p + 8 <= end; p += 8) h = rotl(h ^ xxh_round(0, read64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    h = rotl(h ^ (uint64_t{v} * kP1), 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best GB/s of `iters` passes of f over `bytes`.
template <typename F>
double best_gbps(const std::vector<uint8_t>& bytes, int iters, F&& f) {
  double best = 0;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    f(bytes.data(), bytes.size());
    best = std::max(best, static_cast<double>(bytes.size()) / since(t0) / 1e9);
  }
  return best;
}

struct Args {
  int64_t mb = 256;
  int iters = 5;
  int64_t hidden = 768;
  int64_t layers = 6;
  int64_t vocab = 32000;
  std::string dir;
};

uintmax_t directory_bytes(const fs::path& dir) {
  uintmax_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    baton::cli::for_each_option(argc, argv, {}, [&](const std::string& key, const std::string& v) {
      if (key == "--mb")
        a.mb = baton::cli::parse_int(v, key);
      else if (key == "--iters")
        a.iters = static_cast<int>(baton::cli::parse_int(v, key));
      else if (key == "--hidden")
        a.hidden = baton::cli::parse_int(v, key);
      else if (key == "--layers")
        a.layers = baton::cli::parse_int(v, key);
      else if (key == "--vocab")
        a.vocab = baton::cli::parse_int(v, key);
      else if (key == "--dir")
        a.dir = v;
      else
        baton::cli::unknown_option(key);
    });
  } catch (const baton::cli::UsageError& e) {
    std::fprintf(stderr,
                 "checksum_bench: %s\nusage: checksum_bench [--mb N] [--iters N] [--hidden N] "
                 "[--layers N] [--vocab N] [--dir DIR]\n",
                 e.what());
    return 2;
  }
  if (xxh64("", 0) != 0xEF46DB3751D8E999ULL || baton::crc32c("123456789", 9) != 0xE3069283u) {
    std::fprintf(stderr, "checksum_bench: a known answer is wrong\n");
    return 1;
  }

  // 1. The algorithms, in memory.
  std::vector<uint8_t> bytes(static_cast<size_t>(a.mb) << 20);
  std::mt19937_64 rng(20261130);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  volatile uint64_t sink = 0;
  json throughput;
  if (baton::crc32c_path() == baton::Crc32cPath::kSse42)
    throughput["crc32c_sse42"] = best_gbps(
        bytes, a.iters, [&](const void* p, size_t n) { sink = sink + baton::crc32c_sse42(p, n); });
  throughput["crc32c_software"] = best_gbps(
      bytes, a.iters, [&](const void* p, size_t n) { sink = sink + baton::crc32c_software(p, n); });
  throughput["xxh64"] =
      best_gbps(bytes, a.iters, [&](const void* p, size_t n) { sink = sink + xxh64(p, n); });
  throughput["block_checksums"] = best_gbps(bytes, a.iters, [&](const void* p, size_t n) {
    sink = sink + baton::checksum_bytes(p, n).blocks.size();
  });
  bytes = {};

  // 2. A checkpoint, loaded with and without verification.
  namespace engine = baton::engine;
  const json model_json = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"vocab_size", a.vocab},
                           {"hidden_size", a.hidden},
                           {"intermediate_size", a.hidden * 8 / 3 / 64 * 64},
                           {"num_hidden_layers", a.layers},
                           {"num_attention_heads", a.hidden / 64},
                           {"num_key_value_heads", a.hidden / 64},
                           {"max_position_embeddings", 2048},
                           {"rms_norm_eps", 1e-6},
                           {"tie_word_embeddings", false},
                           {"torch_dtype", "float32"}};
  const auto cfg = engine::ModelConfig::from_hf_json(model_json, "checksum_bench");
  auto model = std::make_shared<engine::Transformer>(cfg, engine::ParallelState::single());
  engine::Optimizer opt(model, engine::OptimizerOptions().set_lr(1e-5));
  std::string made_dir;
  fs::path root = a.dir;
  if (root.empty()) {
    made_dir = (fs::temp_directory_path() / "checksum_bench_XXXXXX").string();
    if (::mkdtemp(made_dir.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    root = made_dir;
  }
  auto t0 = Clock::now();
  engine::save_checkpoint(root, 1, *model, opt);
  const double save_seconds = since(t0);
  const double gb = static_cast<double>(directory_bytes(root / "step_00000001")) / 1e9;
  engine::load_checkpoint(root, *model, opt);  // into the page cache
  std::vector<double> on, off;
  for (int i = 0; i < a.iters; ++i) {
    ::setenv("BATON_VERIFY_CHECKSUMS", "1", 1);
    t0 = Clock::now();
    engine::load_checkpoint(root, *model, opt);
    on.push_back(since(t0));
    ::setenv("BATON_VERIFY_CHECKSUMS", "0", 1);
    t0 = Clock::now();
    engine::load_checkpoint(root, *model, opt);
    off.push_back(since(t0));
  }
  ::unsetenv("BATON_VERIFY_CHECKSUMS");
  if (!made_dir.empty()) baton::remove_tree(made_dir);

  json out = {{"bench", "checksum"},
              {"crc32c_path", baton::to_string(baton::crc32c_path())},
              {"mb", a.mb},
              {"iters", a.iters},
              {"throughput_gbps", throughput},
              {"checkpoint",
               {{"param_bytes", model->param_bytes()},
                {"gb", gb},
                {"save_seconds", save_seconds},
                {"load_seconds_verified", median(on)},
                {"load_seconds_unverified", median(off)},
                {"verify_seconds_per_gb", (median(on) - median(off)) / gb},
                {"load_verified_gbps", gb / median(on)},
                {"load_unverified_gbps", gb / median(off)}}}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
