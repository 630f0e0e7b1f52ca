// baton-logprobs, run as a program: its log-probs equal HF's reference for the
// fixture's unpadded row (within the rounding of a log-prob's chain,
// model_tolerance.h), sharded or not; bad inputs exit non-zero with a message
// naming what was wrong.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "engine/io/safetensors.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/run_program.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = BATON_FIXTURES_DIR;

test::ProgramRun logprobs(const std::string& args) {
  return test::run_program(std::string("'") + BATON_LOGPROBS_EXE + "' " + args);
}

std::string row0_tokens(const TensorMap& ref) {
  auto ids = ref.at("input_ids")[0];
  std::string s;
  for (int64_t i = 0; i < ids.numel(); ++i)
    s += (i ? "," : "") + std::to_string(ids[i].item<int64_t>());
  return s;
}

struct Case {
  std::string fixture;
  int tp, pp;
};

class BatonLogprobs : public ::testing::TestWithParam<Case> {};

TEST_P(BatonLogprobs, MatchesHfReference) {
  const Case& c = GetParam();
  auto dir = kFixtures / c.fixture;
  auto ref = read_safetensors(dir / "reference.safetensors");
  auto r = logprobs("--model '" + dir.string() + "' --tokens " + row0_tokens(ref) + " --tp " +
                    std::to_string(c.tp) + " --pp " + std::to_string(c.pp));
  ASSERT_EQ(r.status, 0) << r.out;
  auto line = r.out.substr(r.out.rfind('{'));
  auto j = nlohmann::json::parse(line);
  auto got = j.at("log_probs").get<std::vector<double>>();
  auto want = ref.at("log_probs")[0];
  // HF's kernels against baton's (and its TP/PP split), at the scale of
  // row 0's logits.
  auto cfg = ModelConfig::load(dir);
  test::expect_close(at::tensor(got, at::kDouble), want,
                     test::Tolerance::fp32(test::log_prob_terms(cfg, ref.at("input_ids").size(1)),
                                           test::max_abs(ref.at("logits")[0])),
                     "log_probs");
  EXPECT_EQ(j.at("tp"), c.tp);
  EXPECT_EQ(j.at("pp"), c.pp);
}

INSTANTIATE_TEST_SUITE_P(Layouts, BatonLogprobs,
                         ::testing::Values(Case{"tiny-llama", 1, 1}, Case{"tiny-llama", 2, 2},
                                           Case{"tiny-qwen2", 2, 1}, Case{"tiny-qwen2", 1, 2},
                                           Case{"tiny-qwen3", 2, 2}, Case{"tiny-qwen3-moe", 2, 2},
                                           Case{"tiny-llama3-rope", 1, 2},
                                           Case{"tiny-llama-yarn", 2, 1},
                                           Case{"tiny-mistral", 2, 1}),
                         [](const auto& info) {
                           std::string n = info.param.fixture.substr(5) + "_tp" +
                                           std::to_string(info.param.tp) + "_pp" +
                                           std::to_string(info.param.pp);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(BatonLogprobsErrors, MissingModelNamesThePath) {
  auto r = logprobs("--model /nonexistent/model --tokens 1,2,3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;
}

TEST(BatonLogprobsErrors, TruncatedSafetensorsIsAnError) {
  testing::TempDir tmp;
  auto src = kFixtures / "tiny-llama";
  fs::copy_file(src / "config.json", tmp / "config.json");
  auto size = fs::file_size(src / "model.safetensors");
  fs::copy_file(src / "model.safetensors", tmp / "model.safetensors");
  fs::resize_file(tmp / "model.safetensors", size / 2);
  auto r = logprobs("--model '" + tmp.path().string() + "' --tokens 1,2,3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

TEST(BatonLogprobsErrors, TokenOutsideVocabularyAndBadLayout) {
  auto dir = (kFixtures / "tiny-llama").string();
  auto r = logprobs("--model '" + dir + "' --tokens 1,500");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("500"), std::string::npos) << r.out;
  r = logprobs("--model '" + dir + "' --tokens 1,2 --tp 3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("3"), std::string::npos) << r.out;
  r = logprobs("--model '" + dir + "' --tokens 1");
  EXPECT_EQ(r.status, 2) << r.out;
}

}  // namespace
}  // namespace baton::engine
