// The reward manager (verl's reward_model.reward_manager: naive, or dapo with
// its overlong buffer): turns a generated batch into token-level scores with
// the rule-based reward functions of reward_registry.h.
//
// The two kinds differ as verl's do: dapo may add DAPO's overlong penalty to
// each score, and does not pass `num_turns` in extra_info; the trainer
// reports a dapo manager's per-row values (acc, ...) in its validation
// metrics, with acc as the core one (trainer/ppo_trainer.h). Both report
// "acc" in RewardResult::extra (verl's naive only for functions returning a
// dict with it; baton's functions return a number).
//
// For each row of the batch:
//   1. its valid response tokens are the `responses` positions where
//      attention_mask[:, P:] is 1 (verl reads the attention mask; without an
//      attention_mask, response_mask); its valid prompt tokens are the
//      `prompts` positions where attention_mask[:, :P] is 1. Padding is never
//      decoded, whatever token it holds.
//   2. the response is decoded with special tokens skipped (an EOS inside the
//      valid tokens is dropped from the text);
//   3. the reward function (`reward_fn_name` for every row, else the one the
//      registry maps the row's `reward_fn_key` column to) scores it against
//      the row's `ground_truth` column, with its `extra_info` column; for a
//      multi-turn rollout's batch, extra_info also holds the row's
//      `rollout_reward_scores` ({"tool_rewards": [...], "turn_scores": [...]},
//      what its tools and interaction scored) and, for the naive manager,
//      `num_turns` (its assistant turns), as verl's reward managers pass them;
//   4. the score (plus the overlong penalty, when enabled) goes to
//      token_level_scores[row, last valid response position]; every other
//      position is 0.
// A row whose response has no valid token still gets a score in `scores`, but
// it is written nowhere in token_level_scores (verl writes it at index -1,
// i.e. the last, padded, column); RewardResult::empty_responses counts them.
//
// With num_examine > 0, the first num_examine rows of each data source of a
// batch are printed to stderr (prompt, response, ground truth, score), as verl
// prints them.
//
// Example:
//   auto tok = baton::data::Tokenizer::load("models/qwen2-0.5b");
//   baton::rewards::RewardManager rm(tok, baton::rewards::RewardManagerOptions().set_num_examine(1));
//   baton::rewards::RewardResult r = rm.compute(batch);  // r.token_level_scores [N, R] fp32
//   DataProto scored = rm.with_token_level_scores(batch);
//   // DAPO's: responses past 512 - 128 tokens lose up to 1.0.
//   baton::rewards::RewardManager dapo(tok, baton::rewards::RewardManagerOptions()
//       .set_kind(baton::rewards::RewardManagerKind::kDapo)
//       .set_overlong_buffer({.enable = true, .len = 128, .penalty_factor = 1.0,
//                             .max_resp_len = 512}));
//
// Lifetime: the manager keeps a pointer to the tokenizer, which must outlive
// it (the trainer owns both). Thread safety: compute() is const and may run
// concurrently when the reward functions may (the built-in ones may).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"
#include "dispatch/data_proto.h"
#include "text/tokenizer/tokenizer.h"
#include "workers/rewards/python_reward.h"
#include "workers/rewards/reward_registry.h"

