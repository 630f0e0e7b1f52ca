// fused_lm_head_log_probs_entropy at tp 2 over real Gloo processes, each rank
// holding half of a padded vocabulary: its results are replicated and equal
// the whole vocabulary's in one process (the fused op at tp 1, and fp64
// log_softmax), each weight shard's gradient is those rows of the whole
// weight's, and hidden's gradient summed over the ranks (by
// copy_to_tp_region's backward) is the whole one. Tolerances:
// fused_lm_head_reference.h.
#include "engine/parallel/fused_lm_head.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>

#include "engine/parallel/tensor_parallel.h"
#include "tests/engine/fused_lm_head_reference.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::LmHeadResults;
using test::max_abs;
using test::run_world;
using test::seeded_randn;
using test::Tolerance;

constexpr int64_t N = 11, H = 16, kRows = 8, kChunk = 4;  // kRows per rank, 2 ranks
constexpr double kTemperature = 0.7;

// real_vocab of the 2·kRows rows are tokens, the rest padding at the end (as
// vocab_padding.h pads): rank k holds real_vocab − k·kRows of them, clamped.
void check_tp2(int64_t rank, c10::intrusive_ptr<c10d::Store> store, int64_t real_vocab) {
  ParallelConfig cfg;
  cfg.tp = 2;
  auto ps = ParallelState::create(store, rank, cfg, std::chrono::seconds(60));
  const Group& tp = ps->tp();
  const at::Tensor hidden = seeded_randn({N, H}, 1), weight = seeded_randn({2 * kRows, H}, 2);
  at::Tensor targets =
      at::randint(real_vocab, {N}, at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);
  targets[0] = 0;
  targets[N - 1] = real_vocab - 1;
  const at::Tensor up_lp = seeded_randn({N}, 4), up_ent = seeded_randn({N}, 5);
  const auto o = FusedLmHeadOptions().set_temperature(kTemperature).set_chunk_tokens(kChunk);

  // One process, the whole vocabulary.
  const LmHeadResults exact =
      test::fp64_lm_head(hidden, weight, real_vocab, targets, kTemperature, up_lp, up_ent);
  LmHeadResults whole;
  {
    auto single = ParallelState::single();
    at::Tensor h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    LogProbsEntropy out =
        fused_lm_head_log_probs_entropy(h, w, real_vocab, targets, single->tp(), o);
    ((out.log_probs * up_lp).sum() + (out.entropy * up_ent).sum()).backward();
    whole = {out.log_probs, out.entropy, h.grad(), w.grad()};
  }

  // This rank's half.
  const int64_t real_rows = std::clamp<int64_t>(real_vocab - rank * kRows, 0, kRows);
  at::Tensor h = hidden.clone().requires_grad_(true);
  at::Tensor w = weight.narrow(0, rank * kRows, kRows).clone().requires_grad_(true);
  LogProbsEntropy out =
      fused_lm_head_log_probs_entropy(copy_to_tp_region(h, tp), w, real_rows, targets, tp, o);
  ((out.log_probs * up_lp).sum() + (out.entropy * up_ent).sum()).backward();

  // Replicated: every rank has rank 0's results, bit for bit.
  for (const at::Tensor& r : {out.log_probs, out.entropy}) {
    const at::Tensor all = collective::all_gather(r.detach().unsqueeze(0), 0, tp);
    expect_close(all[1], all[0], Tolerance::exact(), "replicated over tp");
  }

  const double m = test::max_scaled_logit(hidden, weight, real_vocab, kTemperature);
  const Tolerance value = test::lm_head_value_tolerance(H, real_vocab, m);
  const Tolerance grad =
      test::lm_head_grad_tolerance(H, real_vocab, N, m, std::max(max_abs(up_lp), max_abs(up_ent)),
                                   std::max(max_abs(hidden), max_abs(weight)), kTemperature);
  const at::Tensor rows_of_rank = at::arange(rank * kRows, (rank + 1) * kRows);
  for (const LmHeadResults* ref : std::initializer_list<const LmHeadResults*>{&whole, &exact}) {
    const std::string of = ref == &whole ? " (against tp 1)" : " (against fp64)";
    expect_close(out.log_probs, ref->log_probs, value, "log_probs" + of);
    expect_close(out.entropy, ref->entropy, value, "entropy" + of);
    expect_close(h.grad(), ref->grad_hidden, grad, "grad hidden, summed over tp" + of);
    expect_close(w.grad(), ref->grad_weight.index_select(0, rows_of_rank), grad,
                 "grad of this rank's weight rows" + of);
  }
}

TEST(FusedLmHead, Tp2MatchesTheWholeVocabulary) {
  // 13 tokens: rank 0 holds 8, rank 1 holds 5 and 3 padding rows.
  run_world(
      2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) { check_tp2(rank, store, 13); });
}

TEST(FusedLmHead, Tp2WithARankHoldingOnlyPadding) {
  // 8 tokens: rank 1 holds only padding.
  run_world(2,
            [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) { check_tp2(rank, store, 8); });
}

}  // namespace
}  // namespace baton::engine
