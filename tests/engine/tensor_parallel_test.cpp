// Region functions at tp=2 over real Gloo processes: forward and backward
// against what one process computes from every rank's inputs.
// Tolerances: copies and gathers are exact; a sum over the kTp ranks may add
// in another order, so it gets Tolerance::fp32(kTp, largest term)
// (tests/tolerance.h); sums of small integers are exact.
#include "engine/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/errors.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::max_abs;
using test::run_world;
using test::Tolerance;

constexpr int64_t kTp = 2;

std::shared_ptr<ParallelState> tp_state(int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
  ParallelConfig cfg;
  cfg.tp = kTp;
  return ParallelState::create(store, rank, cfg, std::chrono::seconds(60));
}

at::Tensor seeded(at::IntArrayRef shape, uint64_t seed) { return test::seeded_randn(shape, seed); }

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// The tolerance of a sum over the ranks of `a` and `b`.
Tolerance sum_tol(const at::Tensor& a, const at::Tensor& b) {
  return Tolerance::fp32(kTp, std::max(max_abs(a), max_abs(b)));
}

TEST(TensorParallel, CopyToRegionSumsGradients) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    at::Tensor x = leaf(seeded({2, 3}, 1));
    at::Tensor y = copy_to_tp_region(x, ps->tp());
    expect_close(y, x, Tolerance::exact(), "forward is the identity");
    (y * seeded({2, 3}, 100 + rank)).sum().backward();
    expect_close(x.grad(), seeded({2, 3}, 100) + seeded({2, 3}, 101),
                 sum_tol(seeded({2, 3}, 100), seeded({2, 3}, 101)), "gradient summed over ranks");
  });
}

TEST(TensorParallel, ReduceFromRegionSumsForwardOnly) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    at::Tensor x = leaf(seeded({2, 3}, 10 + rank));
    at::Tensor y = reduce_from_tp_region(x, ps->tp());
    expect_close(y, seeded({2, 3}, 10) + seeded({2, 3}, 11),
                 sum_tol(seeded({2, 3}, 10), seeded({2, 3}, 11)), "sum over ranks");
    const at::Tensor g = seeded({2, 3}, 5);  // replicated upstream gradient
    y.backward(g);
    expect_close(x.grad(), g, Tolerance::exact(), "gradient passes through");
  });
}

TEST(TensorParallel, GatherFromRegionConcatenatesLastDim) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor full = seeded({2, 3, 4}, 2);
    at::Tensor x = leaf(full.narrow(-1, 2 * rank, 2));
    at::Tensor y = gather_from_tp_region(x, ps->tp());
    expect_close(y, full, Tolerance::exact(), "gathered");
    const at::Tensor g = seeded({2, 3, 4}, 6);
    y.backward(g);
    expect_close(x.grad(), g.narrow(-1, 2 * rank, 2), Tolerance::exact(),
                 "own slice of the gradient");
  });
}

TEST(TensorParallel, ScatterToRegionKeepsOwnSliceAndGathersGradient) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor full = seeded({3, 4}, 3);
    at::Tensor x = leaf(full);
    at::Tensor y = scatter_to_tp_region(x, ps->tp());
    expect_close(y, full.narrow(-1, 2 * rank, 2), Tolerance::exact(), "own slice");
    const at::Tensor g = seeded({3, 4}, 7);
    y.backward(g.narrow(-1, 2 * rank, 2));
    expect_close(x.grad(), g, Tolerance::exact(), "gradient gathered");
    EXPECT_THROW(scatter_to_tp_region(at::ones({3, 5}), ps->tp()), EngineError);
  });
}

TEST(TensorParallel, GatherFromSequenceRegionReduceScattersGradient) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor full = seeded({2, 4, 3}, 4);
    at::Tensor x = leaf(full.narrow(1, 2 * rank, 2));
    at::Tensor y = gather_from_sequence_region(x, ps->tp());
    expect_close(y, full, Tolerance::exact(), "gathered along the sequence");
    // Each rank's gradient is partial (as after a column-parallel layer).
    y.backward(seeded({2, 4, 3}, 20 + rank));
    const at::Tensor total = seeded({2, 4, 3}, 20) + seeded({2, 4, 3}, 21);
    expect_close(x.grad(), total.narrow(1, 2 * rank, 2),
                 sum_tol(seeded({2, 4, 3}, 20), seeded({2, 4, 3}, 21)),
                 "own positions of the summed gradient");
    EXPECT_THROW(gather_from_sequence_region(at::ones({4, 3}), ps->tp()), EngineError);
  });
}

TEST(TensorParallel, ReduceScatterToSequenceRegionGathersGradient) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    at::Tensor x = leaf(seeded({2, 4, 3}, 30 + rank));
    at::Tensor y = reduce_scatter_to_sequence_region(x, ps->tp());
    const at::Tensor total = seeded({2, 4, 3}, 30) + seeded({2, 4, 3}, 31);
    expect_close(y, total.narrow(1, 2 * rank, 2),
                 sum_tol(seeded({2, 4, 3}, 30), seeded({2, 4, 3}, 31)), "own positions of the sum");
    const at::Tensor g = seeded({2, 4, 3}, 8);
    y.backward(g.narrow(1, 2 * rank, 2));
    expect_close(x.grad(), g, Tolerance::exact(), "gradient gathered along the sequence");
    EXPECT_THROW(reduce_scatter_to_sequence_region(at::ones({2, 3, 3}), ps->tp()), EngineError);
  });
}

TEST(TensorParallel, ScatterToSequenceRegionGathersGradient) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor full = seeded({2, 4, 3}, 9);
    at::Tensor x = leaf(full);
    at::Tensor y = scatter_to_sequence_region(x, ps->tp());
    expect_close(y, full.narrow(1, 2 * rank, 2), Tolerance::exact(), "own positions");
    const at::Tensor g = seeded({2, 4, 3}, 12);
    y.backward(g.narrow(1, 2 * rank, 2));
    expect_close(x.grad(), g, Tolerance::exact(), "gradient gathered along the sequence");
  });
}

TEST(TensorParallel, AllReduceGradsSumsOverTheGroup) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    at::Tensor a = leaf(at::ones({2, 2})), b = leaf(at::ones({3})), none = leaf(at::ones({1}));
    ((a * (rank + 1)).sum() + (b * (10 * (rank + 1))).sum()).backward();
    all_reduce_grads({a, none, b}, ps->tp());
    expect_close(a.grad(), at::full({2, 2}, 3.0), Tolerance::exact(), "a");
    expect_close(b.grad(), at::full({3}, 30.0), Tolerance::exact(), "b");
    EXPECT_FALSE(none.grad().defined());
  });
}

}  // namespace
}  // namespace baton::engine
