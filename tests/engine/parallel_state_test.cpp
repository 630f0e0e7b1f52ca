// ParallelConfig, coordinates, group memberships and layer ranges: pure
// functions, one process. (Groups over real processes: parallel_state_world_test.)
#include "engine/parallel/parallel_state.h"

#include <gtest/gtest.h>

#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"

namespace baton::engine {
namespace {

using Ranks = std::vector<std::vector<int64_t>>;

ParallelConfig config(int64_t tp, int64_t cp, int64_t dp, int64_t pp) {
  ParallelConfig c;
  c.tp = tp;
  c.cp = cp;
  c.dp = dp;
  c.pp = pp;
  return c;
}

std::pair<int64_t, int64_t> layers(int64_t begin, int64_t end) { return {begin, end}; }

TEST(ParallelState, CoordsRoundTripInMegatronOrder) {
  const ParallelConfig c = config(2, 1, 2, 2);
  ASSERT_EQ(c.world_size(), 8);
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(rank_of(coords_of(r, c), c), r);
  // tp fastest, then dp, then pp.
  EXPECT_EQ(coords_of(1, c), (Coords{1, 0, 0, 0}));
  EXPECT_EQ(coords_of(2, c), (Coords{0, 0, 1, 0}));
  EXPECT_EQ(coords_of(5, c), (Coords{1, 0, 0, 1}));
  EXPECT_EQ(coords_of(7, c), (Coords{1, 0, 1, 1}));

  const ParallelConfig d = config(2, 3, 2, 2);  // with context parallelism
  for (int64_t r = 0; r < d.world_size(); ++r) {
    const Coords k = coords_of(r, d);
    EXPECT_EQ(r, ((k.pp * d.dp + k.dp) * d.cp + k.cp) * d.tp + k.tp);
    EXPECT_EQ(rank_of(k, d), r);
  }
}

TEST(ParallelState, GroupsOfTwoByTwoByTwoMatchMegatron) {
  const ParallelConfig c = config(2, 1, 2, 2);
  EXPECT_EQ(all_group_ranks(GroupKind::kTensor, c), (Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kData, c), (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kPipeline, c), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kModel, c), (Ranks{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kEmbedding, c), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kContext, c),
            (Ranks{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kDataContext, c), all_group_ranks(GroupKind::kData, c));
  EXPECT_EQ(all_group_ranks(GroupKind::kWorld, c), (Ranks{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(group_ranks(GroupKind::kData, 5, c), (std::vector<int64_t>{5, 7}));
}

TEST(ParallelState, ContextGroupsSitBetweenTensorAndData) {
  const ParallelConfig c = config(2, 2, 2, 1);
  EXPECT_EQ(all_group_ranks(GroupKind::kContext, c), (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kData, c), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kDataContext, c), (Ranks{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kModel, c),
            (Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));  // tp × pp of one (cp, dp)
}

TEST(ParallelState, EmbeddingGroupJoinsFirstAndLastStageOnly) {
  const ParallelConfig c = config(1, 1, 2, 4);  // ranks: pp-major, dp within
  EXPECT_EQ(group_ranks(GroupKind::kPipeline, 1, c), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(group_ranks(GroupKind::kEmbedding, 1, c), (std::vector<int64_t>{1, 7}));
  EXPECT_EQ(group_ranks(GroupKind::kEmbedding, 7, c), (std::vector<int64_t>{1, 7}));
  EXPECT_EQ(group_ranks(GroupKind::kEmbedding, 3, c), (std::vector<int64_t>{3}));
  EXPECT_EQ(group_ranks(GroupKind::kEmbedding, 2, config(2, 1, 2, 1)),
            (std::vector<int64_t>{2}));  // pp == 1
}

// tp 2 × dp 4 × pp 1, ep 2: dp ranks {0, 1} and {2, 3} of each tp rank form
// the EP groups; dp ranks {0, 2} and {1, 3} hold the same experts.
TEST(ParallelState, ExpertGroupsAreCarvedFromDataParallelBlocks) {
  ParallelConfig c = config(2, 1, 4, 1);
  c.ep = 2;
  EXPECT_NO_THROW(c.validate(8));
  EXPECT_EQ(all_group_ranks(GroupKind::kData, c), (Ranks{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kExpert, c), (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_group_ranks(GroupKind::kExpertData, c), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(c.ep_rank_of(3), 1);
  EXPECT_EQ(c.to_string(), "tp=2 cp=1 dp=4 pp=1 ep=2");
  // Without EP: each rank alone, and the experts' data group is dp × cp.
  const ParallelConfig plain = config(2, 1, 4, 1);
  EXPECT_EQ(group_ranks(GroupKind::kExpert, 5, plain), (std::vector<int64_t>{5}));
  EXPECT_EQ(all_group_ranks(GroupKind::kExpertData, plain),
            all_group_ranks(GroupKind::kDataContext, plain));
  // ep must divide dp.
  ParallelConfig bad = config(1, 1, 4, 1);
  bad.ep = 3;
  try {
    bad.validate();
    FAIL() << "ep 3 over dp 4 was accepted";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("ep = 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("divide dp = 4"), std::string::npos) << e.what();
  }
}

TEST(ParallelState, ValidateNamesConfigAndWorldSize) {
  const ParallelConfig c = config(2, 1, 2, 2);
  EXPECT_NO_THROW(c.validate(8));
  try {
    c.validate(4);
    FAIL() << "validate(4) accepted a config of 8 ranks";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("8 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("world has 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config(0, 1, 1, 1).validate(), EngineError);
  ParallelConfig bad_split = config(1, 1, 1, 2);
  bad_split.layer_split = {1, 2, 3};
  EXPECT_THROW(bad_split.validate(), EngineError);
  EXPECT_THROW(coords_of(8, c), EngineError);
  EXPECT_THROW(rank_of(Coords{2, 0, 0, 0}, c), EngineError);
}

TEST(ParallelState, EvenLayerSplitGivesRemainderToFirstStages) {
  const ParallelConfig c = config(1, 1, 1, 3);
  EXPECT_EQ(stage_layer_range(0, 4, c), layers(0, 2));
  EXPECT_EQ(stage_layer_range(1, 4, c), layers(2, 3));
  EXPECT_EQ(stage_layer_range(2, 4, c), layers(3, 4));
  EXPECT_EQ(stage_layer_range(2, 9, c), layers(6, 9));
  EXPECT_THROW(stage_layer_range(0, 2, c), EngineError);  // a stage without layers
}

TEST(ParallelState, ExplicitLayerSplitMustSumToLayerCount) {
  ParallelConfig c = config(1, 1, 1, 2);
  c.layer_split = {1, 3};
  EXPECT_EQ(stage_layer_range(0, 4, c), layers(0, 1));
  EXPECT_EQ(stage_layer_range(1, 4, c), layers(1, 4));
  EXPECT_THROW(stage_layer_range(1, 5, c), EngineError);
}

TEST(ParallelState, SingleIsAWorldOfOne) {
  auto ps = ParallelState::single();
  EXPECT_EQ(ps->config().world_size(), 1);
  EXPECT_EQ(ps->rank(), 0);
  EXPECT_TRUE(ps->is_first_stage());
  EXPECT_TRUE(ps->is_last_stage());
  for (const Group* g : {&ps->world(), &ps->tp(), &ps->cp(), &ps->dp(), &ps->dp_cp(), &ps->pp(),
                         &ps->model_parallel(), &ps->embedding()}) {
    ASSERT_TRUE(g->pg);
    EXPECT_EQ(g->size, 1);
    EXPECT_EQ(g->rank, 0);
    EXPECT_EQ(g->ranks, std::vector<int64_t>{0});
  }
  EXPECT_THROW(ps->layer_begin(), baton::InternalError);  // set_num_layers first
  ps->set_num_layers(5);
  EXPECT_EQ(ps->num_layers(), 5);
  EXPECT_EQ(ps->layer_begin(), 0);
  EXPECT_EQ(ps->layer_end(), 5);

  // A real process group: collectives work (and are the identity).
  std::vector<at::Tensor> t{at::arange(3, at::kFloat)};
  ps->dp().pg->allreduce(t)->wait();
  EXPECT_TRUE(t[0].equal(at::arange(3, at::kFloat)));
  // Region functions skip the collective and return their input.
  at::Tensor x = at::randn({2, 4, 3});
  EXPECT_TRUE(copy_to_tp_region(x, ps->tp()).is_same(x));
  EXPECT_TRUE(gather_from_sequence_region(x, ps->tp()).is_same(x));
  EXPECT_TRUE(scatter_to_tp_region(x, ps->tp()).is_same(x));
}

}  // namespace
}  // namespace baton::engine
