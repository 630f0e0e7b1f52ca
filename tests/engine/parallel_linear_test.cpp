// Column/row-parallel linears and the vocab-parallel embedding at tp=2 over
// real Gloo processes, against dense layers with the same weights.
// Tolerances (tests/tolerance.h): the MLP sums the same fp32 terms in other
// orders (a partial sum per rank), so it gets the rounding of its longest
// chain at the magnitude of its activations and gradients (DenseMlp::tol);
// an embedding lookup copies rows and adds zeros from the other ranks, so its
// output is exact, and its weight gradient sums up to B·S upstream rows.
#include "engine/parallel/parallel_linear.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::max_abs;
using test::run_world;
using test::seeded_randn;
using test::Tolerance;

constexpr int64_t kTp = 2;
constexpr int64_t B = 2, S = 4, H = 4, F = 6, V = 8;

std::shared_ptr<ParallelState> tp_state(int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
  ParallelConfig cfg;
  cfg.tp = kTp;
  return ParallelState::create(store, rank, cfg, std::chrono::seconds(60));
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

void assign(at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.copy_(value);
}

// An MLP, x -> fc2(gelu(fc1(x))), with the same weights everywhere.
struct DenseMlp {
  at::Tensor w1 = leaf(seeded_randn({F, H}, 1) * 0.5), b1 = leaf(seeded_randn({F}, 2));
  at::Tensor w2 = leaf(seeded_randn({H, F}, 3) * 0.5), b2 = leaf(seeded_randn({H}, 4));
  at::Tensor x = leaf(seeded_randn({B, S, H}, 5));
  at::Tensor upstream = seeded_randn({B, S, H}, 6);
  at::Tensor y;
  // The longest chain is a weight's gradient: fc1 (H terms and a bias), fc2
  // (F and a bias, split in kTp partial sums), back through fc2 and fc1 (H +
  // F), and the sum over the B·S positions; every term is at most the
  // largest activation or gradient.
  Tolerance tol;

  DenseMlp() {
    at::Tensor h = at::linear(x, w1, b1);
    y = at::linear(at::gelu(h), w2, b2);
    (y * upstream).sum().backward();
    double m = 0;
    for (const at::Tensor& t :
         {x, h, y, upstream, x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()})
      m = std::max(m, max_abs(t));
    tol = Tolerance::fp32((H + 1) + (F + 1 + kTp) + (H + F) + B * S, m);
  }
};

struct ParallelMlp {
  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};

  ParallelMlp(const DenseMlp& dense, const Group& tp, bool gather_output, bool sequence_parallel) {
    fc1 = ColumnParallelLinear(ColumnParallelLinearOptions{.in_features = H,
                                                           .out_features = F,
                                                           .bias = true,
                                                           .gather_output = gather_output,
                                                           .sequence_parallel = sequence_parallel},
                               tp);
    fc2 = RowParallelLinear(RowParallelLinearOptions{.in_features = F,
                                                     .out_features = H,
                                                     .bias = true,
                                                     .input_is_parallel = !gather_output,
                                                     .sequence_parallel = sequence_parallel},
                            tp);
    const int64_t f = F / tp.size;
    assign(fc1->weight, dense.w1.narrow(0, tp.rank * f, f));
    assign(fc1->bias, dense.b1.narrow(0, tp.rank * f, f));
    assign(fc2->weight, dense.w2.narrow(1, tp.rank * f, f));
    assign(fc2->bias, dense.b2);
  }

  at::Tensor forward(const at::Tensor& x) { return fc2(at::gelu(fc1(x))); }

  // Parameter gradients against the dense ones, sliced as the layout says.
  void expect_grads(const DenseMlp& dense, const Group& tp) {
    const int64_t f = F / tp.size;
    expect_close(fc1->weight.grad(), dense.w1.grad().narrow(0, tp.rank * f, f), dense.tol,
                 "fc1 weight grad");
    expect_close(fc1->bias.grad(), dense.b1.grad().narrow(0, tp.rank * f, f), dense.tol,
                 "fc1 bias grad");
    expect_close(fc2->weight.grad(), dense.w2.grad().narrow(1, tp.rank * f, f), dense.tol,
                 "fc2 weight grad");
    expect_close(fc2->bias.grad(), dense.b2.grad(), dense.tol, "fc2 bias grad");
  }
};

