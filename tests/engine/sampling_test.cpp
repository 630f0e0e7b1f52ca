// Sampling: the truncated distributions are the intended ones (checked against
// hand-computed values), and draws follow them (a chi-square test over 20000
// draws with fixed seeds; excluded tokens are never drawn).
#include "engine/rollout/sampling.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/engine/expect_error.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::test::expect_near;
using baton::test::max_abs;
using baton::test::Tolerance;
using testing::expect_error;

// log of probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04.
at::Tensor logits() {
  return at::tensor(std::vector<double>{0.4, 0.25, 0.15, 0.1, 0.06, 0.04}).log().to(at::kFloat);
}

SamplingParams params(double t, int64_t k, double p) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  return s;
}

// The distribution is computed in double from logits() rounded to fp32: a
// probability p_i ∝ exp(x_i / T) moves by p_i·(δx_i − Σ p_j·δx_j) / T, at
// most two roundings of the largest |logit| / T.
Tolerance distribution_tol(double temperature) {
  return Tolerance::fp32(2, max_abs(logits()) / temperature);
}

void expect_distribution(const at::Tensor& actual, const std::vector<double>& expected,
                         const Tolerance& tol) {
  ASSERT_EQ(actual.size(0), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i)
    expect_near(actual[i].item<double>(), expected[i], tol, "token " + std::to_string(i));
}

TEST(Sampling, DistributionsAreTheIntendedOnes) {
  auto l = logits();
  const Tolerance t1 = distribution_tol(1);
  expect_distribution(sampling_distribution(l, params(1, 0, 1)), {0.4, 0.25, 0.15, 0.1, 0.06, 0.04},
                      t1);
  // Top-k 3: the three most likely, renormalised over 0.8.
  expect_distribution(sampling_distribution(l, params(1, 3, 1)), {0.5, 0.3125, 0.1875, 0, 0, 0},
                      t1);
  // Top-p 0.7: 0.4 + 0.25 = 0.65 < 0.7, so the third joins (0.8 >= 0.7).
  expect_distribution(sampling_distribution(l, params(1, 0, 0.7)), {0.5, 0.3125, 0.1875, 0, 0, 0},
                      t1);
  // Top-p 0.64: two tokens (0.65) reach it.
  expect_distribution(sampling_distribution(l, params(1, 0, 0.64)),
                      {0.4 / 0.65, 0.25 / 0.65, 0, 0, 0, 0}, t1);
  // Temperature 0.5 squares the probabilities (then renormalises).
  std::vector<double> sq{0.16, 0.0625, 0.0225, 0.01, 0.0036, 0.0016};
  double z = 0;
  for (double v : sq) z += v;
  for (double& v : sq) v /= z;
  expect_distribution(sampling_distribution(l, params(0.5, 0, 1)), sq, distribution_tol(0.5));
  // Greedy: one-hot at the argmax, exactly.
  expect_distribution(sampling_distribution(l, params(0, 0, 1)), {1, 0, 0, 0, 0, 0},
                      Tolerance::exact());
}

TEST(Sampling, DrawsFollowTheDistribution) {
  auto l = logits();
  for (const auto& p : {params(1, 0, 1), params(0.7, 0, 1), params(1, 3, 1), params(1, 0, 0.75),
                        params(1.5, 4, 0.9)}) {
    SCOPED_TRACE(p.to_string());
    auto dist = sampling_distribution(l, p);
    const int64_t draws = 20000;
    std::vector<int64_t> counts(6, 0);
    SequenceRng rng(12345);
    for (int64_t i = 0; i < draws; ++i) ++counts[sample_token(l, p, rng).token];
    double chi2 = 0;
    int64_t dof = -1;
    for (int64_t t = 0; t < 6; ++t) {
      double e = dist[t].item<double>() * draws;
      if (e == 0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " is outside the truncation";
        continue;
      }
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++dof;
    }
    // The 99.9th percentile of chi-square with <= 5 degrees of freedom is 20.5.
    EXPECT_LT(chi2, 20.5) << "dof " << dof;
  }
}

TEST(Sampling, SameSeedSameTokensAndLogProbOfTheTemperatureScaledDistribution) {
  auto l = at::randn({50}, at::make_generator<at::CPUGeneratorImpl>(3));
  auto p = params(0.8, 10, 0.9);
  // fp32 log-softmaxes over the 50 logits (V + 3 terms) on both sides; the
  // truncated distribution's log-prob would differ by log(kept mass) ~ 0.1.
  const Tolerance lp_tol = Tolerance::fp32(50 + 3, max_abs(l) / 0.8);
  SequenceRng a = SequenceRng::for_sample(SequenceRng::request_seed(7, 3), 1);
  SequenceRng b = SequenceRng::for_sample(SequenceRng::request_seed(7, 3), 1);
  SequenceRng c = SequenceRng::for_sample(SequenceRng::request_seed(7, 3), 2);
  std::vector<int64_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    auto sa = sample_token(l, p, a);
    ta.push_back(sa.token);
    tb.push_back(sample_token(l, p, b).token);
    tc.push_back(sample_token(l, p, c).token);
    expect_near(sa.log_prob, at::log_softmax(l / 0.8, 0)[sa.token].item<double>(), lp_tol,
                "sample " + std::to_string(i));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  auto g = sample_token(l, params(0, 0, 1), a);
  EXPECT_EQ(g.token, l.argmax().item<int64_t>());
  expect_near(g.log_prob, at::log_softmax(l, 0)[g.token].item<double>(),
              Tolerance::fp32(50 + 3, max_abs(l)), "greedy");
}

