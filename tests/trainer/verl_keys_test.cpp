// verl's keys in baton (trainer/config/verl_keys.h): every key of verl's own
// configs and example scripts (copies in tests/fixtures/verl/) has a fate, and
// each fate does what it says; docs/verl-keys.md is the table.
#include "trainer/config/verl_keys.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/config/settings.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
const fs::path kConfigs = BATON_CONFIGS_DIR;
const fs::path kFixtures = fs::path(BATON_SOURCE_DIR) / "tests" / "fixtures" / "verl";

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The keys a verl script's `python3 -m verl.trainer.main_ppo` line sets
// (`  key=value \` lines, `+` forms included), without the plus signs.
std::vector<std::string> script_keys(const fs::path& script) {
  std::vector<std::string> keys;
  const std::regex line(R"(^\s+\+*([A-Za-z_][A-Za-z0-9_.]*)=)");
  std::istringstream in(read_text(script));
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) keys.push_back(m[1]);
  }
  return keys;
}

// Keys with neither an entry of baton's config nor a verl entry.
std::vector<std::string> without_fate(const std::vector<std::string>& keys) {
  const Config baton = Config::load(kConfigs / "ppo_trainer.yaml");
  std::vector<std::string> missing;
  for (const std::string& key : keys)
    if (!baton.has(key) && !find_verl_key(key)) missing.push_back(key);
  return missing;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

TEST(VerlKeys, EveryKeyOfVerlsConfigsIsBatonsOrHasAnEntry) {
  for (const char* file : {"ppo_trainer.yaml", "ppo_megatron_trainer.yaml"}) {
    // Without read tracking, unread_keys() is every leaf.
    const std::vector<std::string> keys = Config::load(kFixtures / file).unread_keys();
    ASSERT_GT(keys.size(), 500u) << file;  // the walk saw the whole file
    const std::vector<std::string> missing = without_fate(keys);
    EXPECT_TRUE(missing.empty()) << file << ": keys with no fate:\n" << joined(missing);
  }
}

TEST(VerlKeys, EveryKeyOfVerlsExampleScriptsIsBatonsOrHasAnEntry) {
  for (const char* script : {"run_qwen2-7b_math_megatron.sh", "run_qwen2-7b_seq_balance.sh",
                             "run_qwen2_5-3b_gsm8k_grpo_lora.sh"}) {
    const std::vector<std::string> keys = script_keys(kFixtures / script);
    ASSERT_GT(keys.size(), 30u) << script;
    const std::vector<std::string> missing = without_fate(keys);
    EXPECT_TRUE(missing.empty()) << script << ": keys with no fate:\n" << joined(missing);
  }
}

TEST(VerlKeys, PatternsMatchWholeSegments) {
  ASSERT_NE(find_verl_key("critic.profiler.tool_config.npu.level"), nullptr);
  EXPECT_STREQ(find_verl_key("critic.profiler.tool_config.npu.level")->pattern, "**.profiler.**");
  EXPECT_STREQ(find_verl_key("actor_rollout_ref.actor._target_")->pattern, "**._target_");
  EXPECT_STREQ(find_verl_key("critic.megatron.override_transformer_config.recompute_method")
                   ->pattern,
               "**.override_transformer_config.recompute_*");
  // First match decides: the mapped offload key before the FSDP catch-all.
  EXPECT_EQ(find_verl_key("actor_rollout_ref.actor.fsdp_config.param_offload")->fate,
            VerlFate::kMapped);
  EXPECT_EQ(find_verl_key("actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params")->fate,
            VerlFate::kIgnored);
  // `*` is one segment, a name is the whole segment.
  EXPECT_EQ(find_verl_key("actor_rollout_ref.rollout.names"), nullptr);
  EXPECT_EQ(find_verl_key("actor_rollout_ref.rollout.name.x"), nullptr);
  EXPECT_EQ(find_verl_key("data.custom_cls.path.deeper"), nullptr);
}

TEST(VerlKeys, FatesDoWhatTheySay) {
  Config config = Config::load(kConfigs / "ppo_trainer.yaml");
  std::vector<std::string> notes;
  // Ignored: accepted at any value, with a note.
  apply_verl_override(config, "actor_rollout_ref.rollout.name=sglang", notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_CONTAINS(notes[0], "actor_rollout_ref.rollout.name=sglang: ignored: baton's own engine");
  // Mapped: baton's key takes the value (with `+`, as Hydra adds a key).
  apply_verl_override(config, "actor_rollout_ref.actor.fsdp_config.param_offload=True", notes);
  EXPECT_TRUE(config.get<bool>("actor_rollout_ref.actor.megatron.param_offload"));
  apply_verl_override(config, "+actor_rollout_ref.actor.optim.clip_grad=0.5", notes);
  EXPECT_EQ(config.get<double>("actor_rollout_ref.actor.grad_clip"), 0.5);
  EXPECT_CONTAINS(notes.back(), "verl's name for actor_rollout_ref.actor.grad_clip");
  // Default only: the default (in any spelling) passes, another value names baton's way.
  apply_verl_override(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1", notes);
  apply_verl_override(config, "critic.optim.min_lr=0.0", notes);
  apply_verl_override(config, "transfer_queue.enable=False", notes);
  apply_verl_override(config, "actor_rollout_ref.model.custom_chat_template=~", notes);
  EXPECT_EQ(notes.size(), 7u);
  EXPECT_CONTAINS(error_of([&] {
                    apply_verl_override(
                        config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", notes);
                  }),
                  "sequence_parallel");
  EXPECT_CONTAINS(error_of([&] {
                    apply_verl_override(config,
                                        "+actor_rollout_ref.actor.megatron."
                                        "override_transformer_config.recompute_granularity=full",
                                        notes);
                  }),
                  "enable_gradient_checkpointing");
  // Refused at any value.
  EXPECT_CONTAINS(error_of([&] {
                    apply_verl_override(config,
                                        "actor_rollout_ref.model.lora.target_modules=[linear_qkv]",
                                        notes);
                  }),
                  "actor_rollout_ref.model.lora_rank");
  // A key in neither: the config's own error, naming the closest key.
  EXPECT_CONTAINS(error_of([&] {
                    apply_verl_override(config, "actor_rollout_ref.rollout.temperatur=0.5", notes);
                  }),
                  "actor_rollout_ref.rollout.temperature");
  EXPECT_EQ(notes.size(), 7u);  // refusals add no note
  // baton's own keys are applied as they are, even where verl has an entry pattern.
  apply_verl_override(config, "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", notes);
  EXPECT_EQ(config.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization"), 0.6);
}

TEST(VerlKeys, VerlsConfigNamesStandForBatonsConfig) {
  const char* argv[] = {"main_ppo", "--config-path=config",
                        "--config-name=ppo_megatron_trainer.yaml",
                        "actor_rollout_ref.rollout.mode=async", "data.train_batch_size=16"};
  const CommandLineConfig cl = config_from_command_line(5, argv, kConfigs / "ppo_trainer.yaml");
  EXPECT_EQ(cl.config.get<int64_t>("data.train_batch_size"), 16);
  ASSERT_EQ(cl.notes.size(), 2u);
  EXPECT_CONTAINS(cl.notes[0], "--config-name=ppo_megatron_trainer.yaml: verl's config");
  EXPECT_CONTAINS(cl.notes[1], "actor_rollout_ref.rollout.mode=async: ignored");
  // Hydra's spaced form; a name that is neither a file nor verl's.
  const char* spaced[] = {"main_ppo", "--config-path", kConfigs.c_str(), "--config-name",
                          "grpo_toy"};
  EXPECT_EQ(config_from_command_line(5, spaced).config.get<std::string>("algorithm.adv_estimator"),
            "grpo");
  const char* unknown[] = {"main_ppo", "--config-name=my_trainer"};
  EXPECT_CONTAINS(error_of([&] { config_from_command_line(2, unknown); }),
                  "--config-name=my_trainer: no such file");
}

TEST(VerlKeys, DocsTableIsTheTable) {
  const std::string docs = read_text(fs::path(BATON_SOURCE_DIR) / "docs" / "verl-keys.md");
  const std::string table = verl_keys_markdown();
  EXPECT_NE(docs.find(table), std::string::npos)
      << "docs/verl-keys.md does not hold the table of trainer/config/verl_keys.cpp; it is "
         "now:\n"
      << table;
}

// Settings verl's keys wire: the strategy note, packed fixed-size micro-batches.
TrainerSettings settings_with(const std::vector<std::string>& overrides) {
  Config config = Config::load(kConfigs / "ppo_trainer.yaml");
  config.apply_overrides({"actor_rollout_ref.model.path=models/m", "data.train_files=[t.jsonl]",
                          "trainer.n_gpus_per_node=2", "trainer.device=cpu",
                          "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                          "actor_rollout_ref.rollout.n=2",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                          "data.max_prompt_length=100", "data.max_response_length=28"});
  config.apply_overrides(overrides);
  return read_trainer_settings(config);
}

TEST(VerlKeys, FsdpStrategyRunsAsZeroOneDataParallelWithANote) {
  EXPECT_TRUE(settings_with({}).notes.empty());
  const TrainerSettings s = settings_with({"actor_rollout_ref.actor.strategy=fsdp2"});
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_CONTAINS(s.notes[0], "actor_rollout_ref.actor.strategy=fsdp2");
  EXPECT_CONTAINS(s.notes[0], "optimizer state sharded");
  EXPECT_TRUE(s.actor.optim.distributed);
  const TrainerSettings whole =
      settings_with({"actor_rollout_ref.actor.strategy=fsdp",
                     "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false"});
  EXPECT_CONTAINS(whole.notes.at(0), "use_distributed_optimizer is false");
  EXPECT_CONTAINS(error_of([] { settings_with({"actor_rollout_ref.actor.strategy=deepspeed"}); }),
                  "actor_rollout_ref.actor.strategy = 'deepspeed' is not one of: megatron, fsdp");
}

TEST(VerlKeys, RemovePaddingPacksFixedSizeMicroBatches) {
  const std::vector<std::string> micro = {
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3"};
  const TrainerSettings padded = settings_with(micro);
  EXPECT_EQ(padded.actor.update.max_token_len, 0);
  EXPECT_EQ(padded.actor.rollout.log_prob_max_token_len, 0);
  std::vector<std::string> rmpad = micro;
  rmpad.push_back("actor_rollout_ref.model.use_remove_padding=true");
  const TrainerSettings packed = settings_with(rmpad);
  EXPECT_EQ(packed.actor.update.max_token_len, 2 * 128);  // 2 rows of 100 + 28 tokens
  EXPECT_EQ(packed.actor.rollout.log_prob_max_token_len, 3 * 128);
  EXPECT_EQ(packed.actor.ref_log_prob_max_token_len, 0);  // its micro-batch size is null
  // use_dynamic_bsz keeps its own budget.
  rmpad.push_back("actor_rollout_ref.actor.use_dynamic_bsz=true");
  rmpad.push_back("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=999");
  EXPECT_EQ(settings_with(rmpad).actor.update.max_token_len, 999);
}

}  // namespace
}  // namespace baton::trainer
