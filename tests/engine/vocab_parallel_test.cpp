// Log-probs and entropy of vocab-sharded logits, at tp=2 over real Gloo
// processes and at tp=1, against log_softmax of the full logits (computed in
// double from the same fp32 logits).
//
// Tolerances (tests/tolerance.h): the fp32 side sums V exponentials after
// subtracting the max (V + 3 terms: max, subtraction, sum, log), each term
// at most 1 and their log at most log V; products p·log p and p·(x − max)
// stay below 1 + log V. So values get Tolerance::fp32(V + 3, 1 + log V), and
// gradients, whose backward sums V more terms times the upstream gradient,
// Tolerance::fp32(2V + 3, (1 + log V)·max|upstream|). For logits of
// magnitude 1e5 the log-probs reach 1e4 and the relative part applies.
#include "engine/parallel/vocab_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/errors.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::max_abs;
using test::run_world;
using test::seeded_randn;
using test::Tolerance;

constexpr int64_t B = 2, S = 3, V = 8;

const Tolerance kValueTol = Tolerance::fp32(V + 3, 1 + std::log(V));

std::shared_ptr<ParallelState> tp_state(int64_t tp, int64_t rank,
                                        c10::intrusive_ptr<c10d::Store> store) {
  ParallelConfig cfg;
  cfg.tp = tp;
  return ParallelState::create(store, rank, cfg, std::chrono::seconds(60));
}

at::Tensor targets() {
  at::Tensor t = at::randint(V, {B, S}, at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);
  t[0][0] = 0;
  t[0][1] = V - 1;
  t[1][0] = V / 2;
  return t;
}

// The expected values and gradients, from the full logits in one process.
struct Reference {
  at::Tensor log_probs, entropy;
  at::Tensor grad_log_probs, grad_entropy, grad_both;  // d/d logits, [B, S, V]

  Reference(const at::Tensor& logits, const at::Tensor& tgt, const at::Tensor& up_lp,
            const at::Tensor& up_ent) {
    auto run = [&](bool lp, bool ent) {
      at::Tensor x = logits.to(at::kDouble).requires_grad_(true);
      at::Tensor logp = at::log_softmax(x, -1);
      at::Tensor l = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1);
      at::Tensor h = -(logp.exp() * logp).sum(-1);
      at::Tensor loss = at::zeros({}, at::kDouble);
      if (lp) loss = loss + (l * up_lp).sum();
      if (ent) loss = loss + (h * up_ent).sum();
      loss.backward();
      log_probs = l.detach();
      entropy = h.detach();
      return x.grad();
    };
    grad_log_probs = run(true, false);
    grad_entropy = run(false, true);
    grad_both = run(true, true);
  }
};

// Checks the three entry points on this rank's shard of `logits`.
void check_against_reference(const at::Tensor& logits, const Group& tp) {
  const at::Tensor tgt = targets();
  const at::Tensor up_lp = seeded_randn({B, S}, 4), up_ent = seeded_randn({B, S}, 5);
  const Reference ref(logits, tgt, up_lp, up_ent);
  const Tolerance grad_tol =
      Tolerance::fp32(2 * V + 3, (1 + std::log(V)) * std::max(max_abs(up_lp), max_abs(up_ent)));
  const int64_t v = V / tp.size;
  auto shard_of = [&](const at::Tensor& t) { return t.narrow(-1, tp.rank * v, v); };

  at::Tensor x = shard_of(logits).clone().requires_grad_(true);
  at::Tensor lp = vocab_parallel_log_probs(x, tgt, tp);
  EXPECT_EQ(lp.scalar_type(), at::kFloat);
  expect_close(lp, ref.log_probs, kValueTol, "log_probs");
  (lp * up_lp).sum().backward();
  expect_close(x.grad(), shard_of(ref.grad_log_probs), grad_tol, "log_probs grad");

  x = shard_of(logits).clone().requires_grad_(true);
  at::Tensor ent = vocab_parallel_entropy(x, tp);
  expect_close(ent, ref.entropy, kValueTol, "entropy");
  (ent * up_ent).sum().backward();
  expect_close(x.grad(), shard_of(ref.grad_entropy), grad_tol, "entropy grad");

  x = shard_of(logits).clone().requires_grad_(true);
  LogProbsEntropy both = vocab_parallel_log_probs_entropy(x, tgt, tp);
  expect_close(both.log_probs, ref.log_probs, kValueTol, "log_probs (both)");
  expect_close(both.entropy, ref.entropy, kValueTol, "entropy (both)");
  ((both.log_probs * up_lp).sum() + (both.entropy * up_ent).sum()).backward();
  expect_close(x.grad(), shard_of(ref.grad_both), grad_tol, "grad (both)");

  // Only one output of the pair used: the other contributes no gradient.
  x = shard_of(logits).clone().requires_grad_(true);
  both = vocab_parallel_log_probs_entropy(x, tgt, tp);
  (both.entropy * up_ent).sum().backward();
  expect_close(x.grad(), shard_of(ref.grad_entropy), grad_tol, "grad (entropy of both)");
}

