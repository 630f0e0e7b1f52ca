// Calls on real groups of worker processes.
#include "net/auth.h"
#include "runtime/internal/auth_store.h"
#include "runtime/shared_tensor.h"
#include "runtime/worker_group.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "base/log.h"
#include "runtime/baton.h"

namespace baton {
namespace {

using std::chrono::milliseconds;

class WorkerGroupTest : public ::testing::Test {
 protected:
  ResourcePool pool4 = ResourcePool::cpu(4);
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

TEST_F(WorkerGroupTest, OneToAllSendsTheSameArgumentsToEveryRank) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  EXPECT_EQ(g.world_size(), 4);
  Value sums = g.call("add", {2, 3}).get();
  EXPECT_EQ(sums, Value(List{5, 5, 5, 5}));
  Value ranks = g.call("my_rank").get();
  EXPECT_EQ(ranks, Value(List{0, 1, 2, 3}));
}

TEST_F(WorkerGroupTest, AllToAllGivesRankRElementROfEachArgument) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  EXPECT_EQ(g.call("times_rank", {List{10, 10, 10, 10}}).get(), Value(List{0, 10, 20, 30}));
  std::string err = error_of([&] { g.call("times_rank", {List{1, 2, 3}}); });
  EXPECT_NE(err.find("ALL_TO_ALL"), std::string::npos) << err;
  EXPECT_NE(err.find("one element per rank (4), got a list of 3"), std::string::npos) << err;
}

TEST_F(WorkerGroupTest, RankZeroExecutionRunsOnlyRankZero) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  EXPECT_EQ(g.call("rank_zero_rank").get(), Value(0));
  // Only rank 0 counted a call.
  g.call_rank(0, "count").get();
  EXPECT_EQ(g.call("count").get(), Value(List{2, 1, 1, 1}));
}

TEST_F(WorkerGroupTest, PerRankArgumentsAndSingleRankCalls) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  List got = g.call_per_rank("add", {{0, 1}, {1, 1}, {2, 1}, {3, 1}}).get();
  EXPECT_EQ(Value(got), Value(List{1, 2, 3, 4}));
  EXPECT_EQ(g.call_rank(2, "my_rank").get(), Value(2));
  EXPECT_THROW(g.call_rank(4, "my_rank"), CallError);
  EXPECT_THROW(g.call_per_rank("add", {{0, 1}}), CallError);
}

TEST_F(WorkerGroupTest, InitArgumentsReachEveryWorker) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4, {Dict{{"lr", 0.5}}});
  Value v = g.call("init_value").get();
  // Copied through the wire: bit-exact.
  for (const Value& x : v.as_list()) EXPECT_EQ(x.at("lr").as_float(), 0.5);
}

TEST_F(WorkerGroupTest, WorkersKnowTheirPlaceAndShareTheCores) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  Value infos = g.call("info").get();
  std::set<int64_t> pids;
  const int cores = baton::usable_cores();
  for (int r = 0; r < 4; ++r) {
    const Value& i = infos.as_list()[r];
    EXPECT_EQ(i.at("rank").as_int(), r);
    EXPECT_EQ(i.at("world_size").as_int(), 4);
    EXPECT_EQ(i.at("local_rank").as_int(), r);
    EXPECT_EQ(i.at("slot").as_int(), r);
    EXPECT_EQ(i.at("device").as_int(), -1);  // CPU
    EXPECT_EQ(i.at("class").as_string(), "TestWorker");
    EXPECT_EQ(i.at("threads").as_int(), std::max(1, cores / 4));
    EXPECT_EQ(i.at("omp").as_string(), std::to_string(std::max(1, cores / 4)));
    EXPECT_EQ(i.at("torch_threads").as_int(), std::max(1, cores / 4));
    EXPECT_EQ(i.at("wait").as_string(), "PASSIVE");
    pids.insert(i.at("pid").as_int());
  }
  EXPECT_EQ(pids.size(), 4u);
  std::vector<pid_t> known = g.pids();
  EXPECT_EQ(std::set<int64_t>(known.begin(), known.end()), pids);
}

