// PEFT LoRA adapters (engine/io/peft_adapter.h) on the tiny Qwen3 and Llama
// fixtures: baton's adapters written as a PEFT directory and read back are
// the same bit for bit; HF PEFT 0.21 loads what baton writes and computes
// baton's logits, and baton loads what PEFT writes and computes PEFT's
// (tests/engine/peft_check.py runs PEFT; those two skip without it); bad
// adapters are refused naming the file, key or tensor. The TP × PP split of
// an adapter is in peft_adapter_parallel_test.cpp.
#include "engine/io/peft_adapter.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "base/checksum_manifest.h"
#include "engine/io/hf_model.h"
#include "engine/io/safetensors.h"
#include "engine/model/transformer.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/fixture_model.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/run_program.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using test::expect_close;
using test::max_abs;
using test::Tolerance;
using testing::expect_error;
using testing::TempDir;

const std::string kFixtures = BATON_FIXTURES_DIR;
const std::string kPeftCheck = std::string(BATON_FIXTURES_DIR) + "/../peft_check.py";
constexpr int kSkip = 77;

LoraOptions lora_options(std::vector<std::string> targets, int64_t rank = 4, double alpha = 8,
                         uint64_t seed = 1234) {
  LoraOptions l;
  l.rank = rank;
  l.alpha = alpha;
  l.targets = std::move(targets);
  l.seed = seed;
  return l;
}

std::shared_ptr<Transformer> load(const std::string& fixture, const LoraOptions& lora) {
  TransformerOptions o;
  o.lora = lora;
  return test::load_fixture_model(fixture, o);
}

// Every adapter factor drawn from normal(0, 0.1) (B too: a fresh B is zero).
void randomize_adapters(Transformer& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, p] : model.lora_params()) p.copy_(at::normal(0.0, 0.1, p.sizes(), gen));
}

// The single-process model's adapters as a PEFT adapter (in memory).
PeftAdapter adapter_of(const Transformer& model, const std::string& base) {
  TensorMap mine;
  for (const auto& [name, t] : model.lora_params()) mine.emplace(name, t.detach());
  PeftAdapter a;
  a.lora = model.options().lora;
  a.base_model = base;
  a.weights = lora_shards_to_peft({{mine}}, model.config(), a.lora, {model.config().num_layers});
  return a;
}

at::Tensor logits_of(Transformer& model, const TensorMap& ref) {
  at::NoGradGuard no_grad;
  return model.forward(ref.at("input_ids"), ref.at("position_ids"), ref.at("attention_mask"));
}

// The terms behind a logit of the adapted model: the base model's, and per
// layer the rank-long sum of x Aᵀ times B on each of its four projections
// (x Aᵀ sums as many terms as x Wᵀ does, beside it).
double lora_logit_terms(const ModelConfig& cfg, int64_t rank, int64_t seq) {
  return test::logit_terms(cfg, seq) + static_cast<double>(4 * rank * cfg.num_layers);
}

class PeftAdapterFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftAdapterFixture, WrittenAndReadBackTheAdaptersAreTheSameBitForBit) {
  const std::string fixture = GetParam();
  for (const auto& targets : {std::vector<std::string>{"all-linear"},
                              std::vector<std::string>{"v_proj", "q_proj", "down_proj"}}) {
    SCOPED_TRACE(targets.front());
    auto model = load(fixture, lora_options(targets));
    randomize_adapters(*model, 7);
    TempDir dir;
    save_peft_adapter(dir.path(), adapter_of(*model, kFixtures + "/" + fixture));

    // PEFT's names and shapes, and its config keys.
    const TensorMap w = read_safetensors(dir / kPeftWeightsFile);
    const ModelConfig& cfg = model->config();
    EXPECT_EQ(w.size(), model->lora_params().size());
    EXPECT_EQ(w.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").sizes(),
              (at::IntArrayRef{4, cfg.hidden_size}));
    EXPECT_EQ(w.at("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight").sizes(),
              (at::IntArrayRef{cfg.hidden_size, 4}));
    const nlohmann::json j = read_json_file(dir / kPeftConfigFile);
    EXPECT_EQ(j.at("peft_type"), "LORA");
    EXPECT_EQ(j.at("task_type"), "CAUSAL_LM");
    EXPECT_EQ(j.at("r"), 4);
    EXPECT_EQ(j.at("lora_alpha"), 8);
    EXPECT_EQ(j.at("bias"), "none");
    EXPECT_EQ(j.at("use_rslora"), false);
    EXPECT_EQ(j.at("base_model_name_or_path"), kFixtures + "/" + fixture);
    EXPECT_EQ(j.at("target_modules").get<std::vector<std::string>>(),
              model->options().lora.modules());
    EXPECT_EQ(read_peft_adapter_config(dir.path()).modules(), model->options().lora.modules());

    // A fresh model (another A) takes them exactly.
    auto fresh = load(fixture, lora_options(targets, 4, 8, /*seed=*/99));
    copy_peft_adapter(load_peft_adapter(dir.path()), fresh->config(), fresh->options().lora,
                      fresh->shard_spec(), fresh->lora_params());
    const auto want = model->lora_params(), got = fresh->lora_params();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << got[i].first;
    }
  }
}

