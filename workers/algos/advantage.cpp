#include "workers/algos/advantage.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "base/errors.h"
#include "workers/algos/masked_reductions.h"

namespace baton::algos {
namespace {

void check_batch(std::string_view fn, const at::Tensor& rewards, const at::Tensor& mask) {
  if (rewards.dim() != 2 || rewards.sizes() != mask.sizes())
    throw baton::InvalidArgument(std::string(fn) + ": rewards and mask must both be [B, L]; got " +
                                "rewards " + c10::str(rewards.sizes()) + " and mask " +
                                c10::str(mask.sizes()));
}

void check_uids(std::string_view fn, const at::Tensor& rewards, const Uids& uids) {
  if (static_cast<int64_t>(uids.size()) != rewards.size(0))
    throw baton::InvalidArgument(std::string(fn) + ": uids has " + std::to_string(uids.size()) +
                                " entries but the batch has " + std::to_string(rewards.size(0)) +
                                " rows (one uid per row)");
}

at::Tensor float_mask(const at::Tensor& mask, const at::Tensor& like) {
  return mask.to(like.scalar_type());
}

// The rows of each group, in order of first appearance.
std::vector<std::vector<int64_t>> group_rows(const Uids& uids) {
  std::unordered_map<std::string_view, size_t> index;
  std::vector<std::vector<int64_t>> groups;
  for (size_t i = 0; i < uids.size(); ++i) {
    auto [it, inserted] = index.try_emplace(uids[i], groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(static_cast<int64_t>(i));
  }
  return groups;
}

// Group id of each row, as an int64 tensor on `device`, and the group count.
std::pair<at::Tensor, int64_t> group_ids(const Uids& uids, at::Device device) {
  const std::vector<std::vector<int64_t>> groups = group_rows(uids);
  std::vector<int64_t> id(uids.size());
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t row : groups[g]) id[row] = static_cast<int64_t>(g);
  return {at::tensor(id, at::kLong).to(device), static_cast<int64_t>(groups.size())};
}

// s_i = Σ_t rewards[i, t] over all positions, in double on the host.
std::vector<double> row_scores(const at::Tensor& rewards) {
  const at::Tensor s = rewards.to(at::kDouble).sum(-1).cpu().contiguous();
  return std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
}

double mean_of(const std::vector<double>& s, const std::vector<int64_t>& rows) {
  double sum = 0;
  for (int64_t r : rows) sum += s[r];
  return sum / static_cast<double>(rows.size());
}

// Bessel-corrected standard deviation (rows.size() >= 2).
double std_of(const std::vector<double>& s, const std::vector<int64_t>& rows) {
  const double mean = mean_of(s, rows);
  double ss = 0;
  for (int64_t r : rows) ss += (s[r] - mean) * (s[r] - mean);
  return std::sqrt(ss / static_cast<double>(rows.size() - 1));
}

// a_i·mask[i, t] in the rewards' dtype and device (a plain product, so a NaN
// score stays NaN at every position, as in verl).
at::Tensor broadcast_rows(const std::vector<double>& a, const at::Tensor& rewards,
                          const at::Tensor& mask) {
  return at::tensor(a, at::kDouble).to(rewards.options()).unsqueeze(-1) * float_mask(mask, rewards);
}

AdvantageResult same(const at::Tensor& advantages) { return {advantages, advantages}; }

}  // namespace

AdvantageResult compute_gae(const at::Tensor& rewards, const at::Tensor& values,
                            const at::Tensor& mask, double gamma, double lam) {
  check_batch("compute_gae", rewards, mask);
  if (values.sizes() != rewards.sizes())
    throw baton::InvalidArgument("compute_gae: values must be [B, L] like rewards " +
                                c10::str(rewards.sizes()) + "; got " + c10::str(values.sizes()));
  c10::NoGradGuard no_grad;
  const int64_t length = rewards.size(1);
  const at::Tensor valid = mask.ne(0);
  at::Tensor next_value = at::zeros({rewards.size(0)}, rewards.options());
  at::Tensor last = at::zeros({rewards.size(0)}, rewards.options());
  at::Tensor raw = at::empty_like(rewards);
  for (int64_t t = length - 1; t >= 0; --t) {
    const at::Tensor v_t = values.select(1, t);
    const at::Tensor delta = rewards.select(1, t) + gamma * next_value - v_t;
    const at::Tensor candidate = delta + gamma * lam * last;
    const at::Tensor valid_t = valid.select(1, t);
    next_value = at::where(valid_t, v_t, next_value);
    last = at::where(valid_t, candidate, last);
    raw.select(1, t).copy_(last);
  }
  return {masked_whiten(raw, mask), raw + values};
}

AdvantageResult compute_grpo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids,
                             const GrpoOptions& options) {
  check_batch("compute_grpo", rewards, mask);
  check_uids("compute_grpo", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  std::vector<double> a(s.size());
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    const bool single = rows.size() == 1;
    const double mean = single ? 0.0 : mean_of(s, rows);
    const double deviation = single ? 1.0 : std_of(s, rows);
    for (int64_t r : rows)
      a[r] = options.norm_adv_by_std ? (s[r] - mean) / (deviation + options.epsilon) : s[r] - mean;
  }
  return same(broadcast_rows(a, rewards, mask));
}

