#include "data/prompt_dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "base/errors.h"
#include "data/parquet_file.h"
#include "text/chat_template.h"

namespace baton::data {
namespace {

class RowError : public Error {
 public:
  using Error::Error;
};

std::string field_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// Checks the shape of a chat prompt; the messages go to the template as they are (extra keys
// such as tool_calls included).
void check_messages(const nlohmann::json& list, const std::string& where) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    const std::string here = where + "[" + std::to_string(i) + "]";
    if (!m.is_object()) throw RowError(here + ": expected a {\"role\", \"content\"} object");
    if (!m.contains("role") || !m["role"].is_string()) {
      throw RowError(here + ".role: expected a string");
    }
    if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_array())) {
      throw RowError(here + ".content: expected a string or a list of content parts");
    }
  }
}

}  // namespace

Truncation parse_truncation(const std::string& name) {
  if (name == "error") return Truncation::kError;
  if (name == "left") return Truncation::kLeft;
  if (name == "right") return Truncation::kRight;
  if (name == "middle") return Truncation::kMiddle;
  throw baton::InvalidArgument("data.truncation: '" + name +
                              "' is not one of error, left, right, middle");
}

PromptDataset PromptDataset::load(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                                  const PromptDatasetOptions& options) {
  if (options.max_prompt_length <= 0) {
    throw baton::InvalidArgument("data.max_prompt_length must be > 0 (got " +
                                std::to_string(options.max_prompt_length) + ")");
  }
  PromptDataset ds;
  ds.max_prompt_length_ = options.max_prompt_length;
  const auto pad = tokenizer.pad_id() ? tokenizer.pad_id() : tokenizer.eos_id();
  if (!pad) {
    throw Error(
        "the tokenizer has neither pad_token nor eos_token: prompts cannot "
        "be padded (set pad_token in tokenizer_config.json)");
  }
  ds.pad_id_ = *pad;
  // Parsed once, and only when a chat prompt needs it.
  std::optional<ChatTemplate> chat;
  const auto max_len = static_cast<std::size_t>(options.max_prompt_length);
  const std::string& key = options.prompt_key;

  for (const std::string& file : files) {
    // Rows as JSON text: a JSONL file's lines, or a Parquet file's rows (verl's
    // preprocessing scripts write those) as the objects a JSONL line would hold.
    const bool parquet = file.size() >= 8 && file.compare(file.size() - 8, 8, ".parquet") == 0;
    std::vector<std::string> texts;
    if (parquet) {
      for (const auto& r : read_parquet_rows(file)) texts.push_back(r.dump());
    } else {
      std::ifstream in(file);
      if (!in) throw Error(file + ": cannot open the dataset file (does it exist?)");
      for (std::string line; std::getline(in, line);) texts.push_back(std::move(line));
    }
    for (int64_t line_no = 1; line_no <= static_cast<int64_t>(texts.size()); ++line_no) {
      const std::string& text = texts[static_cast<std::size_t>(line_no - 1)];
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where =
          file + (parquet ? ": row " : ":") + std::to_string(line_no);
      try {
        nlohmann::json row;
        try {
          row = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {  // out_of_range: a number past a double
          throw RowError(where + ": malformed JSON: " + e.what());
        }
        if (!row.is_object()) throw RowError(where + ": expected a JSON object per line");
        PromptRow out;
        out.file = file;
        out.line = line_no;

        if (!row.contains(key)) throw RowError(where + ": missing field '" + key + "'");
        const auto& prompt = row[key];
        if (prompt.is_string()) {
          out.prompt_text = prompt.get<std::string>();
        } else if (prompt.is_array()) {
          check_messages(prompt, where + ": field '" + key + "'");
          if (!chat) chat = ChatTemplate::from_tokenizer(tokenizer, "tokenizer_config.json");
          // Parsed again keeping the keys' order, which the template may show (tojson).
          const auto messages = nlohmann::ordered_json::parse(text).at(key);
          out.prompt_text = chat->render(messages, /*add_generation_prompt=*/true,
                                         options.chat_template_variables);
        } else {
          throw RowError(where + ": field '" + key +
                         "': expected a string or a list of {\"role\", \"content\"} messages");
        }

        if (!row.contains("data_source") || !row["data_source"].is_string()) {
          throw RowError(where + ": field 'data_source': expected a string");
        }
        out.data_source = row["data_source"].get<std::string>();
        if (!row.contains("reward_model") || !row["reward_model"].is_object() ||
            !row["reward_model"].contains("ground_truth")) {
          throw RowError(where + ": field 'reward_model.ground_truth' is missing");
        }
        const auto& truth = row["reward_model"]["ground_truth"];
        if (!truth.is_string() && !truth.is_number()) {
          throw RowError(where +
                         ": field 'reward_model.ground_truth': expected a string or a number");
        }
        out.ground_truth = field_text(truth);
        if (row.contains("extra_info") && !row["extra_info"].is_null()) {
          if (!row["extra_info"].is_object()) {
            throw RowError(where + ": field 'extra_info': expected an object");
          }
          out.extra_info = row["extra_info"].dump();
        } else {
          out.extra_info = "{}";
        }

        std::vector<int32_t> ids;
        try {
          ids = tokenizer.encode(out.prompt_text, /*add_special_tokens=*/false);
        } catch (const TokenizerError& e) {
          throw RowError(where + ": field '" + key + "': " + e.what());
        }
        if (ids.size() > max_len) {
          if (options.filter_overlong_prompts) {
            ++ds.filtered_;
            continue;
          }
          const auto n = static_cast<std::ptrdiff_t>(max_len);
          switch (options.truncation) {
            case Truncation::kError:
              throw RowError(
                  where + ": the prompt has " + std::to_string(ids.size()) +
                  " tokens, more than data.max_prompt_length = " + std::to_string(max_len) +
                  " (set data.filter_overlong_prompts=true or data.truncation)");
            case Truncation::kLeft:
              ids.erase(ids.begin(), ids.end() - n);
              break;
            case Truncation::kRight:
              ids.resize(max_len);
              break;
            case Truncation::kMiddle: {
              const std::ptrdiff_t left = n / 2, right = n - left;
              ids.erase(ids.begin() + left, ids.end() - right);
              break;
            }
          }
        }
        out.prompt_ids = std::move(ids);
        ds.rows_.push_back(std::move(out));
      } catch (const JinjaError& e) {  // the chat template
        throw Error(where + ": " + e.what());
      } catch (const TokenizerError& e) {
        throw Error(where + ": " + e.what());
      }
    }
  }
  return ds;
}

PromptBatch PromptDataset::batch(const std::vector<std::size_t>& indices) const {
  PromptBatch b;
  b.size = static_cast<int64_t>(indices.size());
  b.seq_len = max_prompt_length_;
  const auto len = static_cast<std::size_t>(max_prompt_length_);
  b.input_ids.assign(indices.size() * len, pad_id_);
  b.attention_mask.assign(indices.size() * len, 0);
  b.position_ids.assign(indices.size() * len, 0);
  for (std::size_t r = 0; r < indices.size(); ++r) {
    const PromptRow& row = rows_.at(indices[r]);
    const std::size_t pad = len - row.prompt_ids.size();
    for (std::size_t j = 0; j < row.prompt_ids.size(); ++j) {
      b.input_ids[r * len + pad + j] = row.prompt_ids[j];
      b.attention_mask[r * len + pad + j] = 1;
      b.position_ids[r * len + pad + j] = static_cast<int32_t>(j);
    }
    b.raw_prompt_ids.push_back(row.prompt_ids);
    b.indices.push_back(indices[r]);
    b.data_sources.push_back(row.data_source);
    b.ground_truths.push_back(row.ground_truth);
    b.extra_infos.push_back(row.extra_info);
  }
  return b;
}

}  // namespace baton::data
