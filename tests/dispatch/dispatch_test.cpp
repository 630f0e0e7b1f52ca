// DataProto dispatch modes on real worker groups.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"
#include "runtime/dispatch_registry.h"

namespace baton {
namespace {

namespace mode = dispatch_mode;

class ProtoWorker : public Worker {
 public:
  // Doubles "x", adds a per-row "rank" tensor; one output row per input row.
  DataProto compute(const DataProto& batch) {
    DataProto out({{"y", batch.tensor("x") * 2},
                   {"rank", at::full({batch.size()}, static_cast<int64_t>(rank()), at::kLong)}},
                  {{"prompt", batch.column("prompt")}});
    out.set_meta("metrics", Dict{{"rows", batch.size()}});
    return out;
  }
  // Returns one row whatever it gets: breaks padding removal.
  DataProto summarize(const DataProto& batch) { return batch.slice(0, 1); }
  Value metric(const DataProto& batch) { return Dict{{"rank", rank()}, {"rows", batch.size()}}; }
  int64_t scaled(int64_t x) { return x * (rank() + 1); }
  // Tags every row with the rank that saw it.
  DataProto tag(const DataProto& batch) {
    DataProto out = batch;
    out.set_tensor("seen_by", at::full({batch.size()}, static_cast<int64_t>(rank()), at::kLong));
    return out;
  }
  Value coords(const Value& x) {
    const ParallelCoords& c = info().coords;
    return Dict{{"x", x}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"rank", rank()}};
  }

