// The cost of a Python reward file (custom_reward_function.path): rows scored
// per second by the pool of python subprocesses (workers/rewards/
// python_reward.h), against the same rule compiled in (the built-in gsm8k).
//
//   build/bench/python_reward_bench [--rows 1000] [--rounds 5] [--python python3]
//
// The Python function is GSM8K's strict rule, as verl's gsm8k.compute_score
// writes it (a regex for "#### n", the last match against the ground truth).
// Prints one JSON object: per process count (1, 2, 4), the median seconds per
// 1,000 rows and the overhead per row over the built-in.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "workers/rewards/python_reward.h"
#include "workers/rewards/reward_registry.h"

namespace {

constexpr const char* kReward = R"PY(
import re
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
    if not solutions:
        return 0.0
    return 1.0 if solutions[-1].replace(",", "").replace("$", "") == ground_truth else 0.0
)PY";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 1000, rounds = 5;
  std::string python = "python3";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rows") rows = std::atoll(value.c_str());
    else if (flag == "--rounds") rounds = std::atoll(value.c_str());
    else if (flag == "--python") python = value;
    else {
      std::fprintf(stderr, "python_reward_bench: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  namespace fs = std::filesystem;
  const fs::path file = fs::temp_directory_path() / ("baton_reward_bench_" + std::to_string(getpid()) + ".py");
  std::ofstream(file) << kReward;
  std::vector<std::string> responses, truths;
  for (int64_t i = 0; i < rows; ++i) {
    responses.push_back("Let me think step by step. 12 + " + std::to_string(i) + " = " +
                        std::to_string(12 + i) + ". #### " + std::to_string(12 + i + i % 2));
    truths.push_back(std::to_string(12 + i));
  }
  std::vector<baton::rewards::RewardInput> inputs;
  for (int64_t i = 0; i < rows; ++i)
    inputs.push_back({.data_source = "openai/gsm8k", .response = responses[i], .ground_truth = truths[i]});
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // The built-in, on this thread.
  std::vector<double> builtin;
  const baton::rewards::RewardFunction gsm8k = baton::rewards::find_reward_function("gsm8k");
  double check = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto t = Clock::now();
    for (const auto& in : inputs) check += gsm8k(in);
    builtin.push_back(seconds(t));
  }
  nlohmann::json out = {{"rows", rows}, {"rounds", rounds}};
  out["builtin_s_per_1000_rows"] = median(builtin) * 1000.0 / static_cast<double>(rows);
  double python_check = 0;
  for (int64_t processes : {1, 2, 4}) {
    baton::rewards::PythonRewardOptions o;
    o.path = file.string();
    o.python = python;
    o.processes = processes;
    const auto start = Clock::now();
    baton::rewards::PythonRewardPool pool(o);
    const double startup = seconds(start);
    std::vector<double> times;
    for (int64_t r = 0; r < rounds; ++r) {
      const auto t = Clock::now();
      const auto results = pool.score(inputs);
      times.push_back(seconds(t));
      python_check = 0;
      for (const auto& x : results) python_check += x.score.value_or(-1e9);
    }
    const double per_1000 = median(times) * 1000.0 / static_cast<double>(rows);
    out["python"][std::to_string(processes) + "_processes"] = {
        {"startup_s", startup},
        {"s_per_1000_rows", per_1000},
        {"overhead_us_per_row", (per_1000 - out["builtin_s_per_1000_rows"].get<double>()) * 1000.0}};
  }
  out["same_scores"] = python_check == check / static_cast<double>(rounds);
  fs::remove(file);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
