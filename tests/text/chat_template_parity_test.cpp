// Chat templates against transformers' apply_chat_template (jinja2), byte for byte, on the real
// templates llama.cpp vendors (fixtures/make_chat_template_fixtures.py writes them and
// transformers' renderings into the directory BATON_CHAT_TEMPLATE_FIXTURES names).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "text/chat_template.h"

namespace baton::data {
namespace {

using Json = nlohmann::ordered_json;

std::string fixtures_dir() {
  const char* dir = std::getenv("BATON_CHAT_TEMPLATE_FIXTURES");
  return dir ? dir : BATON_CHAT_TEMPLATE_FIXTURES_DEFAULT;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The local time "YYYY-MM-DD HH:MM:SS" as a time point.
std::chrono::system_clock::time_point local_time(const std::string& text) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%d %H:%M:%S");
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm));
}

// Where two texts first differ, with some context, for the failure message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const std::size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + ":\n  baton: " + Json(a.substr(from, 100)).dump() +
         "\n  jinja2: " + Json(b.substr(from, 100)).dump();
}

struct Outcome {
  int passed = 0;
  std::vector<std::string> failures;
  std::vector<std::string> both_failed;  // jinja2's error and baton's, for BATON_PARITY_VERBOSE
};

class ChatTemplateParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = fixtures_dir() + "/chat_template_expected.json";
    std::ifstream in(path);
    if (!in) return;
    expected_ = new Json(Json::parse(in));
  }
  static void TearDownTestSuite() {
    delete expected_;
    expected_ = nullptr;
  }

  // Renders every case; template file -> outcome.
  static std::map<std::string, Outcome> run_all() {
    std::map<std::string, Outcome> outcomes;
    JinjaRenderOptions options;
    options.now = local_time(expected_->at("now").get<std::string>());
    std::map<std::string, std::optional<ChatTemplate>> loaded;
    std::map<std::string, std::string> load_errors;
    for (const Json& c : expected_->at("cases")) {
      const std::string file = c.at("template");
      if (!loaded.count(file)) {
        try {
          loaded[file] = ChatTemplate::from_template(read(fixtures_dir() + "/" + file), file);
        } catch (const Error& e) {  // JinjaError or TokenizerError
          loaded[file] = std::nullopt;
          load_errors[file] = e.what();
        }
      }
      const std::string label = c.at("case").get<std::string>() +
                                (c.at("add_generation_prompt").get<bool>() ? " +gen" : "");
      Outcome& o = outcomes[file];
      const bool should_fail = !c.at("error").is_null();
      std::string got, error;
      if (loaded[file]) {
        try {
          got = loaded[file]->render(c.at("messages"), c.at("add_generation_prompt").get<bool>(),
                                     c.at("variables"), options);
        } catch (const Error& e) {  // JinjaError or TokenizerError
          error = e.what();
        }
      } else {
        error = "at load: " + load_errors[file];
      }
      if (should_fail) {
        if (!error.empty()) {
          ++o.passed;
          o.both_failed.push_back(label + ":\n  jinja2: " + c.at("error").get<std::string>() +
                                  "\n  baton: " + error);
        } else {
          o.failures.push_back(label + ": jinja2 raised (" + c.at("error").get<std::string>() +
                               ") but baton rendered");
        }
      } else if (!error.empty()) {
        o.failures.push_back(label + ": baton failed: " + error);
      } else if (got != c.at("expected").get<std::string>()) {
        o.failures.push_back(label + ": differs " +
                             first_difference(got, c.at("expected").get<std::string>()));
      } else {
        ++o.passed;
      }
    }
    return outcomes;
  }

  static Json* expected_;
};
Json* ChatTemplateParity::expected_ = nullptr;

TEST_F(ChatTemplateParity, EveryTemplateRendersAsTransformers) {
  if (!expected_) GTEST_SKIP() << "no fixtures in " << fixtures_dir();
  const auto outcomes = run_all();
  int templates_ok = 0, cases_ok = 0, cases = 0;
  for (const auto& [file, o] : outcomes) {
    cases += o.passed + static_cast<int>(o.failures.size());
    cases_ok += o.passed;
    templates_ok += o.failures.empty();
    for (const auto& f : o.failures) ADD_FAILURE() << file << " " << f;
    if (std::getenv("BATON_PARITY_VERBOSE")) {
      for (const auto& f : o.both_failed) std::cout << file << " " << f << "\n";
    }
  }
  std::cout << templates_ok << "/" << outcomes.size() << " templates and " << cases_ok << "/"
            << cases << " cases as transformers renders them\n";
}

TEST_F(ChatTemplateParity, TheTemplatesOfIssue22AllPass) {
  if (!expected_) GTEST_SKIP() << "no fixtures in " << fixtures_dir();
  const std::vector<std::string> named = {
      "Qwen-Qwen2.5-7B-Instruct",
      "Qwen-Qwen3-0.6B",
      "Qwen-QwQ-32B",
      "meta-llama-Llama-3.1-8B-Instruct",
      "meta-llama-Llama-3.2-3B-Instruct",
      "meta-llama-Llama-3.3-70B-Instruct",
      "mistralai-Mistral-Nemo-Instruct-2407",
      "google-gemma-2-2b-it",
      "microsoft-Phi-3.5-mini-instruct",
      "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
      "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
      "ibm-granite-granite-3.3-2B-Instruct",
  };
  const auto outcomes = run_all();
  for (const std::string& name : named) {
    const auto it = outcomes.find("templates/" + name + ".jinja");
    ASSERT_NE(it, outcomes.end()) << name << " is not among the fixtures";
    EXPECT_TRUE(it->second.failures.empty())
        << name << ": " << it->second.failures.size()
        << " case(s) differ, first: " << it->second.failures.front();
    EXPECT_GT(it->second.passed, 0) << name;
  }
}

}  // namespace
}  // namespace baton::data
