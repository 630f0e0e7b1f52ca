// Sampling: the truncated distributions are the intended ones (checked against
// hand-computed values), and draws follow them (a chi-square test over 20000
// draws with fixed seeds; excluded tokens are never drawn). The device draw
// (sample_on_device) draws sample_tokens' tokens from the same uniforms.
#include "engine/rollout/sampling.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/rollout/decode_graph.h"
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

// Truncation ranks tied logits by token id: of six equal logits, top-k 3
// keeps tokens 0, 1, 2, and top-p 0.5 keeps the first three too.
TEST(Sampling, TruncationRanksTiesByTokenId) {
  auto l = at::zeros({6});
  const std::vector<double> first_three{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0, 0};
  expect_distribution(sampling_distribution(l, params(1, 3, 1)), first_three,
                      Tolerance::fp32(6, 1));
  expect_distribution(sampling_distribution(l, params(1, 0, 0.5)), first_three,
                      Tolerance::fp32(6, 1));
}

// Rows of [16, 1000] logits with what a draw can trip on: random rows at
// several scales; ties (a coarse grid, a constant row); -inf entries (half a
// row; a row with three finite logits, two of them tied, fewer than top-k).
at::Tensor hard_logits() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto l = at::randn({16, 1000}, gen);
  for (int64_t i = 0; i < 12; ++i) l[i].mul_(0.5 + i);
  l[12].mul_(6).round_().div_(2);
  l[13].fill_(1.5);
  const double inf = std::numeric_limits<double>::infinity();
  l[14].mul_(3).masked_fill_(at::rand({1000}, gen).lt(0.5), -inf);
  l[15].fill_(-inf);
  l[15][10] = 2.0;
  l[15][500] = 2.0;
  l[15][999] = 1.0;
  return l.to(at::kFloat);
}

// Greedy; without truncation at three temperatures; top-k; top-p; both.
std::vector<SamplingParams> device_params() {
  return {params(0, 0, 1),  params(1, 0, 1),     params(0.7, 0, 1),    params(1.3, 0, 1),
          params(1, 50, 1), params(0.7, 0, 0.9), params(1.3, 20, 0.8), params(1, 0, 0.3)};
}

std::vector<SequenceRng*> pointers(std::vector<SequenceRng>& rngs) {
  std::vector<SequenceRng*> out;
  for (auto& r : rngs) out.push_back(&r);
  return out;
}

struct DrawComparison {
  int64_t draws = 0;
  std::vector<std::string> mismatches;  // where, and the two tokens
};

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

// `steps` draws of every row of `logits` (on its device) with
// sample_on_device, its uniforms read ahead with peek_uniforms, against
// sample_tokens on the same logits on the host with fresh copies of the same
// streams. Lists the tokens that differ; checks the
// log-probs where the tokens agree, and that skipping the read-ahead streams
// by the tokens drawn lands where sample_tokens left its streams.
//
// The log-probs: both sides are fp32 log-softmaxes over the V logits / T
// (sample_tokens divides in fp64, then rounds), V + 3 summed terms of
// magnitude up to the largest finite |logit| / T (as in
// ABatchDrawsWhatEachRowDrawsAlone).
DrawComparison compare_with_host(const at::Tensor& logits, const SamplingParams& p, int64_t steps) {
  const int64_t b = logits.size(0), v = logits.size(1);
  const double t = p.temperature > 0 ? p.temperature : 1.0;
  const Tolerance lp_tol = Tolerance::fp32(v + 3, max_abs(logits) / t);
  std::vector<SequenceRng> device_rngs, host_rngs;
  for (int64_t i = 0; i < b; ++i)
    device_rngs.push_back(SequenceRng::for_sample(SequenceRng::request_seed(p.seed, i), 0));
  host_rngs = device_rngs;
  auto host_streams = pointers(host_rngs);
  auto uniforms = peek_uniforms(pointers(device_rngs), steps).to(logits.device());
  DrawComparison out;
  for (int64_t s = 0; s < steps; ++s) {
    DeviceSampled on_device = sample_on_device(logits, p, uniforms[s]);
    EXPECT_EQ(on_device.tokens.device(), logits.device());
    EXPECT_EQ(on_device.log_probs.device(), logits.device());
    auto tokens = on_device.tokens.cpu();
    auto log_probs = on_device.log_probs.cpu();
    auto on_host = sample_tokens(logits, p, host_streams);
    for (int64_t i = 0; i < b; ++i) {
      ++out.draws;
      const std::string where = "step " + std::to_string(s) + " row " + std::to_string(i);
      if (tokens[i].item<int64_t>() != on_host[i].token) {
        std::ostringstream line;
        line << p.to_string() << " " << where << ": device token " << tokens[i].item<int64_t>()
             << ", host " << on_host[i].token << " (u " << uniforms[s][i].item<double>() << ")";
        out.mismatches.push_back(line.str());
        continue;
      }
      expect_near(log_probs[i].item<double>(), on_host[i].log_prob, lp_tol, where);
    }
  }
  for (int64_t i = 0; i < b; ++i) {
    if (p.temperature > 0) device_rngs[i].skip(steps);
    EXPECT_EQ(device_rngs[i].next(), host_rngs[i].next()) << "stream " << i;
  }
  return out;
}