// The thread rule of runtime/threads.h: the driver runs one intra-op thread;
// a worker's wait policy is the pool's, whatever the driver's environment
// says, unless the pool inherits it.
TEST_F(WorkerGroupTest, ThreadsAndWaitPolicyAreThePoolsNotTheInheritedEnvironment) {
  EXPECT_EQ(at::get_num_threads(), 1) << "baton::init leaves the driver one intra-op thread";
  ::setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  ::setenv("GOMP_SPINCOUNT", "30000000", 1);
  struct Restore {
    ~Restore() {
      ::unsetenv("OMP_WAIT_POLICY");
      ::unsetenv("GOMP_SPINCOUNT");
    }
  } restore;
  {
    ResourcePool pool(ResourcePoolOptions().set_processes_on_nodes({2}).set_intra_op_threads(3));
    Value infos = WorkerGroup::spawn("TestWorker", pool).call("info").get();
    for (const Value& i : infos.as_list()) {
      EXPECT_EQ(i.at("threads").as_int(), 3);
      EXPECT_EQ(i.at("torch_threads").as_int(), 3);
      EXPECT_EQ(i.at("wait").as_string(), "PASSIVE");
      EXPECT_EQ(i.at("spin").as_string(), "") << "GOMP_SPINCOUNT would override the policy";
    }
  }
  {
    ResourcePool pool(ResourcePoolOptions().set_wait_policy(WaitPolicy::kActive));
    Value i = WorkerGroup::spawn("TestWorker", pool).call("info").get().as_list().at(0);
    EXPECT_EQ(i.at("wait").as_string(), "ACTIVE");
    EXPECT_EQ(i.at("spin").as_string(), "");
  }
  {
    ResourcePool pool(ResourcePoolOptions().set_wait_policy(WaitPolicy::kInherit));
    Value i = WorkerGroup::spawn("TestWorker", pool).call("info").get().as_list().at(0);
    EXPECT_EQ(i.at("wait").as_string(), "ACTIVE");
    EXPECT_EQ(i.at("spin").as_string(), "30000000");
  }
}

TEST(UsableCores, IsTheAffinityMaskAtMost) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(baton::usable_cores(), 1);
  EXPECT_LE(baton::usable_cores(), CPU_COUNT(&set));
}

TEST_F(WorkerGroupTest, ValuesOfEveryKindRoundTrip) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  Value v(Dict{{"i", -7},
               {"f", 0.25},
               {"b", false},
               {"s", "text"},
               {"n", Value()},
               {"l", List{1, List{2, "x"}, Dict{{"k", 3}}}},
               {"t", at::arange(6, at::kLong).reshape({2, 3})}});
  EXPECT_EQ(g.call_rank(0, "echo", {v}).get(), v);
  // 1 + 2.5 + 4.5 + 2 and / 4 are exact in any order.
  EXPECT_EQ(g.call_rank(0, "mean", {List{1, 2.5, 4.5, 2}}).get().as_float(), 2.5);
}

TEST_F(WorkerGroupTest, LargeAndNonContiguousTensorsGoThroughSharedMemoryBothWays) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  at::Tensor big = at::randn({1024, 1024});  // 4 MiB
  at::Tensor strided = big.t();
  at::Tensor back = g.call_rank(0, "scale", {strided, 2.0}).get().as_tensor();
  EXPECT_TRUE(back.equal(strided * 2));
  at::Tensor made = g.call_rank(0, "make", {1 << 20}).get().as_tensor();
  EXPECT_TRUE(made.equal(at::arange(1 << 20, at::kFloat)));
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kInt, at::kBool}) {
    at::Tensor t = at::ones({300, 300}).to(dtype);
    EXPECT_TRUE(g.call_rank(0, "echo", {t}).get().as_tensor().equal(t)) << dtype;
  }
}

