// verl-format prompt datasets: JSONL or Parquet files (parquet_file.h; a `.parquet` name) whose
// rows carry `prompt` (a string, or a list of
// {"role", "content", ...} chat messages, content a string or a list of parts), `data_source`,
// `reward_model.ground_truth` and an optional `extra_info` object. Chat prompts are rendered
// with the tokenizer's chat template (chat_template.h) and tokenized without special tokens, as
// verl's RLHFDataset does; string prompts are used as they are. Batches are left-padded to
// max_prompt_length.
//
// Example:
//   auto tok = baton::data::Tokenizer::load("models/qwen2-0.5b");
//   auto ds = baton::data::PromptDataset::load(
//       {"data/train.jsonl"}, tok,
//       baton::data::PromptDatasetOptions().set_max_prompt_length(256).set_filter_overlong_prompts(true));
//   baton::data::PromptBatch batch = ds.batch({0, 1, 2, 3});
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "text/tokenizer/tokenizer.h"

namespace baton::data {

// data.truncation: what happens to a prompt longer than max_prompt_length.
enum class Truncation {
  kError,   // fail naming the row
  kLeft,    // keep the last max_prompt_length tokens
  kRight,   // keep the first max_prompt_length tokens
  kMiddle,  // keep the first and last halves
};
// "error", "left", "right", "middle"; throws baton::InvalidArgument naming the value otherwise.
Truncation parse_truncation(const std::string& name);

struct PromptDatasetOptions {
  // data.max_prompt_length: the padded length of every prompt, in tokens.
  int64_t max_prompt_length = 512;
  // data.filter_overlong_prompts: drop rows longer than max_prompt_length at load time.
  bool filter_overlong_prompts = false;
  // data.truncation, for rows that are too long and not filtered.
  Truncation truncation = Truncation::kError;
  // data.prompt_key: the field holding the prompt.
  std::string prompt_key = "prompt";
  // Extra variables of every chat prompt's rendering (a JSON object, or null
  // for none), e.g. {"tools": [...]}: the schemas a multi-turn rollout offers.
  nlohmann::ordered_json chat_template_variables;

  PromptDatasetOptions& set_max_prompt_length(int64_t v) {
    max_prompt_length = v;
    return *this;
  }
  PromptDatasetOptions& set_filter_overlong_prompts(bool v) {
    filter_overlong_prompts = v;
    return *this;
  }
  PromptDatasetOptions& set_truncation(Truncation v) {
    truncation = v;
    return *this;
  }
  PromptDatasetOptions& set_prompt_key(std::string v) {
    prompt_key = std::move(v);
    return *this;
  }
};

struct PromptRow {
  std::string data_source;
  std::string ground_truth;         // reward_model.ground_truth (a number is kept as its JSON text)
  std::string extra_info;           // extra_info as JSON text ("{}" when absent)
  std::string prompt_text;          // the prompt as rendered
  std::vector<int32_t> prompt_ids;  // its tokens after truncation (no padding)
  std::string file;                 // where the row came from
  int64_t line = 0;                 // 1-based (the row, in a Parquet file)
};

// A batch of prompts: row-major [size, seq_len] arrays, left-padded.
struct PromptBatch {
  int64_t size = 0;
  int64_t seq_len = 0;                               // max_prompt_length
  std::vector<int32_t> input_ids;                    // pad id, then the prompt
  std::vector<int32_t> attention_mask;               // 0 on padding, 1 on the prompt
  std::vector<int32_t> position_ids;                 // 0 on padding, then 0, 1, 2, ...
  std::vector<std::vector<int32_t>> raw_prompt_ids;  // unpadded
  std::vector<std::size_t> indices;                  // rows of the dataset
  std::vector<std::string> data_sources, ground_truths, extra_infos;
};

class PromptDataset {
 public:
  // Reads the JSONL (or .parquet) files in order (empty lines are skipped). Throws std::runtime_error naming
  // the file, the line and the field for a missing file, malformed JSON, a missing or
  // mistyped field, an unsupported chat template, or (truncation "error") an overlong prompt.
  static PromptDataset load(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const PromptDatasetOptions& options = {});

  std::size_t size() const { return rows_.size(); }
  const PromptRow& row(std::size_t i) const { return rows_.at(i); }
  // Rows dropped by filter_overlong_prompts.
  std::size_t filtered() const { return filtered_; }
  int64_t max_prompt_length() const { return max_prompt_length_; }
  // pad_token, or eos_token when the tokenizer has no pad_token (as verl).
  int32_t pad_id() const { return pad_id_; }

  // The rows `indices` as a left-padded batch.
  PromptBatch batch(const std::vector<std::size_t>& indices) const;

 private:
  std::vector<PromptRow> rows_;
  std::size_t filtered_ = 0;
  int64_t max_prompt_length_ = 0;
  int32_t pad_id_ = 0;
};

}  // namespace baton::data