// On the CPU the device draw is sample_tokens' draw, bit for bit: the same
// fp64 softmax and cumulative sum, the same uniform, the same pick, for fp32
// and bf16 logits (both converted to fp32 first).
TEST(SamplingOnDevice, DrawsWhatSampleTokensDrawsOnTheCpu) {
  auto l = hard_logits();
  for (const auto& p : device_params()) {
    SCOPED_TRACE(p.to_string());
    auto result = compare_with_host(l, p, 20);
    EXPECT_TRUE(result.mismatches.empty()) << join(result.mismatches);
  }
  auto bf16 = l.to(at::kBFloat16);
  for (const auto& p : {params(0, 0, 1), params(1, 0, 1), params(1.3, 20, 0.8)}) {
    SCOPED_TRACE("bf16 " + p.to_string());
    auto result = compare_with_host(bf16, p, 5);
    EXPECT_TRUE(result.mismatches.empty()) << join(result.mismatches);
  }
}

TEST(SamplingOnDevice, PeekUniformsReadsAheadWithoutAdvancing) {
  std::vector<SequenceRng> rngs{SequenceRng::for_sample(SequenceRng::request_seed(3, 0), 0),
                                SequenceRng::for_sample(SequenceRng::request_seed(3, 1), 2),
                                SequenceRng(5)};
  auto streams = pointers(rngs);
  auto u = peek_uniforms(streams, 7);
  ASSERT_EQ(u.sizes(), (at::IntArrayRef{7, 3}));
  EXPECT_EQ(u.scalar_type(), at::kDouble);
  EXPECT_TRUE(u.device().is_cpu());
  EXPECT_TRUE(at::equal(peek_uniforms(streams, 7), u)) << "peeking advanced a stream";
  for (int64_t s = 0; s < 7; ++s)
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(u[s][i].item<double>(), rngs[i].uniform()) << "step " << s << " stream " << i;
  EXPECT_EQ(peek_uniforms(streams, 0).sizes(), (at::IntArrayRef{0, 3}));
  expect_error([&] { peek_uniforms(streams, -1); }, {"steps", "-1"});
}

// Chi-square of `counts` against `dist` (token t expected dist[t] · draws
// times): the statistic and its degrees of freedom; infinite when a token of
// probability 0 was drawn.
std::pair<double, int64_t> chi_square(const std::vector<int64_t>& counts, const at::Tensor& dist,
                                      int64_t draws) {
  double chi2 = 0;
  int64_t dof = -1;
  for (size_t t = 0; t < counts.size(); ++t) {
    double e = dist[t].item<double>() * draws;
    if (e == 0) {
      if (counts[t] > 0) return {std::numeric_limits<double>::infinity(), dof};
      continue;
    }
    chi2 += (counts[t] - e) * (counts[t] - e) / e;
    ++dof;
  }
  return {chi2, dof};
}