// A shared tensor crosses as its memory: the worker's write shows in the
// driver's tensor (an ordinary one is the worker's own copy); a shared tensor
// the worker returns arrives shared and goes back to it by reference.
TEST_F(WorkerGroupTest, SharedTensorsArePassedNotCopied) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  at::Tensor shared = shared_empty({1 << 18});
  shared.zero_();
  at::Tensor ordinary = at::zeros({1 << 18});
  g.call_rank(0, "fill", {shared, 3.0}).get();
  g.call_rank(0, "fill", {ordinary, 3.0}).get();
  EXPECT_TRUE(shared.eq(3.0).all().item<bool>()) << "the worker wrote into the driver's pages";
  EXPECT_TRUE(ordinary.eq(0.0).all().item<bool>()) << "an ordinary tensor is copied";
  at::Tensor made = g.call_rank(0, "make_shared", {int64_t{1} << 20}).get().as_tensor();
  EXPECT_TRUE(is_shared(made));
  EXPECT_TRUE(made.equal(at::arange(1 << 20, at::kFloat)));
  g.call_rank(0, "fill", {made, 1.0}).get();
  EXPECT_TRUE(made.eq(1.0).all().item<bool>()) << "a returned shared tensor went back by reference";
}

TEST_F(WorkerGroupTest, ATensorTheWorkerKeepsIsNotOverwrittenByLaterCalls) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  at::Tensor a = at::full({1 << 20}, 1.0);
  g.call_rank(0, "keep", {a}).get();
  for (int i = 0; i < 3; ++i) g.call_rank(0, "sum", {at::full({1 << 20}, 5.0)}).get();
  // 2^20 fp32 ones: every partial sum is an integer below 2^24, exact.
  EXPECT_EQ(g.call_rank(0, "kept_sum").get().as_float(), 1 << 20);
}

TEST_F(WorkerGroupTest, ResultsComeBackInSubmissionOrderWithoutWaiting) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  std::vector<Future<Value>> fs;
  for (int i = 0; i < 1000; ++i) fs.push_back(g.call_rank(0, "count"));
  wait_all(fs);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(fs[i].get(), Value(i + 1));
  auto done = std::make_shared<Promise<int64_t>>();
  g.call_rank(0, "count").on_complete([done](const Future<Value>& f) {
    done->set_value(f.get().as_int());
  });
  EXPECT_EQ(done->future().get(std::chrono::seconds(30)), 1001);
}

TEST_F(WorkerGroupTest, WorkersAllReduceOverTheirOwnGlooGroup) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  List per_rank;
  for (int r = 0; r < 4; ++r) per_rank.push_back(List{at::full({3}, double(r + 1))});
  std::vector<List> args;
  for (int r = 0; r < 4; ++r) args.push_back({at::full({3}, double(r + 1))});
  List out = g.call_per_rank("all_reduce", args).get();
  for (const Value& v : out) EXPECT_TRUE(v.as_tensor().equal(at::full({3}, 10.0)));
}

// The sockets listening on TCP port `port` (IPv4 and IPv6), as the local
// addresses /proc/net/tcp{,6} print them (hex; 0100007F is 127.0.0.1).
std::vector<std::string> listeners_on(int64_t port) {
  std::vector<std::string> found;
  char want[8];
  std::snprintf(want, sizeof(want), "%04X", static_cast<unsigned>(port));
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == want)
        found.push_back(local.substr(0, colon));
    }
  }
  return found;
}

