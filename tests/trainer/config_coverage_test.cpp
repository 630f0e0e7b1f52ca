// Every key of configs/ppo_trainer.yaml is read by something: the trainer's
// settings (trainer/config/settings.h), which are checked as they are read. A
// key that is accepted and then ignored (issue 24 found six) fails here, named.
#include "trainer/config/settings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace baton::trainer {
namespace {

const std::filesystem::path kBase = std::filesystem::path(BATON_CONFIGS_DIR) / "ppo_trainer.yaml";

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += "\n  " + k;
  return out;
}

// The base config with every optional part switched on (a critic, a reward
// model, a resume path), so that every conditional read happens.
Config everything_on() {
  Config c = Config::load(kBase);
  c.apply_overrides(
      {"actor_rollout_ref.model.path=models/m", "data.train_files=[train.jsonl]",
       "data.val_files=[val.jsonl]", "trainer.n_gpus_per_node=2", "trainer.device=cpu",
       "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "algorithm.adv_estimator=gae",
       "reward_model.enable=true", "reward_model.model.path=models/rm",
       "trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_1",
       "custom_reward_function.path=my_reward.py"});
  return c;
}

TEST(ConfigCoverage, EveryKeyOfTheBaseConfigIsRead) {
  Config c = everything_on();
  c.track_reads();
  const TrainerSettings s = read_trainer_settings(c.resolved());
  EXPECT_TRUE(s.use_critic && s.use_rm);
  const std::vector<std::string> unread = c.unread_keys();
  EXPECT_TRUE(unread.empty()) << "keys of " << kBase << " that nothing reads:" << joined(unread);
}

// verl's custom_reward_function.path: a Python file, its function (name,
// else compute_score), reward_kwargs as JSON values, the pool's size.
TEST(ConfigCoverage, APythonRewardFileIsVerlsKeys) {
  Config c = everything_on();
  c.apply_overrides({"+custom_reward_function.reward_kwargs.bonus=2",
                     "+custom_reward_function.reward_kwargs.mode=strict",
                     "custom_reward_function.processes=3"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  ASSERT_TRUE(s.python_reward.has_value());
  EXPECT_EQ(s.python_reward->path, "my_reward.py");
  EXPECT_EQ(s.python_reward->function, "compute_score");
  EXPECT_EQ(s.python_reward->processes, 3);
  EXPECT_EQ(s.python_reward->kwargs, nlohmann::json({{"bonus", 2}, {"mode", "strict"}}));
  EXPECT_FALSE(s.custom_reward_fn.has_value()) << "name is the Python function's, not a C++ one";
  Config named = everything_on();
  named.apply_overrides({"custom_reward_function.name=score_it"});
  EXPECT_EQ(read_trainer_settings(named.resolved()).python_reward->function, "score_it");
  Config not_python = everything_on();
  not_python.apply_overrides({"custom_reward_function.path=reward.so"});
  try {
    read_trainer_settings(not_python.resolved());
    ADD_FAILURE() << "a .so reward path was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("baton runs Python reward files (.py)"),
              std::string::npos)
        << e.what();
  }
}

// custom_reward_function.path naming one of verl's own reward_score files:
// its built-in, no Python; another of verl's functions is refused, naming
// what baton maps.
TEST(ConfigCoverage, VerlsOwnRewardScoreFilesAreTheBuiltIns) {
  const auto with = [](const std::vector<std::string>& overrides) {
    Config c = everything_on();
    c.apply_overrides(overrides);
    return read_trainer_settings(c.resolved());
  };
  const std::string dir = "/opt/verl/verl/utils/reward_score/";
  for (const auto& [file, builtin] :
       std::vector<std::pair<std::string, std::string>>{{"gsm8k.py", "gsm8k"},
                                                        {"math_reward.py", "math"},
                                                        {"math.py", "math"},
                                                        {"math_dapo.py", "math_dapo"},
                                                        {"search_r1_like_qa_em.py", "exact_match"}}) {
    const TrainerSettings s = with({"custom_reward_function.path=" + dir + file});
    EXPECT_FALSE(s.python_reward.has_value()) << file;
    EXPECT_EQ(s.custom_reward_fn.value_or("(none)"), builtin) << file;
  }
  const TrainerSettings by_source = with({"custom_reward_function.path=" + dir + "__init__.py",
                                          "custom_reward_function.name=default_compute_score"});
  EXPECT_FALSE(by_source.python_reward.has_value());
  EXPECT_FALSE(by_source.custom_reward_fn.has_value()) << "each sample by its data source";
  // Another file named gsm8k.py is the user's own.
  EXPECT_TRUE(with({"custom_reward_function.path=rewards/gsm8k.py"}).python_reward.has_value());
  for (const auto& [overrides, part] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"custom_reward_function.path=" + dir + "prime_math/__init__.py"}, ""},
           {{"custom_reward_function.path=" + dir + "geo3k.py"}, "module 'geo3k'"},
           {{"custom_reward_function.path=" + dir + "gsm8k.py",
             "custom_reward_function.name=extract_solution"},
            "asked for extract_solution"},
           {{"custom_reward_function.path=" + dir + "gsm8k.py",
             "+custom_reward_function.reward_kwargs.method=flexible"},
            "reward_kwargs: not applied"}}) {
    if (part.empty()) {  // not a file of reward_score itself: the user's Python
      EXPECT_TRUE(with(overrides).python_reward.has_value());
      continue;
    }
    try {
      with(overrides);
      ADD_FAILURE() << "accepted " << overrides[0];
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("custom_reward_function."), std::string::npos)
          << e.what();
    }
  }
}

