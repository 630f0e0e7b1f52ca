// The tools on an HF checkpoint whose vocabulary (97, tiny-llama-v97) no
// tensor-parallel size divides: baton-logprobs --tp 2, --tp 2 --pp 2 and
// --tp 4 agree with HF transformers' reference, baton-generate --tp 2 gives
// TP 1's tokens, and baton-convert round trips the checkpoint bit for bit
// through padded shards.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/run_program.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
const fs::path kFixture = fs::path(BATON_FIXTURES_DIR) / "tiny-llama-v97";

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

nlohmann::json last_json_line(const test::ProgramRun& r) {
  EXPECT_EQ(r.status, 0) << r.out;
  return nlohmann::json::parse(r.out.substr(r.out.rfind('{', r.out.rfind("\"model\""))));
}

struct Layout {
  int tp, pp, divisible_by;
};

class VocabPaddingLogprobs : public ::testing::TestWithParam<Layout> {};

TEST_P(VocabPaddingLogprobs, MatchesHfReference) {
  const Layout l = GetParam();
  auto ref = read_safetensors(kFixture / "reference.safetensors");
  auto ids = ref.at("input_ids")[0];  // row 0: unpadded
  std::string tokens;
  for (int64_t i = 0; i < ids.numel(); ++i)
    tokens += (i ? "," : "") + std::to_string(ids[i].item<int64_t>());
  auto j = last_json_line(test::run_program(
      std::string("'") + BATON_LOGPROBS_EXE + "' --model " + q(kFixture) + " --tokens " + tokens +
      " --tp " + std::to_string(l.tp) + " --pp " + std::to_string(l.pp) +
      " --make-vocab-size-divisible-by " + std::to_string(l.divisible_by)));
  // HF's kernels against baton's and its TP/PP split: a log-prob's chain at
  // the scale of row 0's logits.
  auto cfg = ModelConfig::load(kFixture);
  test::expect_close(at::tensor(j.at("log_probs").get<std::vector<double>>(), at::kDouble),
                     ref.at("log_probs")[0],
                     test::Tolerance::fp32(test::log_prob_terms(cfg, ids.numel()),
                                           test::max_abs(ref.at("logits")[0])),
                     "log_probs");
}

INSTANTIATE_TEST_SUITE_P(Layouts, VocabPaddingLogprobs,
                         ::testing::Values(Layout{1, 1, 128}, Layout{2, 1, 128},
                                           Layout{2, 2, 128}, Layout{4, 1, 128}, Layout{2, 2, 1}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "_pp" +
                                  std::to_string(info.param.pp) + "_div" +
                                  std::to_string(info.param.divisible_by);
                         });

TEST(VocabPaddingGenerate, Tp2GivesTheTokensOfTp1) {
  auto run = [](int tp, const std::string& sampling) {
    return last_json_line(test::run_program(
        std::string("'") + BATON_GENERATE_EXE + "' --model " + q(kFixture) +
        " --prompt-tokens '5,17,33;96,4,60;40' --max-new-tokens 6 --ignore-eos " + sampling +
        " --tp " + std::to_string(tp)));
  };
  for (const std::string sampling : {"--temperature 0", "--temperature 1 --n 2 --seed 7"}) {
    auto one = run(1, sampling), two = run(2, sampling);
    ASSERT_EQ(one["sequences"].size(), two["sequences"].size()) << sampling;
    for (size_t i = 0; i < one["sequences"].size(); ++i)
      EXPECT_EQ(two["sequences"][i]["response"], one["sequences"][i]["response"])
          << sampling << " sequence " << i;
  }
}

TEST(VocabPaddingConvert, RoundTripIsBitExact) {
  const TensorMap original = read_hf_weights(kFixture);
  for (const std::string layout :
       {"--tp 2 --pp 2", "--tp 4 --pp 1", "--tp 2 --pp 2 --make-vocab-size-divisible-by 1"}) {
    testing::TempDir scratch;
    auto r = test::run_program(std::string("'") + BATON_CONVERT_EXE + "' --to-sharded --hf " +
                               q(kFixture) + " --out " + q(scratch / "sharded") + " " + layout);
    ASSERT_EQ(r.status, 0) << layout << ": " << r.out;
    std::ifstream in(scratch / "sharded" / "layout.json");
    auto j = nlohmann::json::parse(in);
    EXPECT_GT(j.at("padded_vocab_size").get<int64_t>(), 97) << layout;
    r = test::run_program(std::string("'") + BATON_CONVERT_EXE + "' --to-hf --sharded " +
                          q(scratch / "sharded") + " --out " + q(scratch / "hf"));
    ASSERT_EQ(r.status, 0) << layout << ": " << r.out;
    const TensorMap back = read_hf_weights(scratch / "hf");
    ASSERT_EQ(back.size(), original.size()) << layout;
    for (const auto& [name, t] : original) {
      ASSERT_TRUE(back.count(name)) << layout << ": " << name;
      EXPECT_TRUE(at::equal(back.at(name), t)) << layout << ": " << name;
    }
    EXPECT_EQ(ModelConfig::load(scratch / "hf").vocab_size, 97) << layout;
  }
}

}  // namespace
}  // namespace baton::engine