  static void register_methods(MethodTable<ProtoWorker>& t) {
    t.def("compute", &ProtoWorker::compute, MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("summarize", &ProtoWorker::summarize, MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("metric", &ProtoWorker::metric, MethodOptions().set_dispatch_mode(mode::kDpComputeMetric));
    t.def("scaled", &ProtoWorker::scaled, MethodOptions().set_dispatch_mode(mode::kDpCompute));
    t.def("mc_tag", &ProtoWorker::tag, MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
    t.def("ppdp_tag", &ProtoWorker::tag, MethodOptions().set_dispatch_mode(mode::kMegatronPpAsDpProto));
    t.def("mc_coords", &ProtoWorker::coords, MethodOptions().set_dispatch_mode(mode::kMegatronCompute));
    t.def("ppdp_coords", &ProtoWorker::coords, MethodOptions().set_dispatch_mode(mode::kMegatronPpAsDp));
    t.def("pp_only", &ProtoWorker::coords, MethodOptions().set_dispatch_mode(mode::kMegatronPpOnly));
  }
};
BATON_WORKER(ProtoWorker);

// Its mode is registered by the test that spawns it: spawning checks that
// every method's mode is registered.
class FirstTwoWorker : public Worker {
 public:
  int64_t scaled(int64_t x) { return x * (rank() + 1); }
  static void register_methods(MethodTable<FirstTwoWorker>& t) {
    t.def("first_two", &FirstTwoWorker::scaled, MethodOptions().set_dispatch_mode("TEST_FIRST_TWO"));
  }
};
BATON_WORKER(FirstTwoWorker);

DataProto batch_of(int64_t rows) {
  List prompts;
  for (int64_t r = 0; r < rows; ++r) prompts.push_back("p" + std::to_string(r));
  return DataProto({{"x", at::arange(rows, at::kFloat)}}, {{"prompt", prompts}},
                   Dict{{"step", 1}});
}

class DispatchTest : public ::testing::Test {
 protected:
  ResourcePool pool = ResourcePool::cpu(4);
};

TEST_F(DispatchTest, DpComputeProtoChunksByRankAndConcatenatesInRankOrder) {
  WorkerGroup g = WorkerGroup::spawn("ProtoWorker", pool);
  DataProto in = batch_of(8);
  DataProto out = g.call("compute", {in}).get().as<DataProto>();  // a DataProto is an argument
  EXPECT_EQ(out.size(), 8);
  EXPECT_TRUE(out.tensor("y").equal(in.tensor("x") * 2));
  EXPECT_TRUE(out.tensor("rank").equal(at::arange(4, at::kLong).repeat_interleave(2)));
  EXPECT_EQ(out.column("prompt"), in.column("prompt"));
  // Each rank's metrics are merged into a list.
  EXPECT_EQ(out.meta_value("metrics")->at("rows"), Value(List{2, 2, 2, 2}));
}

TEST_F(DispatchTest, DpComputeProtoPadsAnIndivisibleBatchAndTrimsTheResult) {
  WorkerGroup g = WorkerGroup::spawn("ProtoWorker", pool);
  DataProto in = batch_of(10);  // 10 rows over 4 ranks: padded to 12
  DataProto out = DataProto::from_value(g.call("compute", {in.to_value()}).get());
  EXPECT_EQ(out.size(), 10);
  EXPECT_TRUE(out.tensor("y").equal(in.tensor("x") * 2));
  EXPECT_EQ(in.size(), 10);  // the caller's batch is not padded
  EXPECT_EQ(out.meta_value("metrics")->at("rows"), Value(List{3, 3, 3, 3}));

  std::string err;
  try {
    g.call("summarize", {in.to_value()}).get();
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("ProtoWorker.summarize (DP_COMPUTE_PROTO): collecting the results failed: "
                     "rank 0 returned 1 rows for a chunk of 3"),
            std::string::npos)
      << err;
}

TEST_F(DispatchTest, DpComputeMetricAndDpComputeCollectAList) {
  WorkerGroup g = WorkerGroup::spawn("ProtoWorker", pool);
  Value metrics = g.call("metric", {batch_of(8).to_value()}).get();
  ASSERT_EQ(metrics.as_list().size(), 4u);
  EXPECT_EQ(metrics.as_list()[3].at("rank"), Value(3));
  EXPECT_EQ(g.call("scaled", {List{1, 1, 1, 1}}).get(), Value(List{1, 2, 3, 4}));
}

TEST_F(DispatchTest, BadArgumentsFailAtTheDriverNamingMethodModeAndSizes) {
  WorkerGroup g = WorkerGroup::spawn("ProtoWorker", pool);
  auto error_of = [&](const std::string& m, List args) {
    try {
      g.call(m, std::move(args));
    } catch (const CallError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  std::string err = error_of("compute", {5});
  EXPECT_NE(err.find("ProtoWorker.compute (DP_COMPUTE_PROTO): argument 0 must be a DataProto"),
            std::string::npos)
      << err;
  err = error_of("scaled", {List{1, 2}});
  EXPECT_NE(err.find("ProtoWorker.scaled (DP_COMPUTE): ALL_TO_ALL: argument 0 must be a list "
                     "with one element per rank (4)"),
            std::string::npos)
      << err;
}

TEST_F(DispatchTest, UserRegisteredModeRunsOnTheRanksItPlansAndCollectsItsWay) {
  register_dispatch_mode(
      "TEST_FIRST_TWO",
      [](const WorkerGroup& g, const List& args) {
        DispatchPlan p;
        p.chunks = {args};
        p.chunk_of_rank.assign(static_cast<size_t>(g.world_size()), -1);
        p.chunk_of_rank[0] = p.chunk_of_rank[1] = 0;  // one chunk, written once, two ranks
        p.collect = {false, true, false, false};
        return p;
      },
      [](const CollectInput& in) { return Value(List{Value(in.outputs), Value(in.ranks[0])}); });
  WorkerGroup g = WorkerGroup::spawn("FirstTwoWorker", pool);
  EXPECT_EQ(g.call("first_two", {10}).get(), Value(List{List{20}, 1}));
  EXPECT_THROW(register_dispatch_mode("TEST_FIRST_TWO", nullptr, nullptr), Error);
}

// tp=2 x pp=2 x dp=2 over 8 workers. Megatron rank order (tp fastest, then
// cp, dp, pp): rank = tp + 2*dp + 4*pp.
class MegatronTest : public ::testing::Test {
 protected:
  ResourcePool pool = ResourcePool::cpu(8);
  WorkerGroup group = WorkerGroup::spawn(
      "ProtoWorker", pool, {},
      WorkerGroupOptions().set_layout(ParallelLayout{.tp = 2, .cp = 1, .dp = 2, .pp = 2}));
};

TEST_F(MegatronTest, WorkersReportTheirCoordinatesInMegatronOrder) {
  Value all = group.call_all("pp_only", {Value()}).get();
  for (int r = 0; r < 8; ++r) {
    const Value& c = all.as_list()[r];
    EXPECT_EQ(c.at("tp").as_int(), r % 2) << r;
    EXPECT_EQ(c.at("dp").as_int(), r / 2 % 2) << r;
    EXPECT_EQ(c.at("pp").as_int(), r / 4) << r;
  }
}

TEST_F(MegatronTest, ComputeGivesEachDpReplicaItsElementAndCollectsTp0LastStage) {
  // Collected ranks: tp 0, pp 1: ranks 4 (dp 0) and 6 (dp 1).
  Value out = group.call("mc_coords", {List{"a", "b"}}).get();
  ASSERT_EQ(out.as_list().size(), 2u);
  EXPECT_EQ(out.as_list()[0].at("x").as_string(), "a");
  EXPECT_EQ(out.as_list()[0].at("rank").as_int(), 4);
  EXPECT_EQ(out.as_list()[1].at("x").as_string(), "b");
  EXPECT_EQ(out.as_list()[1].at("rank").as_int(), 6);

  DataProto in = batch_of(8);
  DataProto tagged = DataProto::from_value(group.call("mc_tag", {in.to_value()}).get());
  EXPECT_TRUE(tagged.tensor("x").equal(in.tensor("x")));
  std::vector<int64_t> seen(8);
  for (int i = 0; i < 8; ++i) seen[i] = tagged.tensor("seen_by")[i].item<int64_t>();
  EXPECT_EQ(seen, (std::vector<int64_t>{4, 4, 4, 4, 6, 6, 6, 6}));
  std::string err;
  try {
    group.call("mc_tag", {batch_of(7).to_value()});
  } catch (const CallError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("has 7 rows, not divisible into 2 parts"), std::string::npos) << err;
}

TEST_F(MegatronTest, PpAsDpOrdersChunksPpFastestAndCollectsEveryTp0Rank) {
  // Element (dp*2 + pp): rank = tp + 2*dp + 4*pp gets element dp*2 + pp.
  Value out = group.call("ppdp_coords", {List{"A", "B", "C", "D"}}).get();
  ASSERT_EQ(out.as_list().size(), 4u);
  std::vector<std::string> xs;
  std::vector<int64_t> ranks;
  for (const Value& v : out.as_list()) {
    xs.push_back(v.at("x").as_string());
    ranks.push_back(v.at("rank").as_int());
  }
  EXPECT_EQ(xs, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ(ranks, (std::vector<int64_t>{0, 4, 2, 6}));  // (dp0,pp0) (dp0,pp1) (dp1,pp0) (dp1,pp1)

  DataProto in = batch_of(8);
  DataProto tagged = DataProto::from_value(group.call("ppdp_tag", {in.to_value()}).get());
  EXPECT_TRUE(tagged.tensor("x").equal(in.tensor("x")));  // back in input order
  std::vector<int64_t> seen(8);
  for (int i = 0; i < 8; ++i) seen[i] = tagged.tensor("seen_by")[i].item<int64_t>();
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 0, 4, 4, 2, 2, 6, 6}));
}

TEST_F(MegatronTest, PpOnlyCollectsOneResultPerStage) {
  Value out = group.call("pp_only", {"w"}).get();
  ASSERT_EQ(out.as_list().size(), 2u);
  EXPECT_EQ(out.as_list()[0].at("rank").as_int(), 0);
  EXPECT_EQ(out.as_list()[1].at("rank").as_int(), 4);
}

// Registers mesh "actor" as tp=2 x dp=2: dp rank = rank / 2, rank % 2 == 0 collects.
class MeshWorker : public Worker {
 public:
  MeshWorker() { register_mesh("actor", rank() / 2, rank() % 2 == 0); }
  DataProto tag(const DataProto& batch) {
    DataProto out = batch;
    out.set_tensor("seen_by", at::full({batch.size()}, static_cast<int64_t>(rank()), at::kLong));
    return out;
  }
  static void register_methods(MethodTable<MeshWorker>& t) {
    t.def("tag", &MeshWorker::tag, MethodOptions().set_dispatch_mode(mode::mesh_proto("actor")));
    t.def("tag_critic", &MeshWorker::tag, MethodOptions().set_dispatch_mode(mode::mesh_proto("critic")));
  }
};
BATON_WORKER(MeshWorker);

TEST(MeshDispatch, ChunksGoToTheRegisteredDpRanksAndCollectorsAreConcatenated) {
  ResourcePool pool = ResourcePool::cpu(4);
  WorkerGroup g = WorkerGroup::spawn("MeshWorker", pool);
  MeshInfo info = g.mesh("actor");
  EXPECT_EQ(info.dp_size, 2);
  EXPECT_EQ(info.dp_rank, (std::vector<int>{0, 0, 1, 1}));
  DataProto in = batch_of(6);
  DataProto out = DataProto::from_value(g.call("tag", {in.to_value()}).get());
  EXPECT_TRUE(out.tensor("x").equal(in.tensor("x")));
  std::vector<int64_t> seen(6);
  for (int i = 0; i < 6; ++i) seen[i] = out.tensor("seen_by")[i].item<int64_t>();
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 0, 0, 2, 2, 2}));

  std::string err;
  try {
    g.call("tag_critic", {in.to_value()});
  } catch (const CallError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("MeshWorker.tag_critic (MESH_PROTO:critic)"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 0: mesh 'critic' was never registered"), std::string::npos) << err;
}

TEST(MegatronLayout, ALayoutThatDoesNotFillThePoolIsRejected) {
  ResourcePool pool = ResourcePool::cpu(4);
  EXPECT_THROW(WorkerGroup::spawn("ProtoWorker", pool, {},
                                  WorkerGroupOptions().set_layout(ParallelLayout{.tp = 2, .dp = 3})),
               CallError);
}

}  // namespace
}  // namespace baton