AdvantageResult compute_grpo_vectorized(const at::Tensor& rewards, const at::Tensor& mask,
                                        const Uids& uids, const GrpoOptions& options) {
  check_batch("compute_grpo_vectorized", rewards, mask);
  check_uids("compute_grpo_vectorized", rewards, uids);
  c10::NoGradGuard no_grad;
  const at::Tensor scores = rewards.sum(-1);
  const auto [gid, num_groups] = group_ids(uids, rewards.device());
  const at::Tensor count =
      at::zeros({num_groups}, scores.options()).index_add_(0, gid, at::ones_like(scores));
  at::Tensor mean = at::zeros({num_groups}, scores.options()).index_add_(0, gid, scores) / count;
  const at::Tensor centered = scores - mean.index_select(0, gid);
  const at::Tensor var =
      at::zeros({num_groups}, scores.options()).index_add_(0, gid, centered.square()) /
      at::clamp_min(count - 1, 1);
  at::Tensor deviation = at::sqrt(at::clamp_min(var, 0));
  const at::Tensor single = count.eq(1);
  mean = at::where(single, at::zeros_like(mean), mean);
  deviation = at::where(single, at::ones_like(deviation), deviation);
  at::Tensor a = scores - mean.index_select(0, gid);
  if (options.norm_adv_by_std) a = a / (deviation.index_select(0, gid) + options.epsilon);
  return same(a.unsqueeze(-1) * float_mask(mask, rewards));
}

AdvantageResult compute_grpo_passk(const at::Tensor& rewards, const at::Tensor& mask,
                                   const Uids& uids, const GrpoOptions& options) {
  check_batch("compute_grpo_passk", rewards, mask);
  check_uids("compute_grpo_passk", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  std::vector<double> a(s.size(), 0.0);
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    if (rows.size() < 2)
      throw baton::InvalidArgument("compute_grpo_passk: group '" + uids[rows[0]] + "' has " +
                                  std::to_string(rows.size()) +
                                  " row; pass@k advantages need at least 2 rows per group "
                                  "(rollout.n >= 2)");
    int64_t best = rows[0];
    for (int64_t r : rows)
      if (s[r] > s[best]) best = r;
    double second = -INFINITY;
    for (int64_t r : rows)
      if (r != best) second = std::max(second, s[r]);
    double advantage = s[best] - second;
    if (options.norm_adv_by_std) advantage /= std_of(s, rows) + options.epsilon;
    a[best] = advantage;
  }
  return same(broadcast_rows(a, rewards, mask));
}

AdvantageResult compute_rloo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids) {
  check_batch("compute_rloo", rewards, mask);
  check_uids("compute_rloo", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  std::vector<double> a(s.size());
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    const double n = static_cast<double>(rows.size());
    const double mean = mean_of(s, rows);
    for (int64_t r : rows) a[r] = rows.size() == 1 ? s[r] : n / (n - 1) * (s[r] - mean);
  }
  return same(broadcast_rows(a, rewards, mask));
}

