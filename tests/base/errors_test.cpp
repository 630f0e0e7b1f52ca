// One root: an error raised by each module is caught as baton::Error, with
// its module's own type intact, and the message names what was wrong.
#include "base/errors.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <typeinfo>

#include "base/atomic_file.h"
#include "base/checksum.h"
#include "base/checksum_manifest.h"
#include "data/parquet_file.h"
#include "dispatch/data_proto.h"
#include "engine/errors.h"
#include "engine/io/model_config.h"
#include "net/auth.h"
#include "runtime/value.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"
#include "trainer/config/config.h"
#include "workers/algos/algo_registry.h"
#include "workers/rewards/reward_registry.h"

namespace baton {
namespace {

// Runs `raise`; it must throw something caught as `const baton::Error&` whose
// dynamic type is `Specific` and whose message contains `needle`. Anything
// else (no throw, a std::exception outside the family) fails the test.
template <typename Specific>
void expect_baton_error(const std::string& module, const std::function<void()>& raise,
                        const std::string& needle) {
  try {
    raise();
    ADD_FAILURE() << module << ": nothing was thrown";
  } catch (const Error& e) {
    EXPECT_NE(dynamic_cast<const Specific*>(&e), nullptr)
        << module << ": caught as baton::Error but not as " << typeid(Specific).name() << ": "
        << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << module << ": '" << e.what() << "' does not name '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << module << ": threw " << typeid(e).name()
                  << ", which is not a baton::Error: " << e.what();
  }
}

TEST(Errors, OneErrorFromEachModuleIsCaughtAsBatonError) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("baton_errors_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "latest") << "12abc";
  }
  expect_baton_error<FileError>("base", [&] { read_step_file(dir / "latest"); }, "latest");
  ChecksumManifest manifest;
  manifest.add("latest", checksum_bytes("12", 2));
  manifest.write(dir);
  expect_baton_error<ChecksumError>(
      "base (checksums)", [&] { verify_file_bytes(dir / "latest", "12abc", 5); }, "latest");
  remove_tree(dir);

  expect_baton_error<Error>(
      "net", [] { auth::split_host_port("no-port-here", "--driver"); }, "--driver");
  expect_baton_error<TypeError>("runtime", [] { Value(int64_t{3}).as_string(); }, "");
  expect_baton_error<Error>(
      "dispatch", [] { DataProto().tensor("input_ids"); }, "input_ids");
  expect_baton_error<engine::EngineError>(
      "engine (bad input)",
      [] { engine::ModelConfig::from_hf_json(nlohmann::json::parse("{}"), "cfg.json"); },
      "cfg.json");
  expect_baton_error<InternalError>(
      "engine (invariant)", [] { ENGINE_CHECK(1 + 1 == 3, "arithmetic"); }, "arithmetic");
  expect_baton_error<data::TokenizerError>(
      "text (tokenizer)", [] { data::Tokenizer::from_json("{", "{}", "tok.json"); }, "tok.json");
  expect_baton_error<data::JinjaError>(
      "text (jinja)",
      [] { data::ChatTemplate::from_template("{% include 'x' %}", "tokenizer_config.json"); },
      "tokenizer_config.json");
  expect_baton_error<Error>(
      "data", [] { data::read_parquet_rows("/nonexistent/train.parquet"); }, "train.parquet");
  expect_baton_error<trainer::ConfigError>(
      "trainer", [] { trainer::Config::from_yaml("a: [1, 2", "bad.yaml"); }, "bad.yaml");
  expect_baton_error<Error>(
      "workers/algos", [] { algos::find_policy_loss("no_such_loss"); }, "no_such_loss");
  expect_baton_error<Error>(
      "workers/rewards", [] { rewards::find_reward_function("no_such_reward"); },
      "no_such_reward");
}

}  // namespace
}  // namespace baton
