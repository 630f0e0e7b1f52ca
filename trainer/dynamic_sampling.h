// DAPO's dynamic sampling (verl's algorithm.filter_groups, as its DAPO
// trainer runs it): a group (the n responses to one prompt, rows sharing a
// uid) whose metric is the same for every response (zero standard deviation:
// all right or all wrong) has zero advantage under GRPO and teaches nothing,
// so it is dropped; the step generates batch after batch until
// data.train_batch_size prompts' groups are kept, and trains on exactly that
// many.
//
// Example (the fit loop, trainer/ppo_trainer.cpp):
//   DynamicSampler sampler(s.train_batch, s.filter_groups);
//   do {
//     sampler.add(generate_and_score());  // throws past max_num_gen_batches
//   } while (!sampler.full());
//   auto [batch, baselines] = sampler.take();  // train_batch groups
//   m["train/num_gen_batches"] = sampler.gen_batches();
//
// Not thread-safe: one step's loop drives a sampler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/data_proto.h"

namespace baton::trainer {

// algorithm.filter_groups.
struct FilterGroupsOptions {
  bool enable = false;
  // The per-row value whose spread within a group decides (filter_metric_values).
  std::string metric;
  // Generation batches per step at most; <= 0: no limit (verl's).
  int64_t max_num_gen_batches = 0;
};

// Each row's value of `metric` in a scored batch: seq_reward is the sum of
// the row's token_level_scores, seq_final_reward of its token_level_rewards
// (the scores less a KL penalty in the reward); score reads the column "acc"
// (verl's "score" is what a reward function returned before the overlong
// penalty, which baton's reward manager reports as acc); any other metric is
// the column of that name (acc, overlong_reward, ...). Throws baton::Error
// naming the metric and the batch's columns when the batch has no such
// tensor or column.
std::vector<double> filter_metric_values(const DataProto& batch, const std::string& metric);

// The rows of the groups whose `values` are not all equal (a nonzero
// standard deviation), and of groups of one row, in row order. Rows are
// grouped by `uids`, wherever they lie.
std::vector<int64_t> rows_of_varied_groups(const List& uids, const std::vector<double>& values);

class DynamicSampler {
 public:
  // `train_batch`: the groups a step trains on (data.train_batch_size).
  // Throws baton::InvalidArgument for train_batch < 1 or an empty metric.
  DynamicSampler(int64_t train_batch, FilterGroupsOptions options);

  // One generation batch, scored (its "uid" column and what the metric
  // reads): keeps the rows of its varied groups (rows_of_varied_groups), and
  // the same rows of `reward_baselines` (one value per row; may be undefined).
  // The batch's meta "reward_errors" (a per-batch count, already reported) is
  // dropped so that batches concatenate. Throws baton::Error naming
  // algorithm.filter_groups.max_num_gen_batches when this batch was the last
  // one allowed and fewer than train_batch groups are kept.
  void add(DataProto batch, at::Tensor reward_baselines = {});

  // Whether train_batch groups are kept.
  bool full() const { return kept_groups_ >= train_batch_; }
  int64_t gen_batches() const { return gen_batches_; }
  int64_t kept_groups() const { return kept_groups_; }

  // The rows of the first train_batch groups kept, in the order they were
  // kept, and their baselines (undefined when none were given).
  // REQUIRES: full(). The sampler is empty afterwards.
  std::pair<DataProto, at::Tensor> take();

 private:
  int64_t train_batch_;
  FilterGroupsOptions options_;
  int64_t gen_batches_ = 0;
  int64_t kept_groups_ = 0;
  std::vector<DataProto> kept_;
  std::vector<at::Tensor> kept_baselines_;
};

}  // namespace baton::trainer
