// DP_COMPUTE_PROTO_WITH_FUNC: named functions run on the workers through the
// built-in method execute_with_func.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "dispatch/data_proto.h"
#include "dispatch/worker_function.h"
#include "runtime/baton.h"

namespace baton {
namespace {

BATON_FUNCTION(add_rank, [](Worker& w, const DataProto& b) {
  return DataProto({{"x", b.tensor("x") + w.rank()}});
});

// The general form: two DataProto chunks in, their sum out.
BATON_FUNCTION(sum_pair, [](Worker&, const List& chunks) -> Value {
  DataProto a = DataProto::from_value(chunks.at(0));
  DataProto b = DataProto::from_value(chunks.at(1));
  return DataProto({{"s", a.tensor("x") + b.tensor("x")}});
});

BATON_FUNCTION(throws,
               [](Worker&, const DataProto&) -> DataProto { throw std::runtime_error("boom"); });

// Any worker class has execute_with_func; this one has nothing else.
class Plain : public Worker {
 public:
  int64_t one() { return 1; }
  static void register_methods(MethodTable<Plain>& t) { t.def("one", &Plain::one); }
};
BATON_WORKER(Plain);

DataProto batch_of(int64_t rows) { return DataProto({{"x", at::arange(rows, at::kFloat)}}); }

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

class WorkerFunctionTest : public ::testing::Test {
 protected:
  ResourcePool pool = ResourcePool::cpu(4);
  WorkerGroup group = WorkerGroup::spawn("Plain", pool);
};

TEST_F(WorkerFunctionTest, ExecuteWithFuncRunsTheNamedFunctionOnEachRanksChunk) {
  DataProto in = batch_of(8);  // rank r gets rows 2r, 2r+1
  DataProto out = group.call(kExecuteWithFunc, {"add_rank", in}).get().as<DataProto>();
  at::Tensor rank_of_row = at::arange(4, at::kFloat).repeat_interleave(2);
  EXPECT_TRUE(out.tensor("x").equal(in.tensor("x") + rank_of_row));

  DataProto sums = group.call(kExecuteWithFunc, {"sum_pair", in, in}).get().as<DataProto>();
  EXPECT_TRUE(sums.tensor("s").equal(in.tensor("x") * 2));

  // The result of one call, still pending, as the batch of the next.
  Future<Value> once = group.call(kExecuteWithFunc, {"add_rank", in});
  DataProto twice = group.call(kExecuteWithFunc, {"add_rank", once}).get().as<DataProto>();
  EXPECT_TRUE(twice.tensor("x").equal(in.tensor("x") + rank_of_row * 2));
}

TEST_F(WorkerFunctionTest, AnUnknownFunctionFailsAtTheDriverNamingFunctionAndMethod) {
  std::string err = error_of([&] {
    group.call(kExecuteWithFunc, {"no_such_function", batch_of(8)});
  });
  EXPECT_NE(err.find("Plain.execute_with_func (DP_COMPUTE_PROTO_WITH_FUNC): function "
                     "'no_such_function' is not registered (BATON_FUNCTION or register_function); "
                     "registered: add_rank, "),
            std::string::npos)
      << err;
}

TEST_F(WorkerFunctionTest, BadArgumentsNameMethodModeAndSizes) {
  const std::string where = "Plain.execute_with_func (DP_COMPUTE_PROTO_WITH_FUNC): ";
  std::string err = error_of([&] { group.call(kExecuteWithFunc, {5, batch_of(8)}); });
  EXPECT_NE(err.find(where + "argument 0 must name a function registered with BATON_FUNCTION or "
                             "register_function, got a int"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call(kExecuteWithFunc, {"add_rank", batch_of(6)}); });
  EXPECT_NE(err.find(where + "argument 1 has 6 rows, not divisible into 4 parts (this mode does "
                             "not pad)"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call(kExecuteWithFunc, {"sum_pair", batch_of(8), batch_of(4)}); });
  EXPECT_NE(err.find(where + "argument 2 has 4 rows, argument 1 has 8"), std::string::npos) << err;
  err = error_of([&] { group.call(kExecuteWithFunc, {"add_rank", 3}); });
  EXPECT_NE(err.find(where + "argument 1 must be a DataProto"), std::string::npos) << err;

  // Errors only the worker can see come back naming the function.
  err = error_of([&] {
    group.call(kExecuteWithFunc, {"add_rank", batch_of(8), batch_of(8)}).get();
  });
  EXPECT_NE(err.find("Plain.execute_with_func failed on rank "), std::string::npos) << err;
  EXPECT_NE(err.find("function 'add_rank': it takes one DataProto argument, the call gave 2"),
            std::string::npos)
      << err;
  err = error_of([&] { group.call(kExecuteWithFunc, {"throws", batch_of(8)}).get(); });
  EXPECT_NE(err.find("function 'throws': boom"), std::string::npos) << err;
  EXPECT_EQ(group.call("one").get(), Value(List{1, 1, 1, 1}));  // the workers go on
}

TEST(WorkerFunction, RegisteringTwiceOrAfterInitIsAnError) {
  auto fn = [](Worker&, const DataProto& b) { return b; };
  std::string err = error_of([&] { register_function("add_rank", ProtoFunction(fn)); });
  EXPECT_NE(err.find("function 'add_rank' is already registered"), std::string::npos) << err;
  err = error_of([&] { register_function("late", ProtoFunction(fn)); });
  EXPECT_NE(err.find("register_function('late') after baton::init(): worker processes would "
                     "never have it"),
            std::string::npos)
      << err;
  EXPECT_FALSE(has_function("late"));
}

}  // namespace
}  // namespace baton
