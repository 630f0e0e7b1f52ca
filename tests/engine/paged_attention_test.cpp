// Decode attention over the paged KV cache (engine/kernels/paged_attention.h).
// On the CPU: the reference against a plain per-sequence loop in fp64 (an
// explicit softmax over the visible positions only), over ragged lengths,
// shared and scattered blocks, grouped query heads, fp32 and bf16, int32 and
// int64 block tables; and the errors that name what is wrong. On a GPU
// (_CUDA, skipped without one): the CUDA kernel against the reference in
// fp32, bf16 and fp16 up to 4096 positions and batch 64, its reruns
// bit-equal, and its call captured in a CUDA graph (which fails on any host
// synchronisation) replaying what an eager call gives.
#include "engine/kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#if defined(BATON_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/engine/expect_error.h"
#include "tests/tolerance.h"

namespace baton::engine {
namespace {

using baton::engine::testing::expect_error;
using baton::test::expect_close;
using baton::test::max_abs;
using baton::test::Tolerance;

struct Shape {
  int64_t batch = 1, q_heads = 1, kv_heads = 1, head_dim = 64, block_size = 16;
  int64_t max_len = 40;  // row 0 has it; the others a random length in [1, max_len]

  std::string to_string() const {
    return "B " + std::to_string(batch) + ", Hq " + std::to_string(q_heads) + ", Hkv " +
           std::to_string(kv_heads) + ", D " + std::to_string(head_dim) + ", block_size " +
           std::to_string(block_size) + ", max_len " + std::to_string(max_len);
  }
};

struct Inputs {
  at::Tensor q, k_cache, v_cache, block_tables, context_lens;
  int64_t block_size = 0;
  double scale = 0;

  at::Tensor attend() const {
    return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, block_size,
                                  scale);
  }
  at::Tensor reference() const {
    return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, context_lens,
                                            block_size, scale);
  }
  Inputs to(at::Device device) const {
    return {q.to(device),
            k_cache.to(device),
            v_cache.to(device),
            block_tables.to(device),
            context_lens.to(device),
            block_size,
            scale};
  }
};

// Random inputs laid out as KvCache lays them out: blocks handed out in a
// shuffled order (block 0, scratch, holds garbage and pads the tables), odd
// rows sharing the full blocks of the row before them (prefix sharing), one
// padding column past the longest row.
Inputs make_inputs(const Shape& s, at::ScalarType dtype, at::ScalarType index_type, uint64_t seed) {
  at::manual_seed(seed);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lens(s.batch);
  for (int64_t b = 0; b < s.batch; ++b)
    lens[b] = b == 0 ? s.max_len : std::uniform_int_distribution<int64_t>(1, s.max_len)(rng);
  std::vector<std::vector<int64_t>> tables(s.batch);
  int64_t blocks = 1;  // block 0 is scratch
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t needed = (lens[b] + s.block_size - 1) / s.block_size;
    if (b % 2 == 1) {
      // The full blocks of both rows' common prefix: neither writes them again.
      const int64_t common = std::min(lens[b], lens[b - 1]) / s.block_size;
      tables[b].assign(tables[b - 1].begin(), tables[b - 1].begin() + std::min(common, needed));
    }
    while (static_cast<int64_t>(tables[b].size()) < needed) tables[b].push_back(blocks++);
  }
  std::vector<int64_t> order(blocks - 1);
  std::iota(order.begin(), order.end(), 1);
  std::shuffle(order.begin(), order.end(), rng);
  int64_t width = 0;
  for (const auto& t : tables) width = std::max<int64_t>(width, static_cast<int64_t>(t.size()));
  ++width;
  std::vector<int64_t> table(s.batch * width, 0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (size_t j = 0; j < tables[b].size(); ++j)
      table[b * width + static_cast<int64_t>(j)] = order[tables[b][j] - 1];
  const int64_t slots = blocks * s.block_size;
  Inputs in;
  in.q = at::randn({s.batch, s.q_heads, s.head_dim}).to(dtype);
  in.k_cache = at::randn({slots, s.kv_heads, s.head_dim}).to(dtype);
  in.v_cache = at::randn({slots, s.kv_heads, s.head_dim}).to(dtype);
  in.block_tables = at::tensor(table, at::kLong).view({s.batch, width}).to(index_type);
  in.context_lens = at::tensor(lens, at::kLong);
  in.block_size = s.block_size;
  in.scale = 1 / std::sqrt(static_cast<double>(s.head_dim));
  return in;
}

