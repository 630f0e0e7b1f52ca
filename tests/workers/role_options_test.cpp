// The role options' JSON: every field travels both ways, and a text that is
// missing a key, has an unknown one or a value of the wrong type is refused
// with the key's path (issue 24: overlap_grad_reduce and the bucket size were
// dropped on the way to the workers).
#include "workers/roles/role_options.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "base/errors.h"

namespace baton::workers {
namespace {

// Every field away from its default (a field left at its default would not
// show a field the JSON drops).
ModelOptions model() {
  ModelOptions m;
  m.path = "models/x";
  m.value_model = true;
  m.tp = 2;
  m.pp = 3;
  m.vocab_divisible_by = 64;
  m.seed = 7;
  m.dtype = "bfloat16";
  m.sequence_parallel = true;
  m.recompute_activations = true;
  m.ep = 2;
  m.fused_lm_head = true;
  m.lora = engine::LoraOptions{.rank = 8, .alpha = 32, .targets = {"q_proj"}, .seed = 9};
  m.lora_adapter_path = "adapters/a";
  m.collective_timeout_ms = 1500;
  return m;
}

OptimOptions optim() {
  OptimOptions o;
  o.lr = 3e-5;
  o.weight_decay = 0.1;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.warmup_steps = 5;
  o.scheduler = "cosine";
  o.min_lr_ratio = 0.1;
  o.total_steps = 99;
  o.grad_clip = 0.5;
  o.distributed = false;
  o.overlap_grad_reduce = false;
  o.bucket_bytes = 12345;
  return o;
}

UpdateOptions update() {
  UpdateOptions u;
  u.mini_batch_size = 16;
  u.micro_batch_size = 4;
  u.epochs = 2;
  u.shuffle = true;
  u.loss_agg_mode = "seq-mean-token-sum";
  u.seed = 11;
  return u;
}

ActorRolloutRefOptions actor() {
  ActorRolloutRefOptions o;
  o.model = model();
  o.optim = optim();
  o.update = update();
  PolicyOptions& p = o.policy;
  p.loss_mode = "gspo";
  p.clip_ratio = 0.3;
  p.clip_ratio_low = 0.25;
  p.clip_ratio_high = 0.28;
  p.clip_ratio_c = 4;
  p.clip_cov_ratio = 1e-3;
  p.clip_cov_lb = 2;
  p.clip_cov_ub = 6;
  p.kl_cov_ratio = 3e-4;
  p.ppo_kl_coef = 0.2;
  p.entropy_coeff = 0.01;
  p.use_kl_loss = true;
  p.kl_loss_coef = 0.05;
  p.kl_loss_type = "k3";
  RolloutOptions& r = o.rollout;
  r.tp = 2;
  r.response_length = 17;
  r.max_batch = 5;
  r.cache_bytes = 1 << 20;
  r.gpu_memory_utilization = 0.7;
  r.free_cache_engine = false;
  r.packed_cpu_steps = false;
  r.device_decode_steps = 3;
  r.cuda_graphs = false;
  r.multi_turn = {.enable = true,
                  .tool_config_path = "tools.yaml",
                  .interaction_config_path = "interaction.yaml",
                  .tokenizer_path = "models/t",
                  .format = "llama3_json",
                  .max_assistant_turns = 4,
                  .max_user_turns = 5,
                  .max_parallel_calls = 2,
                  .max_tool_response_length = 100,
                  .tool_response_truncate_side = "left"};
  r.log_prob_micro_batch_size = 3;
  o.actor = false;
  o.ref = true;
  o.ref_dtype = "bfloat16";
  return o;
}

std::string error_of(const std::string& text) {
  try {
    ActorRolloutRefOptions::from_json(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RoleOptions, EveryActorFieldSurvivesTheJson) {
  const ActorRolloutRefOptions o = actor();
  ASSERT_FALSE(o == ActorRolloutRefOptions{});
  const ActorRolloutRefOptions back = ActorRolloutRefOptions::from_json(o.to_json());
  EXPECT_TRUE(back == o) << o.to_json() << "\nread back as\n" << back.to_json();
  EXPECT_FALSE(back.optim.overlap_grad_reduce);
  EXPECT_EQ(back.optim.bucket_bytes, 12345);
}

TEST(RoleOptions, EveryCriticAndRewardModelFieldSurvivesTheJson) {
  CriticOptions c;
  c.model = model();
  c.optim = optim();
  c.update = update();
  c.cliprange_value = 0.3;
  c.forward_micro_batch_size = 3;
  EXPECT_TRUE(CriticOptions::from_json(c.to_json()) == c) << c.to_json();
  RewardModelOptions r;
  r.model = model();
  r.micro_batch_size = 2;
  EXPECT_TRUE(RewardModelOptions::from_json(r.to_json()) == r) << r.to_json();
}

TEST(RoleOptions, AMissingKeyIsNamedWithItsPath) {
  nlohmann::json j = nlohmann::json::parse(actor().to_json());
  j["optim"].erase("bucket_bytes");
  EXPECT_NE(error_of(j.dump()).find("ActorRolloutRefOptions.optim.bucket_bytes: missing"),
            std::string::npos)
      << error_of(j.dump());
}

TEST(RoleOptions, AnUnknownKeyIsNamedWithItsPath) {
  nlohmann::json j = nlohmann::json::parse(actor().to_json());
  j["rollout"]["temprature"] = 0.7;
  EXPECT_NE(error_of(j.dump()).find("ActorRolloutRefOptions.rollout.temprature"), std::string::npos)
      << error_of(j.dump());
}

TEST(RoleOptions, AWrongTypeOrMalformedTextIsNamed) {
  nlohmann::json j = nlohmann::json::parse(actor().to_json());
  j["update"]["shuffle"] = "yes";
  EXPECT_NE(error_of(j.dump()).find("ActorRolloutRefOptions.update.shuffle"), std::string::npos)
      << error_of(j.dump());
  j = nlohmann::json::parse(actor().to_json());
  j["policy"] = 3;
  EXPECT_NE(error_of(j.dump()).find("ActorRolloutRefOptions.policy: expected an object"),
            std::string::npos)
      << error_of(j.dump());
  EXPECT_NE(error_of("{\"model\": ").find("malformed JSON"), std::string::npos);
}

}  // namespace
}  // namespace baton::workers
