// Advantage estimators and policy losses by name: every built-in is there and
// gives what its function gives; unknown names fail naming the closest known
// one; a user's own estimator or loss is selected by its name.
#include "workers/algos/algo_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/tolerance.h"
#include "workers/algos/core_algos.h"

namespace baton::algos {
namespace {

using test::expect_close;
using test::Tolerance;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const baton::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no baton::InvalidArgument";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

AdvantageInputs inputs() {
  AdvantageInputs in;
  in.token_level_rewards = at::tensor({0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 3.0f}).reshape({3, 2});
  in.response_mask = at::ones({3, 2});
  in.uids = {"a", "b", "a"};
  in.values = at::full({3, 2}, 0.5f);
  in.reward_baselines = at::tensor({0.5f, 0.5f, 0.5f});
  in.old_log_probs = at::full({3, 2}, std::log(0.5f));
  in.sum_pi_squared = at::full({3, 2}, 0.375f);
  in.rollout_is_weights = at::tensor({1.0f, 2.0f, 1.0f, 1.0f, 0.5f, 1.0f}).reshape({3, 2});
  return in;
}

TEST(AlgoRegistry, ListsEveryBuiltInEstimatorAndLoss) {
  const std::vector<std::string> estimators = advantage_estimator_names();
  for (const char* name :
       {"gae", "grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized",
        "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
        "optimal_token_baseline", "tir_optimal_token_baseline"})
    EXPECT_EQ(std::count(estimators.begin(), estimators.end(), name), 1) << name;
  EXPECT_TRUE(std::is_sorted(estimators.begin(), estimators.end()));
  const std::vector<std::string> losses = policy_loss_names();
  for (const char* name : {"vanilla", "gspo", "sapo", "gpg", "cispo", "dro", "geo_mean", "dppo_tv",
                           "dppo_kl", "clip_cov", "kl_cov", "reinforce"})
    EXPECT_EQ(std::count(losses.begin(), losses.end(), name), 1) << name;
}

TEST(AlgoRegistry, EstimatorsByNameGiveWhatTheirFunctionsGive) {
  const AdvantageInputs in = inputs();
  AdvantageOptions o;
  o.gamma = 0.9;
  o.lam = 0.8;
  o.grpo.norm_adv_by_std = false;
  o.gpg_f_norm = 2;
  const at::Tensor& r = in.token_level_rewards;
  const at::Tensor& m = in.response_mask;
  const auto same = [&](const std::string& name, const AdvantageResult& expected) {
    const AdvantageResult got = compute_advantage(name, in, o);
    expect_close(got.advantages, expected.advantages, Tolerance::exact(), name + " advantages");
    expect_close(got.returns, expected.returns, Tolerance::exact(), name + " returns");
  };
  same("gae", compute_gae(r, in.values, m, 0.9, 0.8));
  same("grpo", compute_grpo(r, m, in.uids, o.grpo));
  same("grpo_vectorized", compute_grpo_vectorized(r, m, in.uids, o.grpo));
  same("rloo", compute_rloo(r, m, in.uids));
  same("rloo_vectorized", compute_rloo_vectorized(r, m, in.uids));
  same("reinforce_plus_plus", compute_reinforce_plus_plus(r, m, 0.9));
  same("reinforce_plus_plus_baseline", compute_reinforce_plus_plus_baseline(r, m, in.uids));
  same("remax", compute_remax(r, in.reward_baselines, m));
  same("opo", compute_opo(r, m, in.uids));
  same("gpg", compute_gpg(r, m, in.uids, 2));
  const TokenBaselineInputs policy{in.old_log_probs, in.sum_pi_squared, in.rollout_is_weights};
  same("optimal_token_baseline", compute_optimal_token_baseline(r, m, in.uids, policy));
  same("tir_optimal_token_baseline", compute_tir_optimal_token_baseline(r, m, in.uids, policy));
  AdvantageInputs pairs = in;  // pass@k needs groups of 2 or more rows
  pairs.uids = {"a", "a", "a"};
  expect_close(compute_advantage("grpo_passk", pairs, o).advantages,
               compute_grpo_passk(pairs.token_level_rewards, m, pairs.uids, o.grpo).advantages,
               Tolerance::exact(), "grpo_passk");
}

TEST(AlgoRegistry, EstimatorsNameTheInputTheyMiss) {
  AdvantageInputs in = inputs();
  in.values = at::Tensor();
  EXPECT_TRUE(contains(error_of([&] { compute_advantage("gae", in); }), "values"));
  in.uids.clear();
  EXPECT_TRUE(contains(error_of([&] { compute_advantage("grpo", in); }), "uids"));
  in.reward_baselines = at::Tensor();
  EXPECT_TRUE(contains(error_of([&] { compute_advantage("remax", in); }), "reward_baselines"));
  in = inputs();
  in.sum_pi_squared = at::Tensor();
  EXPECT_TRUE(contains(error_of([&] { compute_advantage("optimal_token_baseline", in); }),
                       "sum_pi_squared"));
  in = inputs();
  in.old_log_probs = at::Tensor();
  EXPECT_TRUE(contains(error_of([&] { compute_advantage("tir_optimal_token_baseline", in); }),
                       "old_log_probs"));
}

TEST(AlgoRegistry, UnknownNamesFailNamingTheClosestAndAllKnown) {
  const std::string e = error_of([] { compute_advantage("grpoo", inputs()); });
  EXPECT_TRUE(contains(e, "'grpoo'")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'grpo'")) << e;
  EXPECT_TRUE(contains(e, "reinforce_plus_plus_baseline")) << e;
  const std::string l = error_of([] { find_policy_loss("vanila"); });
  EXPECT_TRUE(contains(l, "'vanila'")) << l;
  EXPECT_TRUE(contains(l, "did you mean 'vanilla'")) << l;
  EXPECT_TRUE(contains(l, "kl_cov")) << l;
  const std::string far = error_of([] { find_policy_loss("zzzzzzzzzzzz"); });
  EXPECT_FALSE(contains(far, "did you mean")) << far;
}

TEST(AlgoRegistry, PolicyLossByNameIsTheBuiltIn) {
  const at::Tensor old = at::zeros({1, 3});
  const at::Tensor lp = at::tensor({0.1f, -0.3f, 0.5f}).unsqueeze(0);
  const at::Tensor a = at::tensor({1.0f, -1.0f, 2.0f}).unsqueeze(0);
  const at::Tensor m = at::ones({1, 3});
  const PolicyLossResult by_name = policy_loss("cispo", old, lp, a, m, {});
  const PolicyLossResult direct = cispo_policy_loss(old, lp, a, m, {});
  EXPECT_EQ(by_name.loss.item<double>(), direct.loss.item<double>());
  EXPECT_EQ(by_name.metrics, direct.metrics);
}

TEST(AlgoRegistry, AUsersEstimatorAndLossAreSelectedByName) {
  register_advantage_estimator(
      "test_sum_of_rewards", [](const AdvantageInputs& in, const AdvantageOptions& o) {
        const at::Tensor a = in.token_level_rewards.sum(-1, true) * o.gamma * in.response_mask;
        return AdvantageResult{a, a};
      });
  AdvantageOptions o;
  o.gamma = 2;
  const AdvantageInputs in = inputs();
  expect_close(compute_advantage("test_sum_of_rewards", in, o).advantages,
               at::tensor({2.0f, 2.0f, 0.0f, 0.0f, 6.0f, 6.0f}).reshape({3, 2}), Tolerance::exact(),
               "user estimator");
  EXPECT_TRUE(contains(error_of([] {
                         register_advantage_estimator(
                             "test_sum_of_rewards",
                             [](const AdvantageInputs&, const AdvantageOptions&) {
                               return AdvantageResult{};
                             });
                       }),
                       "already registered"));
  EXPECT_THROW(register_advantage_estimator("grpo",
                                            [](const AdvantageInputs&, const AdvantageOptions&) {
                                              return AdvantageResult{};
                                            }),
               baton::InvalidArgument);
  EXPECT_THROW(
      register_advantage_estimator(
          "", [](const AdvantageInputs&, const AdvantageOptions&) { return AdvantageResult{}; }),
      baton::InvalidArgument);
  EXPECT_THROW(register_advantage_estimator("test_empty", AdvantageEstimator()),
               baton::InvalidArgument);

  register_policy_loss(
      "test_scaled_gpg",
      [](const at::Tensor& old, const at::Tensor& lp, const at::Tensor& a, const at::Tensor& m,
         const PolicyLossOptions& opts, const std::optional<at::Tensor>& w) {
        PolicyLossResult r = gpg_policy_loss(old, lp, a, m, opts, w);
        r.loss = r.loss * 10;
        r.metrics["user/scale"] = 10;
        return r;
      });
  const at::Tensor lp = at::tensor({-0.5f, -1.0f}).unsqueeze(0);
  const at::Tensor adv = at::tensor({1.0f, -2.0f}).unsqueeze(0);
  const PolicyLossResult r = policy_loss("test_scaled_gpg", lp, lp, adv, at::ones({1, 2}), {});
  EXPECT_NEAR(r.loss.item<double>(), -7.5, 1e-6);  // 10 · gpg's −0.75
  EXPECT_EQ(r.metrics.at("user/scale"), 10);
  const std::vector<std::string> names = policy_loss_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "test_scaled_gpg"), 1);
}

}  // namespace
}  // namespace baton::algos