// skip(k) lands where k next() calls land, for draws that wrap the state
// past 2^64 too; and a stream resumed after k sampled tokens draws what the
// uninterrupted stream draws next (one uniform per sampled token).
TEST(Sampling, SkipEqualsThatManyDraws) {
  for (uint64_t k : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}}) {
    SequenceRng stepped = SequenceRng::for_sample(SequenceRng::request_seed(9, 2), 1);
    SequenceRng skipped = stepped;
    for (uint64_t i = 0; i < k; ++i) stepped.next();
    skipped.skip(k);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(skipped.next(), stepped.next()) << "skip " << k;
  }
  // 2^64 draws come back to the start (the state moves mod 2^64).
  SequenceRng a(123), b(123);
  b.skip(~uint64_t{0});
  b.next();
  EXPECT_EQ(a.next(), b.next());

  auto l = at::randn({50}, at::make_generator<at::CPUGeneratorImpl>(4));
  auto p = params(1, 0, 1);
  SequenceRng whole = SequenceRng::for_sample(11, 0);
  std::vector<int64_t> tokens;
  for (int i = 0; i < 10; ++i) tokens.push_back(sample_token(l, p, whole).token);
  SequenceRng resumed = SequenceRng::for_sample(11, 0);
  resumed.skip(6);
  for (int i = 6; i < 10; ++i) EXPECT_EQ(sample_token(l, p, resumed).token, tokens[i]) << i;
}

// sample_tokens over a batch draws, row by row, what sample_token draws from
// that row with the same random stream: the tokens are the promise (the same
// CDF walk over the same fp64 probabilities); the log-probs come from a
// batched fp32 log-softmax over the 50 logits.
TEST(Sampling, ABatchDrawsWhatEachRowDrawsAlone) {
  auto l = at::randn({6, 50}, at::make_generator<at::CPUGeneratorImpl>(5)) * 3;
  for (const auto& p :
       {params(0, 0, 1), params(0.7, 0, 1), params(1.0, 10, 1), params(0.9, 0, 0.8)}) {
    SCOPED_TRACE(p.to_string());
    const double t = p.temperature > 0 ? p.temperature : 1.0;
    const Tolerance lp_tol = Tolerance::fp32(50 + 3, max_abs(l) / t);
    for (int draw = 0; draw < 20; ++draw) {
      std::vector<SequenceRng> batch_rngs, row_rngs;
      for (int64_t i = 0; i < 6; ++i) {
        batch_rngs.push_back(SequenceRng::for_sample(SequenceRng::request_seed(draw, i), 0));
        row_rngs.push_back(batch_rngs.back());
      }
      std::vector<SequenceRng*> streams;
      for (auto& r : batch_rngs) streams.push_back(&r);
      auto together = sample_tokens(l, p, streams);
      ASSERT_EQ(together.size(), 6u);
      for (int64_t i = 0; i < 6; ++i) {
        auto alone = sample_token(l[i], p, row_rngs[i]);
        EXPECT_EQ(together[i].token, alone.token) << "draw " << draw << " row " << i;
        expect_near(together[i].log_prob, alone.log_prob, lp_tol,
                    "draw " + std::to_string(draw) + " row " + std::to_string(i));
      }
    }
  }
  std::vector<SequenceRng> one{SequenceRng(1)};
  expect_error([&] { sample_tokens(l, params(1, 0, 1), {&one[0]}); }, {"[6, 50]", "1 streams"});
}

// A row on the GPU is sampled on the host: the same tokens and log-probs as
// the same row on the CPU, bit for bit (the same copy of the same values).
TEST(Sampling, AGpuRowDrawsWhatTheSameRowDrawsOnTheCpu_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device to put the logits on";
  auto l = at::randn({50}, at::make_generator<at::CPUGeneratorImpl>(3));
  auto gpu = l.to(at::kCUDA);
  for (const auto& p : {params(0.8, 10, 0.9), params(1, 0, 1), params(0, 0, 1)}) {
    SequenceRng a = SequenceRng::for_sample(11, 0), b = SequenceRng::for_sample(11, 0);
    for (int i = 0; i < 20; ++i) {
      auto on_cpu = sample_token(l, p, a), on_gpu = sample_token(gpu, p, b);
      EXPECT_EQ(on_gpu.token, on_cpu.token) << "draw " << i;
      EXPECT_EQ(on_gpu.log_prob, on_cpu.log_prob) << "draw " << i;
    }
    EXPECT_TRUE(at::equal(sampling_distribution(gpu, p), sampling_distribution(l, p)));
  }
}

TEST(Sampling, InvalidParamsNameTheField) {
  expect_error([] { params(-1, 0, 1).validate(10); }, {"temperature", "-1"});
  expect_error([] { params(1, -2, 1).validate(10); }, {"top_k", "-2"});
  expect_error([] { params(1, 0, 1.5).validate(10); }, {"top_p", "1.5"});
  auto p = params(1, 0, 1);
  p.n = 0;
  expect_error([&] { p.validate(10); }, {"n must be"});
  p = params(1, 0, 1);
  p.max_new_tokens = 0;
  expect_error([&] { p.validate(10); }, {"max_new_tokens"});
  p = params(1, 0, 1);
  p.stop_token_ids = {10};
  expect_error([&] { p.validate(10); }, {"stop token id 10", "[0, 10)"});
}

}  // namespace
}  // namespace baton::engine
