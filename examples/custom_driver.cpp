// The RL loop written out by hand: no trainer, just workers, a custom reward
// worker and a custom advantage estimator, all in this file.
//
//   build/examples/custom_driver [toy_dir] [steps]
//
// toy_dir is a toy task directory (build/examples/toy_task --out toy, with its
// SFT base in toy/sft/model from build/examples/sft); default "toy".
#include <ATen/ATen.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "data/prompt_dataset.h"
#include "data/prompt_loader.h"
#include "text/tokenizer/tokenizer.h"
#include "workers/rewards/reward_manager.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/worker_api.h"

using baton::DataProto;

// A reward worker of our own: the registry's GSM8K score, minus a small
// penalty per response token past the eighth. Its batch is split over the
// workers (DP_COMPUTE_PROTO), each decodes and scores its share.
class ShortAnswerReward : public baton::Worker {
 public:
  explicit ShortAnswerReward(const baton::List& args)
      : tokenizer_(baton::data::Tokenizer::load(args.at(0).as_string())), manager_(tokenizer_) {}

  DataProto score(const DataProto& batch) {
    DataProto out = manager_.with_token_level_scores(batch);
    const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
    const at::Tensor extra = (mask.sum(1, true) - 8).clamp_min(0) * 0.05;
    const at::Tensor last = mask.cumsum(1).eq(mask.sum(1, true)) * mask;  // last valid token
    out.set_tensor("token_level_scores", out.tensor("token_level_scores") - extra * last);
    return out.select({"token_level_scores"});
  }
  static void register_methods(baton::MethodTable<ShortAnswerReward>& t) {
    t.def("score", &ShortAnswerReward::score,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
  }

 private:
  baton::data::Tokenizer tokenizer_;
  baton::rewards::RewardManager manager_;
};
BATON_WORKER(ShortAnswerReward);

// A custom advantage estimator: each sample's score minus its group's mean,
// divided by the group's range (max - min) rather than GRPO's deviation, and
// spread over the response tokens. A group whose samples all score the same
// gets 0.
baton::algos::AdvantageResult range_normalised(const baton::algos::AdvantageInputs& in,
                                               const baton::algos::AdvantageOptions&) {
  const at::Tensor scores = in.token_level_rewards.sum(1);
  at::Tensor adv = at::zeros_like(scores);
  std::map<std::string, std::vector<int64_t>> groups;
  for (size_t i = 0; i < in.uids.size(); ++i) groups[in.uids[i]].push_back(static_cast<int64_t>(i));
  for (const auto& [uid, rows] : groups) {
    const at::Tensor g = scores.index_select(0, at::tensor(rows, at::kLong));
    const double range = (g.max() - g.min()).item<double>();
    if (range > 0) adv.index_put_({at::tensor(rows, at::kLong)}, (g - g.mean()) / range);
  }
  const at::Tensor per_token = adv.unsqueeze(1) * in.response_mask;
  return {per_token, per_token};
}
// Registered in every process of this executable, before main() (this loop
// computes advantages in the driver; a loss would run in the workers).
BATON_ADVANTAGE_ESTIMATOR("range_normalised", range_normalised);

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process this runs the worker and never returns
  const std::string toy = argc > 1 ? argv[1] : "toy";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 10;

  // Data: the toy task's prompts, 16 per step.
  auto tokenizer = baton::data::Tokenizer::load(toy + "/sft/model");
  auto dataset = baton::data::PromptDataset::load(
      {toy + "/data/train.jsonl"}, tokenizer,
      baton::data::PromptDatasetOptions().set_max_prompt_length(8));
  baton::data::PromptLoader loader(dataset, baton::data::PromptLoaderOptions().set_batch_size(16));

  // Workers: the actor (with its rollout) on 2 processes, the reward worker on 2 more.
  baton::workers::ActorRolloutRefOptions opt;
  opt.model.path = toy + "/sft/model";
  opt.optim.lr = 1e-4;
  opt.update.mini_batch_size = 64;
  opt.update.micro_batch_size = 32;
  opt.rollout.response_length = 8;
  baton::ResourcePool actor_pool = baton::ResourcePool::cpu(2), reward_pool = baton::ResourcePool::cpu(2);
  auto actor = baton::WorkerGroup::spawn(baton::workers::actor_rollout_ref_worker_class(),
                                         actor_pool, {opt.to_json()});
  auto reward = baton::WorkerGroup::spawn("ShortAnswerReward", reward_pool, {toy + "/sft/model"});
  actor.call("init_model", {}).get();

  for (int step = 1; step <= steps; ++step) {
    // The loader's prompts as the RL batch (input_ids, attention_mask, the
    // reward's columns, uid = the dataset row: the groups).
    DataProto prompts = baton::workers::prompt_batch_proto(loader.next());
    const int64_t n = prompts.size();
    DataProto gen = prompts.select({"input_ids", "attention_mask"});
    gen.set_meta("n", baton::Value(int64_t{8}));
    // One seed per prompt, never repeated across steps: the samples are
    // reproducible and differ between prompts, samples and steps.
    gen.set_tensor("request_seed", at::arange(n, at::kLong) + static_cast<int64_t>(step) * n);
    gen.set_meta("pad_token_id", baton::Value(static_cast<int64_t>(dataset.pad_id())));

    // Generate 8 answers per prompt; each answer keeps its prompt's columns.
    DataProto batch = prompts.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                          .repeat(8)
                          .union_with(actor.call("generate_sequences", {gen}).get().as<DataProto>());

    // Reward (our worker), old log-probs (the actor), advantages (our estimator), update.
    batch.set_tensor("token_level_scores",
                     reward.call("score", {batch}).get().as<DataProto>().tensor("token_level_scores"));
    batch.set_tensor("old_log_probs", actor.call("compute_log_prob", {batch})
                                          .get().as<DataProto>().tensor("old_log_probs"));
    baton::algos::AdvantageInputs in;
    in.token_level_rewards = batch.tensor("token_level_scores");
    in.response_mask = batch.tensor("response_mask").to(at::kFloat);
    for (const auto& u : batch.column("uid")) in.uids.push_back(u.as_string());
    batch.set_tensor("advantages",
                     baton::algos::compute_advantage("range_normalised", in).advantages);
    DataProto m = actor.call("update_actor", {batch}).get().as<DataProto>();

    const double score = in.token_level_rewards.sum(1).mean().item<double>();
    const double correct = (in.token_level_rewards.sum(1) > 0.5).to(at::kFloat).mean().item<double>();
    double grad_norm = 0;  // the update's metrics: lists by name, one entry per mini-batch
    for (const auto& [key, values] : m.meta_value("metrics")->as_dict())
      if (key == "actor/grad_norm") grad_norm = values.as_list().at(0).as_float();
    std::printf("step %2d  score %+.3f  correct %5.1f %%  grad norm %.3f\n", step, score,
                100 * correct, grad_norm);
  }
  return 0;
}
