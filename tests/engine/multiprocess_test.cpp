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
      EXPECT_EQ(at::get_num_threads(), 1);
      // Every rank sees every other rank through the shared store.
      const std::string me = std::to_string(world) + ":" + std::to_string(rank);
      store->set(key_for(rank) + "/" + std::to_string(world), {me.begin(), me.end()});
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
  EXPECT_NE(std::string(r.message()).find("max |actual - expected| = 0.5 at flat index 1"),
            std::string::npos)
      << r.message();
  EXPECT_FALSE(tensors_close(a, at::tensor({1.0, NAN, 3.0}), 1, 1));
  EXPECT_FALSE(tensors_close(a, a.reshape({3, 1}), 1, 1));
}

}  // namespace
}  // namespace baton::engine::test
