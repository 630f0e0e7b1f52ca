// The run_world harness itself: several worlds in one test, and failures
// reported with the ranks and their exit statuses.
#include "tests/engine/multiprocess.h"

#include <ATen/Parallel.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

namespace baton::engine::test {
namespace {

std::string key_for(int64_t rank) { return "rank/" + std::to_string(rank); }

std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

TEST(MultiProcess, EachCallRunsItsOwnWorld) {
  for (int64_t world : {2, 3}) {
    run_world(world, [world](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
      EXPECT_TRUE(in_rank_process());
      EXPECT_EQ(at::get_num_threads(), rank_threads());
      // Every rank sees every other rank through the shared store.
      const std::string me = std::to_string(world) + ":" + std::to_string(rank);
      store->set(key_for(rank) + "/" + std::to_string(world),
                 std::vector<uint8_t>(me.begin(), me.end()));
      for (int64_t r = 0; r < world; ++r)
        EXPECT_EQ(str(store->get(key_for(r) + "/" + std::to_string(world))),
                  std::to_string(world) + ":" + std::to_string(r));
    });
  }
}

TEST(MultiProcess, ReportsAFailedRankAndKillsTheRest) {
  EXPECT_NONFATAL_FAILURE(run_world(2,
                                    [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
                                      if (rank == 1) std::_Exit(3);
                                      store->get("never set");  // blocks until killed
                                    }),
                          "rank 0: killed after rank 1 failed\n  rank 1: exited with status 3");
}

TEST(MultiProcess, AnExceptionFailsItsRank) {
  EXPECT_NONFATAL_FAILURE(run_world(2,
                                    [](int64_t rank, c10::intrusive_ptr<c10d::Store>) {
                                      if (rank == 0) throw std::runtime_error("boom");
                                    }),
                          "rank 0: exited with status 1");
}

TEST(MultiProcess, ATimeoutKillsEveryRank) {
  EXPECT_NONFATAL_FAILURE(
      run_world(
          1, [](int64_t, c10::intrusive_ptr<c10d::Store> store) { store->get("never set"); },
          std::chrono::seconds(1)),
      "rank 0: timed out after 1 s");
}

TEST(MultiProcess, TensorsCloseNamesTheWorstElement) {
  const at::Tensor a = at::tensor({1.0, 2.0, 3.0});
  EXPECT_TRUE(tensors_close(a, a + 1e-7, 1e-6, 0));
  const auto r = tensors_close(a, at::tensor({1.0, 2.5, 3.0}), 1e-6, 1e-6);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("worst at [1]: actual 2, expected 2.5, |diff| 0.5"),
            std::string::npos)
      << r.message();
  EXPECT_FALSE(tensors_close(a, at::tensor({1.0, NAN, 3.0}), 1, 1));
  EXPECT_FALSE(tensors_close(a, a.reshape({3, 1}), 1, 1));
  // The index of the worst element, not the largest difference: 1e-3 on 1e3
  // is within rtol 1e-5, 1e-4 on 1 is not.
  const at::Tensor b = at::tensor({1.0, 1e3, 1.0, 1.0}).view({2, 2});
  const auto worst =
      tensors_close(b + at::tensor({0.0, 1e-3, 1e-4, 0.0}).view({2, 2}), b, Tolerance{1e-6, 1e-5});
  EXPECT_NE(std::string(worst.message()).find("1 of 4 compared elements"), std::string::npos)
      << worst.message();
  EXPECT_NE(std::string(worst.message()).find("worst at [1, 0]"), std::string::npos)
      << worst.message();
}

TEST(MultiProcess, TensorsCloseComparesOnlyWhereMasked) {
  const at::Tensor expected = at::zeros({2, 3, 4});
  at::Tensor actual = expected.clone();
  actual[1][2][3] = 7.0;  // a padded position
  const at::Tensor mask = at::tensor({1, 1, 1, 1, 1, 0}, at::kLong).view({2, 3});
  EXPECT_TRUE(tensors_close(actual, expected, Tolerance::exact(), mask));
  EXPECT_FALSE(tensors_close(actual, expected, Tolerance::exact()));
}

TEST(MultiProcess, Fp32ToleranceGrowsWithTermsAndMagnitude) {
  // min(n, 6·sqrt(n)) terms' worth of eps, times the magnitude.
  EXPECT_DOUBLE_EQ(Tolerance::fp32(4, 1).rtol, 4 * kFp32Eps);
  EXPECT_DOUBLE_EQ(Tolerance::fp32(4, 10).atol, 40 * kFp32Eps);
  EXPECT_DOUBLE_EQ(Tolerance::fp32(36, 1).rtol, 36 * kFp32Eps);
  EXPECT_DOUBLE_EQ(Tolerance::fp32(400, 2).atol, 240 * kFp32Eps);
  EXPECT_EQ(Tolerance::exact().atol + Tolerance::exact().rtol, 0);
}

}  // namespace
}  // namespace baton::engine::test
