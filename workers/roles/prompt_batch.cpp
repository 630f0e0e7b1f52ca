#include "workers/roles/prompt_batch.h"

#include <ATen/ATen.h>

namespace baton::workers {

DataProto prompt_batch_proto(const data::PromptBatch& batch, const std::string& uid_prefix) {
  const auto matrix = [&](const std::vector<int32_t>& v) {
    return at::from_blob(const_cast<int32_t*>(v.data()), {batch.size, batch.seq_len}, at::kInt)
        .to(at::kLong);
  };
  DataProto d;
  d.set_tensor("input_ids", matrix(batch.input_ids));
  d.set_tensor("attention_mask", matrix(batch.attention_mask));
  d.set_tensor("position_ids", matrix(batch.position_ids));
  List sources, truths, extras, uids;
  for (int64_t i = 0; i < batch.size; ++i) {
    const auto k = static_cast<size_t>(i);
    sources.emplace_back(batch.data_sources[k]);
    truths.emplace_back(batch.ground_truths[k]);
    extras.emplace_back(batch.extra_infos[k]);
    uids.emplace_back(uid_prefix + std::to_string(batch.indices[k]));
  }
  d.set_column("data_source", std::move(sources));
  d.set_column("ground_truth", std::move(truths));
  d.set_column("extra_info", std::move(extras));
  d.set_column("uid", std::move(uids));
  return d;
}

}  // namespace baton::workers