// The rendezvous store every worker meets at (and weight sync connects to)
// listens on the loopback interface only, not on every interface as c10d's
// TCPStore would by itself, and serves only clients that hold the cluster
// token, which the workers got from the driver and no longer keep in their
// environment.
TEST_F(WorkerGroupTest, TheRendezvousStoreListensOnLoopbackOnlyAndRequiresTheClusterToken) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  const Value info = g.call("info").get().as_list()[0];
  EXPECT_EQ(info.at("master_addr").as_string(), "127.0.0.1");
  EXPECT_EQ(info.at("token_env").as_string(), "");
  const int64_t port = info.at("master_port").as_int();
  ASSERT_GT(port, 0);
  EXPECT_EQ(listeners_on(port), std::vector<std::string>{"0100007F"});
  // The workers did meet there: a Gloo all-reduce over it works.
  std::vector<List> args;
  for (int r = 0; r < 4; ++r) args.push_back({at::full({2}, 1.0)});
  for (const Value& v : g.call_per_rank("all_reduce", args).get())
    EXPECT_TRUE(v.as_tensor().equal(at::full({2}, 4.0)));
  // The driver's token opens it; another does not.
  auto mine = c10::make_intrusive<AuthStore>("127.0.0.1", static_cast<uint16_t>(port));
  EXPECT_GT(mine->getNumKeys(), 0);
  EXPECT_THROW(c10::make_intrusive<AuthStore>("127.0.0.1", static_cast<uint16_t>(port),
                                              "not-the-cluster-token-0000"),
               auth::AuthError);
}

TEST_F(WorkerGroupTest, UnknownMethodFailsAtTheDriverListingTheKnownOnes) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  std::string err = error_of([&] { g.call("no_such_method"); });
  EXPECT_NE(err.find("worker class TestWorker has no method 'no_such_method'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("add"), std::string::npos) << err;
}

TEST_F(WorkerGroupTest, WrongArgumentsFailBeforeAnythingRuns) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  std::string err = error_of([&] { g.call("add", {1, "two"}); });
  EXPECT_NE(err.find("TestWorker.add: argument 1: expected int, got string"), std::string::npos)
      << err;
  EXPECT_NE(err.find("signature: add(int, int) -> int"), std::string::npos) << err;
  err = error_of([&] { g.call("add", {1}); });
  EXPECT_NE(err.find("takes 2 argument(s), 1 given"), std::string::npos) << err;
  EXPECT_THROW(g.call("scale", {1, 2.0}), CallError);
  EXPECT_THROW(g.call_per_rank("add", {{0, 1}, {1, 1}, {2, "x"}, {3, 1}}), CallError);
  // Nothing reached the workers: the first counted call is call 1 everywhere.
  EXPECT_EQ(g.call("count").get(), Value(List{1, 1, 1, 1}));
}

TEST_F(WorkerGroupTest, AnExceptionInAMethodNamesClassRankMethodAndMessage) {
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  try {
    g.call_rank(2, "throw_error", {"bad batch"}).get();
    FAIL() << "no exception";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker_class(), "TestWorker");
    EXPECT_EQ(e.rank(), 2);
    EXPECT_EQ(e.method(), "throw_error");
    EXPECT_EQ(e.remote_message(), "bad batch");
    EXPECT_STREQ(e.what(), "TestWorker.throw_error failed on rank 2: bad batch");
  }
  std::string err = error_of([&] { g.call("torch_error").get(); });
  EXPECT_NE(err.find("TestWorker.torch_error failed on rank"), std::string::npos) << err;
  EXPECT_NE(err.find("must match the size"), std::string::npos) << err;  // LibTorch's message
  // The workers are still usable.
  EXPECT_EQ(g.call("add", {1, 1}).get(), Value(List{2, 2, 2, 2}));
  EXPECT_TRUE(g.alive());
}

TEST_F(WorkerGroupTest, ACallPastItsTimeoutFailsWithTimeoutErrorAndTheWorkerGoesOn) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  Future<Value> slow = g.call_rank(0, "sleep_ms", {2000}, CallOptions().set_timeout_ms(50));
  std::string err = error_of([&] { slow.get(); });
  EXPECT_NE(err.find("TestWorker.sleep_ms on rank 0 timed out after 50 ms"), std::string::npos)
      << err;
  EXPECT_THROW(slow.get(), TimeoutError);
  EXPECT_EQ(g.call_rank(0, "count").get(), Value(1));  // ran after the slow call finished
}

