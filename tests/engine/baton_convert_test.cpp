// baton-convert, run as a program on the HF fixtures: HF → sharded → HF is
// bit-exact, and bad inputs give a message on stderr and a non-zero exit.
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "engine/io/hf_model.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_model.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const fs::path kFixtures = BATON_FIXTURES_DIR;

struct Result {
  int status = -1;
  std::string err;
};

// Runs baton-convert with `args`; stdout is discarded, stderr captured.
Result convert(const std::string& args, const TempDir& scratch) {
  const fs::path err = scratch / "stderr.txt";
  std::string cmd =
      std::string("'") + BATON_CONVERT_EXE + "' " + args + " >/dev/null 2>'" + err.string() + "'";
  int raw = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(err);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

class BatonConvert : public ::testing::TestWithParam<std::string> {};

TEST_P(BatonConvert, HfToTp2Pp2AndBackIsBitExact) {
  const fs::path src = kFixtures / GetParam();
  if (!fs::exists(src / "config.json")) GTEST_SKIP() << "no fixture " << src;
  TempDir scratch;
  auto r = convert("--to-sharded --hf " + q(src) + " --out " + q(scratch / "sharded") +
                       " --tp 2 --pp 2 --layer-split 3,1",
                   scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  auto layout = load_sharded_layout(scratch / "sharded");
  EXPECT_EQ(layout.tp, 2);
  EXPECT_EQ(layout.layer_split, (std::vector<int64_t>{3, 1}));
  EXPECT_TRUE(fs::exists(scratch / "sharded" / "model-tp1-pp1.safetensors"));

  r = convert("--to-hf --sharded " + q(scratch / "sharded") + " --out " + q(scratch / "hf") +
                  " --max-shard-bytes 300000",
              scratch);
  ASSERT_EQ(r.status, 0) << r.err;
  auto original = read_hf_weights(src);
  auto back = read_hf_weights(scratch / "hf");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(bit_equal(back.at(name), t)) << name;
  }
  // The config keeps every key of the source (token ids, ...).
  auto src_config = read_json_file(src / "config.json");
  auto out_config = read_json_file(scratch / "hf" / "config.json");
  for (const auto& [key, value] : src_config.items()) {
    ASSERT_TRUE(out_config.contains(key)) << key;
    if (value.is_number_float()) {
      // JSON doubles are written with enough digits to round trip: bit-exact.
      EXPECT_EQ(out_config[key].get<double>(), value.get<double>()) << key;
    } else {
      EXPECT_EQ(out_config[key], value) << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HfFixtures, BatonConvert,
                         ::testing::Values("tiny-llama", "tiny-qwen2", "tiny-qwen2-value"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(BatonConvertErrors, MissingDirectory) {
  TempDir scratch;
  auto r = convert(
      "--to-sharded --hf " + q(scratch / "nope") + " --out " + q(scratch / "o") + " --tp 1 --pp 1",
      scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
}

// A copy of tiny-llama the test can damage.
fs::path copy_llama(const TempDir& scratch) {
  fs::path dst = scratch / "llama";
  fs::create_directories(dst);
  fs::copy_file(kFixtures / "tiny-llama" / "config.json", dst / "config.json");
  fs::copy_file(kFixtures / "tiny-llama" / "model.safetensors", dst / "model.safetensors");
  return dst;
}

TEST(BatonConvertErrors, TruncatedSafetensors) {
  if (!fs::exists(kFixtures / "tiny-llama" / "model.safetensors")) GTEST_SKIP();
  TempDir scratch;
  auto dir = copy_llama(scratch);
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") / 2);
  auto r = convert("--to-sharded --hf " + q(dir) + " --out " + q(scratch / "o") + " --tp 2 --pp 1",
                   scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
}

TEST(BatonConvertErrors, ShapeThatDoesNotMatchTheConfig) {
  if (!fs::exists(kFixtures / "tiny-llama" / "model.safetensors")) GTEST_SKIP();
  TempDir scratch;
  auto dir = copy_llama(scratch);
  auto config = read_json_file(dir / "config.json");
  config["intermediate_size"] = 64;
  std::ofstream(dir / "config.json") << config.dump();
  auto r = convert("--to-sharded --hf " + q(dir) + " --out " + q(scratch / "o") + " --tp 1 --pp 2",
                   scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("model.layers.0.mlp.gate_proj.weight expected [64, 64] got [128, 64]"),
            std::string::npos)
      << r.err;
}

TEST(BatonConvertErrors, UnsupportedArchitecture) {
  if (!fs::exists(kFixtures / "tiny-llama" / "model.safetensors")) GTEST_SKIP();
  TempDir scratch;
  auto dir = copy_llama(scratch);
  auto config = read_json_file(dir / "config.json");
  config["architectures"] = {"Phi3ForCausalLM"};
  config["model_type"] = "phi3";
  std::ofstream(dir / "config.json") << config.dump();
  auto r = convert("--to-sharded --hf " + q(dir) + " --out " + q(scratch / "o") + " --tp 1 --pp 1",
                   scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("Phi3ForCausalLM"), std::string::npos) << r.err;
  // The one line names what is supported.
  EXPECT_NE(r.err.find("supported model_types: llama, qwen2, qwen3, mistral, qwen3_moe"),
            std::string::npos)
      << r.err;
}

TEST(BatonConvertErrors, BadLayoutAndUsage) {
  if (!fs::exists(kFixtures / "tiny-llama" / "model.safetensors")) GTEST_SKIP();
  TempDir scratch;
  auto src = q(kFixtures / "tiny-llama");
  auto r = convert("--to-sharded --hf " + src + " --out " + q(scratch / "o") +
                       " --tp 1 --pp 2 --layer-split 3,2",
                   scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("sums to 5"), std::string::npos) << r.err;
  r = convert("--to-sharded --hf " + src + " --out " + q(scratch / "o") + " --tp 3 --pp 1",
              scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("num_key_value_heads 2"), std::string::npos) << r.err;
  r = convert("--to-sharded --hf " + src + " --tp x --pp 1", scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--tp"), std::string::npos) << r.err;
  r = convert("--to-hf --sharded " + q(scratch / "absent") + " --out " + q(scratch / "o2"),
              scratch);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("absent"), std::string::npos) << r.err;
  r = convert("", scratch);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("usage"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace baton::engine
