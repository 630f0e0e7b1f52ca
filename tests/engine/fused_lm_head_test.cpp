// fused_lm_head_log_probs_entropy in one process (tp 1): its values and the
// gradients of hidden and the weight against the unfused path it replaces,
// over chunk sizes, temperatures, vocabulary padding, large logits and bf16
// inputs; what it allocates; and its errors. The TP2 case is in
// fused_lm_head_parallel_test.cpp. Tolerances: fused_lm_head_reference.h.
#include "engine/parallel/fused_lm_head.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "engine/errors.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/fused_lm_head_reference.h"

namespace baton::engine {
namespace {

using engine::testing::expect_error;
using test::expect_close;
using test::LmHeadResults;
using test::max_abs;
using test::Tolerance;

at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

// Targets among the real rows, the first and last of them included.
at::Tensor targets_for(int64_t n, int64_t real_rows, uint64_t seed) {
  at::Tensor t = at::randint(real_rows, {n}, at::make_generator<at::CPUGeneratorImpl>(seed));
  t[0] = 0;
  if (n > 1) t[n - 1] = real_rows - 1;
  return t;
}

struct Shape {
  int64_t n = 37, h = 24, rows = 40, real_rows = 33;
};

struct Inputs {
  at::Tensor hidden, weight, targets, up_lp, up_ent;
};

Inputs make_inputs(const Shape& s, double scale = 1.0) {
  return {randn({s.n, s.h}, 1) * scale, randn({s.rows, s.h}, 2) * 0.5,
          targets_for(s.n, s.real_rows, 3), randn({s.n}, 4), randn({s.n}, 5)};
}

// The fused op on `in` (fresh leaves), both outputs backpropagated.
LmHeadResults fused(const Inputs& in, int64_t real_rows, const FusedLmHeadOptions& o,
                    at::ScalarType dtype = at::kFloat) {
  auto ps = ParallelState::single();
  at::Tensor h = in.hidden.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
  at::Tensor w = in.weight.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
  LogProbsEntropy out = fused_lm_head_log_probs_entropy(h, w, real_rows, in.targets, ps->tp(), o);
  ((out.log_probs * in.up_lp).sum() + (out.entropy * in.up_ent).sum()).backward();
  return {out.log_probs, out.entropy, h.grad(), w.grad()};
}

// The fused op against the unfused path on the same fp32 inputs.
void expect_matches_unfused(const Shape& s, const Inputs& in, const FusedLmHeadOptions& o,
                            const std::string& what) {
  auto ps = ParallelState::single();
  const double t = o.temperature;
  const LmHeadResults ref = test::unfused_lm_head(in.hidden, in.weight, s.real_rows, in.targets,
                                                  ps->tp(), t, in.up_lp, in.up_ent);
  const LmHeadResults got = fused(in, s.real_rows, o);
  const double m = test::max_scaled_logit(in.hidden, in.weight, s.real_rows, t);
  // Within 1e-5 relative plus the derived absolute part.
  auto at_most_1e5 = [](Tolerance tol) { return Tolerance{tol.atol, std::min(tol.rtol, 1e-5)}; };
  const Tolerance value = at_most_1e5(test::lm_head_value_tolerance(s.h, s.real_rows, m));
  const Tolerance grad = at_most_1e5(test::lm_head_grad_tolerance(
      s.h, s.real_rows, s.n, m, std::max(max_abs(in.up_lp), max_abs(in.up_ent)),
      std::max(max_abs(in.hidden), max_abs(in.weight)), t));
  ASSERT_EQ(got.log_probs.scalar_type(), at::kFloat);
  expect_close(got.log_probs, ref.log_probs, value, what + ": log_probs");
  expect_close(got.entropy, ref.entropy, value, what + ": entropy");
  expect_close(got.grad_hidden, ref.grad_hidden, grad, what + ": grad hidden");
  expect_close(got.grad_weight, ref.grad_weight, grad, what + ": grad weight");
  EXPECT_TRUE(got.grad_weight.narrow(0, s.real_rows, s.rows - s.real_rows).eq(0).all().item<bool>())
      << what << ": padding rows get a zero gradient";
}

TEST(FusedLmHead, MatchesUnfusedPathOverChunkSizesAndTemperatures) {
  const Shape s;  // N = 37: no chunk size below divides it
  const Inputs in = make_inputs(s);
  for (double t : {1.0, 0.7})
    for (int64_t chunk : {1, 8, 36, 37, 64, 0})
      expect_matches_unfused(s, in, FusedLmHeadOptions().set_temperature(t).set_chunk_tokens(chunk),
                             "T " + std::to_string(t) + ", chunk " + std::to_string(chunk));
  // A byte budget of a few tokens' logits.
  expect_matches_unfused(s, in, FusedLmHeadOptions().set_chunk_bytes(5 * 2 * s.rows * 4),
                         "chunk from chunk_bytes");
}

TEST(FusedLmHead, MatchesUnfusedPathWithoutPadding) {
  const Shape s{.n = 9, .h = 16, .rows = 24, .real_rows = 24};
  expect_matches_unfused(s, make_inputs(s), FusedLmHeadOptions().set_chunk_tokens(4), "no padding");
}

TEST(FusedLmHead, LargeLogitsDoNotOverflow) {
  // |logits| of several thousand: exp() of them overflows without the max
  // subtraction, and the softmax is nearly one-hot.
  const Shape s{.n = 21, .h = 24, .rows = 40, .real_rows = 35};
  const Inputs in = make_inputs(s, 1e3);
  ASSERT_GT(test::max_scaled_logit(in.hidden, in.weight, s.real_rows, 0.7), 1e3);
  expect_matches_unfused(s, in, FusedLmHeadOptions().set_temperature(0.7).set_chunk_tokens(5),
                         "large logits");
  const LmHeadResults got = fused(in, s.real_rows, FusedLmHeadOptions().set_chunk_tokens(5));
  for (const at::Tensor& t : {got.log_probs, got.entropy, got.grad_hidden, got.grad_weight})
    EXPECT_TRUE(t.isfinite().all().item<bool>());
}

TEST(FusedLmHead, Bf16InputsGiveFp32ResultsNearTheFp32Path) {
  const Shape s{.n = 19, .h = 32, .rows = 64, .real_rows = 60};
  const Inputs in = make_inputs(s);
  const int64_t chunk = 4;
  const double t = 0.7;
  const auto o = FusedLmHeadOptions().set_temperature(t).set_chunk_tokens(chunk);
  // The reference: fp32 on the bf16 values, exactly widened.
  Inputs wide = in;
  wide.hidden = in.hidden.to(at::kBFloat16).to(at::kFloat);
  wide.weight = in.weight.to(at::kBFloat16).to(at::kFloat);
  auto ps = ParallelState::single();
  const LmHeadResults ref = test::unfused_lm_head(wide.hidden, wide.weight, s.real_rows, in.targets,
                                                  ps->tp(), t, in.up_lp, in.up_ent);
  const LmHeadResults got = fused(wide, s.real_rows, o, at::kBFloat16);
  ASSERT_EQ(got.log_probs.scalar_type(), at::kFloat);
  ASSERT_EQ(got.entropy.scalar_type(), at::kFloat);
  ASSERT_EQ(got.grad_hidden.scalar_type(), at::kBFloat16);
  ASSERT_EQ(got.grad_weight.scalar_type(), at::kBFloat16);
  // Each logit is rounded to bf16 once, an absolute error up to u·m: a
  // log-prob or entropy carries its own logit's and the log-sum-exp's (2
  // roundings of magnitude m). A logit's gradient moves by up to 2u·m
  // relative through its probability, and is rounded to bf16, as are the
  // products and, per chunk, the weight's accumulation: 3 + chunks roundings
  // of the gradients, counted at m times their largest value.
  const double m = test::max_scaled_logit(wide.hidden, wide.weight, s.real_rows, t);
  const double chunks = std::ceil(double(s.n) / chunk);
  const Tolerance value = Tolerance::bf16(2, std::max(1 + std::log(double(s.real_rows)), m));
  auto grad = [&](const at::Tensor& ref_grad) {
    return Tolerance::bf16(3 + chunks, std::max(1.0, m) * max_abs(ref_grad));
  };
  expect_close(got.log_probs, ref.log_probs, value, "bf16 log_probs");
  expect_close(got.entropy, ref.entropy, value, "bf16 entropy");
  expect_close(got.grad_hidden, ref.grad_hidden, grad(ref.grad_hidden), "bf16 grad hidden");
  expect_close(got.grad_weight, ref.grad_weight, grad(ref.grad_weight), "bf16 grad weight");
}

TEST(FusedLmHead, Fp64InputsGiveFp64Results) {
  const Shape s{.n = 5, .h = 8, .rows = 12, .real_rows = 10};
  const Inputs in = make_inputs(s);
  const LmHeadResults got = fused(in, s.real_rows, FusedLmHeadOptions(), at::kDouble);
  EXPECT_EQ(got.log_probs.scalar_type(), at::kDouble);
  EXPECT_EQ(got.grad_weight.scalar_type(), at::kDouble);
  const LmHeadResults ref =
      test::fp64_lm_head(in.hidden, in.weight, s.real_rows, in.targets, 1.0, in.up_lp, in.up_ent);
  const Tolerance tight{1e-12, 1e-12};
  expect_close(got.log_probs, ref.log_probs, tight, "fp64 log_probs");
  expect_close(got.grad_weight, ref.grad_weight, tight, "fp64 grad weight");
}

TEST(FusedLmHead, OneOutputOrOneInputDifferentiated) {
  const Shape s{.n = 13, .h = 16, .rows = 20, .real_rows = 17};
  Inputs in = make_inputs(s);
  auto ps = ParallelState::single();
  const auto o = FusedLmHeadOptions().set_temperature(0.7).set_chunk_tokens(3);
  const double m = test::max_scaled_logit(in.hidden, in.weight, s.real_rows, 0.7);
  const Tolerance grad = test::lm_head_grad_tolerance(
      s.h, s.real_rows, s.n, m, std::max(max_abs(in.up_lp), max_abs(in.up_ent)),
      std::max(max_abs(in.hidden), max_abs(in.weight)), 0.7);

  // Only the entropy, then only the log-probs, carry an upstream gradient.
  for (bool entropy_only : {true, false}) {
    Inputs one = in;
    (entropy_only ? one.up_lp : one.up_ent) = at::zeros({s.n});
    const LmHeadResults ref = test::unfused_lm_head(in.hidden, in.weight, s.real_rows, in.targets,
                                                    ps->tp(), 0.7, one.up_lp, one.up_ent);
    at::Tensor h = in.hidden.clone().requires_grad_(true);
    at::Tensor w = in.weight.clone().requires_grad_(true);
    LogProbsEntropy out =
        fused_lm_head_log_probs_entropy(h, w, s.real_rows, in.targets, ps->tp(), o);
    (entropy_only ? (out.entropy * one.up_ent) : (out.log_probs * one.up_lp)).sum().backward();
    const std::string what = entropy_only ? "entropy only" : "log_probs only";
    expect_close(h.grad(), ref.grad_hidden, grad, what + ": grad hidden");
    expect_close(w.grad(), ref.grad_weight, grad, what + ": grad weight");
  }

  // Without the entropy: it is undefined, and the log-probs' gradient is the same.
  {
    Inputs lp_only = in;
    lp_only.up_ent = at::zeros({s.n});
    const LmHeadResults ref = test::unfused_lm_head(in.hidden, in.weight, s.real_rows, in.targets,
                                                    ps->tp(), 0.7, lp_only.up_lp, lp_only.up_ent);
    at::Tensor h = in.hidden.clone().requires_grad_(true);
    at::Tensor w = in.weight.clone().requires_grad_(true);
    auto no_entropy = o;
    no_entropy.set_with_entropy(false);
    LogProbsEntropy out =
        fused_lm_head_log_probs_entropy(h, w, s.real_rows, in.targets, ps->tp(), no_entropy);
    EXPECT_FALSE(out.entropy.defined());
    (out.log_probs * lp_only.up_lp).sum().backward();
    expect_close(h.grad(), ref.grad_hidden, grad, "without entropy: grad hidden");
    expect_close(w.grad(), ref.grad_weight, grad, "without entropy: grad weight");
  }

  // A frozen trunk: only the weight requires grad.
  {
    const LmHeadResults ref = test::unfused_lm_head(in.hidden, in.weight, s.real_rows, in.targets,
                                                    ps->tp(), 0.7, in.up_lp, in.up_ent);
    at::Tensor w = in.weight.clone().requires_grad_(true);
    LogProbsEntropy out =
        fused_lm_head_log_probs_entropy(in.hidden, w, s.real_rows, in.targets, ps->tp(), o);
    ((out.log_probs * in.up_lp).sum() + (out.entropy * in.up_ent).sum()).backward();
    expect_close(w.grad(), ref.grad_weight, grad, "weight only: grad weight");
  }
}

TEST(FusedLmHead, ForwardOnlyGivesTheSameValuesWithoutAGraph) {
  const Shape s;
  const Inputs in = make_inputs(s);
  auto ps = ParallelState::single();
  const auto o = FusedLmHeadOptions().set_chunk_tokens(8);
  at::Tensor h = in.hidden.clone().requires_grad_(true);
  const LogProbsEntropy with_graph =
      fused_lm_head_log_probs_entropy(h, in.weight, s.real_rows, in.targets, ps->tp(), o);
  EXPECT_TRUE(with_graph.log_probs.requires_grad());
  LogProbsEntropy plain;
  {
    at::NoGradGuard no_grad;
    plain = fused_lm_head_log_probs_entropy(h, in.weight, s.real_rows, in.targets, ps->tp(), o);
  }
  EXPECT_FALSE(plain.log_probs.requires_grad());
  EXPECT_FALSE(plain.log_probs.grad_fn());
  // One computation (same kernels, same chunks): bit for bit.
  expect_close(plain.log_probs, with_graph.log_probs, Tolerance::exact(), "no-grad log_probs");
  expect_close(plain.entropy, with_graph.entropy, Tolerance::exact(), "no-grad entropy");
  const LogProbsEntropy no_leaf =
      fused_lm_head_log_probs_entropy(in.hidden, in.weight, s.real_rows, in.targets, ps->tp(), o);
  EXPECT_FALSE(no_leaf.log_probs.requires_grad());
}

// Counts the bytes of live CPU allocations made while installed, and their
// peak: a wrapper around the CPU allocator that was current.
class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& get() {
    static auto* instance = new CountingAllocator;  // outlives every allocation it made
    return *instance;
  }
  void install() {
    base_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, kPriority);
  }
  void uninstall() { c10::SetCPUAllocator(base_, kPriority); }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = live_;
  }
  int64_t live() const { return live_; }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (n == 0 || !data) return inner;
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[data] = Block{inner.get_context(), inner.get_deleter(), static_cast<int64_t>(n)};
      inner.release_context();
      const int64_t now = live_ += static_cast<int64_t>(n);
      if (now > peak_) peak_ = now;
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static constexpr uint8_t kPriority = 255;
  struct Block {
    void* context;
    c10::DeleterFnPtr deleter;
    int64_t bytes;
  };
  static void release(void* data) {
    CountingAllocator& self = get();
    Block b;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.blocks_.find(data);
      b = it->second;
      self.blocks_.erase(it);
      self.live_ -= b.bytes;
    }
    if (b.deleter) b.deleter(b.context);
  }

  c10::Allocator* base_ = nullptr;
  std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;
  std::atomic<int64_t> live_{0};
  int64_t peak_ = 0;  // under mu_
};