namespace baton::rewards {

// reward_model.reward_manager.
enum class RewardManagerKind { kNaive, kDapo };

// "naive" or "dapo"; throws baton::InvalidArgument naming `name` and the kinds.
RewardManagerKind parse_reward_manager_kind(const std::string& name);

// DAPO's overlong reward shaping (reward_model.overlong_buffer; the dapo
// manager's only): a response longer than max_resp_len - len valid tokens gets
//   min(-(length - (max_resp_len - len)) / len * penalty_factor, 0)
// added to its score, i.e. 0 up to max_resp_len - len tokens, falling
// linearly to -penalty_factor at max_resp_len.
struct OverlongBufferOptions {
  bool enable = false;
  int64_t len = 0;              // tokens of the buffer; > 0 when enabled
  double penalty_factor = 1.0;  // the penalty at max_resp_len
  int64_t max_resp_len = 0;     // data.max_response_length; >= len when enabled
  // Also report "overlong_reward" (the penalty) and "overlong" (1 or 0) in
  // RewardResult::extra.
  bool log = false;
};

struct RewardManagerOptions {
  // reward_model.reward_manager.
  RewardManagerKind kind = RewardManagerKind::kNaive;
  // custom_reward_function.name: one registered function for every row; unset:
  // each row's function is chosen by its reward_fn_key column.
  std::optional<std::string> reward_fn_name;
  // data.reward_fn_key: the column holding each row's data source.
  std::string reward_fn_key = "data_source";
  // Rows printed per data source per batch (verl's num_examine); 0: none.
  int64_t num_examine = 0;
  // A reward function that throws: false (the default) fails the batch with
  // an error naming the row, its data source and the function; true scores
  // that row 0 and counts it in RewardResult::errors.
  bool zero_on_error = false;
  OverlongBufferOptions overlong_buffer;
  // custom_reward_function.path: a Python file's function scores every row
  // (the whole batch at once, in the pool's subprocesses); reward_fn_name
  // and the data sources are not consulted. A row it fails (raised, returned
  // no number, hung, killed its interpreter) fails the batch naming the row,
  // or with zero_on_error scores 0 and counts.
  std::shared_ptr<PythonRewardPool> python;

  RewardManagerOptions& set_kind(RewardManagerKind v) {
    kind = v;
    return *this;
  }
  RewardManagerOptions& set_reward_fn_name(std::optional<std::string> v) {
    reward_fn_name = std::move(v);
    return *this;
  }
  RewardManagerOptions& set_reward_fn_key(std::string v) {
    reward_fn_key = std::move(v);
    return *this;
  }
  RewardManagerOptions& set_num_examine(int64_t v) {
    num_examine = v;
    return *this;
  }
  RewardManagerOptions& set_zero_on_error(bool v) {
    zero_on_error = v;
    return *this;
  }
  RewardManagerOptions& set_python(std::shared_ptr<PythonRewardPool> v) {
    python = std::move(v);
    return *this;
  }
  RewardManagerOptions& set_overlong_buffer(OverlongBufferOptions v) {
    overlong_buffer = v;
    return *this;
  }
};

struct RewardResult {
  // [N, R] fp32 on the device of `responses`: each row's reward at its last
  // valid response token, 0 elsewhere.
  at::Tensor token_level_scores;
  // Each row's reward (the value written above, overlong penalty included).
  std::vector<double> scores;
  // Per-row values by name, each N long: "acc" (the reward function's score,
  // before any overlong penalty, as DAPO reports it), and with
  // overlong_buffer.log "overlong_reward" and "overlong".
  std::map<std::string, std::vector<double>> extra;
  // Rows with no valid response token (their score is in `scores` only).
  int64_t empty_responses = 0;
  // Rows whose reward function threw and that were scored 0 (zero_on_error).
  int64_t errors = 0;
};

class RewardManager {
 public:
  // Throws baton::InvalidArgument for an unknown reward_fn_name (naming the
  // registered ones), a negative num_examine, or an enabled overlong buffer
  // on a naive manager, or with len <= 0 or max_resp_len < len.
  RewardManager(const data::Tokenizer& tokenizer, RewardManagerOptions options = {});

  // Scores `batch`, which must hold the tensors `prompts` [N, P] (left-padded)
  // and `responses` [N, R] (right-padded) and `attention_mask` [N, P + R] or
  // `response_mask` [N, R], and the columns reward_fn_key (unless
  // reward_fn_name is set) and `ground_truth` (strings; an integer ground truth
  // is taken as its decimal text), optionally `extra_info` (JSON text or none).
  // Throws baton::Error naming the key and the expected shape or kind for a
  // missing or malformed tensor or column, and naming the row for a data
  // source with no reward function. Exceptions of a reward function pass
  // through.
  RewardResult compute(const DataProto& batch) const;

  // A copy of `batch` (tensors shared) with the tensor "token_level_scores"
  // and one float column per RewardResult::extra key ("acc", ...), as verl's
  // trainer stores reward_extra_info in non_tensor_batch.
  DataProto with_token_level_scores(const DataProto& batch) const;

  const RewardManagerOptions& options() const { return options_; }

 private:
  const data::Tokenizer* tokenizer_;
  RewardManagerOptions options_;
  RewardFunction named_function_;  // set when options_.reward_fn_name is
};

}  // namespace baton::rewards
