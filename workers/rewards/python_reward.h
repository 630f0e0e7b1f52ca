// Python reward functions, unchanged from verl (custom_reward_function.path):
// a .py file whose function (custom_reward_function.name, default
// compute_score) has verl's signature
//   compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)
// and returns a number, or a dict holding one under "score".
//
// The functions run in a pool of python3 subprocesses, not in an interpreter
// embedded in the trainer: no GIL shared with anything, and a function that
// crashes or hangs takes down one subprocess, which is replaced. Each
// subprocess imports the file once and is fed rows over a pipe as JSON lines
// (a batch split into one contiguous chunk per subprocess); it answers a line
// per row as it goes, so a row that hangs (past timeout_s) or kills its
// interpreter is known by its index. extra_info reaches the function as verl
// passes it: the row's JSON object (None for a row without one).
//
// verl's reward_score modules import there as they do under verl (`from
// verl.utils.reward_score import gsm8k`): unless the interpreter has a real
// verl, a stand-in `verl` package answers the functions verl_reward_score.h
// lists by asking this pool, over the same pipe, to run baton's built-in
// (on the thread scoring that subprocess's rows).
//
// Example:
//   PythonRewardPool pool({.path = "my_reward.py"});
//   std::vector<PythonRewardResult> r = pool.score({{.data_source = "gsm8k",
//       .response = "#### 4", .ground_truth = "4"}});
//   // r[0].score == 1.0, or r[0].error says what went wrong for that row
//
// Thread safety: score() may be called from one thread at a time (it locks).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "workers/rewards/reward_registry.h"

namespace baton::rewards {

struct PythonRewardOptions {
  std::string path;                         // the .py file
  std::string function = "compute_score";   // the function in it
  std::string python = "python3";           // the interpreter (PATH is searched)
  int64_t processes = 2;                    // subprocesses in the pool
  double timeout_s = 60;                    // per row; past it the row fails
  nlohmann::json kwargs = nlohmann::json::object();  // custom_reward_function.reward_kwargs
};

struct PythonRewardResult {
  std::optional<double> score;  // set unless the row failed
  std::string error;            // why it failed: the exception, a non-number, a timeout, a death
};

class PythonRewardPool {
 public:
  // Starts the subprocesses and imports the file in each. Throws baton::Error
  // naming the file for a file that does not import (with Python's error), a
  // missing function, an interpreter that cannot start, or processes < 1.
  explicit PythonRewardPool(PythonRewardOptions options);
  ~PythonRewardPool();
  PythonRewardPool(const PythonRewardPool&) = delete;
  PythonRewardPool& operator=(const PythonRewardPool&) = delete;

  // One result per input, in order. A failed row's error names the file and
  // function; the subprocess of a row that timed out or died is replaced
  // before the next row.
  std::vector<PythonRewardResult> score(const std::vector<RewardInput>& inputs);

  const PythonRewardOptions& options() const { return options_; }

 private:
  struct Process;
  PythonRewardOptions options_;
  std::vector<std::unique_ptr<Process>> processes_;
  std::mutex mutex_;
};

}  // namespace baton::rewards
