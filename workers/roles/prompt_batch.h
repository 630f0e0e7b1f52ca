// A batch of prompts from the data loader as the DataProto the RL roles take.
//
// Example:
//   DataProto prompts = prompt_batch_proto(loader.next(), "step7-");
//   // tensors input_ids, attention_mask, position_ids [size, seq_len] int64
//   // (left-padded); columns data_source, ground_truth, extra_info, and uid =
//   // uid_prefix + the row's index in the dataset (GRPO's groups).
//
// The one conversion the trainer, its validation and custom drivers share.
#pragma once

#include <string>

#include "data/prompt_dataset.h"
#include "dispatch/data_proto.h"

namespace baton::workers {

DataProto prompt_batch_proto(const data::PromptBatch& batch, const std::string& uid_prefix = "");

}  // namespace baton::workers
