#include "trainer/metric_utils.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/errors.h"
#include "dispatch/data_proto.h"

namespace baton::trainer {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A 1-D double CPU copy of `t`'s elements.
std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
  const double* p = d.data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

void add_stats(std::map<std::string, double>& out, const std::string& name,
               const std::vector<double>& xs) {
  if (xs.empty()) {
    out[name + "/mean"] = out[name + "/max"] = out[name + "/min"] = kNaN;
    return;
  }
  // A NaN element makes all three NaN, as torch's reductions.
  double sum = 0, lo = xs[0], hi = xs[0];
  for (double x : xs) {
    sum += x;
    if (std::isnan(x)) lo = hi = x;
    if (!std::isnan(lo)) lo = std::min(lo, x);
    if (!std::isnan(hi)) hi = std::max(hi, x);
  }
  out[name + "/mean"] = sum / static_cast<double>(xs.size());
  out[name + "/max"] = hi;
  out[name + "/min"] = lo;
}

// Unbiased variance (torch.var's default), NaN below two elements.
double variance(const std::vector<double>& xs) {
  if (xs.size() < 2) return kNaN;
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  double ss = 0;
  for (double x : xs) ss += (x - mean) * (x - mean);
  return ss / static_cast<double>(xs.size() - 1);
}

double fraction_equal(const std::vector<double>& xs, double value) {
  if (xs.empty()) return kNaN;
  return static_cast<double>(std::count(xs.begin(), xs.end(), value)) /
         static_cast<double>(xs.size());
}

// Prompt and response lengths per row, from attention_mask split at R.
struct Lengths {
  int64_t prompt_width = 0;  // P
  std::vector<double> prompt, response;
};

Lengths lengths_of(const DataProto& batch, const char* caller) {
  if (batch.empty()) throw Error(std::string(caller) + ": the batch has no rows");
  const at::Tensor& responses = batch.tensor("responses");
  const at::Tensor& mask = batch.tensor("attention_mask");
  if (responses.dim() != 2 || mask.dim() != 2 || mask.size(1) < responses.size(1)) {
    throw Error(std::string(caller) + ": responses " + std::to_string(responses.dim()) +
                "-D with " + std::to_string(responses.size(-1)) + " columns and attention_mask " +
                std::to_string(mask.dim()) + "-D with " + std::to_string(mask.size(-1)) +
                " columns; expected [N,R] and [N,P+R]");
  }
  const int64_t r = responses.size(1);
  const int64_t p = mask.size(1) - r;
  Lengths l;
  l.prompt_width = p;
  l.prompt = to_doubles(mask.narrow(1, 0, p).sum(1));
  l.response = to_doubles(mask.narrow(1, p, r).sum(1));
  return l;
}

double total(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return s;
}

// Elements of `t` [N,R] where `valid` [N,R] is nonzero.
std::vector<double> valid_elements(const DataProto& batch, const std::string& key,
                                   const at::Tensor& valid) {
  const at::Tensor& t = batch.tensor(key);
  if (t.sizes() != valid.sizes()) {
    throw Error("compute_data_metrics: " + key + " has shape " + c10::str(t.sizes()) +
                " but the response mask " + c10::str(valid.sizes()));
  }
  return to_doubles(t.masked_select(valid));
}

}  // namespace

