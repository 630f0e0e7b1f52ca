// The Future of one call as an argument of another group's call.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"

namespace baton {
namespace {

namespace mode = dispatch_mode;

// A FIFO per rank that a worker method blocks on until the test opens it:
// an event the test controls, so that a call can be held pending without
// sleeping. The test keeps each FIFO open read-write, so a worker's open
// never blocks and its read returns when the test writes (or exits).
class Gates {
 public:
  explicit Gates(int n) {
    char tmpl[] = "/tmp/baton-gates-XXXXXX";
    dir_ = mkdtemp(tmpl);
    for (int r = 0; r < n; ++r) {
      std::string path = prefix() + std::to_string(r);
      EXPECT_EQ(mkfifo(path.c_str(), 0600), 0);
      fds_.push_back(open(path.c_str(), O_RDWR | O_CLOEXEC));
    }
  }
  ~Gates() {
    for (size_t r = 0; r < fds_.size(); ++r) {
      close(fds_[r]);
      unlink((prefix() + std::to_string(r)).c_str());
    }
    rmdir(dir_.c_str());
  }
  std::string prefix() const { return dir_ + "/gate-"; }
  void open_all() {
    for (int fd : fds_) EXPECT_EQ(write(fd, "x", 1), 1);
  }

 private:
  std::string dir_;
  std::vector<int> fds_;
};

class Stage : public Worker {
 public:
  // Doubles "x"; tags rows with the rank and this worker's call count. Waits
  // at the gate named by meta "gate", if any (the output has no meta).
  DataProto double_x(const DataProto& b) {
    ++calls_;
    if (const Value* gate = b.meta_value("gate")) {
      int fd = open((gate->as_string() + std::to_string(rank())).c_str(), O_RDONLY | O_CLOEXEC);
      char c;
      if (fd < 0 || read(fd, &c, 1) < 0) throw std::runtime_error("gate failed");
      close(fd);
    }
    return DataProto({{"x", b.tensor("x") * 2},
                      {"seen_by", at::full({b.size()}, static_cast<int64_t>(rank()), at::kLong)},
                      {"call", at::full({b.size()}, calls_, at::kLong)}});
  }
  DataProto explode(const DataProto&) { throw std::runtime_error("upstream exploded"); }
  int64_t seq() { return ++calls_; }
  int64_t rows(const DataProto& b) { return b.size(); }
  int64_t length(const std::vector<Value>& xs) { return static_cast<int64_t>(xs.size()); }

  static void register_methods(MethodTable<Stage>& t) {
    t.def("double_x", &Stage::double_x, MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("explode", &Stage::explode, MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("seq", &Stage::seq);
    t.def("rows", &Stage::rows);
    t.def("length", &Stage::length);
  }

 private:
  int64_t calls_ = 0;
};
BATON_WORKER(Stage);

DataProto batch_of(int64_t rows, const std::string& gate = "") {
  DataProto b({{"x", at::arange(rows, at::kFloat)}});
  if (!gate.empty()) b.set_meta("gate", gate);
  return b;
}

std::vector<int64_t> as_vector(const at::Tensor& t) {
  at::Tensor c = t.contiguous().to(at::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Group a: 2 workers; group b: 3 workers, so b re-chunks what a returns.
class FutureArgsTest : public ::testing::Test {
 protected:
  ResourcePool pool_a = ResourcePool::cpu(2);
  ResourcePool pool_b = ResourcePool::cpu(3);
  WorkerGroup a = WorkerGroup::spawn("Stage", pool_a);
  WorkerGroup b = WorkerGroup::spawn("Stage", pool_b);
  Gates gates{2};
};

TEST_F(FutureArgsTest, ADataProtoFutureGoesIntoAnotherGroupsMethodWithoutBlockingTheCaller) {
  DataProto in = batch_of(6, gates.prefix());
  Future<Value> from_a = a.call("double_x", {in});
  // a cannot finish before the gates open, so these calls must not wait for it.
  Future<Value> from_b = b.call("double_x", {from_a});
  Future<Value> rows = b.call_rank(1, "rows", {from_a});
  EXPECT_FALSE(from_a.ready());
  EXPECT_FALSE(from_b.ready());
  gates.open_all();
  DataProto out = from_b.get().as<DataProto>();
  EXPECT_TRUE(out.tensor("x").equal(in.tensor("x") * 4));
  EXPECT_EQ(as_vector(out.tensor("seen_by")), (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(rows.get(), Value(6));
}

TEST_F(FutureArgsTest, ACallWaitingForAFutureKeepsItsPlaceInItsGroupsOrder) {
  Future<Value> from_a = a.call("double_x", {batch_of(6, gates.prefix())});
  Future<Value> first = b.call("double_x", {from_a});
  Future<Value> second = b.call("seq");  // no future, but submitted after `first`
  Future<Value> third = b.call_all("seq").then([](const List& l) { return Value(l); });
  EXPECT_FALSE(second.ready());
  gates.open_all();
  EXPECT_EQ(as_vector(first.get().as<DataProto>().tensor("call")), std::vector<int64_t>(6, 1));
  EXPECT_EQ(second.get(), Value(List{2, 2, 2}));
  EXPECT_EQ(third.get(), Value(List{3, 3, 3}));
}

TEST_F(FutureArgsTest, AFailedFutureFailsTheCallNamingBothMethodsAndNothingIsSent) {
  Future<Value> from_a = a.call("explode", {batch_of(4)});
  Future<Value> from_b = b.call("double_x", {from_a});
  try {
    from_b.get();
    FAIL() << "no error";
  } catch (const UpstreamError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Stage.double_x (DP_COMPUTE_PROTO): argument 0 is the future of a call "
                       "that failed: Stage.explode failed on rank "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(": upstream exploded"), std::string::npos) << msg;
    EXPECT_THROW(e.rethrow_nested(), RemoteError);
  }
  EXPECT_EQ(b.call("seq").get(), Value(List{1, 1, 1}));  // double_x never ran on b
}

TEST_F(FutureArgsTest, AResolvedValueTheModeRejectsFailsTheFutureNamingMethodAndMode) {
  Future<Value> not_a_batch = a.call("seq");  // a list of ints
  std::string err;
  try {
    b.call("double_x", {not_a_batch}).get();
  } catch (const CallError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("Stage.double_x (DP_COMPUTE_PROTO): argument 0 must be a DataProto"),
            std::string::npos)
      << err;
  EXPECT_EQ(b.call("seq").get(), Value(List{1, 1, 1}));
  // A call_all result goes in as the list of per-rank results.
  EXPECT_EQ(b.call_rank(0, "length", {a.call_all("seq")}).get(), Value(2));
}

TEST_F(FutureArgsTest, ShuttingDownFailsTheCallsStillWaitingAndNothingHangs) {
  Future<Value> from_a = a.call("double_x", {batch_of(6, gates.prefix())});
  Future<Value> waiting = b.call("double_x", {from_a});
  b.shutdown();
  std::string err;
  try {
    waiting.get();
  } catch (const CallError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("Stage.double_x (DP_COMPUTE_PROTO): not sent: group Stage_"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("was shut down while the call waited for its arguments"), std::string::npos)
      << err;
  gates.open_all();
  EXPECT_EQ(from_a.get().as<DataProto>().size(), 6);
}

}  // namespace
}  // namespace baton
