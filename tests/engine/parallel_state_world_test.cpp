// ParallelState over real processes and Gloo groups.
#include <gtest/gtest.h>

#include "engine/errors.h"
#include "engine/parallel/parallel_state.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::run_world;

constexpr auto kTimeout = std::chrono::seconds(60);

// Each group's all-reduce of the global ranks must give the sum of its members.
void expect_group_connects(const Group& g, int64_t rank, const char* what) {
  at::Tensor x = at::full({1}, static_cast<double>(rank), at::kDouble);
  const double sum = collective::all_reduce(x, g).item<double>();
  double expected = 0;
  for (int64_t r : g.ranks) expected += static_cast<double>(r);
  EXPECT_EQ(sum, expected) << what << " group of rank " << rank;
}

TEST(ParallelStateWorld, EightRanksBuildMegatronGroupsAndLayerRanges) {
  run_world(8, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.tp = 2;
    cfg.dp = 2;
    cfg.pp = 2;
    auto ps = ParallelState::create(store, rank, cfg, kTimeout);
    EXPECT_EQ(ps->rank(), rank);
    EXPECT_EQ(ps->coords(), coords_of(rank, cfg));
    EXPECT_EQ(ps->is_first_stage(), rank < 4);
    EXPECT_EQ(ps->is_last_stage(), rank >= 4);

    // Megatron's groups for tp2 × dp2 × pp2.
    const std::vector<int64_t> tp{rank / 2 * 2, rank / 2 * 2 + 1};
    const std::vector<int64_t> dp{rank - (rank % 4) + rank % 2, rank - (rank % 4) + rank % 2 + 2};
    const std::vector<int64_t> pp{rank % 4, rank % 4 + 4};
    const int64_t first = (rank % 4) / 2 * 2;  // model parallel: tp × pp of one dp replica
    const std::vector<int64_t> mp{first, first + 1, first + 4, first + 5};
    EXPECT_EQ(ps->tp().ranks, tp);
    EXPECT_EQ(ps->dp().ranks, dp);
    EXPECT_EQ(ps->pp().ranks, pp);
    EXPECT_EQ(ps->model_parallel().ranks, mp);
    EXPECT_EQ(ps->embedding().ranks, pp);
    EXPECT_EQ(ps->cp().ranks, std::vector<int64_t>{rank});
    EXPECT_EQ(ps->world().size, 8);
    EXPECT_EQ(ps->tp().rank, rank % 2);
    EXPECT_EQ(ps->pp().rank, rank / 4);

    expect_group_connects(ps->world(), rank, "world");
    expect_group_connects(ps->tp(), rank, "tp");
    expect_group_connects(ps->dp(), rank, "dp");
    expect_group_connects(ps->pp(), rank, "pp");
    expect_group_connects(ps->model_parallel(), rank, "model_parallel");
    expect_group_connects(ps->embedding(), rank, "embedding");
    expect_group_connects(ps->cp(), rank, "cp");

    // 5 layers: evenly [0, 3) and [3, 5).
    ps->set_num_layers(5);
    EXPECT_EQ(ps->layer_begin(), rank < 4 ? 0 : 3);
    EXPECT_EQ(ps->layer_end(), rank < 4 ? 3 : 5);
  });
}

TEST(ParallelStateWorld, UnevenExplicitSplitOverFourStages) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.pp = 4;
    cfg.layer_split = {1, 3, 2, 0};
    auto ps = ParallelState::create(store, rank, cfg, kTimeout);
    ps->set_num_layers(6);
    const int64_t begin[] = {0, 1, 4, 6}, end[] = {1, 4, 6, 6};
    EXPECT_EQ(ps->layer_begin(), begin[rank]);
    EXPECT_EQ(ps->layer_end(), end[rank]);
    const std::vector<int64_t> embedding =
        (rank == 0 || rank == 3) ? std::vector<int64_t>{0, 3} : std::vector<int64_t>{rank};
    EXPECT_EQ(ps->embedding().ranks, embedding);
    expect_group_connects(ps->embedding(), rank, "embedding");
    expect_group_connects(ps->pp(), rank, "pp");
  });
}

TEST(ParallelStateWorld, ConfigDifferingFromRankZerosIsAnError) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.tp = 2;
    if (rank == 1) {
      ParallelConfig other;
      other.dp = 2;
      try {
        ParallelState::create(store, rank, other, kTimeout);
        ADD_FAILURE() << "a config that differs from rank 0's was accepted";
      } catch (const EngineError& e) {
        EXPECT_NE(std::string(e.what()).find("differs from rank 0's"), std::string::npos)
            << e.what();
      }
    }
    // Then agree, so that rank 0 is not left waiting.
    auto ps = ParallelState::create(store, rank, cfg, kTimeout);
    expect_group_connects(ps->tp(), rank, "tp");
  });
}

}  // namespace
}  // namespace baton::engine