// Peak bytes allocated on the CPU by `f` beyond what was live before it.
template <typename F>
int64_t peak_bytes(F&& f) {
  CountingAllocator& counter = CountingAllocator::get();
  counter.install();
  const int64_t before = counter.live();
  counter.reset_peak();
  try {
    f();
  } catch (...) {
    counter.uninstall();
    throw;
  }
  counter.uninstall();
  return counter.peak() - before;
}

TEST(FusedLmHead, PeakMemoryIsThatOfAChunkNotOfTheLogits) {
  constexpr int64_t n = 2048, v = 32000, h = 64, chunk = 256;
  const Shape s{.n = n, .h = h, .rows = v, .real_rows = v};
  const Inputs in = make_inputs(s);
  auto ps = ParallelState::single();
  constexpr int64_t logits_bytes = n * v * 4;           // 262 MB
  constexpr int64_t chunk_bytes = chunk * v * 4;        // 33 MB
  constexpr int64_t grads_bytes = (v * h + n * h) * 4;  // 8.7 MB
  // Two chunk buffers (and room for one temporary of a chunk's size in a
  // GEMM), the gradients, and O(N·H) besides.
  constexpr int64_t bound = 3 * chunk_bytes + grads_bytes + 64 * n * 4 + (int64_t{1} << 20);
  static_assert(bound < logits_bytes / 2);

  // The counter sees what the unfused path allocates: the logits at least.
  const int64_t unfused = peak_bytes([&] {
    at::NoGradGuard no_grad;
    at::Tensor logits = at::linear(in.hidden, in.weight);
    vocab_parallel_log_probs_entropy(logits, in.targets, ps->tp());
  });
  EXPECT_GE(unfused, logits_bytes);

  at::Tensor hid = in.hidden.clone().requires_grad_(true);
  at::Tensor w = in.weight.clone().requires_grad_(true);
  LogProbsEntropy out;
  const auto o = FusedLmHeadOptions().set_chunk_tokens(chunk);
  const int64_t forward = peak_bytes(
      [&] { out = fused_lm_head_log_probs_entropy(hid, w, v, in.targets, ps->tp(), o); });
  const int64_t backward = peak_bytes(
      [&] { ((out.log_probs * in.up_lp).sum() + (out.entropy * in.up_ent).sum()).backward(); });
  RecordProperty("unfused_peak_bytes", std::to_string(unfused));
  RecordProperty("forward_peak_bytes", std::to_string(forward));
  RecordProperty("backward_peak_bytes", std::to_string(backward));
  EXPECT_LE(forward, bound) << "forward peak " << forward << " bytes; the logits are "
                            << logits_bytes;
  EXPECT_LE(backward, bound) << "backward peak " << backward << " bytes; the logits are "
                             << logits_bytes;
  EXPECT_TRUE(w.grad().defined());

  // One chunk of all N tokens holds the logits: the same measure exceeds the bound.
  const int64_t one_chunk = peak_bytes([&] {
    at::NoGradGuard no_grad;
    fused_lm_head_log_probs_entropy(in.hidden, in.weight, v, in.targets, ps->tp(),
                                    FusedLmHeadOptions().set_chunk_tokens(n));
  });
  EXPECT_GT(one_chunk, bound);
}