AdvantageResult compute_rloo_vectorized(const at::Tensor& rewards, const at::Tensor& mask,
                                        const Uids& uids) {
  check_batch("compute_rloo_vectorized", rewards, mask);
  check_uids("compute_rloo_vectorized", rewards, uids);
  c10::NoGradGuard no_grad;
  const at::Tensor scores = rewards.sum(-1);
  const auto [gid, num_groups] = group_ids(uids, rewards.device());
  const at::Tensor count = at::zeros({num_groups}, scores.options())
                               .index_add_(0, gid, at::ones_like(scores))
                               .index_select(0, gid);
  const at::Tensor sum =
      at::zeros({num_groups}, scores.options()).index_add_(0, gid, scores).index_select(0, gid);
  // s_i minus the mean of the others: (n·s_i − Σ s)/(n − 1); 0 for singletons.
  const at::Tensor a = at::where(count.gt(1), (count * scores - sum) / at::clamp_min(count - 1, 1),
                                 at::zeros_like(scores));
  return same(a.unsqueeze(-1) * float_mask(mask, rewards));
}

AdvantageResult compute_reinforce_plus_plus(const at::Tensor& rewards, const at::Tensor& mask,
                                            double gamma) {
  check_batch("compute_reinforce_plus_plus", rewards, mask);
  c10::NoGradGuard no_grad;
  const at::Tensor valid = mask.ne(0);
  const at::Tensor zero = at::zeros({}, rewards.options());
  at::Tensor running = at::zeros({rewards.size(0)}, rewards.options());
  at::Tensor returns = at::empty_like(rewards);
  for (int64_t t = rewards.size(1) - 1; t >= 0; --t) {
    const at::Tensor candidate = rewards.select(1, t) + gamma * running;
    const at::Tensor valid_t = valid.select(1, t);
    returns.select(1, t).copy_(at::where(valid_t, candidate, zero));
    running = at::where(valid_t, candidate, running);
  }
  const at::Tensor advantages = masked_whiten(returns, mask) * float_mask(mask, rewards);
  return {advantages, returns};
}

AdvantageResult compute_reinforce_plus_plus_baseline(const at::Tensor& rewards,
                                                     const at::Tensor& mask, const Uids& uids) {
  check_batch("compute_reinforce_plus_plus_baseline", rewards, mask);
  check_uids("compute_reinforce_plus_plus_baseline", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  std::vector<double> a(s.size());
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    const double mean = rows.size() == 1 ? 0.0 : mean_of(s, rows);
    for (int64_t r : rows) a[r] = s[r] - mean;
  }
  const at::Tensor m = float_mask(mask, rewards);
  return same(masked_whiten(broadcast_rows(a, rewards, mask), mask) * m);
}

AdvantageResult compute_remax(const at::Tensor& rewards, const at::Tensor& reward_baselines,
                              const at::Tensor& mask) {
  check_batch("compute_remax", rewards, mask);
  if (reward_baselines.dim() != 1 || reward_baselines.size(0) != rewards.size(0))
    throw baton::InvalidArgument(
        "compute_remax: reward_baselines must be [B] with B = " + std::to_string(rewards.size(0)) +
        "; got " + c10::str(reward_baselines.sizes()));
  c10::NoGradGuard no_grad;
  const at::Tensor m = float_mask(mask, rewards);
  const at::Tensor kept = at::where(mask.ne(0), rewards, at::zeros({}, rewards.options()));
  const at::Tensor returns = kept.flip({-1}).cumsum(-1).flip({-1});
  const at::Tensor advantages = returns - reward_baselines.to(rewards.options()).unsqueeze(-1) * m;
  return {advantages, returns};
}

AdvantageResult compute_opo(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids) {
  check_batch("compute_opo", rewards, mask);
  check_uids("compute_opo", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  const std::vector<double> len = row_scores(mask.ne(0).to(at::kDouble));
  std::vector<double> a(s.size());
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    double weighted = 0, total_len = 0;
    for (int64_t r : rows) {
      weighted += len[r] * s[r];
      total_len += len[r];
    }
    const double baseline = rows.size() == 1 ? 0.0 : weighted / total_len;
    for (int64_t r : rows) a[r] = s[r] - baseline;
  }
  return same(broadcast_rows(a, rewards, mask));
}

