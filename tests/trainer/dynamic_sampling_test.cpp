// DAPO's dynamic sampling (trainer/dynamic_sampling.h) on hand-made scored
// batches: which groups are kept, what each metric reads, the accumulation
// over generation batches, the trim to train_batch groups, the limit.
#include "trainer/dynamic_sampling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/errors.h"

namespace baton::trainer {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

List strings(const std::vector<std::string>& v) {
  List out;
  for (const auto& s : v) out.emplace_back(s);
  return out;
}

List numbers(const std::vector<double>& v) {
  List out;
  for (double x : v) out.emplace_back(x);
  return out;
}

// A scored generation batch: one row per uid entry, its acc, a row index
// tensor (to see which rows were kept) and meta as the trainer sets it.
DataProto scored(const std::vector<std::string>& uids, const std::vector<double>& acc,
                 int64_t first_row = 0) {
  const int64_t n = static_cast<int64_t>(uids.size());
  DataProto d({{"row", at::arange(first_row, first_row + n, at::kLong)}},
              {{"uid", strings(uids)}, {"acc", numbers(acc)}});
  d.set_meta("global_steps", Value(int64_t{1}));
  d.set_meta("reward_errors", Value(first_row));  // differs from batch to batch
  return d;
}

std::vector<int64_t> rows_of(const DataProto& d) {
  const at::Tensor t = d.tensor("row").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST(DynamicSampling, GroupsWhoseValuesDifferAndSingleRowsAreKept) {
  // a varies, b is all 1, c has one row, d is all 0.25, e varies across the
  // batch (its rows are not together).
  const List uids = strings({"a", "a", "b", "b", "c", "d", "e", "d", "e"});
  const std::vector<double> values = {1, 0, 1, 1, 0.5, 0.25, 0, 0.25, -1};
  EXPECT_EQ(rows_of_varied_groups(uids, values), (std::vector<int64_t>{0, 1, 4, 6, 8}));
  EXPECT_TRUE(rows_of_varied_groups(strings({"a", "a"}), {0.0, 0.0}).empty());
  EXPECT_THROW(rows_of_varied_groups(uids, {1.0}), InvalidArgument);
}

TEST(DynamicSampling, EachMetricReadsItsValues) {
  DataProto d = scored({"a", "a"}, {1.0, 0.0});
  d.set_tensor("token_level_scores", at::tensor({0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 2.0f}).view({2, 3}));
  d.set_tensor("token_level_rewards",
               at::tensor({0.0f, 0.25f, 0.0f, 0.0f, 0.0f, 1.5f}).view({2, 3}));
  EXPECT_EQ(filter_metric_values(d, "acc"), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(filter_metric_values(d, "score"), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(filter_metric_values(d, "seq_reward"), (std::vector<double>{0.5, 2.0}));
  EXPECT_EQ(filter_metric_values(d, "seq_final_reward"), (std::vector<double>{0.25, 1.5}));
  try {
    filter_metric_values(d, "overlong_reward");
    ADD_FAILURE() << "a missing column was read";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "algorithm.filter_groups.metric = overlong_reward");
    EXPECT_CONTAINS(e.what(), "its columns: acc, uid");
  }
  d.pop({"token_level_rewards"});
  EXPECT_THROW(filter_metric_values(d, "seq_final_reward"), Error);
}

TEST(DynamicSampling, KeptGroupsAccumulateOverBatchesAndAreTrimmedToTheTrainBatch) {
  DynamicSampler sampler(3, {.enable = true, .metric = "acc", .max_num_gen_batches = 0});
  // Batch 1 (rows 0-5): only g1 varies. Batch 2 (rows 6-11): h1 and h3 vary.
  // Batch 3 (rows 12-17): all three vary; one is needed.
  sampler.add(scored({"g1", "g1", "g2", "g2", "g3", "g3"}, {1, 0, 0, 0, 1, 1}, 0),
              at::arange(0, 6, at::kFloat));
  EXPECT_EQ(sampler.kept_groups(), 1);
  EXPECT_FALSE(sampler.full());
  sampler.add(scored({"h1", "h1", "h2", "h2", "h3", "h3"}, {0, 1, 1, 1, 1, 0}, 6),
              at::arange(6, 12, at::kFloat));
  EXPECT_TRUE(sampler.full());
  EXPECT_EQ(sampler.kept_groups(), 3);
  EXPECT_EQ(sampler.gen_batches(), 2);
  auto [batch, baselines] = sampler.take();
  EXPECT_EQ(rows_of(batch), (std::vector<int64_t>{0, 1, 6, 7, 10, 11}));
  EXPECT_TRUE(at::equal(baselines, at::tensor({0.0f, 1.0f, 6.0f, 7.0f, 10.0f, 11.0f})));
  EXPECT_EQ(batch.column("uid"), strings({"g1", "g1", "h1", "h1", "h3", "h3"}));
  EXPECT_EQ(batch.meta_value("reward_errors"), nullptr);

  // More groups kept than needed: the first train_batch, in order.
  DynamicSampler more(2, {.enable = true, .metric = "acc"});
  more.add(scored({"a", "a", "b", "b", "c", "c"}, {0, 1, 1, 0, 0, 1}));
  auto [trimmed, none] = more.take();
  EXPECT_EQ(rows_of(trimmed), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(none.defined());
}

TEST(DynamicSampling, TooFewGroupsAfterMaxNumGenBatchesIsAnErrorNamingTheKey) {
  DynamicSampler sampler(2, {.enable = true, .metric = "acc", .max_num_gen_batches = 2});
  sampler.add(scored({"a", "a", "b", "b"}, {1, 0, 1, 1}, 0));
  try {
    sampler.add(scored({"c", "c", "d", "d"}, {0, 0, 1, 1}, 4));
    ADD_FAILURE() << "a second batch without enough groups did not stop";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "algorithm.filter_groups.max_num_gen_batches = 2");
    EXPECT_CONTAINS(e.what(), "1 groups have a varied acc, fewer than data.train_batch_size = 2");
  }
  // Enough on the last batch allowed: no error.
  DynamicSampler just(2, {.enable = true, .metric = "acc", .max_num_gen_batches = 2});
  just.add(scored({"a", "a"}, {1, 0}, 0));
  EXPECT_NO_THROW(just.add(scored({"b", "b"}, {0, 1}, 2)));
  EXPECT_TRUE(just.full());
  // No limit (0, or negative as verl's): batches until there are enough.
  for (int64_t limit : {0, -1}) {
    DynamicSampler endless(1, {.enable = true, .metric = "acc", .max_num_gen_batches = limit});
    for (int64_t i = 0; i < 20; ++i) endless.add(scored({"z", "z"}, {1, 1}, 2 * i));
    EXPECT_FALSE(endless.full());
    EXPECT_THROW(endless.take(), InternalError);
  }
}

}  // namespace
}  // namespace baton::trainer
