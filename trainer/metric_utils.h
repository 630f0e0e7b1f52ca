// The metrics a PPO step reports about its batch (verl's
// trainer/ppo/metric_utils.py): sequence scores and rewards, advantages,
// returns and values, prompt and response lengths, per-phase timings and
// throughput; and reduce_metrics, which turns per-micro-batch lists into one
// number per key.
//
// The batch is the RL batch of one step (a DataProto with verl's keys):
// `responses` [N,R] gives R, `attention_mask` [N,P+R] the prompt (first P
// columns) and response (last R columns) lengths, `response_mask` [N,R] the
// tokens whose advantages, returns and values count (attention_mask's
// response part when absent). Every other tensor is optional: a key the batch
// lacks omits its metrics.
//
// Example:
//   std::map<std::string, double> m = compute_data_metrics(batch, use_critic, 1024);
//   m.merge(compute_timing_metrics(batch, timing_s));
//   m.merge(compute_throughput_metrics(batch, timing_s, world_size));
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace baton {
class DataProto;
}

namespace baton::trainer {

// Per step (keys as verl's; "mean/max/min" below means the three keys
// <name>/mean, <name>/max, <name>/min):
//   critic/score/{mean,max,min}       over rows of Σ_t token_level_scores
//   critic/rewards/{mean,max,min}     over rows of Σ_t token_level_rewards
//   critic/advantages/{mean,max,min}  over the valid response tokens
//   critic/returns/{mean,max,min}     over the valid response tokens
//   critic/values/{mean,max,min}      over the valid response tokens  } use_critic
//   critic/vf_explained_var           1 − Var(returns − values) /     } and `values`
//                                       (Var(returns) + 1e-5), unbiased variances
//   response_length/{mean,max,min,clip_ratio}  response tokens per row (attention
//                                     mask); clip_ratio: the fraction of rows
//                                     of length == max_response_length
//   prompt_length/{mean,max,min,clip_ratio}    prompt tokens per row; clip_ratio:
//                                     the fraction of rows of length == P
//                                     (prompts are left-padded to
//                                     data.max_prompt_length)
// max_response_length is data.max_response_length, passed rather than taken
// from R because a rollout may pad responses to the longest one it generated.
// Sums are over all R columns, as verl's (scores sit on valid tokens only).
// Statistics over no valid token are NaN. Computed in double on the CPU.
// Throws baton::Error for an empty batch, a batch without `responses` or
// `attention_mask`, or widths that do not agree.
std::map<std::string, double> compute_data_metrics(const DataProto& batch, bool use_critic,
                                                   int64_t max_response_length);

// timing_s/<name> for every entry of `timing_s` (seconds), and
// timing_per_token_ms/<name> = 1000 · seconds / tokens for the phases verl
// normalises: "gen" by the response tokens of the batch, "ref", "values",
// "adv", "update_critic" and "update_actor" by its prompt + response tokens
// (attention_mask). Other names get no per-token entry, nor does a phase of a
// batch with no such token.
std::map<std::string, double> compute_timing_metrics(const DataProto& batch,
                                                     const std::map<std::string, double>& timing_s);

// perf/total_num_tokens (Σ attention_mask: prompt + response tokens),
// perf/time_per_step (timing_s["step"], seconds) and perf/throughput
// (tokens / (time_per_step · n_workers): tokens per second per worker).
// Throws baton::Error when timing_s has no "step" or n_workers < 1.
std::map<std::string, double> compute_throughput_metrics(
    const DataProto& batch, const std::map<std::string, double>& timing_s, int n_workers);

// One value per key: the mean of its list; for a key whose last component
// ends in "max" or "min" ("critic/values/max", "actor/grad_max"), the max or
// min instead (today's verl.utils.metric.reduce_metrics; a mean of per-micro-
// batch maxima is no maximum). An empty list gives NaN.
std::map<std::string, double> reduce_metrics(
    const std::map<std::string, std::vector<double>>& metrics);

}  // namespace baton::trainer
