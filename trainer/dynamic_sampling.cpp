#include "trainer/dynamic_sampling.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/errors.h"

namespace baton::trainer {

std::vector<double> filter_metric_values(const DataProto& batch, const std::string& metric) {
  if (metric == "seq_reward" || metric == "seq_final_reward") {
    const std::string key = metric == "seq_reward" ? "token_level_scores" : "token_level_rewards";
    if (!batch.has_tensor(key))
      throw Error("algorithm.filter_groups.metric = " + metric + " sums the tensor '" + key +
                  "', which the batch does not have");
    const at::Tensor sums = batch.tensor(key).sum(-1).to(at::kCPU).to(at::kDouble).contiguous();
    return std::vector<double>(sums.data_ptr<double>(), sums.data_ptr<double>() + sums.numel());
  }
  const std::string column = metric == "score" ? "acc" : metric;
  if (!batch.has_column(column)) {
    std::string keys;
    for (const auto& k : batch.column_keys()) keys += (keys.empty() ? "" : ", ") + k;
    throw Error("algorithm.filter_groups.metric = " + metric + " reads the column '" + column +
                "', which the scored batch does not have (its columns: " + keys +
                "; seq_reward and seq_final_reward read the token-level rewards)");
  }
  std::vector<double> values;
  for (const Value& v : batch.column(column)) values.push_back(v.as_float());
  return values;
}

std::vector<int64_t> rows_of_varied_groups(const List& uids, const std::vector<double>& values) {
  if (uids.size() != values.size())
    throw InvalidArgument("rows_of_varied_groups: " + std::to_string(uids.size()) + " uids but " +
                          std::to_string(values.size()) + " values");
  // Per uid: its first value and whether another differs (or it has one row).
  struct Group {
    double first = 0;
    int64_t rows = 0;
    bool varied = false;
  };
  std::map<std::string, Group> groups;
  for (size_t i = 0; i < uids.size(); ++i) {
    Group& g = groups[uids[i].as_string()];
    if (g.rows++ == 0)
      g.first = values[i];
    else if (values[i] != g.first)
      g.varied = true;
  }
  std::vector<int64_t> rows;
  for (size_t i = 0; i < uids.size(); ++i) {
    const Group& g = groups.at(uids[i].as_string());
    if (g.varied || g.rows == 1) rows.push_back(static_cast<int64_t>(i));
  }
  return rows;
}

DynamicSampler::DynamicSampler(int64_t train_batch, FilterGroupsOptions options)
    : train_batch_(train_batch), options_(std::move(options)) {
  if (train_batch_ < 1)
    throw InvalidArgument("DynamicSampler: train_batch = " + std::to_string(train_batch_) +
                          " must be >= 1");
  if (options_.metric.empty())
    throw InvalidArgument("DynamicSampler: algorithm.filter_groups.metric is empty");
}

void DynamicSampler::add(DataProto batch, at::Tensor reward_baselines) {
  ++gen_batches_;
  const std::vector<int64_t> rows =
      rows_of_varied_groups(batch.column("uid"), filter_metric_values(batch, options_.metric));
  DataProto kept = batch.select_rows(rows);
  std::erase_if(kept.meta(), [](const auto& kv) { return kv.first == "reward_errors"; });
  std::set<std::string> uids;
  for (const Value& v : kept.column("uid")) uids.insert(v.as_string());
  kept_groups_ += static_cast<int64_t>(uids.size());
  if (reward_baselines.defined())
    kept_baselines_.push_back(reward_baselines.index_select(0, at::tensor(rows, at::kLong)));
  kept_.push_back(std::move(kept));
  const int64_t max = options_.max_num_gen_batches;
  if (!full() && max > 0 && gen_batches_ >= max)
    throw Error("algorithm.filter_groups: after algorithm.filter_groups.max_num_gen_batches = " +
                std::to_string(max) + " generation batches, " + std::to_string(kept_groups_) +
                " groups have a varied " + options_.metric +
                ", fewer than data.train_batch_size = " + std::to_string(train_batch_) +
                " (the prompts may be too hard or too easy for the model; "
                "max_num_gen_batches = 0 generates until there are enough)");
}

std::pair<DataProto, at::Tensor> DynamicSampler::take() {
  if (!full())
    throw InternalError("DynamicSampler::take: " + std::to_string(kept_groups_) + " of " +
                        std::to_string(train_batch_) + " groups kept");
  DataProto all = DataProto::concat(kept_);
  at::Tensor baselines = kept_baselines_.empty() ? at::Tensor() : at::cat(kept_baselines_, 0);
  // The rows of the first train_batch uids, in order of first appearance.
  std::set<std::string> first;
  std::vector<int64_t> rows;
  const List& uids = all.column("uid");
  for (size_t i = 0; i < uids.size(); ++i) {
    const std::string& uid = uids[i].as_string();
    if (!first.count(uid)) {
      if (static_cast<int64_t>(first.size()) == train_batch_) continue;
      first.insert(uid);
    }
    rows.push_back(static_cast<int64_t>(i));
  }
  kept_.clear();
  kept_baselines_.clear();
  kept_groups_ = 0;
  if (baselines.defined()) baselines = baselines.index_select(0, at::tensor(rows, at::kLong));
  return {all.select_rows(rows), baselines};
}

}  // namespace baton::trainer