// HF PEFT loads baton's adapter onto the base model and computes the logits
// of the adapted model, within the fp32 tolerance of the two computations.
TEST_P(PeftAdapterFixture, PeftLoadsWhatBatonWritesAndComputesTheSameLogits) {
  const std::string fixture = GetParam();
  const std::string base = kFixtures + "/" + fixture;
  const TensorMap ref = read_safetensors(base + "/reference.safetensors");
  auto model = load(fixture, lora_options({"all-linear"}));
  randomize_adapters(*model, 11);
  TempDir dir;
  save_peft_adapter(dir / "adapter", adapter_of(*model, base));
  const test::ProgramRun run = test::run_program(
      "python3 '" + kPeftCheck + "' logits --base '" + base + "' --adapter '" +
      (dir / "adapter").string() + "' --reference '" + base + "/reference.safetensors' --out '" +
      (dir / "peft.safetensors").string() + "'");
  if (run.status == kSkip) GTEST_SKIP() << run.out;
  ASSERT_EQ(run.status, 0) << run.out;
  const at::Tensor peft = read_safetensors(dir / "peft.safetensors").at("logits");
  const at::Tensor ours = logits_of(*model, ref);
  const at::Tensor& mask = ref.at("attention_mask");
  const double scale = max_abs(peft, mask);
  expect_close(ours, peft,
               Tolerance::fp32(lora_logit_terms(model->config(), 4, ours.size(1)), scale),
               "baton's adapted logits vs PEFT's", mask);
  // The adapters matter: off, the logits are far from PEFT's.
  model->set_lora_enabled(false);
  EXPECT_GT(((logits_of(*model, ref) - peft) * mask.unsqueeze(-1)).abs().max().item<double>(),
            1e-2);
}