// 20000 draws of one row (the row repeated down the batch, one stream's
// successive uniforms across it) follow sampling_distribution: chi-square
// below its 99.9th percentile, the empirical CDF within the Kolmogorov-
// Smirnov bound 1.95 / sqrt(n) (99.9%, conservative for a discrete
// distribution), and never a token outside the truncation. The same counts
// against the distribution at another temperature fail the chi-square test:
// it can tell.
TEST(SamplingOnDevice, DrawsFollowTheDistribution) {
  auto l = logits();
  const int64_t draws = 20000;
  for (const auto& p : {params(1, 0, 1), params(0.7, 0, 1), params(1, 3, 1), params(1, 0, 0.75),
                        params(1.5, 4, 0.9)}) {
    SCOPED_TRACE(p.to_string());
    SequenceRng rng(12345);
    auto u = peek_uniforms({&rng}, draws).reshape({draws});
    auto tokens = sample_on_device(l.unsqueeze(0).expand({draws, 6}), p, u).tokens;
    auto bins = at::bincount(tokens, {}, 6);
    std::vector<int64_t> counts(bins.data_ptr<int64_t>(), bins.data_ptr<int64_t>() + 6);
    auto dist = sampling_distribution(l, p);
    auto [chi2, dof] = chi_square(counts, dist, draws);
    // The 99.9th percentile of chi-square with <= 5 degrees of freedom is 20.5.
    EXPECT_LT(chi2, 20.5) << "dof " << dof;
    double sup = 0, seen = 0, expected = 0;
    for (int64_t t = 0; t < 6; ++t) {
      seen += static_cast<double>(counts[t]) / draws;
      expected += dist[t].item<double>();
      sup = std::max(sup, std::abs(seen - expected));
    }
    EXPECT_LT(sup, 1.95 / std::sqrt(static_cast<double>(draws)));
    auto other = p;
    other.temperature *= 1.3;
    EXPECT_GT(chi_square(counts, sampling_distribution(l, other), draws).first, 20.5);
  }
}

TEST(SamplingOnDevice, ShapeErrorsNameTheShapes) {
  auto p = params(1, 0, 1);
  auto l = at::zeros({4, 10});
  expect_error([&] { sample_on_device(l, p, at::zeros({3}, at::kDouble)); }, {"[4, 10]", "[3]"});
  expect_error(
      [&] {
        sample_on_device(l, p, at::zeros({4, 1}, at::kDouble));
      },
      {"[4, 10]", "[4, 1]"});
  expect_error([&] { sample_on_device(l, p, at::zeros({4})); }, {"fp64", "Float"});
  expect_error([&] { sample_on_device(l, p, at::Tensor()); }, {"[4, 10]", "undefined"});
  expect_error([&] { sample_on_device(at::zeros({10}), p, at::zeros({1}, at::kDouble)); },
               {"[B, V]", "[10]"});
  expect_error(
      [&] {
        sample_on_device(at::zeros({4, 0}), p, at::zeros({4}, at::kDouble));
      },
      {"[4, 0]"});
}

// On the GPU the sums run in another order, which may move a token whose
// uniform falls within rounding (~1e-15) of a CDF boundary: over 10240
// draws, at most one in 10000 may differ (a boundary within 1e-12 of a
// uniform has probability ~1e-9 per draw). Uniforms on another device than
// the logits are refused.
TEST(SamplingOnDevice, DrawsWhatSampleTokensDraws_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device to put the logits on";
  auto l = hard_logits().to(at::kCUDA);
  DrawComparison total;
  for (const auto& p : device_params()) {
    SCOPED_TRACE(p.to_string());
    auto result = compare_with_host(l, p, 80);
    total.draws += result.draws;
    total.mismatches.insert(total.mismatches.end(), result.mismatches.begin(),
                            result.mismatches.end());
  }
  ASSERT_GE(total.draws, 10000);
  EXPECT_LE(static_cast<int64_t>(total.mismatches.size()), total.draws / 10000)
      << join(total.mismatches);
  expect_error([&] { sample_on_device(l, params(1, 0, 1), at::zeros({16}, at::kDouble)); },
               {"cuda", "cpu"});
}

// The draw captured in a CUDA graph (no host synchronisation, which capture
// refuses) and replayed with new uniforms copied into its input draws what
// the uncaptured draw draws.
TEST(SamplingOnDevice, RunsInACapturedGraph_CUDA) {
  if (!cuda_graphs_available()) GTEST_SKIP() << "no CUDA graphs in this build or process";
  auto l = hard_logits().to(at::kCUDA);
  for (const auto& p : device_params()) {
    SCOPED_TRACE(p.to_string());
    std::vector<SequenceRng> rngs;
    for (int64_t i = 0; i < 16; ++i) rngs.push_back(SequenceRng::for_sample(i, 0));
    auto uniforms = peek_uniforms(pointers(rngs), 3).to(at::kCUDA);
    auto u = uniforms[0].clone();
    DeviceSampled captured;
    CapturedStep step([&] { captured = sample_on_device(l, p, u); });
    for (int64_t s = 0; s < 3; ++s) {
      u.copy_(uniforms[s]);
      step.replay();
      auto direct = sample_on_device(l, p, uniforms[s]);
      EXPECT_TRUE(at::equal(captured.tokens, direct.tokens)) << "step " << s;
      EXPECT_TRUE(at::equal(captured.log_probs, direct.log_probs)) << "step " << s;
    }
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
