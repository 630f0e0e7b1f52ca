// prompt_batch_proto: the loader's batch as the RL roles' DataProto.
#include "workers/roles/prompt_batch.h"

#include <gtest/gtest.h>

#include <vector>

namespace baton::workers {
namespace {

TEST(PromptBatchProto, TensorsAreInt64MatricesAndColumnsCarryUidsByDatasetRow) {
  data::PromptBatch b;
  b.size = 2;
  b.seq_len = 3;
  b.input_ids = {0, 5, 6, 7, 8, 9};  // row 0 left-padded with pad id 0
  b.attention_mask = {0, 1, 1, 1, 1, 1};
  b.position_ids = {0, 0, 1, 0, 1, 2};
  b.indices = {41, 7};
  b.data_sources = {"gsm8k", "math"};
  b.ground_truths = {"12", "x"};
  b.extra_infos = {"{}", "{\"k\":1}"};
  const DataProto d = prompt_batch_proto(b, "step3-");
  ASSERT_EQ(d.size(), 2);
  for (const char* k : {"input_ids", "attention_mask", "position_ids"}) {
    EXPECT_EQ(d.tensor(k).scalar_type(), at::kLong) << k;
    EXPECT_EQ(d.tensor(k).sizes(), (at::IntArrayRef{2, 3})) << k;
  }
  EXPECT_EQ(d.tensor("input_ids")[1][2].item<int64_t>(), 9);
  EXPECT_EQ(d.tensor("attention_mask")[0][0].item<int64_t>(), 0);
  EXPECT_EQ(d.tensor("position_ids")[0][2].item<int64_t>(), 1);
  EXPECT_EQ(d.column("uid").at(0).as_string(), "step3-41");
  EXPECT_EQ(d.column("uid").at(1).as_string(), "step3-7");
  EXPECT_EQ(d.column("data_source").at(1).as_string(), "math");
  EXPECT_EQ(d.column("ground_truth").at(0).as_string(), "12");
  EXPECT_EQ(d.column("extra_info").at(1).as_string(), "{\"k\":1}");
  // The tensors own their memory: the batch may go away.
  b.input_ids.assign(6, -1);
  EXPECT_EQ(d.tensor("input_ids")[0][1].item<int64_t>(), 5);
}

}  // namespace
}  // namespace baton::workers