std::map<std::string, double> compute_data_metrics(const DataProto& batch, bool use_critic,
                                                   int64_t max_response_length) {
  const Lengths len = lengths_of(batch, "compute_data_metrics");
  std::map<std::string, double> m;

  if (batch.has_tensor("token_level_scores")) {
    add_stats(m, "critic/score", to_doubles(batch.tensor("token_level_scores").sum(-1)));
  }
  if (batch.has_tensor("token_level_rewards")) {
    add_stats(m, "critic/rewards", to_doubles(batch.tensor("token_level_rewards").sum(-1)));
  }

  const int64_t r = batch.tensor("responses").size(1);
  const at::Tensor valid = (batch.has_tensor("response_mask")
                                ? batch.tensor("response_mask")
                                : batch.tensor("attention_mask").narrow(1, len.prompt_width, r))
                               .to(at::kCPU)
                               .ne(0);
  if (batch.has_tensor("advantages")) {
    add_stats(m, "critic/advantages", valid_elements(batch, "advantages", valid));
  }
  std::vector<double> returns;
  if (batch.has_tensor("returns")) {
    returns = valid_elements(batch, "returns", valid);
    add_stats(m, "critic/returns", returns);
  }
  if (use_critic && batch.has_tensor("values")) {
    const std::vector<double> values = valid_elements(batch, "values", valid);
    add_stats(m, "critic/values", values);
    if (batch.has_tensor("returns")) {
      std::vector<double> diff(values.size());
      for (size_t i = 0; i < values.size(); ++i) diff[i] = returns[i] - values[i];
      m["critic/vf_explained_var"] = 1.0 - variance(diff) / (variance(returns) + 1e-5);
    }
  }

  add_stats(m, "response_length", len.response);
  m["response_length/clip_ratio"] =
      fraction_equal(len.response, static_cast<double>(max_response_length));
  add_stats(m, "prompt_length", len.prompt);
  m["prompt_length/clip_ratio"] = fraction_equal(len.prompt, static_cast<double>(len.prompt_width));
  // Multi-turn rollouts (workers/roles/agent_loop.h): per-row turns, tool
  // calls, failed calls, seconds in tools and an interaction's user turns.
  for (const char* name : {"turns", "tool_calls", "tool_errors", "tool_time_s", "user_turns"}) {
    const std::string key = std::string("multi_turn_") + name;
    if (batch.has_tensor(key))
      add_stats(m, std::string("multi_turn/") + name, to_doubles(batch.tensor(key)));
  }
  return m;
}

std::map<std::string, double> compute_timing_metrics(
    const DataProto& batch, const std::map<std::string, double>& timing_s) {
  const Lengths len = lengths_of(batch, "compute_timing_metrics");
  const double response_tokens = total(len.response);
  const double overall_tokens = total(len.prompt) + response_tokens;
  const std::map<std::string, double> tokens_of_phase = {
      {"gen", response_tokens}, {"ref", overall_tokens},           {"values", overall_tokens},
      {"adv", overall_tokens},  {"update_critic", overall_tokens}, {"update_actor", overall_tokens},
  };
  std::map<std::string, double> m;
  for (const auto& [name, seconds] : timing_s) {
    m["timing_s/" + name] = seconds;
    const auto it = tokens_of_phase.find(name);
    if (it != tokens_of_phase.end() && it->second > 0) {
      m["timing_per_token_ms/" + name] = seconds * 1000.0 / it->second;
    }
  }
  return m;
}

std::map<std::string, double> compute_throughput_metrics(
    const DataProto& batch, const std::map<std::string, double>& timing_s, int n_workers) {
  const auto step = timing_s.find("step");
  if (step == timing_s.end()) {
    throw Error("compute_throughput_metrics: timing_s has no \"step\" (the whole step's seconds)");
  }
  if (n_workers < 1) {
    throw Error("compute_throughput_metrics: n_workers is " + std::to_string(n_workers) +
                "; it must be at least 1");
  }
  const double tokens = to_doubles(batch.tensor("attention_mask").sum())[0];
  return {
      {"perf/total_num_tokens", tokens},
      {"perf/time_per_step", step->second},
      {"perf/throughput", tokens / (step->second * n_workers)},
  };
}

std::map<std::string, double> reduce_metrics(
    const std::map<std::string, std::vector<double>>& metrics) {
  std::map<std::string, double> out;
  for (const auto& [key, xs] : metrics) {
    const std::string last = key.substr(key.rfind('/') + 1);  // npos + 1 == 0
    const bool is_max = last.size() >= 3 && last.compare(last.size() - 3, 3, "max") == 0;
    const bool is_min = last.size() >= 3 && last.compare(last.size() - 3, 3, "min") == 0;
    if (xs.empty()) {
      out[key] = kNaN;
    } else if (is_max) {
      out[key] = *std::max_element(xs.begin(), xs.end());
    } else if (is_min) {
      out[key] = *std::min_element(xs.begin(), xs.end());
    } else {
      out[key] = total(xs) / static_cast<double>(xs.size());
    }
  }
  return out;
}

}  // namespace baton::trainer
