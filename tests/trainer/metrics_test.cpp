// MetricsLogger: metrics.jsonl (content, parse-back, NaN as null, resume
// truncation), the console table, and plot() through gnuplot.
#include "trainer/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "base/errors.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed afterwards.
class MetricsLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("baton_metrics_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    baton::remove_tree(dir_);
  }
  void TearDown() override { baton::remove_tree(dir_); }

  MetricsLoggerOptions file_only() const {
    return MetricsLoggerOptions().set_dir(dir_).set_loggers({"file"});
  }
  std::vector<std::string> lines() const {
    std::ifstream in(dir_ / "metrics.jsonl");
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

  fs::path dir_;
};

TEST_F(MetricsLoggerTest, FileLoggerWritesOneJsonObjectPerStepStepFirst) {
  MetricsLogger logger(file_only());
  logger.log(1, {{"critic/score/mean", 0.5}, {"actor/pg_loss", -2.25}});
  // Flushed per step: readable while the logger is alive.
  ASSERT_EQ(lines().size(), 1u);
  logger.log(2, {{"critic/score/mean", 0.1}});
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0].rfind("{\"step\":1,", 0), 0u) << ls[0];
  const json a = json::parse(ls[0]);
  EXPECT_EQ(a["step"].get<int64_t>(), 1);
  EXPECT_EQ(a["critic/score/mean"].get<double>(), 0.5);
  EXPECT_EQ(a["actor/pg_loss"].get<double>(), -2.25);
  EXPECT_EQ(a.size(), 3u);
  const json b = json::parse(ls[1]);
  EXPECT_EQ(b["step"].get<int64_t>(), 2);
  // Doubles round-trip exactly through the text.
  EXPECT_EQ(b["critic/score/mean"].get<double>(), 0.1);
}

TEST_F(MetricsLoggerTest, NonFiniteValuesAreWrittenAsNull) {
  MetricsLogger logger(file_only());
  logger.log(7, {{"nan", std::numeric_limits<double>::quiet_NaN()},
                 {"inf", std::numeric_limits<double>::infinity()},
                 {"minus_inf", -std::numeric_limits<double>::infinity()},
                 {"ok", 3.0}});
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 1u);
  const json j = json::parse(ls[0]);  // throws on NaN/Infinity tokens
  EXPECT_TRUE(j["nan"].is_null());
  EXPECT_TRUE(j["inf"].is_null());
  EXPECT_TRUE(j["minus_inf"].is_null());
  EXPECT_EQ(j["ok"].get<double>(), 3.0);
}

TEST_F(MetricsLoggerTest, ResumeKeepsTheStepsBeforeTheFirstStepLogged) {
  {
    MetricsLogger first(file_only());
    for (int64_t s = 1; s <= 5; ++s) first.log(s, {{"x", static_cast<double>(s)}});
  }
  // A line torn by a crash.
  { std::ofstream(dir_ / "metrics.jsonl", std::ios::app) << "{\"step\": 6, \"x\""; }

  MetricsLogger resumed(file_only());
  // Nothing changes on disk until the first log().
  EXPECT_EQ(lines().size(), 6u);
  ASSERT_EQ(resumed.history().size(), 5u);
  resumed.log(3, {{"x", 30.0}});
  resumed.log(4, {{"x", 40.0}});
  const auto ls = lines();
  ASSERT_EQ(ls.size(), 4u);
  const std::vector<std::pair<int64_t, double>> expected = {{1, 1}, {2, 2}, {3, 30}, {4, 40}};
  for (size_t i = 0; i < ls.size(); ++i) {
    const json j = json::parse(ls[i]);
    EXPECT_EQ(j["step"].get<int64_t>(), expected[i].first) << ls[i];
    EXPECT_EQ(j["x"].get<double>(), expected[i].second) << ls[i];
  }
  ASSERT_EQ(resumed.history().size(), 4u);
  EXPECT_EQ(resumed.history()[2].first, 3);
  EXPECT_EQ(resumed.history()[2].second.at("x"), 30.0);
  EXPECT_FALSE(fs::exists(dir_ / "metrics.jsonl.tmp"));
}

TEST_F(MetricsLoggerTest, ResumeStepKeepsTheCheckpointsStepWhenItIsLoggedAgain) {
  {
    MetricsLogger first(file_only());
    for (int64_t s = 1; s <= 5; ++s) first.log(s, {{"x", static_cast<double>(s)}});
  }
  // Resumed from the checkpoint of step 3: validation logs step 3 again.
  MetricsLogger resumed(file_only().set_resume_step(3));
  resumed.log(3, {{"val", 0.5}});
  resumed.log(4, {{"x", 40.0}});
  std::vector<int64_t> steps;
  for (const std::string& l : lines()) steps.push_back(json::parse(l)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 3, 4}));
  EXPECT_EQ(json::parse(lines()[2])["x"].get<double>(), 3.0);  // step 3's training line
  EXPECT_EQ(resumed.history().size(), 5u);
}