AdvantageResult compute_gpg(const at::Tensor& rewards, const at::Tensor& mask, const Uids& uids,
                            double f_norm) {
  check_batch("compute_gpg", rewards, mask);
  check_uids("compute_gpg", rewards, uids);
  c10::NoGradGuard no_grad;
  const std::vector<double> s = row_scores(rewards);
  const auto nonzero = std::count_if(s.begin(), s.end(), [](double x) { return x != 0; });
  const double alpha =
      static_cast<double>(s.size()) / static_cast<double>(std::max<int64_t>(1, nonzero));
  std::vector<double> a(s.size());
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    const double mean = rows.size() == 1 ? 0.0 : mean_of(s, rows);
    for (int64_t r : rows) a[r] = alpha * (s[r] - mean) / f_norm;
  }
  return same(broadcast_rows(a, rewards, mask));
}

namespace {

// The reward-to-go G and the realized energy W of the OTB estimators.
struct ReturnsAndEnergy {
  at::Tensor returns, energy, mask;  // [B, L]; mask in the rewards' dtype
};

ReturnsAndEnergy returns_and_energy(std::string_view fn, const at::Tensor& rewards,
                                    const at::Tensor& mask, const TokenBaselineInputs& policy) {
  auto check = [&](const at::Tensor& t, const char* name, bool required) {
    if (!t.defined()) {
      if (!required) return;
      throw baton::InvalidArgument(std::string(fn) + ": needs " + name + " [B, L]");
    }
    if (t.sizes() != rewards.sizes())
      throw baton::InvalidArgument(std::string(fn) + ": " + name + " must be [B, L] like rewards " +
                                   c10::str(rewards.sizes()) + "; got " + c10::str(t.sizes()));
  };
  check(policy.old_log_probs, "old_log_probs", true);
  check(policy.sum_pi_squared, "sum_pi_squared", true);
  check(policy.rollout_is_weights, "rollout_is_weights", false);
  ReturnsAndEnergy out;
  out.mask = float_mask(mask, rewards);
  out.returns = (rewards * out.mask).flip({-1}).cumsum(-1).flip({-1});
  // ||s_t||² ≈ 1 − 2π_t + Σπ² (the logit-gradient proxy), scaled by ρ̄² under
  // truncated IS, accumulated from the response's start.
  at::Tensor w = 1.0 - 2.0 * policy.old_log_probs.to(rewards.scalar_type()).exp() +
                 policy.sum_pi_squared.to(rewards.scalar_type());
  if (policy.rollout_is_weights.defined())
    w = w * policy.rollout_is_weights.to(rewards.scalar_type()).square();
  out.energy = (w * out.mask).cumsum(-1);
  return out;
}

std::vector<int64_t> row_lengths(const at::Tensor& mask) {
  const at::Tensor len = mask.ne(0).sum(-1).to(at::kLong).cpu().contiguous();
  return std::vector<int64_t>(len.data_ptr<int64_t>(), len.data_ptr<int64_t>() + len.numel());
}

// handle_zero_tail: the group's row (an index into `rows`) that is strictly
// the longest and the second-longest length, or nothing.
std::optional<std::pair<int64_t, int64_t>> zero_tail(const std::vector<int64_t>& rows,
                                                     const std::vector<int64_t>& lengths) {
  std::vector<int64_t> sorted;
  for (int64_t r : rows) sorted.push_back(lengths[r]);
  std::sort(sorted.begin(), sorted.end());
  const int64_t longest = sorted.back(), second = sorted[sorted.size() - 2];
  if (longest == second) return std::nullopt;  // also: no row is the unique longest
  for (int64_t r : rows)
    if (lengths[r] == longest) return std::pair{r, second};
  return std::nullopt;
}

at::Tensor index_of(const std::vector<int64_t>& rows, at::Device device) {
  return at::tensor(rows, at::kLong).to(device);
}

}  // namespace

