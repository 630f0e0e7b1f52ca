// The checks of read_trainer_settings (trainer/config/config_validation.h and
// the key reads of settings.cpp): every problem named, with its keys.
#include "trainer/config/config_validation.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "trainer/config/settings.h"
#include "trainer/step_profiler.h"

namespace baton::trainer {
namespace {

const std::filesystem::path kBase = std::filesystem::path(BATON_CONFIGS_DIR) / "ppo_trainer.yaml";

// The base config with `overrides`, read; the base names no model or files,
// which a run needs, so those come first.
TrainerSettings settings_with(const std::vector<std::string>& overrides) {
  Config config = Config::load(kBase);
  config.apply_overrides({"actor_rollout_ref.model.path=models/m", "data.train_files=[t.jsonl]"});
  config.apply_overrides(overrides);
  return read_trainer_settings(config);
}

// The validation error of settings_with(overrides) ("" if valid).
std::string problems_with(const std::vector<std::string>& overrides) {
  try {
    settings_with(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// A small CPU layout that is valid: 4 workers, actor TP2, rollout TP2.
const std::vector<std::string> kSmall = {
    "trainer.n_gpus_per_node=4",
    "trainer.device=cpu",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"};

std::vector<std::string> small_with(std::vector<std::string> more) {
  std::vector<std::string> all = kSmall;
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

TEST(ConfigValidation, BaseAndSmallLayoutsAreValid) {
  EXPECT_EQ(problems_with({}), "");
  EXPECT_EQ(problems_with(kSmall), "");
  // 8 sequences per mini-batch over actor DP 2 = 4 per rank, 2 per micro-batch.
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"})),
            "");
}

TEST(ConfigValidation, WorldMustDivideEveryLayout) {
  const std::string actor = problems_with(
      small_with({"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3"}));
  EXPECT_CONTAINS(actor,
                  "the actor layout does not fit the workers: trainer.nnodes x "
                  "trainer.n_gpus_per_node = 4 is not divisible by "
                  "actor_rollout_ref.actor.megatron.tensor_model_parallel_size x "
                  "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = 2 x 3 = 6");
  // The reference policy is a copy in the actor's processes: its layout must be the actor's.
  EXPECT_CONTAINS(
      problems_with(small_with({"actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1"})),
      "actor_rollout_ref.ref.megatron.tensor_model_parallel_size = 1 differs from "
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size = 2; the reference policy "
      "runs in the actor's layout");
  EXPECT_CONTAINS(
      problems_with(small_with({"actor_rollout_ref.rollout.tensor_model_parallel_size=3"})),
      "the rollout layout does not fit the workers: trainer.nnodes x "
      "trainer.n_gpus_per_node = 4 is not divisible by "
      "actor_rollout_ref.rollout.tensor_model_parallel_size = 3");
  EXPECT_CONTAINS(problems_with(small_with({"critic.megatron.pipeline_model_parallel_size=8"})),
                  "the critic layout does not fit");
  // One node of 6 fits TP 2 x PP 3.
  EXPECT_EQ(problems_with(
                {"trainer.nnodes=1", "trainer.n_gpus_per_node=6",
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=6",
                 "critic.megatron.tensor_model_parallel_size=3", "data.train_batch_size=12",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=6", "critic.ppo_mini_batch_size=12"}),
            "");
  // Two nodes of 3 (node agents) have the same 6 workers, but a TP group of 2
  // or 6 would span both nodes; TP 3 fits.
  const std::string two_nodes = problems_with(
      {"trainer.nnodes=2", "trainer.n_gpus_per_node=3", "trainer.cluster_listen=0.0.0.0:29400",
       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
       "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3",
       "actor_rollout_ref.rollout.tensor_model_parallel_size=6",
       "critic.megatron.tensor_model_parallel_size=3", "data.train_batch_size=12",
       "actor_rollout_ref.actor.ppo_mini_batch_size=6", "critic.ppo_mini_batch_size=12"});
  EXPECT_CONTAINS(two_nodes,
                  "actor_rollout_ref.actor.megatron.tensor_model_parallel_size = 2 does not divide "
                  "trainer.n_gpus_per_node = 3: the actor's tensor-parallel groups would span two "
                  "nodes");
  EXPECT_CONTAINS(two_nodes,
                  "actor_rollout_ref.rollout.tensor_model_parallel_size = 6 does not divide "
                  "trainer.n_gpus_per_node = 3");
  EXPECT_EQ(two_nodes.find("critic.megatron.tensor_model_parallel_size = 3 does not"),
            std::string::npos)
      << two_nodes;
  // Without agents, more than one node is refused saying what to set.
  EXPECT_CONTAINS(problems_with({"trainer.nnodes=2", "trainer.n_gpus_per_node=3"}),
                  "trainer.nnodes = 2 needs node agents: set trainer.cluster_listen");
}

TEST(ConfigValidation, CriticLayoutIsIgnoredWithoutACritic) {
  const std::vector<std::string> bad_critic = {"critic.megatron.tensor_model_parallel_size=3"};
  EXPECT_NE(problems_with(small_with(bad_critic)), "");
  std::vector<std::string> grpo = small_with(bad_critic);
  grpo.push_back("algorithm.adv_estimator=grpo");
  EXPECT_EQ(problems_with(grpo), "");
  EXPECT_CONTAINS(problems_with(small_with({"critic.enable=false"})),
                  "algorithm.adv_estimator = gae needs a critic, but critic.enable = false");
}

TEST(ConfigValidation, MiniBatchMustSplitTheBatch) {
  EXPECT_CONTAINS(problems_with(small_with({"data.train_batch_size=10"})),
                  "data.train_batch_size = 10 is not divisible by "
                  "actor_rollout_ref.actor.ppo_mini_batch_size = 4");
  // A mini-batch larger than the batch is capped at the batch, not an error.
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.ppo_mini_batch_size=64",
                                      "critic.ppo_mini_batch_size=8"})),
            "");
}

TEST(ConfigValidation, MiniBatchSequencesMustSplitOverDataParallelRanks) {
  // 4 workers, actor TP 1: DP 4; 1 prompt x n 2 = 2 sequences per mini-batch.
  const std::string message =
      problems_with(small_with({"actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=1"}));
  EXPECT_CONTAINS(message,
                  "actor_rollout_ref.actor.ppo_mini_batch_size x "
                  "actor_rollout_ref.rollout.n = 1 x 2 = 2 sequences per mini-batch do "
                  "not split evenly over the actor's 4 data-parallel ranks");
}

TEST(ConfigValidation, MicroBatchMustDivideTheLocalMiniBatch) {
  // Mini-batch 4 prompts x n 2 = 8 sequences over actor DP 2 = 4 per rank.
  EXPECT_CONTAINS(
      problems_with(small_with({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"})),
      "the actor's 4 sequences per mini-batch and rank "
      "(actor_rollout_ref.actor.ppo_mini_batch_size "
      "x rollout.n / DP = 8 / 2) are not divisible by "
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 3");
  // The critic (DP 4 with TP 1): 8 / 4 = 2 per rank.
  EXPECT_CONTAINS(problems_with(small_with({"critic.ppo_micro_batch_size_per_gpu=4"})),
                  "the critic's 2 sequences per mini-batch and rank");
}

TEST(ConfigValidation, RolloutSequencesMustSplitOverRolloutRanks) {
  // 4 workers, rollout TP 1: 4 rollout ranks; 2 prompts x n 1 = 2 sequences.
  EXPECT_CONTAINS(
      problems_with({"trainer.n_gpus_per_node=4",
                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                     "critic.megatron.tensor_model_parallel_size=4", "data.train_batch_size=2",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2"}),
      "data.train_batch_size x actor_rollout_ref.rollout.n = 2 x 1 = 2 sequences do not split "
      "evenly over the rollout's 4 data-parallel ranks");
}

TEST(ConfigValidation, CountsMustBePositive) {
  const std::string message = problems_with(
      small_with({"actor_rollout_ref.rollout.n=0", "data.train_batch_size=0", "trainer.nnodes=0",
                  "actor_rollout_ref.actor.ppo_epochs=0", "trainer.total_training_steps=-3"}));
  EXPECT_CONTAINS(message, "actor_rollout_ref.rollout.n = 0 must be >= 1");
  EXPECT_CONTAINS(message, "data.train_batch_size = 0 must be >= 1");
  EXPECT_CONTAINS(message, "trainer.nnodes = 0 must be >= 1");
  EXPECT_CONTAINS(message, "actor_rollout_ref.actor.ppo_epochs = 0 must be >= 1");
  EXPECT_CONTAINS(message, "trainer.total_training_steps = -3 must be >= 1 (or null)");
}

TEST(ConfigValidation, ChoicesAreChecked) {
  const std::string message = problems_with(small_with(
      {"data.truncation=centre", "actor_rollout_ref.actor.loss_agg_mode=token_mean",
       "algorithm.kl_penalty=full", "trainer.logger=[console,mlflow]", "trainer.resume_mode=always",
       "actor_rollout_ref.actor.clip_ratio_c=1.0", "actor_rollout_ref.rollout.top_p=0"}));
  EXPECT_CONTAINS(message, "data.truncation = 'centre' is not one of: error, left, right, middle");
  EXPECT_CONTAINS(message,
                  "actor_rollout_ref.actor.loss_agg_mode = 'token_mean' is not one of: "
                  "token-mean, token-sum");
  EXPECT_CONTAINS(message, "algorithm.kl_penalty = 'full' is not one of");
  EXPECT_CONTAINS(message,
                  "trainer.logger has 'mlflow'; loggers baton has: console, file, "
                  "tensorboard, wandb");
  EXPECT_EQ(problems_with(small_with({"trainer.logger=[console,tensorboard]"})), "");
  EXPECT_EQ(problems_with(small_with({"trainer.logger=[console,wandb]"})), "");
  EXPECT_CONTAINS(message,
                  "trainer.resume_mode = 'always' is not one of: auto, disable, resume_path");
  EXPECT_CONTAINS(message, "actor_rollout_ref.actor.clip_ratio_c = 1 must be > 1");
  EXPECT_CONTAINS(message, "actor_rollout_ref.rollout.top_p = 0 must be in (0, 1]");
  EXPECT_CONTAINS(problems_with(small_with({"trainer.resume_mode=resume_path"})),
                  "trainer.resume_mode = resume_path needs trainer.resume_from_path");
  EXPECT_EQ(problems_with(small_with({"trainer.resume_mode=resume_path",
                                      "trainer.resume_from_path=ckpt/global_step_3"})),
            "");
  EXPECT_CONTAINS(
      problems_with(small_with({"algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"})),
      "algorithm.kl_ctrl.horizon must be > 0");
}

// The KV cache's budget (verl's keys): gpu_memory_utilization is a fraction
// in (0, 1]; it and free_cache_engine reach the workers' options, with
// verl's defaults (0.5, true).
TEST(ConfigValidation, GpuMemoryUtilizationIsAFractionAndTheCacheKeysReachTheWorkers) {
  const std::string key = "actor_rollout_ref.rollout.gpu_memory_utilization";
  EXPECT_CONTAINS(problems_with(small_with({key + "=0"})),
                  key + " = 0 must be in (0, 1] (the fraction of a GPU's memory");
  EXPECT_CONTAINS(problems_with(small_with({key + "=1.5"})), key + " = 1.5 must be in (0, 1]");
  EXPECT_CONTAINS(problems_with(small_with({key + "=-0.2"})), key + " = -0.2 must be in (0, 1]");
  EXPECT_EQ(problems_with(small_with({key + "=1.0"})), "");

  const TrainerSettings defaults = settings_with({});
  EXPECT_EQ(defaults.actor.rollout.gpu_memory_utilization, 0.5);
  EXPECT_TRUE(defaults.actor.rollout.free_cache_engine);
  EXPECT_EQ(defaults.actor.rollout.cache_bytes, 64 << 20);
  const TrainerSettings set =
      settings_with({key + "=0.85", "actor_rollout_ref.rollout.free_cache_engine=false"});
  EXPECT_EQ(set.actor.rollout.gpu_memory_utilization, 0.85);
  EXPECT_FALSE(set.actor.rollout.free_cache_engine);
}

// The device decode loop's keys: device_decode_steps (>= 0, 8 by default)
// and verl's enforce_eager (false: CUDA graphs) reach the workers' options.
TEST(ConfigValidation, DeviceDecodeKeysReachTheWorkers) {
  const std::string key = "actor_rollout_ref.rollout.device_decode_steps";
  EXPECT_CONTAINS(problems_with(small_with({key + "=-1"})), key);
  EXPECT_EQ(problems_with(small_with({key + "=0"})), "");
  const TrainerSettings defaults = settings_with({});
  EXPECT_EQ(defaults.actor.rollout.device_decode_steps, 8);
  EXPECT_TRUE(defaults.actor.rollout.cuda_graphs);
  const TrainerSettings set =
      settings_with({key + "=2", "actor_rollout_ref.rollout.enforce_eager=true"});
  EXPECT_EQ(set.actor.rollout.device_decode_steps, 2);
  EXPECT_FALSE(set.actor.rollout.cuda_graphs);
}

// Parameter dtypes left null follow the device: bfloat16 on GPUs (verl's
// default there; the rollout and the reference follow the actor), float32
// on the CPU.
TEST(ConfigValidation, NullDtypesAreBf16OnGpusAndFp32OnTheCpu) {
  const TrainerSettings gpu = settings_with({"trainer.device=cuda"});
  EXPECT_EQ(gpu.actor.model.dtype, "bfloat16");
  EXPECT_EQ(gpu.actor.ref_dtype, "bfloat16");
  EXPECT_EQ(gpu.rollout_dtype, "bfloat16");
  EXPECT_EQ(gpu.critic.model.dtype, "bfloat16");
  const TrainerSettings cpu = settings_with({"trainer.device=cpu"});
  EXPECT_EQ(cpu.actor.model.dtype, "float32");
  EXPECT_EQ(cpu.rollout_dtype, "float32");
  EXPECT_EQ(cpu.critic.model.dtype, "float32");
  EXPECT_EQ(settings_with({"actor_rollout_ref.actor.megatron.dtype=float32", "trainer.device=cuda"})
                .actor.model.dtype,
            "float32");
}

TEST(ConfigValidation, ParameterDtypesAreCheckedAndTheRolloutFollowsTheActor) {
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.megatron.dtype=bfloat16"})), "");
  const std::string message = problems_with(
      small_with({"actor_rollout_ref.actor.megatron.dtype=float16", "critic.megatron.dtype=bf16"}));
  EXPECT_CONTAINS(message,
                  "actor_rollout_ref.actor.megatron.dtype = 'float16' is not one of: float32, "
                  "bfloat16");
  // The reference and the rollout follow the actor's key unless set.
  EXPECT_CONTAINS(message, "actor_rollout_ref.ref.megatron.dtype = 'float16' is not one of");
  EXPECT_CONTAINS(problems_with(small_with({"actor_rollout_ref.rollout.dtype=bfloat16"})),
                  "actor_rollout_ref.rollout.dtype = 'bfloat16' differs from "
                  "actor_rollout_ref.actor.megatron.dtype = 'float32'");
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.megatron.dtype=bfloat16",
                                      "actor_rollout_ref.ref.megatron.dtype=float32"})),
            "");
}

TEST(ConfigValidation, LoraKeysAreCheckedAndRefuseSequenceParallelism) {
  const std::string m = "actor_rollout_ref.model.";
  EXPECT_EQ(problems_with(small_with({m + "lora_rank=8", m + "target_modules=[q_proj,down_proj]"})),
            "");
  const std::string ranges = problems_with(small_with({m + "lora_rank=-1", m + "lora_alpha=0"}));
  EXPECT_CONTAINS(ranges, "actor_rollout_ref.model.lora_rank = -1 must be >= 0");
  EXPECT_CONTAINS(ranges, "actor_rollout_ref.model.lora_alpha = 0 must be > 0");
  // The engine's own check names the unknown module and the known ones.
  const std::string unknown =
      problems_with(small_with({m + "lora_rank=8", m + "target_modules=[q_proj,qkv_proj]"}));
  EXPECT_CONTAINS(unknown, "actor_rollout_ref.model.target_modules: LoRA target \"qkv_proj\"");
  EXPECT_CONTAINS(unknown, "all-linear");
  EXPECT_CONTAINS(problems_with(small_with({m + "lora_rank=8", m + "target_modules=[]"})),
                  "actor_rollout_ref.model.target_modules names no module");
  // Without adapters the targets are not read for a check.
  EXPECT_EQ(problems_with(small_with({m + "target_modules=[qkv_proj]"})), "");
  const std::string sp = problems_with(
      small_with({m + "lora_rank=8", "actor_rollout_ref.actor.megatron.sequence_parallel=true"}));
  EXPECT_CONTAINS(sp, "actor_rollout_ref.model.lora_rank = 8");
  EXPECT_CONTAINS(sp, "actor_rollout_ref.actor.megatron.sequence_parallel = true");
}

// verl's lora_adapter_path: a PEFT adapter directory, whose r, lora_alpha and
// target modules the actor takes (LoRA on even with lora_rank 0, as verl's).
TEST(ConfigValidation, LoraAdapterPathIsAPeftAdapterThatSuppliesTheLoraKeys) {
  const std::string m = "actor_rollout_ref.model.";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("baton_peft_config_" + std::to_string(::getpid()));
  baton::remove_tree(dir);
  std::filesystem::create_directories(dir / "empty");
  auto write_config = [&](const std::string& extra) {
    std::ofstream(dir / "adapter_config.json")
        << R"({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 32,)"
        << R"( "target_modules": ["v_proj", "q_proj"], "bias": "none")" << extra << "}";
  };
  write_config("");
  Config config = Config::load(kBase);
  config.apply_overrides(
      {m + "path=models/m", "data.train_files=[t.jsonl]", m + "lora_adapter_path=" + dir.string()});
  const TrainerSettings s = read_trainer_settings(config);
  EXPECT_EQ(s.actor.model.lora_adapter_path, dir.string());
  EXPECT_EQ(s.actor.model.lora.rank, 8);
  EXPECT_EQ(s.actor.model.lora.alpha, 32.0);
  EXPECT_EQ(s.actor.model.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_FALSE(s.critic.model.lora.enabled());
  // The adapter's values win over the keys'.
  EXPECT_EQ(problems_with(small_with({m + "lora_rank=4", m + "lora_adapter_path=" + dir.string()})),
            "");
  // Not an adapter directory, or not plain LoRA: named.
  EXPECT_CONTAINS(problems_with({m + "lora_adapter_path=" + (dir / "none").string()}),
                  m + "lora_adapter_path = '" + (dir / "none").string() + "' is not a directory");
  EXPECT_CONTAINS(
      problems_with({m + "lora_adapter_path=" + (dir / "empty").string()}),
      m + "lora_adapter_path = '" + (dir / "empty").string() + "' has no adapter_config.json");
  write_config(R"(, "use_dora": true)");
  const std::string dora = problems_with({m + "lora_adapter_path=" + dir.string()});
  EXPECT_CONTAINS(dora, m + "lora_adapter_path: " + (dir / "adapter_config.json").string());
  EXPECT_CONTAINS(dora, "\"use_dora\": true");
  // The adapter turns LoRA on: sequence parallelism is refused beside it.
  write_config("");
  EXPECT_CONTAINS(
      problems_with(small_with({m + "lora_adapter_path=" + dir.string(),
                                "actor_rollout_ref.actor.megatron.sequence_parallel=true"})),
      "actor_rollout_ref.model.lora_rank = 8 cannot be used with");
  baton::remove_tree(dir);
}

TEST(ConfigValidation, ExpertParallelismDividesDpAndNeedsThePlainOptimizer) {
  const std::string a = "actor_rollout_ref.actor.megatron.";
  EXPECT_EQ(problems_with(small_with(
                {a + "expert_model_parallel_size=2", a + "use_distributed_optimizer=false"})),
            "");
  const std::string three = problems_with(
      small_with({a + "expert_model_parallel_size=3", a + "use_distributed_optimizer=false"}));
  EXPECT_CONTAINS(three,
                  a + "expert_model_parallel_size = 3 does not divide the data-parallel size 2");
  EXPECT_CONTAINS(problems_with(small_with({a + "expert_model_parallel_size=2"})),
                  a + "use_distributed_optimizer = false");
  EXPECT_CONTAINS(problems_with(small_with({a + "expert_model_parallel_size=0"})),
                  a + "expert_model_parallel_size = 0 must be >= 1");
}

TEST(ConfigValidation, OptimizerSettingsAreInRange) {
  const std::string message =
      problems_with(small_with({"actor_rollout_ref.actor.optim.betas=[0.9]", "critic.optim.lr=-1",
                                "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=1.5",
                                "critic.optim.lr_scheduler_type=linear"}));
  EXPECT_CONTAINS(message, "actor_rollout_ref.actor.optim.betas must be two numbers in [0, 1)");
  EXPECT_CONTAINS(message, "critic.optim.lr must be >= 0");
  EXPECT_CONTAINS(message,
                  "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio = 1.5 must be in [0, 1]");
  EXPECT_CONTAINS(message,
                  "critic.optim.lr_scheduler_type = 'linear' is not one of: constant, cosine");
}

TEST(ConfigValidation, DynamicBatchBudgetsMustHoldTheLongestSequence) {
  // The base allows prompts of 512 and responses of 512 tokens.
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.use_dynamic_bsz=true",
                                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024"})),
            "");
  const std::string p =
      problems_with(small_with({"actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"}));
  EXPECT_CONTAINS(p,
                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 1000 cannot hold a "
                  "sequence of 1024 tokens");
  // The log-prob budgets follow the actor's (interpolated), so they are named too.
  EXPECT_CONTAINS(p, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu = 1000");
  EXPECT_CONTAINS(p, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu = 1000");
  // Off, the budget is only checked to be positive.
  EXPECT_EQ(problems_with(small_with({"actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"})),
            "");
  EXPECT_CONTAINS(problems_with(small_with({"critic.ppo_max_token_len_per_gpu=0",
                                            "algorithm.adv_estimator=gae", "critic.enable=true"})),
                  "critic.ppo_max_token_len_per_gpu = 0 must be >= 1");
}

// DAPO's keys: algorithm.filter_groups with data.gen_batch_size, and
// reward_model.reward_manager = dapo with its overlong buffer, each refused
// where it cannot work, naming the keys.
TEST(ConfigValidation, DynamicSamplingAndTheDapoManagerKeysAreCheckedAndRead) {
  const std::vector<std::string> dapo = {"algorithm.filter_groups.enable=true",
                                         "algorithm.filter_groups.metric=acc",
                                         "algorithm.filter_groups.max_num_gen_batches=5",
                                         "data.gen_batch_size=16",
                                         "reward_model.reward_manager=dapo",
                                         "reward_model.overlong_buffer.enable=true",
                                         "reward_model.overlong_buffer.len=64",
                                         "reward_model.overlong_buffer.penalty_factor=0.5",
                                         "reward_model.overlong_buffer.log=true"};
  const TrainerSettings s = settings_with(small_with(dapo));
  EXPECT_TRUE(s.filter_groups.enable);
  EXPECT_EQ(s.filter_groups.metric, "acc");
  EXPECT_EQ(s.filter_groups.max_num_gen_batches, 5);
  EXPECT_EQ(s.gen_batch, 16);
  EXPECT_EQ(s.train_batch, 8);
  EXPECT_EQ(s.reward_manager, rewards::RewardManagerKind::kDapo);
  EXPECT_TRUE(s.overlong_buffer.enable && s.overlong_buffer.log);
  EXPECT_EQ(s.overlong_buffer.len, 64);
  EXPECT_EQ(s.overlong_buffer.penalty_factor, 0.5);
  EXPECT_EQ(s.overlong_buffer.max_resp_len, 512) << "data.max_response_length, as verl's DAPO";
  // gen_batch_size follows train_batch_size unless set.
  EXPECT_EQ(settings_with(small_with({"data.train_batch_size=4"})).gen_batch, 4);

  EXPECT_CONTAINS(problems_with(small_with({"data.gen_batch_size=16"})),
                  "data.gen_batch_size = 16 differs from data.train_batch_size = 8: only "
                  "algorithm.filter_groups.enable = true");
  EXPECT_CONTAINS(
      problems_with(small_with({"data.gen_batch_size=0", "algorithm.filter_groups.enable=true",
                                "algorithm.filter_groups.metric=acc"})),
      "data.gen_batch_size = 0 must be >= 1");
  EXPECT_CONTAINS(problems_with(small_with({"algorithm.filter_groups.enable=true"})),
                  "algorithm.filter_groups.metric is null");
  EXPECT_CONTAINS(problems_with(small_with({"algorithm.filter_groups.enable=true",
                                            "algorithm.filter_groups.metric=accuracy"})),
                  "algorithm.filter_groups.metric = 'accuracy' is not one of: acc, score, "
                  "seq_reward, seq_final_reward");
  EXPECT_CONTAINS(problems_with(small_with({"algorithm.filter_groups.enable=true",
                                            "algorithm.filter_groups.metric=acc",
                                            "async_training.enable=true"})),
                  "algorithm.filter_groups.enable = true with async_training.enable = true");
  const std::vector<std::string> rm = {"reward_model.enable=true",
                                       "reward_model.model.path=models/rm",
                                       "algorithm.filter_groups.enable=true"};
  std::vector<std::string> rm_acc = rm, rm_seq = rm;
  rm_acc.push_back("algorithm.filter_groups.metric=score");
  rm_seq.push_back("algorithm.filter_groups.metric=seq_reward");
  EXPECT_CONTAINS(problems_with(small_with(rm_acc)),
                  "algorithm.filter_groups.metric = score is the rule reward's");
  EXPECT_EQ(problems_with(small_with(rm_seq)), "");

  EXPECT_CONTAINS(problems_with(small_with({"reward_model.reward_manager=prime"})),
                  "reward_model.reward_manager = 'prime' is not one of: naive, dapo");
  const std::string naive = problems_with(small_with(
      {"reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"}));
  EXPECT_CONTAINS(naive,
                  "reward_model.overlong_buffer.enable = true needs "
                  "reward_model.reward_manager = dapo");
  EXPECT_CONTAINS(problems_with(small_with({"reward_model.reward_manager=dapo",
                                            "reward_model.overlong_buffer.enable=true"})),
                  "reward_model.overlong_buffer.len = 0 must be >= 1");
  EXPECT_CONTAINS(problems_with(small_with({"reward_model.reward_manager=dapo",
                                            "reward_model.overlong_buffer.enable=true",
                                            "reward_model.overlong_buffer.len=600"})),
                  "reward_model.overlong_buffer.len = 600 is more than data.max_response_length "
                  "= 512");
  std::vector<std::string> rm_overlong = {
      "reward_model.enable=true", "reward_model.model.path=models/rm",
      "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true",
      "reward_model.overlong_buffer.len=4"};
  EXPECT_CONTAINS(problems_with(small_with(rm_overlong)),
                  "reward_model.overlong_buffer.enable = true with reward_model.enable = true");
}

TEST(ConfigValidation, RolloutCorrectionKeysAreVerlsAndBadValuesNamed) {
  const std::string k = "algorithm.rollout_correction.";
  // Off by default; on, the old-log-prob pass always runs.
  const std::string one_mini_batch = "actor_rollout_ref.actor.ppo_mini_batch_size=8";
  const TrainerSettings off = settings_with(small_with({one_mini_batch}));
  EXPECT_FALSE(off.rollout_correction.enabled());
  EXPECT_TRUE(off.old_log_prob_from_update);
  const TrainerSettings on = settings_with(
      small_with({one_mini_batch, k + "rollout_is=sequence", k + "rollout_is_threshold=0.5_5.0",
                  k + "rollout_is_batch_normalize=true", k + "rollout_rs=token_k1,seq_max_k3",
                  k + "rollout_rs_threshold='0.8_1.2,3.0'"}));
  const algos::RolloutCorrectionOptions& o = on.rollout_correction;
  ASSERT_TRUE(o.rollout_is.has_value());
  EXPECT_EQ(*o.rollout_is, algos::RolloutIsLevel::Sequence);
  EXPECT_DOUBLE_EQ(o.is_threshold.upper, 5.0);
  EXPECT_DOUBLE_EQ(o.is_threshold.lower.value_or(0), 0.5);
  EXPECT_TRUE(o.batch_normalize);
  ASSERT_EQ(o.rejection.size(), 2u);
  EXPECT_EQ(o.rejection[1].option, "seq_max_k3");
  EXPECT_DOUBLE_EQ(o.rejection[1].upper, 3.0);
  EXPECT_FALSE(on.old_log_prob_from_update);
  // A number as rollout_rs_threshold, as verl's YAML writes it.
  EXPECT_EQ(
      settings_with(small_with({k + "rollout_rs=seq_mean_k3", k + "rollout_rs_threshold=0.01"}))
          .rollout_correction.rejection.at(0)
          .upper,
      0.01);

  EXPECT_CONTAINS(problems_with({k + "bypass_mode=true"}), k + "bypass_mode = true");
  EXPECT_CONTAINS(problems_with({k + "loss_type=ppo"}), k + "loss_type = 'ppo' is not one of");
  EXPECT_CONTAINS(problems_with({k + "rollout_is=geometric"}),
                  k + "rollout_is = 'geometric' is not one of: token, sequence");
  EXPECT_CONTAINS(problems_with({k + "rollout_is=token", k + "rollout_is_threshold=5_0.5"}),
                  k + "rollout_is_threshold = '5_0.5'");
  EXPECT_CONTAINS(problems_with({k + "rollout_is=token", k + "rollout_is_threshold=null"}),
                  k + "rollout_is_threshold is null with rollout_is = token");
  EXPECT_CONTAINS(problems_with({k + "rollout_rs=geometric", k + "rollout_rs_threshold=2"}),
                  k + "rollout_rs option 'geometric' is not one of: token_k1");
  EXPECT_CONTAINS(problems_with({k + "rollout_rs=token_k2"}),
                  k + "rollout_rs_threshold must be given with rollout_rs = 'token_k2'");
  // Both IS sources of the async trainer at once.
  EXPECT_CONTAINS(problems_with({"async_training.enable=true", k + "rollout_is=token"}),
                  "algorithm.rollout_correction.rollout_is with async_training.tis_cap = 2");
  EXPECT_EQ(problems_with({"async_training.enable=true", "async_training.tis_cap=null",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                           k + "rollout_is=token"}),
            "");
}

TEST(ConfigValidation, OptimalTokenBaselinesNeedSumPiSquaredAndUnfusedLogits) {
  for (const char* estimator : {"optimal_token_baseline", "tir_optimal_token_baseline"}) {
    const std::string adv = std::string("algorithm.adv_estimator=") + estimator;
    EXPECT_CONTAINS(problems_with(small_with({adv})),
                    std::string("actor_rollout_ref.model.use_fused_kernels = true, but "
                                "algorithm.adv_estimator = ") +
                        estimator);
    const TrainerSettings s =
        settings_with(small_with({adv, "actor_rollout_ref.model.use_fused_kernels=false",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=8"}));
    EXPECT_TRUE(s.calculate_sum_pi_squared);
    EXPECT_FALSE(s.old_log_prob_from_update);  // the pass gives Σπ²
  }
  EXPECT_CONTAINS(problems_with({"actor_rollout_ref.actor.calculate_sum_pi_squared=true"}),
                  "actor_rollout_ref.actor.calculate_sum_pi_squared = true needs");
  EXPECT_FALSE(settings_with({}).calculate_sum_pi_squared);
}

TEST(ConfigValidation, NullWhereAValueIsNeededIsNamed) {
  EXPECT_CONTAINS(problems_with(small_with({"data.train_batch_size=null"})),
                  "config key 'data.train_batch_size' is null");
}

TEST(ConfigValidation, EveryProblemIsListed) {
  const std::string message =
      problems_with(small_with({"data.truncation=centre", "actor_rollout_ref.rollout.n=0"}));
  EXPECT_CONTAINS(message, "the config cannot be used:\n  - ");
  EXPECT_CONTAINS(message, "data.truncation");
  EXPECT_CONTAINS(message, "actor_rollout_ref.rollout.n");
}

TEST(ConfigValidation, ProfiledStepsAreStepNumbersAndTheTracesGoUnderTheRunDirectory) {
  EXPECT_EQ(problems_with({"global_profiler.steps=[2,3]"}), "");
  EXPECT_EQ(problems_with({"global_profiler.steps=[]"}), "");
  EXPECT_CONTAINS(problems_with({"global_profiler.steps=[2,0]"}),
                  "global_profiler.steps has 0; steps count from 1");
  EXPECT_CONTAINS(problems_with({"global_profiler.steps=[two]"}),
                  "global_profiler.steps must be null or a list of step numbers, like [2, 3]");
  EXPECT_CONTAINS(problems_with({"global_profiler.save_path=[a,b]"}),
                  "global_profiler.save_path must be null or a directory");

  Config config = Config::load(kBase);
  config.apply_overrides({"trainer.default_local_dir=runs/x", "global_profiler.steps=[3,1]"});
  std::vector<std::string> problems;
  ProfilerSettings s = read_profiler_settings(config.resolved(), problems);
  EXPECT_EQ(s.steps, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(s.save_path, "runs/x/profile");
  config.apply_override("global_profiler.save_path=/tmp/traces");
  EXPECT_EQ(read_profiler_settings(config.resolved(), problems).save_path, "/tmp/traces");
  // Off by default.
  EXPECT_TRUE(read_profiler_settings(Config::load(kBase).resolved(), problems).steps.empty());
  EXPECT_TRUE(problems.empty());
}

}  // namespace
}  // namespace baton::trainer