TEST(FusedLmHead, BadInputsAreErrorsNamingTheShapes) {
  auto ps = ParallelState::single();
  const Group& tp = ps->tp();
  const at::Tensor hidden = randn({5, 8}, 1), weight = randn({12, 8}, 2);
  const at::Tensor targets = at::zeros({5}, at::kLong);
  auto call = [&](const at::Tensor& h, const at::Tensor& w, int64_t real, const at::Tensor& t,
                  FusedLmHeadOptions o = {}) {
    return [=, &tp] { fused_lm_head_log_probs_entropy(h, w, real, t, tp, o); };
  };
  expect_error(call(hidden.view({1, 5, 8}), weight, 12, targets), {"hidden", "[1, 5, 8]"});
  expect_error(call(hidden, randn({12, 7}, 2), 12, targets), {"weight_shard", "[12, 7]", "[5, 8]"});
  expect_error(call(hidden, randn({12}, 2), 12, targets), {"weight_shard", "[12]"});
  expect_error(call(hidden, weight, 12, at::zeros({4}, at::kLong)), {"targets", "[4]", "[5, 8]"});
  expect_error(call(hidden, weight, 12, at::zeros({5, 1}, at::kLong)), {"targets", "[5, 1]"});
  expect_error(call(hidden, weight, 12, at::zeros({5}, at::kInt)), {"targets", "Int"});
  expect_error(call(hidden, weight.to(at::kDouble), 12, targets), {"Float", "Double"});
  expect_error(call(hidden, weight, 13, targets), {"real_rows 13", "[12, 8]"});
  expect_error(call(hidden, weight, -1, targets), {"real_rows -1"});
  expect_error(call(hidden, weight, 12, at::full({5}, 12, at::kLong)), {"target id 12", "[0, 12)"});
  expect_error(call(hidden, weight, 12, at::full({5}, -1, at::kLong)), {"target id -1"});
  expect_error(call(hidden, weight, 12, targets, FusedLmHeadOptions().set_temperature(0)),
               {"temperature"});
  expect_error(call(hidden, weight, 12, targets, FusedLmHeadOptions().set_chunk_tokens(-2)),
               {"chunk_tokens"});
}

}  // namespace
}  // namespace baton::engine