// Per sequence and head, in fp64: the visible positions' scores, their
// softmax, the weighted sum of the values.
at::Tensor naive_attention(const Inputs& in) {
  const at::Tensor q = in.q.to(at::kDouble), k = in.k_cache.to(at::kDouble),
                   v = in.v_cache.to(at::kDouble);
  const at::Tensor table = in.block_tables.to(at::kLong);
  const int64_t batch = q.size(0), q_heads = q.size(1), head_dim = q.size(2);
  const int64_t group = q_heads / k.size(1);
  at::Tensor out = at::zeros({batch, q_heads, head_dim}, at::kDouble);
  auto qa = q.accessor<double, 3>(), ka = k.accessor<double, 3>(), va = v.accessor<double, 3>();
  auto ta = table.accessor<int64_t, 2>();
  auto la = in.context_lens.accessor<int64_t, 1>();
  auto oa = out.accessor<double, 3>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = la[b];
    std::vector<int64_t> slots(len);
    for (int64_t p = 0; p < len; ++p)
      slots[p] = ta[b][p / in.block_size] * in.block_size + p % in.block_size;
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> score(len);
      for (int64_t p = 0; p < len; ++p) {
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += qa[b][h][d] * ka[slots[p]][kvh][d];
        score[p] = dot * in.scale;
      }
      const double top = *std::max_element(score.begin(), score.end());
      double sum = 0;
      for (double& s : score) sum += (s = std::exp(s - top));
      for (int64_t p = 0; p < len; ++p)
        for (int64_t d = 0; d < head_dim; ++d) oa[b][h][d] += score[p] / sum * va[slots[p]][kvh][d];
    }
  }
  return out;
}

// The magnitude that bounds a result's rounding: the values, amplified by
// the scores' sensitivity (an error δ in a score is a relative error δ of
// its weight), which is about the largest Σ|q_i·k_i|·scale over every
// position a row's table reaches.
double magnitude(const Inputs& in) {
  const int64_t batch = in.q.size(0), kv_heads = in.k_cache.size(1), head_dim = in.q.size(2);
  const int64_t positions = in.block_tables.size(1) * in.block_size;
  const at::Tensor slots = (in.block_tables.to(at::kLong).unsqueeze(2) * in.block_size +
                            at::arange(in.block_size, in.block_tables.options().dtype(at::kLong)))
                               .reshape({-1});
  const at::Tensor k = in.k_cache.index_select(0, slots)
                           .view({batch, positions, kv_heads, head_dim})
                           .permute({0, 2, 3, 1})
                           .abs()
                           .to(at::kFloat);
  const at::Tensor q = in.q.abs().to(at::kFloat).reshape({batch, kv_heads, -1, head_dim});
  const double terms = at::matmul(q, k).max().item<double>() * in.scale;
  return max_abs(in.v_cache) * (1 + terms);
}

// An fp32 softmax attention: the dot products, the softmax sum and the
// weighted sum, over every position a table reaches.
Tolerance fp32_tolerance(const Inputs& in) {
  const double positions = static_cast<double>(in.block_tables.size(1) * in.block_size);
  return Tolerance::fp32(static_cast<double>(in.q.size(2)) + 2 * positions, magnitude(in));
}

// Each output rounded to the dtype (`roundings` times in all), on top of fp32.
Tolerance output_tolerance(const Inputs& in, double roundings) {
  const Tolerance fp32 = fp32_tolerance(in);
  const at::ScalarType t = in.q.scalar_type();
  if (t == at::kFloat) return fp32;
  // bf16 keeps 8 significant bits, fp16 11.
  const double unit = t == at::kBFloat16 ? baton::test::kBf16Eps / 2 : std::ldexp(1.0, -11);
  const double k = 4 * std::sqrt(roundings) * unit;
  return {fp32.atol + k * max_abs(in.v_cache), fp32.rtol + k};
}

TEST(PagedAttention, ReferenceMatchesAPerSequenceLoopInFp64) {
  const std::vector<std::pair<int64_t, int64_t>> heads = {{2, 2}, {4, 2}, {14, 2}};
  uint64_t seed = 1;
  for (int64_t batch : {1, 3, 5})
    for (auto [q_heads, kv_heads] : heads)
      for (int64_t head_dim : {64, 128})
        for (int64_t block_size : {16, 4})
          for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
            const Shape s{batch, q_heads, kv_heads, head_dim, block_size, 37};
            const at::ScalarType index = seed % 2 ? at::kLong : at::kInt;
            SCOPED_TRACE(s.to_string() + ", " + std::string(c10::toString(dtype)) + ", " +
                         c10::toString(index) + " tables");
            const Inputs in = make_inputs(s, dtype, index, seed++);
            const at::Tensor got = in.reference();
            ASSERT_EQ(got.scalar_type(), dtype);
            expect_close(got, naive_attention(in), output_tolerance(in, 1), "reference vs loop");
          }
}

