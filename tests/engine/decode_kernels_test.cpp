// The decode kernels (engine/kernels/decode_kernels.h) against the same computations
// in LibTorch operations: RMSNorm, silu · up, the sampler's argmax and
// log-sum-exp, and paged attention (rotary, cache writes, causal softmax
// attention through shuffled block tables) for head sizes that take each code
// path (32: the unrolled one, 16: the 8-wide loop, 12: plain loops), one, two
// and four query heads per kv head, and blocks of 4 and 16 positions.
#include "base/errors.h"
#include "engine/kernels/decode_kernels.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model/transformer_layer.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::test::expect_close;
using baton::test::max_abs;
using baton::test::Tolerance;

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

TEST(DecodeKernels, RmsNormAndSiluMulEqualTheirLibTorchForms) {
  const int64_t rows = 37, h = 203;  // odd sizes: the lanes' remainders
  auto x = randn({rows, h}, 1) * 3, w = randn({h}, 2);
  auto y = at::empty_like(x);
  cpu::rms_norm(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), rows, h, 1e-6);
  // A sum of h squares, a square root and two products.
  expect_close(y, rms_norm(x, w, 1e-6), Tolerance::fp32(h + 3, max_abs(y)), "rms_norm");

  auto gate_up = randn({rows, 2 * h}, 3) * 4;
  auto act = at::empty({rows, h});
  cpu::silu_mul(gate_up.data_ptr<float>(), act.data_ptr<float>(), rows, h);
  auto expected = at::silu(gate_up.narrow(1, 0, h)) * gate_up.narrow(1, h, h);
  // exp within 2 ulp, then a sum, a division and a product.
  expect_close(act, expected, Tolerance::fp32(6, max_abs(expected)), "silu_mul");
}

TEST(DecodeKernels, ArgmaxAndLogSumExpEqualTheirLibTorchForms) {
  const int64_t rows = 9, v = 1001;
  auto x = randn({rows, v}, 4) * 5;
  x[3][17] = 40;   // a clear maximum early in a row, and a tie later in it:
  x[3][900] = 40;  // the first one counts
  for (double t : {1.0, 0.7}) {
    std::vector<int64_t> best(rows);
    std::vector<float> lse(rows);
    cpu::argmax_log_sum_exp(x.data_ptr<float>(), rows, v, t, best.data(), lse.data());
    auto expected = at::logsumexp(x / t, 1);
    for (int64_t i = 0; i < rows; ++i) {
      EXPECT_EQ(best[i], x[i].argmax().item<int64_t>()) << "row " << i;
      // A sum of v exponentials (each within 2 ulp) of terms up to max|x| / t.
      baton::test::expect_near(lse[i], expected[i].item<double>(),
                               Tolerance::fp32(v + 2, max_abs(x) / t),
                               "t " + std::to_string(t) + " row " + std::to_string(i));
    }
    EXPECT_EQ(best[3], 17);
  }
  // A precondition (the sampler never passes 0): an invariant check.
  EXPECT_THROW(cpu::argmax_log_sum_exp(x.data_ptr<float>(), rows, v, 0, nullptr, nullptr),
               baton::InternalError);
}

// HF's rotary embedding of x [..., d] at cos / sin rows [..., d].
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  int64_t half = x.size(-1) / 2;
  auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

struct AttentionCase {
  int64_t groups, ratio, head_dim, block_size;
};

class PagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// Three sequences (7, 1 and 20 tokens) prefilled in one packed step, then one
// decode step of a token each; blocks handed out in shuffled order. Each
// token's output against softmax(q · Kᵀ / √d) · V over its sequence's rotated
// keys and values up to its position, and the cache rows against the keys
// and values written.
TEST_P(PagedAttentionTest, EqualsCausalAttentionOverEachSequence) {
  const auto c = GetParam();
  const int64_t G = c.groups, r = c.ratio, d = c.head_dim, bs = c.block_size;
  const std::vector<int64_t> lengths{7, 1, 20};
  const int64_t max_len = 21, width = (max_len + bs - 1) / bs;
  const int64_t blocks = 3 * width, slots = blocks * bs;
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<int64_t> tables(order.begin(), order.end());  // [3, width]
  auto tables_t = at::tensor(tables, at::kLong).view({3, width});

  auto rot =
      rotary_tables(at::arange(max_len, at::kLong).view({1, max_len}), d, 10000.0, at::kFloat);
  auto cos = rot.cos.view({max_len, d}).contiguous(), sin = rot.sin.view({max_len, d}).contiguous();
  auto k_cache = at::full({slots, G, d}, 1e9), v_cache = at::full({slots, G, d}, 1e9);
  // The whole sequences' qkv rows, [len + 1, G, r + 2, d] each; rows up to
  // len - 1 are prefilled, row len is the decode step's token.
  std::vector<at::Tensor> seq_qkv;
  for (size_t i = 0; i < lengths.size(); ++i)
    seq_qkv.push_back(randn({lengths[i] + 1, G, r + 2, d}, 10 + i));

  cpu::PagedAttention a;
  a.groups = G;
  a.ratio = r;
  a.head_dim = d;
  a.block_size = bs;
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.k_cache = k_cache.data_ptr<float>();
  a.v_cache = v_cache.data_ptr<float>();
  a.block_tables = tables.data();
  a.table_stride = width;
  auto slot = [&](int64_t seq, int64_t p) { return tables[seq * width + p / bs] * bs + p % bs; };

  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode ? "decode step" : "prefill step");
    std::vector<int64_t> pos, write, rows;
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t first = decode ? lengths[i] : 0, end = decode ? lengths[i] + 1 : lengths[i];
      for (int64_t p = first; p < end; ++p) {
        pos.push_back(p);
        write.push_back(slot(i, p));
        rows.push_back(i);
      }
      parts.push_back(seq_qkv[i].narrow(0, first, end - first));
    }
    const int64_t tokens = static_cast<int64_t>(pos.size());
    auto qkv = at::cat(parts).reshape({tokens, G * (r + 2) * d}).contiguous();
    auto out = at::empty({tokens, G * r * d});
    a.positions = pos.data();
    a.write_slots = write.data();
    a.rows = rows.data();
    a.rotate_and_store(qkv.data_ptr<float>(), tokens);
    a.attend(qkv.data_ptr<float>(), tokens, out.data_ptr<float>());

    int64_t t = 0;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t n = decode ? lengths[i] + 1 : lengths[i];
      auto s = seq_qkv[i].narrow(0, 0, n);
      auto c_rows = cos.narrow(0, 0, n).view({n, 1, 1, d});
      auto s_rows = sin.narrow(0, 0, n).view({n, 1, 1, d});
      auto q = rotate(s.narrow(2, 0, r), c_rows, s_rows);             // [n, G, r, d]
      auto k = rotate(s.narrow(2, r, 1), c_rows, s_rows).squeeze(2);  // [n, G, d]
      auto v = s.select(2, r + 1);                                    // [n, G, d]
      for (int64_t p = (decode ? n - 1 : 0); p < n; ++p, ++t) {
        const std::string where =
            "sequence " + std::to_string(i) + " position " + std::to_string(p);
        // The cache rows this token wrote: its rotated key (two products and
        // a sum) and its value (a copy).
        expect_close(k_cache[write[t]], k[p], Tolerance::fp32(2, max_abs(k[p])), where + " key");
        EXPECT_TRUE(at::equal(v_cache[write[t]], v[p])) << where << " value";
        auto kp = k.narrow(0, 0, p + 1).permute({1, 2, 0});  // [G, d, p+1]
        auto w = at::softmax(at::matmul(q[p], kp) / std::sqrt(static_cast<double>(d)), -1);
        auto expected = at::matmul(w, v.narrow(0, 0, p + 1).transpose(0, 1));  // [G, r, d]
        // The chain: a dot of d terms for each score (terms up to
        // max|q|·max|k| / √d), a softmax over p + 1 exponentials (2 ulp
        // each) and a weighted sum of p + 1 values.
        const double score = (max_abs(q[p]) * max_abs(kp) * d) / std::sqrt(static_cast<double>(d));
        const Tolerance tol = Tolerance::fp32(d + 3 * (p + 1), max_abs(v) * std::max(1.0, score));
        expect_close(out[t].view({G, r, d}), expected, tol, where + " output");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Values(AttentionCase{4, 2, 32, 16}, AttentionCase{2, 1, 32, 4},
                                           AttentionCase{2, 4, 16, 4}, AttentionCase{1, 2, 12, 16},
                                           AttentionCase{3, 2, 64, 16}),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return "g" + std::to_string(c.groups) + "_r" + std::to_string(c.ratio) +
                                  "_d" + std::to_string(c.head_dim) + "_b" +
                                  std::to_string(c.block_size);
                         });

}  // namespace
}  // namespace baton::engine
