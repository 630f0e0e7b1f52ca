#include "workers/rewards/reward_manager.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace baton::rewards {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error("RewardManager: " + message);
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// `key` as a 2-D integer (or bool, for masks) tensor on the CPU.
at::Tensor int_matrix(const DataProto& batch, const std::string& key, at::ScalarType as) {
  batch.require_tensors({key}, "RewardManager");
  const at::Tensor& t = batch.tensor(key);
  if (t.dim() != 2) fail("tensor '" + key + "' must be 2-D [N, length], got " + shape_of(t));
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()))
    fail("tensor '" + key + "' must hold integers, got " + std::string(at::toString(t.scalar_type())));
  return t.to(at::kCPU).to(as).contiguous();
}

// Row `row` of column `key` as text: a string as it is, an integer as its
// decimal text, none as "" when `none_ok`.
std::string column_text(const List& column, const std::string& key, int64_t row, bool none_ok) {
  const Value& v = column[static_cast<size_t>(row)];
  switch (v.kind()) {
    case ValueKind::kString:
      return v.as_string();
    case ValueKind::kInt:
      if (key == "ground_truth") return std::to_string(v.as_int());
      break;
    case ValueKind::kNone:
      if (none_ok) return "";
      break;
    default:
      break;
  }
  fail("column '" + key + "' row " + std::to_string(row) + ": expected a string" +
       (none_ok ? " or none" : "") + ", got " + kind_name(v.kind()));
}

const List* optional_column(const DataProto& batch, const std::string& key) {
  return batch.has_column(key) ? &batch.column(key) : nullptr;
}

const List& required_column(const DataProto& batch, const std::string& key) {
  if (!batch.has_column(key)) {
    std::string keys;
    for (const auto& k : batch.column_keys()) keys += (keys.empty() ? "" : ", ") + k;
    fail("the batch has no column '" + key + "' (columns: " + keys + ")");
  }
  return batch.column(key);
}

std::vector<int32_t> masked_ids(const int32_t* ids, const int64_t* mask, int64_t length) {
  std::vector<int32_t> out;
  for (int64_t j = 0; j < length; ++j)
    if (mask[j] != 0) out.push_back(ids[j]);
  return out;
}

// `extra_info` (JSON text, "" for none) with a multi-turn rollout's
// `rollout_reward_scores` (JSON text) and `num_turns` added, as verl's reward
// manager adds them. An extra_info that is not a JSON object stays as it is.
std::string with_rollout_fields(const std::string& extra_info, const std::string& scores,
                                std::optional<double> num_turns) {
  nlohmann::json extra = nlohmann::json::object();
  if (!extra_info.empty()) {
    extra = nlohmann::json::parse(extra_info, nullptr, /*allow_exceptions=*/false);
    if (!extra.is_object()) return extra_info;
  }
  if (!scores.empty())
    extra["rollout_reward_scores"] = nlohmann::json::parse(scores, nullptr, false);
  if (num_turns) extra["num_turns"] = static_cast<int64_t>(*num_turns);
  return extra.dump();
}

}  // namespace

RewardManagerKind parse_reward_manager_kind(const std::string& name) {
  if (name == "naive") return RewardManagerKind::kNaive;
  if (name == "dapo") return RewardManagerKind::kDapo;
  throw baton::InvalidArgument("RewardManager: reward manager '" + name +
                               "' is not one of: naive, dapo");
}

RewardManager::RewardManager(const data::Tokenizer& tokenizer, RewardManagerOptions options)
    : tokenizer_(&tokenizer), options_(std::move(options)) {
  if (options_.num_examine < 0)
    throw baton::InvalidArgument("RewardManager: num_examine must be >= 0, got " +
                                 std::to_string(options_.num_examine));
  const OverlongBufferOptions& o = options_.overlong_buffer;
  if (o.enable && options_.kind != RewardManagerKind::kDapo)
    throw baton::InvalidArgument(
        "RewardManager: overlong_buffer is the dapo manager's (reward_model.reward_manager = "
        "dapo); the naive manager has none");
  if (o.enable && o.len <= 0)
    throw baton::InvalidArgument(
        "RewardManager: overlong_buffer.len must be > 0 when enabled, got " +
        std::to_string(o.len));
  if (o.enable && o.max_resp_len < o.len)
    throw baton::InvalidArgument(
        "RewardManager: overlong_buffer.max_resp_len (" + std::to_string(o.max_resp_len) +
        ") must be >= overlong_buffer.len (" + std::to_string(o.len) + ")");
  if (options_.reward_fn_name) named_function_ = find_reward_function(*options_.reward_fn_name);
}