// An adapter PEFT made (non-zero B) loads into a model built with its
// config and computes PEFT's logits.
TEST_P(PeftAdapterFixture, BatonLoadsWhatPeftWritesAndComputesTheSameLogits) {
  const std::string fixture = GetParam();
  const std::string base = kFixtures + "/" + fixture;
  const TensorMap ref = read_safetensors(base + "/reference.safetensors");
  for (const std::string targets : {"all-linear", "q_proj,k_proj,o_proj,up_proj"}) {
    SCOPED_TRACE(targets);
    TempDir dir;
    const test::ProgramRun run =
        test::run_program("python3 '" + kPeftCheck + "' make --base '" + base + "' --adapter '" +
                          (dir / "adapter").string() + "' --reference '" + base +
                          "/reference.safetensors' --out '" + (dir / "peft.safetensors").string() +
                          "' --rank 6 --alpha 12 --targets " + targets + " --seed 3");
    if (run.status == kSkip) GTEST_SKIP() << run.out;
    ASSERT_EQ(run.status, 0) << run.out;
    const LoraOptions lora = read_peft_adapter_config(dir / "adapter");
    EXPECT_EQ(lora.rank, 6);
    EXPECT_EQ(lora.alpha, 12);
    auto model = load(fixture, lora);
    copy_peft_adapter(load_peft_adapter(dir / "adapter"), model->config(), lora,
                      model->shard_spec(), model->lora_params());
    const at::Tensor peft = read_safetensors(dir / "peft.safetensors").at("logits");
    const at::Tensor ours = logits_of(*model, ref);
    const at::Tensor& mask = ref.at("attention_mask");
    expect_close(
        ours, peft,
        Tolerance::fp32(lora_logit_terms(model->config(), 6, ours.size(1)), max_abs(peft, mask)),
        "baton's logits with PEFT's adapter vs PEFT's", mask);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftAdapterFixture,
                         ::testing::Values("tiny-qwen3", "tiny-llama"),
                         [](const auto& info) { return info.param.substr(5); });

// A valid adapter of tiny-qwen3 (rank 4, all-linear) in `dir`, and the
// model it fits.
std::shared_ptr<Transformer> write_valid(const fs::path& dir) {
  auto model = load("tiny-qwen3", lora_options({"all-linear"}));
  randomize_adapters(*model, 5);
  save_peft_adapter(dir, adapter_of(*model, ""));
  // The tests edit its files by hand: without checksums, as PEFT writes one.
  remove_checksum_manifest(dir);
  return model;
}

void copy_into(const std::shared_ptr<Transformer>& model, const fs::path& dir) {
  copy_peft_adapter(load_peft_adapter(dir), model->config(), model->options().lora,
                    model->shard_spec(), model->lora_params());
}

// adapter_config.json of `dir` with `key` set to `value`.
void set_config_key(const fs::path& dir, const std::string& key, const nlohmann::json& value) {
  nlohmann::json j = read_json_file(dir / kPeftConfigFile);
  j[key] = value;
  std::ofstream(dir / kPeftConfigFile) << j.dump(2);
}

TEST(PeftAdapter, AMissingDirectoryOrFileIsNamed) {
  TempDir dir;
  expect_error([&] { load_peft_adapter(dir / "nothing"); },
               {(dir / "nothing" / "adapter_config.json").string(), "missing",
                "not a PEFT adapter directory"});
  write_valid(dir / "a");
  fs::remove(dir / "a" / kPeftWeightsFile);
  expect_error([&] { load_peft_adapter(dir / "a"); },
               {(dir / "a" / "adapter_model.safetensors").string(), "missing"});
  std::ofstream(dir / "a" / "adapter_model.bin") << "pickle";
  expect_error([&] { load_peft_adapter(dir / "a"); },
               {"adapter_model.bin", "safe_serialization=True"});
}

TEST(PeftAdapter, ARankAlphaOrTargetMismatchNamesBoth) {
  TempDir dir;
  write_valid(dir.path());
  auto rank8 = load("tiny-qwen3", lora_options({"all-linear"}, 8));
  expect_error([&] { copy_into(rank8, dir.path()); },
               {dir.path().string(), "the adapter has r = 4", "the model's LoRA is r = 8"});
  auto alpha = load("tiny-qwen3", lora_options({"all-linear"}, 4, 16));
  expect_error([&] { copy_into(alpha, dir.path()); }, {"lora_alpha = 8", "lora_alpha = 16"});
  auto fewer = load("tiny-qwen3", lora_options({"q_proj"}));
  expect_error([&] { copy_into(fewer, dir.path()); }, {"target_modules [q_proj]"});
}

TEST(PeftAdapter, AMissingOrMisshapenTensorIsNamedWithItsShapes) {
  TempDir dir;
  auto model = write_valid(dir.path());
  const fs::path file = dir / kPeftWeightsFile;
  const std::string q = "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight";
  TensorMap w = read_safetensors(file);
  w[q] = at::zeros({4, 47});
  write_safetensors(file, w);
  expect_error([&] { copy_into(model, dir.path()); },
               {file.string(), q + " expected [4, 48] got [4, 47]"});
  w.erase(q);
  write_safetensors(file, w);
  expect_error([&] { copy_into(model, dir.path()); }, {file.string(), "missing tensors: " + q});
  // MoE experts, the LM head: modules the engine does not adapt.
  w[q] = at::zeros({4, 48});
  const std::string expert = "base_model.model.model.layers.0.mlp.experts.0.up_proj.lora_A.weight";
  w[expert] = at::zeros({4, 48});
  write_safetensors(file, w);
  expect_error([&] { copy_into(model, dir.path()); }, {"unexpected tensors: " + expert});
}

TEST(PeftAdapter, UnsupportedConfigKeysAreRefusedByName) {
  TempDir dir;
  write_valid(dir.path());
  const std::string file = (dir / kPeftConfigFile).string();
  const nlohmann::json good = read_json_file(file);
  auto refused = [&](const std::string& key, const nlohmann::json& value,
                     const std::vector<std::string>& needles) {
    SCOPED_TRACE(key);
    std::ofstream(file) << good.dump(2);
    set_config_key(dir.path(), key, value);
    std::vector<std::string> all = needles;
    all.push_back(file);
    expect_error([&] { read_peft_adapter_config(dir.path()); }, all);
  };
  refused("use_rslora", true, {"\"use_rslora\": true", "lora_alpha / sqrt(r)"});
  refused("use_dora", true, {"\"use_dora\": true"});
  refused("bias", "all", {"\"bias\": \"all\""});
  refused("fan_in_fan_out", true, {"\"fan_in_fan_out\": true"});
  refused("modules_to_save", {"lm_head"}, {"\"modules_to_save\""});
  refused("rank_pattern", {{"q_proj", 8}}, {"\"rank_pattern\""});
  refused("layers_to_transform", {0, 1}, {"\"layers_to_transform\""});
  refused("peft_type", "IA3", {"\"peft_type\" is \"IA3\"", "only LORA"});
  refused("task_type", "SEQ_CLS", {"\"task_type\" is \"SEQ_CLS\""});
  refused("r", 0, {"\"r\" is 0"});
  refused("target_modules", {"q_proj", "lm_head"}, {"\"target_modules\"", "lm_head"});
  refused("target_modules", ".*q_proj", {"regular expression"});
  // What PEFT writes by default, and a null task type, are plain LoRA.
  std::ofstream(file) << good.dump(2);
  set_config_key(dir.path(), "task_type", nullptr);
  set_config_key(dir.path(), "lora_dropout", 0.05);
  set_config_key(dir.path(), "target_modules", "all-linear");
  EXPECT_EQ(read_peft_adapter_config(dir.path()).modules(), kLoraModules);
}

}  // namespace
}  // namespace baton::engine