TEST(PagedAttention, OnTheCpuTheCallIsTheReference) {
  const Inputs in = make_inputs({3, 8, 2, 64, 16, 50}, at::kFloat, at::kLong, 7);
  EXPECT_TRUE(at::equal(in.attend(), in.reference()));
}

TEST(PagedAttention, PositionsPastTheLengthAndOtherRowsBlocksDoNotMatter) {
  const Inputs in = make_inputs({4, 4, 2, 64, 4, 30}, at::kFloat, at::kLong, 8);
  const at::Tensor want = in.attend();
  // Garbage in every slot no row sees, scratch block included.
  at::Tensor visible = at::zeros({in.k_cache.size(0)}, at::kBool);
  for (int64_t b = 0; b < in.q.size(0); ++b)
    for (int64_t p = 0; p < in.context_lens[b].item<int64_t>(); ++p)
      visible[in.block_tables[b][p / in.block_size].item<int64_t>() * in.block_size +
              p % in.block_size] = true;
  Inputs noisy = in;
  const at::Tensor hidden = visible.logical_not().view({-1, 1, 1});
  noisy.k_cache = in.k_cache.masked_fill(hidden, 1e4);
  noisy.v_cache = in.v_cache.masked_fill(hidden, -1e4);
  EXPECT_TRUE(at::equal(noisy.attend(), want));
}

TEST(PagedAttention, ErrorsNameTheShapesAndDtypes) {
  const Inputs in = make_inputs({2, 4, 2, 64, 16, 20}, at::kFloat, at::kLong, 9);
  auto call = [](const Inputs& x) { return [x] { x.attend(); }; };
  Inputs bad = in;
  bad.q = in.q.narrow(2, 0, 32);
  expect_error(call(bad), {"q's head dim 32 is not the caches' 64", "q [2, 4, 32]"});
  bad = in;
  bad.q = at::zeros({2, 3, 64});
  expect_error(call(bad), {"3 query heads are not a multiple of 2 kv heads"});
  bad = in;
  bad.q = in.q[0];
  expect_error(call(bad), {"expected q [B, Hq, D]", "q [4, 64]"});
  bad = in;
  bad.v_cache = in.v_cache.narrow(0, 0, 16);
  expect_error(call(bad), {"k_cache and v_cache differ in shape", "v_cache [16, 2, 64]"});
  bad = in;
  bad.context_lens = in.context_lens.narrow(0, 0, 1);
  expect_error(call(bad), {"q's batch size 2", "context_lens [1]"});
  bad = in;
  bad.context_lens = in.context_lens.to(at::kInt);
  expect_error(call(bad), {"context_lens is Int; expected Long"});
  bad = in;
  bad.block_tables = in.block_tables.to(at::kFloat);
  expect_error(call(bad), {"block_tables is Float; expected Int or Long"});
  bad = in;
  bad.v_cache = in.v_cache.to(at::kBFloat16);
  expect_error(call(bad), {"v_cache BFloat16", "expected q's Float"});
  bad = in;
  bad.q = in.q.to(at::kDouble);
  expect_error(call(bad), {"q is Double; expected Float, BFloat16 or Half"});
  bad = in;
  bad.block_size = 0;
  expect_error(call(bad), {"block_size is 0"});
  expect_error(
      [&] {
        paged_decode_attention_reference(in.q, in.k_cache, in.v_cache, in.block_tables, {}, 16,
                                         in.scale);
      },
      {"paged_decode_attention_reference: a tensor argument is undefined"});
}

bool has_gpu() { return at::globalContext().hasCUDA() && at::getNumGPUs() > 0; }