// trainer.logger: wandb, its python (trainer.logger_python) and verl's
// +trainer.wandb_proxy.
TEST(ConfigCoverage, TheWandbLoggerIsVerlsKeys) {
  Config c = everything_on();
  c.apply_overrides({"trainer.logger=[console,wandb]", "trainer.logger_python=/venv/bin/python",
                     "+trainer.wandb_proxy=http://proxy:3128"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  EXPECT_EQ(s.loggers, (std::vector<std::string>{"console", "wandb"}));
  EXPECT_EQ(s.logger_python, "/venv/bin/python");
  EXPECT_EQ(s.wandb_proxy, "http://proxy:3128");
  EXPECT_EQ(read_trainer_settings(everything_on().resolved()).wandb_proxy, "");
}

TEST(ConfigCoverage, AnAddedKeyThatNothingReadsIsFound) {
  Config c = everything_on();
  c.apply_overrides({"+actor_rollout_ref.actor.unused_knob=3", "+extra.section.flag=true"});
  c.track_reads();
  read_trainer_settings(c.resolved());
  EXPECT_EQ(c.unread_keys(), (std::vector<std::string>{"actor_rollout_ref.actor.unused_knob",
                                                       "extra.section.flag"}));
}

TEST(ConfigCoverage, ReadsThroughASectionCountWithTheirFullPath) {
  Config c = Config::from_yaml("a:\n  b: 1\n  c: {d: 2, e: 3}\nf: [1, 2]\n");
  c.track_reads();
  EXPECT_EQ(c.unread_keys(), (std::vector<std::string>{"a.b", "a.c.d", "a.c.e", "f"}));
  const Config a = c.section("a");
  EXPECT_EQ(a.get<int64_t>("c.d"), 2);
  EXPECT_EQ(c.get<std::vector<int64_t>>("f").size(), 2u);
  EXPECT_EQ(c.unread_keys(), (std::vector<std::string>{"a.b", "a.c.e"}));
  EXPECT_EQ(a.unread_keys(), (std::vector<std::string>{"b", "c.e"}));
}

TEST(ConfigCoverage, TheSettingsCarryWhatTheConfigSays) {
  Config c = everything_on();
  c.apply_overrides({"actor_rollout_ref.actor.megatron.overlap_grad_reduce=false",
                     "actor_rollout_ref.actor.megatron.grad_reduce_bucket_bytes=1024",
                     "actor_rollout_ref.actor.loss_scale_factor=512",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
                     "data.max_response_length=33", "actor_rollout_ref.rollout.response_length=21",
                     "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
                     "actor_rollout_ref.actor.policy_loss.dro_beta=0.5",
                     "actor_rollout_ref.actor.policy_loss.tau_neg=1.2",
                     "trainer.collective_timeout_s=7",
                     "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                     "actor_rollout_ref.actor.megatron.sequence_parallel=true",
                     "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                     "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false",
                     "actor_rollout_ref.model.use_fused_kernels=false",
                     "reward_model.megatron.sequence_parallel=true"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  // Recomputation: the critic follows the actor unless set; the reference
  // copies the actor's ModelOptions in its worker.
  EXPECT_TRUE(s.actor.model.recompute_activations);
  EXPECT_TRUE(s.critic.model.recompute_activations);
  EXPECT_FALSE(s.rm.model.recompute_activations);
  EXPECT_TRUE(s.actor.model.sequence_parallel);
  EXPECT_FALSE(s.critic.model.sequence_parallel);
  EXPECT_TRUE(s.rm.model.sequence_parallel);
  EXPECT_EQ(s.actor.model.ep, 2);
  EXPECT_EQ(s.critic.model.ep, 1);
  EXPECT_FALSE(s.actor.model.fused_lm_head);
  EXPECT_TRUE(read_trainer_settings(everything_on().resolved()).actor.model.fused_lm_head);
  EXPECT_EQ(s.actor.model.collective_timeout_ms, 7000);
  EXPECT_EQ(s.critic.model.collective_timeout_ms, 7000);
  EXPECT_EQ(s.rm.model.collective_timeout_ms, 7000);
  EXPECT_FALSE(s.actor.optim.overlap_grad_reduce);
  EXPECT_EQ(s.actor.optim.bucket_bytes, 1024);
  EXPECT_EQ(s.actor.update.loss_scale_factor, 512.0);
  EXPECT_EQ(s.actor.ref_log_prob_micro_batch_size, 3);
  EXPECT_EQ(s.actor.rollout.response_length, 21);
  EXPECT_EQ(s.response_length, 21);
  EXPECT_EQ(s.actor.policy.dro_beta, 0.5);
  EXPECT_EQ(s.actor.policy.tau_neg, 1.2);
  // data.train_files: one file as a string, as the YAML's comment says.
  Config one = Config::load(kBase);
  one.apply_overrides({"actor_rollout_ref.model.path=models/m", "data.train_files=one.jsonl"});
  EXPECT_EQ(read_trainer_settings(one.resolved()).train_files,
            (std::vector<std::string>{"one.jsonl"}));
  // And they reach the workers: the JSON they are spawned with keeps them.
  const auto back = workers::ActorRolloutRefOptions::from_json(s.actor.to_json());
  EXPECT_TRUE(back == s.actor);
  EXPECT_TRUE(workers::CriticOptions::from_json(s.critic.to_json()) == s.critic);
  EXPECT_TRUE(workers::RewardModelOptions::from_json(s.rm.to_json()) == s.rm);
}

TEST(ConfigCoverage, LoraKeysReachTheActorsModelOptions) {
  // Off by default; target_modules null is all-linear, and one name is a string.
  const TrainerSettings off = read_trainer_settings(everything_on().resolved());
  EXPECT_FALSE(off.actor.model.lora.enabled());
  EXPECT_EQ(off.actor.model.lora.alpha, 16.0);
  EXPECT_EQ(off.actor.model.lora.targets, (std::vector<std::string>{"all-linear"}));
  Config one = everything_on();
  one.apply_override("actor_rollout_ref.model.target_modules=q_proj");
  EXPECT_EQ(read_trainer_settings(one.resolved()).actor.model.lora.targets,
            (std::vector<std::string>{"q_proj"}));
  // A list of HF module names; only the actor's model is adapted.
  Config c = everything_on();
  c.apply_overrides({"actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=32",
                     "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  EXPECT_EQ(s.actor.model.lora.rank, 8);
  EXPECT_EQ(s.actor.model.lora.alpha, 32.0);
  EXPECT_EQ(s.actor.model.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_FALSE(s.critic.model.lora.enabled());
  // The workers are spawned with them.
  const auto back = workers::ActorRolloutRefOptions::from_json(s.actor.to_json());
  EXPECT_TRUE(back.model.lora == s.actor.model.lora);
  EXPECT_TRUE(back == s.actor);
}

TEST(ConfigCoverage, SamplingKeysReadInTheEnginesTerms) {
  Config c = everything_on();
  c.apply_overrides({"actor_rollout_ref.rollout.temperature=0.7",
                     "actor_rollout_ref.rollout.top_k=5", "actor_rollout_ref.rollout.top_p=0.9",
                     "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.val_kwargs.n=3",
                     "actor_rollout_ref.rollout.val_kwargs.temperature=0.5"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  EXPECT_EQ(s.sampling.temperature, 0.7);
  EXPECT_EQ(s.sampling.top_k, 5);
  EXPECT_EQ(s.sampling.top_p, 0.9);
  EXPECT_EQ(s.sampling.n, 2);
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.sampling.max_new_tokens, s.response_length);
  // verl's val_kwargs: do_sample false is greedy whatever the temperature;
  // top_k -1 is no truncation (the engine's 0).
  EXPECT_EQ(s.val_sampling.temperature, 0.0);
  EXPECT_EQ(s.val_sampling.top_k, 0);
  EXPECT_EQ(s.val_sampling.n, 3);
  EXPECT_EQ(s.logprob_temperature, 0.7);
  // Greedy rollouts; the log-probs keep the configured temperature (verl's).
  c.apply_override("actor_rollout_ref.rollout.do_sample=false");
  const TrainerSettings greedy = read_trainer_settings(c.resolved());
  EXPECT_EQ(greedy.sampling.temperature, 0.0);
  EXPECT_EQ(greedy.logprob_temperature, 0.7);
}

TEST(ConfigCoverage, MultiTurnKeysReachTheRolloutAndThePromptsShowTheTools) {
  const TrainerSettings off = read_trainer_settings(everything_on().resolved());
  EXPECT_FALSE(off.actor.rollout.multi_turn.enable);
  EXPECT_TRUE(off.dataset.chat_template_variables.is_null());
  const std::filesystem::path tools =
      std::filesystem::temp_directory_path() /
      ("baton_config_tools_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(tools) << "tools:\n  - tool_schema: {type: function, function: {name: "
                          "calculator, description: Exact arithmetic.}}\n";
  Config c = everything_on();
  c.apply_overrides({"actor_rollout_ref.rollout.multi_turn.enable=true",
                     "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + tools.string(),
                     "actor_rollout_ref.rollout.multi_turn.format=llama3_json",
                     "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                     "actor_rollout_ref.rollout.multi_turn.max_user_turns=2",
                     "actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml",
                     "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left"});
  const TrainerSettings s = read_trainer_settings(c.resolved());
  const workers::MultiTurnRolloutOptions& mt = s.actor.rollout.multi_turn;
  EXPECT_TRUE(mt.enable);
  EXPECT_EQ(mt.tool_config_path, tools.string());
  EXPECT_EQ(mt.format, "llama3_json");
  EXPECT_EQ(mt.max_assistant_turns, 3);
  EXPECT_EQ(mt.max_user_turns, 2);
  EXPECT_EQ(mt.interaction_config_path, "i.yaml");
  EXPECT_EQ(mt.max_parallel_calls, 1);
  EXPECT_EQ(mt.max_tool_response_length, 256);
  EXPECT_EQ(mt.tool_response_truncate_side, "left");
  EXPECT_EQ(mt.tokenizer_path, "models/m");
  // The prompts' chat template gets the file's schemas as `tools`.
  EXPECT_EQ(s.dataset.chat_template_variables["tools"][0]["function"]["description"],
            "Exact arithmetic.");
  EXPECT_TRUE(workers::ActorRolloutRefOptions::from_json(s.actor.to_json()) == s.actor);

  // Enabled without a tool or interaction config: refused. An interaction
  // config alone will do.
  auto refused = [&](std::vector<std::string> overrides, const std::string& needle) {
    Config bad = everything_on();
    bad.apply_overrides(overrides);
    try {
      read_trainer_settings(bad.resolved());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({"actor_rollout_ref.rollout.multi_turn.enable=true"},
          "multi_turn.enable needs actor_rollout_ref.rollout.multi_turn.tool_config_path");
  Config interactions_only = everything_on();
  interactions_only.apply_overrides(
      {"actor_rollout_ref.rollout.multi_turn.enable=true",
       "actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml"});
  EXPECT_NO_THROW(read_trainer_settings(interactions_only.resolved()));
  refused({"actor_rollout_ref.rollout.multi_turn.enable=true",
           "actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml",
           "actor_rollout_ref.rollout.multi_turn.max_user_turns=-1"},
          "multi_turn.max_user_turns");
  refused({"actor_rollout_ref.rollout.multi_turn.format=json"}, "multi_turn.format");
  // Fully-async training runs the agent loop in its rollout workers, but not
  // with partial rollouts.
  Config async = everything_on();
  async.apply_overrides({"actor_rollout_ref.rollout.multi_turn.enable=true",
                         "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + tools.string(),
                         "async_training.enable=true"});
  EXPECT_NO_THROW(read_trainer_settings(async.resolved()));
  refused({"actor_rollout_ref.rollout.multi_turn.enable=true",
           "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + tools.string(),
           "async_training.enable=true", "async_training.partial_rollout=true"},
          "multi_turn.enable with async_training.partial_rollout");
  std::filesystem::remove(tools);
}

TEST(ConfigCoverage, DroWithoutItsBetaFailsBeforeAnyWorker) {
  Config c = everything_on();
  c.apply_override("actor_rollout_ref.actor.policy_loss.loss_mode=dro");
  try {
    read_trainer_settings(c.resolved());
    FAIL() << "dro without dro_beta was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("policy_loss.dro_beta"), std::string::npos) << e.what();
  }
}

TEST(ConfigCoverage, TheScheduleLengthComesFromTheSteps) {
  Config c = everything_on();
  c.apply_overrides(
      {"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.25", "trainer.total_epochs=2"});
  TrainerSettings s = read_trainer_settings(c.resolved());
  set_total_steps(s, 10);
  EXPECT_EQ(s.total_steps, 20);
  // 4 prompts per step in mini-batches of 2: 2 optimizer steps per step.
  EXPECT_EQ(s.actor.optim.total_steps, 40);
  EXPECT_EQ(s.actor.optim.warmup_steps, 10);
}

}  // namespace
}  // namespace baton::trainer