RewardResult RewardManager::compute(const DataProto& batch) const {
  const at::Tensor prompts = int_matrix(batch, "prompts", at::kInt);
  const at::Tensor responses = int_matrix(batch, "responses", at::kInt);
  const int64_t n = batch.size();
  const int64_t prompt_length = prompts.size(1);
  const int64_t response_length = responses.size(1);

  // attention_mask [N, P + R] as verl reads it; response_mask [N, R] otherwise.
  at::Tensor prompt_mask;  // [N, P], undefined without an attention_mask
  at::Tensor response_mask;
  if (batch.has_tensor("attention_mask")) {
    const at::Tensor mask = int_matrix(batch, "attention_mask", at::kLong);
    if (mask.size(1) != prompt_length + response_length)
      fail("tensor 'attention_mask' must be [N, P + R] = [" + std::to_string(n) + ", " +
           std::to_string(prompt_length + response_length) + "] (prompts " + shape_of(prompts) +
           ", responses " + shape_of(responses) + "), got " + shape_of(mask));
    prompt_mask = mask.narrow(1, 0, prompt_length).contiguous();
    response_mask = mask.narrow(1, prompt_length, response_length).contiguous();
  } else if (batch.has_tensor("response_mask")) {
    response_mask = int_matrix(batch, "response_mask", at::kLong);
    if (response_mask.size(1) != response_length)
      fail("tensor 'response_mask' must be [N, R] = [" + std::to_string(n) + ", " +
           std::to_string(response_length) + "] (responses " + shape_of(responses) + "), got " +
           shape_of(response_mask));
  } else {
    fail("the batch has neither 'attention_mask' [N, P + R] nor 'response_mask' [N, R]: "
         "which response tokens are valid is unknown");
  }

  const List& ground_truths = required_column(batch, "ground_truth");
  const List* data_sources = named_function_ ? optional_column(batch, options_.reward_fn_key)
                                             : &required_column(batch, options_.reward_fn_key);
  const List* extra_infos = optional_column(batch, "extra_info");
  // A multi-turn rollout's (workers/roles/agent_loop.h): what its tools and
  // interactions scored, and its turns, handed on in extra_info as verl does.
  const List* rollout_scores = optional_column(batch, "rollout_reward_scores");
  at::Tensor turns;  // verl's dapo manager does not pass num_turns
  if (batch.has_tensor("multi_turn_turns") && options_.kind == RewardManagerKind::kNaive)
    turns = batch.tensor("multi_turn_turns").to(at::kDouble).contiguous();

  RewardResult result;
  at::Tensor scores = at::zeros({n, response_length}, at::kFloat);
  float* score_data = scores.data_ptr<float>();
  const int32_t* response_data = responses.data_ptr<int32_t>();
  const int64_t* response_mask_data = response_mask.data_ptr<int64_t>();
  result.scores.reserve(static_cast<size_t>(n));
  std::vector<double>& acc = result.extra["acc"];
  const OverlongBufferOptions& overlong = options_.overlong_buffer;
  std::vector<double>* overlong_rewards = nullptr;
  std::vector<double>* overlong_flags = nullptr;
  if (overlong.enable && overlong.log) {
    overlong_rewards = &result.extra["overlong_reward"];
    overlong_flags = &result.extra["overlong"];
  }

  // Row i as the reward function sees it, and where its score goes.
  struct Row {
    std::vector<int32_t> valid;  // its valid response tokens
    int64_t last = -1;           // the last valid response position
    std::string response, ground_truth, data_source, extra_info;
  };
  const auto row_of = [&](int64_t i) {
    Row r;
    const int32_t* ids = response_data + i * response_length;
    const int64_t* mask = response_mask_data + i * response_length;
    r.valid = masked_ids(ids, mask, response_length);
    for (int64_t j = response_length - 1; j >= 0; --j)
      if (mask[j] != 0) {
        r.last = j;
        break;
      }
    r.response = tokenizer_->decode(r.valid, /*skip_special_tokens=*/true);
    r.ground_truth = column_text(ground_truths, "ground_truth", i, false);
    r.data_source = data_sources ? column_text(*data_sources, options_.reward_fn_key, i, false) : "";
    r.extra_info = extra_infos ? column_text(*extra_infos, "extra_info", i, true) : "";
    if (rollout_scores || turns.defined())
      r.extra_info = with_rollout_fields(
          r.extra_info,
          rollout_scores ? column_text(*rollout_scores, "rollout_reward_scores", i, true) : "",
          turns.defined() ? std::optional<double>(turns.data_ptr<double>()[i]) : std::nullopt);
    return r;
  };
  const auto input_of = [](const Row& r) {
    return RewardInput{.data_source = r.data_source,
                       .response = r.response,
                       .ground_truth = r.ground_truth,
                       .extra_info = r.extra_info};
  };
  // A Python reward file scores the whole batch at once, in its pool.
  std::vector<Row> rows;
  std::vector<PythonRewardResult> python_results;
  if (options_.python) {
    rows.reserve(static_cast<size_t>(n));
    std::vector<RewardInput> inputs;
    for (int64_t i = 0; i < n; ++i) rows.push_back(row_of(i));
    for (const Row& r : rows) inputs.push_back(input_of(r));
    python_results = options_.python->score(inputs);
  }

  std::map<std::string, RewardFunction, std::less<>> functions;  // by data source, this batch
  std::map<std::string, int64_t, std::less<>> examined;           // rows printed by data source
  for (int64_t i = 0; i < n; ++i) {
    const Row row = options_.python ? std::move(rows[static_cast<size_t>(i)]) : row_of(i);
    const std::vector<int32_t>& valid = row.valid;
    const int64_t last = row.last;
    const std::string& response = row.response;
    const std::string& ground_truth = row.ground_truth;
    const std::string& data_source = row.data_source;

    double score = 0;
    if (options_.python) {
      const PythonRewardResult& pr = python_results[static_cast<size_t>(i)];
      if (pr.score) {
        score = *pr.score;
      } else if (!options_.zero_on_error) {
        fail("row " + std::to_string(i) + " (data_source '" + data_source + "'): " + pr.error +
             " (reward_model.zero_on_error=true scores such rows 0 and counts them)");
      } else {
        ++result.errors;
      }
    } else {
      const RewardFunction* fn = &named_function_;
      if (!named_function_) {
        auto it = functions.find(data_source);
        if (it == functions.end()) {
          try {
            it = functions.emplace(data_source, find_reward_function_for(data_source)).first;
          } catch (const baton::InvalidArgument& e) {
            fail("row " + std::to_string(i) + " (column '" + options_.reward_fn_key +
                 "'): " + e.what());
          }
        }
        fn = &it->second;
      }
      try {
        score = (*fn)(input_of(row));
      } catch (const std::exception& e) {
        if (!options_.zero_on_error) {
          const std::string name = options_.reward_fn_name ? *options_.reward_fn_name
                                                            : reward_function_name_for(data_source);
          fail("row " + std::to_string(i) + " (data_source '" + data_source +
               "'): the reward function '" + name + "' threw: " + e.what() +
               " (reward_model.zero_on_error=true scores such rows 0 and counts them)");
        }
        ++result.errors;
      }
    }
    double reward = score;
    if (overlong.enable) {
      const double expected = static_cast<double>(overlong.max_resp_len - overlong.len);
      const double exceed = static_cast<double>(valid.size()) - expected;
      const double penalty =
          std::min(-exceed / static_cast<double>(overlong.len) * overlong.penalty_factor, 0.0);
      reward += penalty;
      if (overlong_rewards) {
        overlong_rewards->push_back(penalty);
        overlong_flags->push_back(penalty < 0 ? 1.0 : 0.0);
      }
    }
    acc.push_back(score);
    result.scores.push_back(reward);
    if (last >= 0)
      score_data[i * response_length + last] = static_cast<float>(reward);
    else
      ++result.empty_responses;

    if (options_.num_examine > 0 && examined[data_source]++ < options_.num_examine) {
      std::string prompt;
      if (prompt_mask.defined()) {
        prompt = tokenizer_->decode(masked_ids(prompts.data_ptr<int32_t>() + i * prompt_length,
                                               prompt_mask.data_ptr<int64_t>() + i * prompt_length,
                                               prompt_length),
                                    /*skip_special_tokens=*/true);
      } else {
        // Without an attention mask the prompt's padding is unknown: pad
        // tokens are special in HF tokenizers, and skipped.
        const int32_t* p = prompts.data_ptr<int32_t>() + i * prompt_length;
        prompt = tokenizer_->decode(std::vector<int32_t>(p, p + prompt_length), true);
      }
      std::ostringstream out;
      out << "[prompt] " << prompt << "\n[response] " << response << "\n[ground_truth] "
          << ground_truth << "\n[score] " << reward << "\n";
      std::cerr << out.str() << std::flush;
    }
  }
  result.token_level_scores = scores.to(batch.tensor("responses").device());
  return result;
}

DataProto RewardManager::with_token_level_scores(const DataProto& batch) const {
  RewardResult result = compute(batch);
  DataProto out = batch;
  out.set_tensor("token_level_scores", std::move(result.token_level_scores));
  out.set_meta("reward_errors", Value(result.errors));
  for (const auto& [key, values] : result.extra) {
    List column;
    column.reserve(values.size());
    for (double v : values) column.emplace_back(v);
    out.set_column(key, std::move(column));
  }
  return out;
}

}  // namespace baton::rewards