at::Tensor ordinary_logits() { return seeded_randn({B, S, V}, 1) * 3.0; }

// Logits around 1e5 with spreads of 1e4: exp() of them overflows without the
// max subtraction.
at::Tensor huge_logits() { return seeded_randn({B, S, V}, 2) * 1e4 + 1e5; }

TEST(VocabParallel, MatchesFullSoftmaxAtTp2) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(2, rank, store);
    check_against_reference(ordinary_logits(), ps->tp());
    check_against_reference(huge_logits(), ps->tp());
  });
}

TEST(VocabParallel, MatchesFullSoftmaxAtTp1) {
  auto ps = ParallelState::single();
  check_against_reference(ordinary_logits(), ps->tp());
  check_against_reference(huge_logits(), ps->tp());
}

// Σ softmax² against exp(logsumexp(2l) − 2·logsumexp(l)) of the full logits
// in double (verl's calculate_sum_pi_squared_from_logits). The two sums of V
// terms (each ≤ 1) and a division: Tolerance::fp32(2V + 3, 1), relative.
void check_sum_pi_squared(const at::Tensor& logits, const Group& tp) {
  const at::Tensor x = logits.to(at::kDouble);
  const at::Tensor expected = (at::logsumexp(2 * x, -1) - 2 * at::logsumexp(x, -1)).exp();
  const int64_t v = V / tp.size;
  const at::Tensor shard = logits.narrow(-1, tp.rank * v, v).clone().requires_grad_(true);
  const at::Tensor got = vocab_parallel_sum_pi_squared(shard, tp);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_FALSE(got.requires_grad());
  expect_close(got, expected, Tolerance::fp32(2 * V + 3, 1), "sum_pi_squared");
}

// A -inf column (vocabulary padding) adds nothing.
at::Tensor padded_logits() {
  at::Tensor padded = ordinary_logits();
  padded.select(-1, V - 1).fill_(-INFINITY);
  return padded;
}

TEST(VocabParallel, SumPiSquaredMatchesTheFullSoftmaxAtTp2) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(2, rank, store);
    check_sum_pi_squared(ordinary_logits(), ps->tp());
    check_sum_pi_squared(huge_logits(), ps->tp());
    check_sum_pi_squared(padded_logits(), ps->tp());
  });
}

TEST(VocabParallel, SumPiSquaredMatchesTheFullSoftmaxAtTp1) {
  auto ps = ParallelState::single();
  check_sum_pi_squared(ordinary_logits(), ps->tp());
  check_sum_pi_squared(huge_logits(), ps->tp());
  check_sum_pi_squared(padded_logits(), ps->tp());
  // Uniform logits: Σ (1/V)² = 1/V; one-hot: 1.
  expect_close(vocab_parallel_sum_pi_squared(at::zeros({1, V}), ps->tp()),
               at::full({1}, 1.0 / V, at::kDouble), Tolerance::fp32(2 * V + 3, 1), "uniform");
  at::Tensor peaked = at::full({1, V}, -INFINITY);
  peaked[0][2] = 0.0f;
  expect_close(vocab_parallel_sum_pi_squared(peaked, ps->tp()), at::ones({1}, at::kDouble),
               Tolerance::exact(), "one-hot");
}

TEST(VocabParallel, LowPrecisionLogitsGiveFloatResultsAndGradsInTheirDtype) {
  auto ps = ParallelState::single();
  at::Tensor x = ordinary_logits().to(at::kBFloat16).requires_grad_(true);
  at::Tensor lp = vocab_parallel_log_probs(x, targets(), ps->tp());
  EXPECT_EQ(lp.scalar_type(), at::kFloat);
  lp.sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  // Both sides compute in fp32 from the same (exactly widened) values.
  expect_close(lp,
               at::log_softmax(x.detach().to(at::kFloat), -1)
                   .gather(-1, targets().unsqueeze(-1))
                   .squeeze(-1),
               kValueTol, "bf16 logits");
}

TEST(VocabParallel, BadTargetsAreErrors) {
  auto ps = ParallelState::single();
  const at::Tensor logits = ordinary_logits();
  EXPECT_THROW(vocab_parallel_log_probs(logits, at::full({B, S}, V, at::kLong), ps->tp()),
               EngineError);
  EXPECT_THROW(vocab_parallel_log_probs(logits, at::full({B, S}, -1, at::kLong), ps->tp()),
               EngineError);
  EXPECT_THROW(vocab_parallel_log_probs(logits, at::zeros({B}, at::kLong), ps->tp()), EngineError);
  EXPECT_THROW(vocab_parallel_log_probs(logits, at::zeros({B, S}, at::kInt), ps->tp()),
               EngineError);
}

}  // namespace
}  // namespace baton::engine