TEST_F(WorkerGroupTest, ConstructorFailureFailsSpawnNamingTheRank) {
  std::string err = error_of([&] { WorkerGroup::spawn("TestWorker", pool4, {"fail"}); });
  EXPECT_NE(err.find("failed to start"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 3: constructing TestWorker on rank 3 failed: constructor asked to fail"),
            std::string::npos)
      << err;
  err = error_of([&] { WorkerGroup::spawn("NoSuchWorker", pool4); });
  EXPECT_NE(err.find("worker class 'NoSuchWorker' is not registered"), std::string::npos) << err;
  // The pool was given back: a new group can use it.
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool4);
  EXPECT_TRUE(g.alive());
}

TEST_F(WorkerGroupTest, PoolLimitsColocatedGroups) {
  ResourcePool shared(ResourcePoolOptions().set_processes_on_nodes({2}).set_max_colocate_count(2));
  WorkerGroup a = WorkerGroup::spawn("TestWorker", shared);
  WorkerGroup b = WorkerGroup::spawn("TestWorker", shared);
  std::string err = error_of([&] { WorkerGroup::spawn("TestWorker", shared); });
  EXPECT_NE(err.find("max_colocate_count"), std::string::npos) << err;
  b.shutdown();
  WorkerGroup c = WorkerGroup::spawn("TestWorker", shared);
  EXPECT_EQ(c.call("my_rank").get(), Value(List{0, 1}));
  EXPECT_THROW(ResourcePool(ResourcePoolOptions().set_processes_on_nodes({2, 2})), Error);
  EXPECT_THROW(ResourcePool(ResourcePoolOptions().set_processes_on_nodes({0})), Error);
}

// Reads `fd` until `needle` has appeared or `deadline` passes.
bool read_until(int fd, const std::string& needle, std::string& seen,
                std::chrono::steady_clock::time_point deadline) {
  while (seen.find(needle) == std::string::npos) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return false;
    seen.append(buf, static_cast<size_t>(n));
  }
  return true;
}

TEST_F(WorkerGroupTest, WorkerOutputReachesTheDriverConsolePrefixedWithClassAndRank) {
  ResourcePool two = ResourcePool::cpu(2);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", two);
  int out[2], err[2];
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(err), 0);
  std::fflush(stdout);
  std::fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  dup2(out[1], 1);
  dup2(err[1], 2);
  g.call("print", {"marker-42"}).get();
  std::string seen_out, seen_err;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool got_out = read_until(out[0], "[TestWorker:1] marker-42\n", seen_out, deadline) &&
                 read_until(out[0], "[TestWorker:0] marker-42\n", seen_out, deadline);
  bool got_err = read_until(err[0], "[TestWorker:1] err:marker-42\n", seen_err, deadline);
  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  EXPECT_TRUE(got_out) << seen_out;
  EXPECT_TRUE(got_err) << seen_err;
}

namespace fs = std::filesystem;