AdvantageResult compute_optimal_token_baseline(const at::Tensor& rewards, const at::Tensor& mask,
                                               const Uids& uids, const TokenBaselineInputs& policy,
                                               const TokenBaselineOptions& options) {
  check_batch("compute_optimal_token_baseline", rewards, mask);
  check_uids("compute_optimal_token_baseline", rewards, uids);
  c10::NoGradGuard no_grad;
  const ReturnsAndEnergy g =
      returns_and_energy("compute_optimal_token_baseline", rewards, mask, policy);
  const std::vector<int64_t> lengths = row_lengths(mask);
  at::Tensor baselines = at::zeros_like(g.returns);
  for (const std::vector<int64_t>& rows : group_rows(uids)) {
    if (rows.size() == 1) continue;  // no baseline: the advantage is the return
    const at::Tensor idx = index_of(rows, rewards.device());
    const at::Tensor returns = g.returns.index_select(0, idx);
    const at::Tensor energy = g.energy.index_select(0, idx) * g.mask.index_select(0, idx);
    const at::Tensor b = (returns * energy).sum(0) / (energy.sum(0) + options.epsilon);
    baselines.index_copy_(0, idx, b.unsqueeze(0).expand({idx.size(0), b.size(0)}).contiguous());
    if (options.handle_zero_tail)
      if (auto tail = zero_tail(rows, lengths))
        baselines[tail->first].narrow(0, tail->second, baselines.size(1) - tail->second).zero_();
  }
  return {(g.returns - baselines) * g.mask, g.returns};
}

AdvantageResult compute_tir_optimal_token_baseline(const at::Tensor& rewards,
                                                   const at::Tensor& mask, const Uids& uids,
                                                   const TokenBaselineInputs& policy,
                                                   const TokenBaselineOptions& options) {
  check_batch("compute_tir_optimal_token_baseline", rewards, mask);
  check_uids("compute_tir_optimal_token_baseline", rewards, uids);
  c10::NoGradGuard no_grad;
  const ReturnsAndEnergy g =
      returns_and_energy("compute_tir_optimal_token_baseline", rewards, mask, policy);
  const int64_t batch = rewards.size(0);
  const std::vector<int64_t> lengths = row_lengths(mask);
  const int64_t width = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  // Each row's valid tokens packed to the left: column k is its k-th token.
  std::vector<at::Tensor> positions(static_cast<size_t>(batch));
  at::Tensor packed_energy = at::zeros({batch, width}, g.energy.options());
  at::Tensor packed_returns = at::zeros({batch, width}, g.returns.options());
  for (int64_t i = 0; i < batch; ++i) {
    if (lengths[i] == 0) continue;
    positions[i] = mask[i].ne(0).nonzero().squeeze(-1);
    packed_energy[i].narrow(0, 0, lengths[i]).copy_(g.energy[i].index_select(0, positions[i]));
    packed_returns[i].narrow(0, 0, lengths[i]).copy_(g.returns[i].index_select(0, positions[i]));
  }
  at::Tensor baselines = at::zeros_like(packed_returns);
  for (const std::vector<int64_t>& all_rows : group_rows(uids)) {
    std::vector<int64_t> rows;  // rows without a valid token take no part
    for (int64_t r : all_rows)
      if (lengths[r] > 0) rows.push_back(r);
    if (rows.size() < 2) continue;  // a singleton keeps its return
    const at::Tensor idx = index_of(rows, rewards.device());
    const at::Tensor energy = packed_energy.index_select(0, idx);
    const at::Tensor b =
        (packed_returns.index_select(0, idx) * energy).sum(0) / (energy.sum(0) + options.epsilon);
    baselines.index_copy_(0, idx, b.unsqueeze(0).expand({idx.size(0), width}).contiguous());
    if (options.handle_zero_tail)
      if (auto tail = zero_tail(rows, lengths))
        baselines[tail->first].narrow(0, tail->second, width - tail->second).zero_();
  }
  const at::Tensor packed_advantages = packed_returns - baselines;
  at::Tensor advantages = at::zeros_like(g.returns);
  for (int64_t i = 0; i < batch; ++i)
    if (lengths[i] > 0)
      advantages[i].index_copy_(0, positions[i], packed_advantages[i].narrow(0, 0, lengths[i]));
  return {advantages * g.mask, g.returns};
}

}  // namespace baton::algos