TEST_F(MetricsLoggerTest, ResumeReadsNullBackAsNaN) {
  {
    MetricsLogger first(file_only());
    first.log(1, {{"x", std::numeric_limits<double>::quiet_NaN()}});
  }
  MetricsLogger resumed(file_only());
  ASSERT_EQ(resumed.history().size(), 1u);
  EXPECT_TRUE(std::isnan(resumed.history()[0].second.at("x")));
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

TEST_F(MetricsLoggerTest, ConsolePrintsTheChosenColumnsWithDashesForMissingValues) {
  std::ostringstream out;
  MetricsLogger logger(MetricsLoggerOptions().set_loggers({"console"}).set_console(&out));
  logger.log(12, {{"critic/score/mean", 0.625},
                  {"val-core/gsm8k/reward/mean@1", 0.5},
                  {"actor/pg_loss", -0.03125},
                  {"actor/entropy", 1.25},
                  {"response_length/mean", 87.5},
                  {"timing_s/step", 3.5},
                  {"not/a/column", 99.0}});
  std::vector<std::string> rows;
  std::istringstream in(out.str());
  for (std::string l; std::getline(in, l);) rows.push_back(l);
  ASSERT_EQ(rows.size(), 2u) << out.str();
  EXPECT_EQ(words(rows[0]),
            (std::vector<std::string>{"step", "score", "val", "pg_loss", "entropy", "ppo_kl",
                                      "grad_norm", "resp_len", "step_s"}));
  EXPECT_EQ(words(rows[1]), (std::vector<std::string>{"12", "0.625", "0.5", "-0.03125", "1.25", "-",
                                                      "-", "87.5", "3.5"}));
  // Right-aligned under their headers: each value ends where its header ends.
  for (const char* h : {"score", "entropy", "step_s"}) {
    const size_t end = rows[0].find(h) + std::string(h).size();
    EXPECT_NE(rows[1][end - 1], ' ') << h;
    EXPECT_TRUE(end == rows[1].size() || rows[1][end] == ' ') << h;
  }
}

TEST_F(MetricsLoggerTest, ConsoleRepeatsTheHeaderEveryHeaderEveryRows) {
  std::ostringstream out;
  MetricsLoggerOptions o = MetricsLoggerOptions().set_console(&out);
  o.header_every = 2;
  MetricsLogger logger(o);
  for (int64_t s = 1; s <= 5; ++s) logger.log(s, {});
  std::vector<std::string> rows;
  std::istringstream in(out.str());
  for (std::string l; std::getline(in, l);) rows.push_back(words(l)[0]);
  EXPECT_EQ(rows, (std::vector<std::string>{"step", "1", "2", "step", "3", "4", "step", "5"}));
}

TEST_F(MetricsLoggerTest, VerboseConsolePrintsEveryMetric) {
  std::ostringstream out;
  MetricsLogger logger(MetricsLoggerOptions().set_console(&out).set_verbose(true));
  logger.log(3, {{"zeta/unlisted", 1.5}, {"alpha", 2.0}});
  const std::string s = out.str();
  EXPECT_NE(s.find("step 3:"), std::string::npos) << s;
  EXPECT_NE(s.find("zeta/unlisted  1.5"), std::string::npos) << s;
  EXPECT_NE(s.find("alpha"), std::string::npos) << s;
  // Without verbose, only the table.
  std::ostringstream quiet;
  MetricsLogger(MetricsLoggerOptions().set_console(&quiet)).log(3, {{"zeta/unlisted", 1.5}});
  EXPECT_EQ(quiet.str().find("zeta"), std::string::npos);
}

TEST_F(MetricsLoggerTest, RejectsUnknownLoggersAndFileWithoutDir) {
  EXPECT_THROW(MetricsLogger(MetricsLoggerOptions().set_loggers({"wandb"})), Error);
  EXPECT_THROW(MetricsLogger(MetricsLoggerOptions().set_loggers({"file"})), Error);
}

bool gnuplot_installed() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

TEST_F(MetricsLoggerTest, PlotWritesAPng) {
  if (!gnuplot_installed()) {
    GTEST_SKIP() << "gnuplot is not installed (Debian's gnuplot-nox; scripts/setup.sh installs it)";
  }
  MetricsLogger logger(file_only().set_names("proj", "exp_1"));
  for (int64_t s = 1; s <= 6; ++s) {
    const double x = static_cast<double>(s);
    std::map<std::string, double> m = {{"critic/score/mean", 0.1 * x},
                                       {"actor/ppo_kl", 0.01 * x},
                                       {"actor/entropy", 2.0 - 0.1 * x},
                                       {"response_length/mean", 50 + x}};
    if (s % 3 == 0) m["val-core/toy/reward/mean@1"] = 0.2 * x;
    logger.log(s, m);
  }
  const fs::path png = dir_ / "curves.png";
  logger.plot(png);
  ASSERT_TRUE(fs::exists(png));
  std::ifstream in(png, std::ios::binary);
  std::string head(8, '\0');
  in.read(head.data(), 8);
  EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(fs::file_size(png), 1000u);
  EXPECT_TRUE(fs::exists(dir_ / "curves.gp"));
  EXPECT_TRUE(fs::exists(dir_ / "curves.dat"));
}

TEST_F(MetricsLoggerTest, PlotNamesTheCommandWhenGnuplotIsMissing) {
  MetricsLoggerOptions o = file_only();
  o.gnuplot = "/nonexistent/baton-gnuplot";
  MetricsLogger logger(o);
  logger.log(1, {{"critic/score/mean", 1.0}});
  try {
    logger.plot(dir_ / "curves.png");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/baton-gnuplot"), std::string::npos) << what;
    EXPECT_NE(what.find("127"), std::string::npos) << what;
  }
}

TEST_F(MetricsLoggerTest, PlotWithNothingToDrawThrows) {
  MetricsLogger logger(file_only());
  logger.log(1, {{"unrelated", 1.0}});
  EXPECT_THROW(logger.plot(dir_ / "curves.png"), Error);
}

}  // namespace
}  // namespace baton::trainer