TEST(ParallelLinear, ColumnThenRowMatchesDenseMlp) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    DenseMlp dense;
    ParallelMlp mlp(dense, ps->tp(), /*gather_output=*/false, /*sequence_parallel=*/false);
    EXPECT_EQ(mlp.fc1->weight.sizes(), (std::vector<int64_t>{F / kTp, H}));
    EXPECT_EQ(mlp.fc2->weight.sizes(), (std::vector<int64_t>{H, F / kTp}));
    EXPECT_EQ(mlp.fc1->named_parameters().keys(), (std::vector<std::string>{"weight", "bias"}));

    at::Tensor x = leaf(dense.x);
    at::Tensor y = mlp.forward(x);
    expect_close(y, dense.y, dense.tol, "output");
    (y * dense.upstream).sum().backward();
    expect_close(x.grad(), dense.x.grad(), dense.tol, "input grad");
    mlp.expect_grads(dense, ps->tp());
  });
}

TEST(ParallelLinear, GatheredColumnOutputFeedsUnsplitRowInput) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    DenseMlp dense;
    ParallelMlp mlp(dense, ps->tp(), /*gather_output=*/true, /*sequence_parallel=*/false);
    at::Tensor x = leaf(dense.x);
    at::Tensor h = mlp.fc1(x);
    EXPECT_EQ(h.sizes(), (std::vector<int64_t>{B, S, F}));  // gathered
    at::Tensor y = mlp.fc2(at::gelu(h));
    expect_close(y, dense.y, dense.tol, "output");
    (y * dense.upstream).sum().backward();
    expect_close(x.grad(), dense.x.grad(), dense.tol, "input grad");
    mlp.expect_grads(dense, ps->tp());
  });
}

TEST(ParallelLinear, SequenceParallelMlpMatchesDenseOnOwnPositions) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    DenseMlp dense;
    ParallelMlp mlp(dense, ps->tp(), /*gather_output=*/false, /*sequence_parallel=*/true);
    const int64_t s = S / kTp;
    at::Tensor x = leaf(dense.x.narrow(1, rank * s, s));
    at::Tensor y = mlp.forward(x);
    expect_close(y, dense.y.narrow(1, rank * s, s), dense.tol, "output positions");
    (y * dense.upstream.narrow(1, rank * s, s)).sum().backward();
    expect_close(x.grad(), dense.x.grad().narrow(1, rank * s, s), dense.tol, "input grad");
    // The bias sees only this rank's positions: complete its gradient over tp.
    all_reduce_grads({mlp.fc2->bias}, ps->tp());
    mlp.expect_grads(dense, ps->tp());
  });
}

at::Tensor token_ids() {
  at::Tensor ids = at::randint(V, {B, S}, at::make_generator<at::CPUGeneratorImpl>(7), at::kLong);
  ids[0][0] = 0;  // ids from both halves of the vocabulary, and the edges
  ids[0][1] = V - 1;
  ids[1][0] = V / 2;
  ids[1][1] = V / 2 - 1;
  return ids;
}

TEST(ParallelLinear, VocabParallelEmbeddingMatchesDense) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor ids = token_ids();
    at::Tensor table = leaf(seeded_randn({V, H}, 8));
    at::Tensor dense = at::embedding(table, ids);
    const at::Tensor upstream = seeded_randn({B, S, H}, 9);
    (dense * upstream).sum().backward();

    VocabParallelEmbedding emb(VocabParallelEmbeddingOptions{.vocab_size = V, .hidden_size = H},
                               ps->tp());
    const int64_t v = V / kTp;
    EXPECT_EQ(emb->vocab_start(), rank * v);
    EXPECT_EQ(emb->vocab_end(), (rank + 1) * v);
    assign(emb->weight, table.narrow(0, rank * v, v));
    at::Tensor out = emb(ids);
    expect_close(out, dense, Tolerance::exact(), "embedding");
    (out * upstream).sum().backward();
    expect_close(emb->weight.grad(), table.grad().narrow(0, rank * v, v),
                 Tolerance::fp32(B * S, max_abs(upstream)), "weight grad");
  });
}