// The run's log file (base/log.h, spdlog's rotating sink) gets the
// driver's log lines and both workers' output lines, each with its prefix and
// a timestamp; past max_bytes it rotates, keeping max_files old files.
TEST_F(WorkerGroupTest, TheRunLogFileGetsEveryProcessesLinesAndRotates) {
  const std::string dir = "/tmp/baton-log-test-" + std::to_string(::getpid());
  const std::string path = dir + "/run/baton.log";
  set_log_file(path, 4096, 2);
  EXPECT_EQ(log_file_path(), path);
  {
    ResourcePool two = ResourcePool::cpu(2);
    WorkerGroup g = WorkerGroup::spawn("TestWorker", two);
    log(LogLevel::kWarn, "driver-marker-7");
    g.call("print", {"worker-marker-7"}).get();
    g.shutdown();  // the workers' pipes drain before it returns
  }
  auto read_all = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string text = read_all(path);
  for (const char* want : {"[baton] [warn] driver-marker-7", "[TestWorker:0] worker-marker-7",
                           "[TestWorker:1] worker-marker-7", "[TestWorker:1] err:worker-marker-7"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " not in:\n" << text;
  // Timestamped: "2026-11-27 03:12:45.123 [baton] ...".
  const size_t at = text.find("[baton] [warn] driver-marker-7");
  ASSERT_NE(at, std::string::npos);
  const size_t line_start = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
  EXPECT_EQ(at - line_start, 24u) << text.substr(line_start, at - line_start);
  EXPECT_EQ(text[line_start + 4], '-');

  // Rotation: 4 KiB files, two old ones kept.
  for (int i = 0; i < 200; ++i)
    log_output_line("[Filler:0] line " + std::to_string(i) + " of filler text");
  close_log_file();
  EXPECT_EQ(log_file_path(), "");
  EXPECT_TRUE(fs::exists(path));
  EXPECT_TRUE(fs::exists(dir + "/run/baton.1.log"));
  EXPECT_TRUE(fs::exists(dir + "/run/baton.2.log"));
  EXPECT_FALSE(fs::exists(dir + "/run/baton.3.log"));
  EXPECT_LE(fs::file_size(path), 4096u);
  EXPECT_NE(read_all(path).find("line 199 of filler"), std::string::npos);
  log(LogLevel::kWarn, "after-close");  // stderr only now
  EXPECT_EQ(read_all(path).find("after-close"), std::string::npos);
  for (const auto& e : fs::directory_iterator(dir + "/run")) fs::remove(e.path());
  fs::remove(dir + "/run");
  fs::remove(dir);
}

// Sets an environment variable of the driver for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

ResourcePool gpu_pool(int workers) {
  return ResourcePool(ResourcePoolOptions().set_processes_on_nodes({workers}).set_use_gpu(true));
}

TEST_F(WorkerGroupTest, GpuSlotsMapThroughTheDriversVisibleDevicesAndBeyondThemFailSpawn) {
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "5");
  ResourcePool pool = gpu_pool(2);
  std::string err = error_of([&] { WorkerGroup::spawn("TestWorker", pool); });
  EXPECT_NE(err.find("GPU slot 1 has no GPU: the driver's CUDA_VISIBLE_DEVICES=\"5\" lists 1"),
            std::string::npos)
      << err;
}

TEST_F(WorkerGroupTest, GpuWorkerWithoutADeviceFailsToStartSayingSo) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has a GPU: the worker would find it";
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "0");
  ResourcePool pool = gpu_pool(1);
  std::string err = error_of([&] { WorkerGroup::spawn("TestWorker", pool); });
  EXPECT_NE(err.find("rank 0 (GPU slot 0, CUDA_VISIBLE_DEVICES=0): "), std::string::npos) << err;
#if defined(BATON_CUDA)
  EXPECT_NE(err.find("CUDA sees no device"), std::string::npos) << err;
#else
  EXPECT_NE(err.find("this build has no CUDA"), std::string::npos) << err;
#endif
}

// Each worker sees one GPU, its slot's, as device 0, already current when its
// constructor runs; two of them all-reduce over NCCL (make_nccl_group).
TEST_F(WorkerGroupTest, GpuWorkersEachBindTheirSlotsGpuAndAllReduceOverNccl_CUDA) {
  const int64_t gpus = at::hasCUDA() ? static_cast<int64_t>(at::getNumGPUs()) : 0;
  if (gpus < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << gpus;
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "0,1");
  ResourcePool pool = gpu_pool(2);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
  Value infos = g.call("gpu_info").get();
  for (int r = 0; r < 2; ++r) {
    const Value& i = infos.as_list()[r];
    EXPECT_EQ(i.at("visible").as_string(), std::to_string(r)) << "rank " << r;
    EXPECT_EQ(i.at("device_count").as_int(), 1) << "rank " << r;
    EXPECT_EQ(i.at("current_device").as_int(), 0) << "rank " << r;
    EXPECT_EQ(i.at("device").as_int(), 0) << "rank " << r;
  }
  std::vector<List> args;
  for (int r = 0; r < 2; ++r) args.push_back({at::full({3}, double(r + 1))});
  List out = g.call_per_rank("nccl_all_reduce", args).get();
  for (const Value& v : out) EXPECT_TRUE(v.as_tensor().equal(at::full({3}, 3.0)));
}

}  // namespace
}  // namespace baton