TEST(PagedAttention, KernelMatchesTheReference_CUDA) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  struct Case {
    Shape shape;
    at::ScalarType index;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1, 64, 16, 1}, at::kLong},       // one position
      {{5, 14, 2, 128, 16, 300}, at::kInt},    // 7 heads per kv head, ragged
      {{3, 16, 1, 128, 4, 700}, at::kLong},    // 16 heads per kv head
      {{4, 8, 8, 64, 16, 257}, at::kInt},      // no grouping; a tile and one position
      {{6, 4, 2, 96, 16, 513}, at::kLong},     // another head dim (16-byte loads)
      {{3, 6, 2, 100, 16, 130}, at::kLong},    // a head dim of scalar loads
      {{2, 8, 2, 256, 16, 300}, at::kInt},     // the largest head dim
      {{64, 16, 2, 128, 16, 4096}, at::kInt},  // batch 64, up to 4096 positions
      {{8, 28, 4, 128, 32, 4096}, at::kLong},
  };
  uint64_t seed = 100;
  for (const Case& c : cases)
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(c.shape.to_string() + ", " + c10::toString(dtype));
      const Inputs in = make_inputs(c.shape, dtype, c.index, seed++).to(gpu);
      const at::Tensor got = in.attend();
      ASSERT_EQ(got.scalar_type(), dtype);
      ASSERT_EQ(got.device(), gpu);
      // Each side rounds its fp32 result to the dtype once.
      expect_close(got, in.reference(), output_tolerance(in, 2), "kernel vs reference");
      EXPECT_TRUE(at::equal(in.attend(), got)) << "a rerun differs";
    }
}

TEST(PagedAttention, KernelReadsStridedQueriesAndCacheViews_CUDA) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA, 0);
  Inputs in = make_inputs({4, 4, 2, 64, 16, 200}, at::kBFloat16, at::kLong, 200).to(gpu);
  // q a slice of a wider projection; the caches views of one layer of a
  // stacked pool, offset by one element (no longer 16-byte aligned).
  in.q = at::cat({in.q, in.q}, 2).narrow(2, 64, 64);
  const at::Tensor pool = at::randn({2, in.k_cache.numel() + 1}, in.k_cache.options());
  pool[0].narrow(0, 1, in.k_cache.numel()).copy_(in.k_cache.reshape({-1}));
  pool[1].narrow(0, 1, in.v_cache.numel()).copy_(in.v_cache.reshape({-1}));
  Inputs views = in;
  views.k_cache = pool[0].narrow(0, 1, in.k_cache.numel()).view(in.k_cache.sizes());
  views.v_cache = pool[1].narrow(0, 1, in.v_cache.numel()).view(in.v_cache.sizes());
  expect_close(views.attend(), in.reference(), output_tolerance(in, 2), "views vs reference");
}

TEST(PagedAttention, CapturedInACudaGraphReplaysWhatAnEagerCallGives_CUDA) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
#if defined(BATON_CUDA)
  const at::Device gpu(at::kCUDA, 0);
  const Shape shape{16, 8, 2, 128, 16, 1000};
  Inputs in = make_inputs(shape, at::kBFloat16, at::kInt, 300).to(gpu);
  // Other inputs of the same sizes: new queries, keys and values, the rows'
  // tables swapped, new lengths.
  at::manual_seed(301);
  Inputs next = in;
  next.q = at::randn(in.q.sizes()).to(in.q.options());
  next.k_cache = at::randn(in.k_cache.sizes()).to(in.k_cache.options());
  next.v_cache = at::randn(in.v_cache.sizes()).to(in.v_cache.options());
  next.block_tables = in.block_tables.flip({0});
  const int64_t positions = in.block_tables.size(1) * shape.block_size;
  next.context_lens = at::randint(1, positions + 1, {shape.batch}, at::kLong).to(gpu);
  // Capture runs on a stream other than the legacy default one, and fails on
  // any synchronisation (an .item(), a blocking copy).
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, gpu.index());
  at::cuda::CUDAGraph graph;
  at::Tensor captured, warm;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    warm = in.attend();
    graph.capture_begin();
    captured = in.attend();
    graph.capture_end();
  }
  side.synchronize();
  // The new inputs in the captured tensors: the replay reads them.
  in.q.copy_(next.q);
  in.k_cache.copy_(next.k_cache);
  in.v_cache.copy_(next.v_cache);
  in.block_tables.copy_(next.block_tables);
  in.context_lens.copy_(next.context_lens);
  graph.replay();
  const at::Tensor want = next.attend();
  EXPECT_TRUE(at::equal(captured, want));
  EXPECT_FALSE(at::equal(captured, warm)) << "the replay did not read the new inputs";
#endif
}

}  // namespace
}  // namespace baton::engine