TEST(ParallelLinear, SequenceParallelEmbeddingReturnsOwnPositions) {
  run_world(kTp, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto ps = tp_state(rank, store);
    const at::Tensor ids = token_ids();
    at::Tensor table = leaf(seeded_randn({V, H}, 8));
    at::Tensor dense = at::embedding(table, ids);
    const at::Tensor upstream = seeded_randn({B, S, H}, 9);
    (dense * upstream).sum().backward();

    VocabParallelEmbedding emb(
        VocabParallelEmbeddingOptions{.vocab_size = V, .hidden_size = H, .sequence_parallel = true},
        ps->tp());
    const int64_t v = V / kTp, s = S / kTp;
    assign(emb->weight, table.narrow(0, rank * v, v));
    at::Tensor out = emb(ids);
    expect_close(out, dense.narrow(1, rank * s, s), Tolerance::exact(), "own positions");
    (out * upstream.narrow(1, rank * s, s)).sum().backward();
    expect_close(emb->weight.grad(), table.grad().narrow(0, rank * v, v),
                 Tolerance::fp32(B * S, max_abs(upstream)), "weight grad");
  });
}

// Layer construction checks need no peers: a Group that claims two ranks.
TEST(ParallelLinear, SizesNotDivisibleByTpAreErrorsNamingTheLayer) {
  auto single = ParallelState::single();
  const Group tp2{single->tp().pg, 0, 2, {0, 1}};
  try {
    ColumnParallelLinear(ColumnParallelLinearOptions{.in_features = 4, .out_features = 5}, tp2);
    FAIL() << "accepted out_features 5 at tp 2";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("ColumnParallelLinear(in_features=4, out_features=5)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      RowParallelLinear(RowParallelLinearOptions{.in_features = 5, .out_features = 4}, tp2),
      EngineError);
  EXPECT_THROW(
      VocabParallelEmbedding(VocabParallelEmbeddingOptions{.vocab_size = 7, .hidden_size = 4}, tp2),
      EngineError);
  EXPECT_THROW(ColumnParallelLinear(ColumnParallelLinearOptions{.in_features = 4,
                                                                .out_features = 4,
                                                                .gather_output = true,
                                                                .sequence_parallel = true},
                                    tp2),
               EngineError);
  EXPECT_THROW(RowParallelLinear(RowParallelLinearOptions{.in_features = 4,
                                                          .out_features = 4,
                                                          .input_is_parallel = false,
                                                          .sequence_parallel = true},
                                 tp2),
               EngineError);
}

TEST(ParallelLinear, SingleRankLayersAreDenseLayers) {
  auto ps = ParallelState::single();
  ColumnParallelLinear col(ColumnParallelLinearOptions{.in_features = H, .out_features = F},
                           ps->tp());
  EXPECT_FALSE(col->bias.defined());
  EXPECT_EQ(col->named_parameters().size(), 1u);
  const at::Tensor x = seeded_randn({B, S, H}, 3);
  // The same at::linear on the same inputs: bit-identical.
  expect_close(col(x), at::linear(x, col->weight), Tolerance::exact(), "column linear at tp 1");
  VocabParallelEmbedding emb(VocabParallelEmbeddingOptions{.vocab_size = V, .hidden_size = H},
                             ps->tp());
  expect_close(emb(token_ids()), at::embedding(emb->weight, token_ids()), Tolerance::exact(),
               "embedding");
  EXPECT_THROW(emb(at::full({1, 2}, V, at::kLong)), EngineError);  // id outside the vocabulary
}

}  // namespace
}  // namespace baton::engine
