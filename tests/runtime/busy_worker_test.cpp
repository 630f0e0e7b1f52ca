// A worker that does not read its socket (busy in a long method, stopped,
// or dead but not yet gone) must never block the driver: every call returns
// at once, timeouts fire, shutdown kills, other groups go on.
//
// "Returns at once" is checked with loose bounds (2 s) against behaviour
// that would otherwise block for 10 s or for ever, so that a loaded machine
// cannot make these tests flaky; waits are on futures, never sleeps.
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "runtime/baton.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Far below anything that would block: the blocking behaviour being ruled
// out is infinite, or at least as long as a 10 s method.
constexpr auto kPrompt = seconds(2);
// Generous upper bound for an event that should come within milliseconds.
constexpr auto kEventually = seconds(20);

// 60 KB: under the shared-memory threshold, so the tensor travels in the
// socket itself. Eight of them are more than a Unix socket buffers by
// default (about 208 KiB), which used to block the fourth call.
at::Tensor socket_sized() { return at::rand({15000}); }
constexpr int kCallsPastTheSocketBuffer = 8;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}

// Waits for `f` to fail with E; returns its message ("" if it did not).
template <class E>
std::string failure(const Future<Value>& f, Clock::duration within = kEventually) {
  if (!f.wait_for(within)) return "";
  try {
    f.get();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong error type: ") + e.what();
  }
  return "";
}

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

TEST(BusyWorker, CallsToAStoppedWorkerReturnAtOnceTimeOutAndShutdownKillsIt) {
  ResourcePool one = ResourcePool::cpu(1);
  ResourcePool other = ResourcePool::cpu(1);
  WorkerGroup stopped = WorkerGroup::spawn("TestWorker", one);
  WorkerGroup healthy = WorkerGroup::spawn("TestWorker", other);
  const pid_t pid = stopped.pids()[0];
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);  // stands in for a method stuck in a collective

  std::vector<Future<Value>> calls;
  std::vector<Clock::time_point> made;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCallsPastTheSocketBuffer; ++i) {
    made.push_back(Clock::now());
    calls.push_back(
        stopped.call_rank(0, "echo", {socket_sized()}, CallOptions().set_timeout_ms(100)));
  }
  EXPECT_LT(Clock::now() - t0, kPrompt) << "call() blocked on a worker that does not read";

  // A call with a future argument goes through the dispatch thread; sending
  // it to the stopped worker must not hold up other groups' such calls.
  Future<Value> via_dispatch =
      stopped.call_rank(0, "echo", {healthy.call_rank(0, "echo", {socket_sized()})});
  at::Tensor x = socket_sized();
  Future<Value> on_healthy =
      healthy.call_rank(0, "echo", {healthy.call_rank(0, "echo", {x})});
  ASSERT_TRUE(on_healthy.wait_for(kEventually)) << "the healthy group's call stalled";
  EXPECT_TRUE(at::equal(on_healthy.get().as_tensor(), x));  // echo: the same bytes back

  // Each timeout counts from its call, not from a send that could not happen.
  for (size_t i = 0; i < calls.size(); ++i) {
    std::string err = failure<TimeoutError>(calls[i]);
    EXPECT_NE(err.find("TestWorker.echo on rank 0 timed out after 100 ms"), std::string::npos)
        << "call " << i << ": " << err;
    EXPECT_GE(Clock::now() - made[i], milliseconds(100)) << "call " << i;
  }
  EXPECT_FALSE(via_dispatch.ready());  // no timeout: it waits for the worker

  const auto t1 = Clock::now();
  stopped.shutdown(seconds(1));  // the exit request cannot be read: it is killed
  EXPECT_LT(Clock::now() - t1, seconds(1) + kPrompt);
  EXPECT_TRUE(process_gone(pid));
  EXPECT_FALSE(stopped.alive());
  std::string err = failure<WorkerDiedError>(via_dispatch);
  EXPECT_NE(err.find("did not exit in time"), std::string::npos) << err;
  EXPECT_EQ(healthy.call_rank(0, "count").get(kEventually), Value(1));
}

TEST(BusyWorker, ACallToAWorkerInALongMethodReturnsAtOnceAndItsTimeoutFires) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  Future<Value> long_method = g.call_rank(0, "sleep_ms", {10000});
  std::vector<Future<Value>> calls;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCallsPastTheSocketBuffer; ++i) {
    calls.push_back(g.call_rank(0, "echo", {socket_sized()}, CallOptions().set_timeout_ms(100)));
  }
  EXPECT_LT(Clock::now() - t0, kPrompt);
  for (const auto& f : calls) {
    EXPECT_NE(failure<TimeoutError>(f, kPrompt).find("timed out after 100 ms"), std::string::npos);
  }
  EXPECT_FALSE(long_method.ready());
  g.shutdown(milliseconds(100));  // kills it inside the method
  EXPECT_NE(failure<WorkerDiedError>(long_method).find("during TestWorker.sleep_ms"),
            std::string::npos);
}

TEST(BusyWorker, CallsQueuedForAStoppedWorkerRunInOrderOnceItResumes) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  const pid_t pid = g.pids()[0];
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  // Socket-sized tensors, and ones large enough for shared memory (their
  // segment's fd waits in the queue with the message).
  std::vector<at::Tensor> sent;
  std::vector<Future<Value>> echoes;
  const auto t0 = Clock::now();
  for (int i = 0; i < kCallsPastTheSocketBuffer; ++i) {
    sent.push_back(i % 3 == 1 ? at::rand({100000}) : socket_sized());
    echoes.push_back(g.call_rank(0, "echo", {sent.back()}));
    g.call_rank(0, "count");
  }
  Future<Value> last = g.call_rank(0, "count");
  EXPECT_LT(Clock::now() - t0, kPrompt);
  EXPECT_FALSE(last.ready());
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  // One count call per echo before it: the counter proves the order.
  EXPECT_EQ(last.get(kEventually), Value(kCallsPastTheSocketBuffer + 1));
  for (size_t i = 0; i < echoes.size(); ++i) {
    EXPECT_TRUE(at::equal(echoes[i].get(kEventually).as_tensor(), sent[i])) << i;  // bit-exact
  }
}

TEST(BusyWorker, WhenAWorkerDiesTheOtherWorkersPendingCallsFailAtOnce) {
  ResourcePool three = ResourcePool::cpu(3);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", three);
  const std::vector<pid_t> pids = g.pids();
  // Rank 0's death will not be seen (a child holds its socket open), so its
  // pending call can only fail because its group failed.
  const pid_t holder = static_cast<pid_t>(g.call_rank(0, "fork_holder").get().as_int());
  struct KillAtEnd {
    pid_t pid;
    ~KillAtEnd() { ::kill(pid, SIGKILL); }  // lets rank 0's socket close, so it can be reaped
  } kill_holder{holder};
  Future<Value> on_rank0 = g.call_rank(0, "block");
  Future<Value> queued_on_rank0 = g.call_rank(0, "count");
  Future<Value> on_rank2 = g.call_rank(2, "block");
  Future<Value> on_victim = g.call_rank(1, "block");
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);

  std::string victim = failure<WorkerDiedError>(on_victim);
  EXPECT_NE(victim.find("was killed by signal 9 (SIGKILL) during TestWorker.block"),
            std::string::npos)
      << victim;
  const auto noticed = Clock::now();
  std::string err = failure<WorkerDiedError>(on_rank0, kPrompt);
  EXPECT_LT(Clock::now() - noticed, kPrompt);
  EXPECT_NE(err.find("worker TestWorker rank 0"), std::string::npos) << err;
  EXPECT_NE(err.find("during TestWorker.block because its group"), std::string::npos) << err;
  EXPECT_NE(err.find("failed: worker TestWorker rank 1"), std::string::npos) << err;
  err = failure<WorkerDiedError>(queued_on_rank0, kPrompt);
  EXPECT_EQ(err.rfind("TestWorker.count refused: worker TestWorker rank 0", 0), 0u) << err;
  EXPECT_NE(failure<WorkerDiedError>(on_rank2, kPrompt).find("worker TestWorker rank 2"),
            std::string::npos);
  EXPECT_FALSE(g.alive());
}

TEST(BusyWorker, ALaterCallNamesTheCallTheWorkerDiedInAndSaysItWasRefused) {
  ResourcePool one = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", one);
  const std::string pid = std::to_string(g.pids()[0]);
  Future<Value> running = g.call_rank(0, "block");
  Future<Value> queued = g.call_rank(0, "count");
  ASSERT_EQ(::kill(g.pids()[0], SIGKILL), 0);
  const std::string death =
      "worker TestWorker rank 0 (pid " + pid + ") was killed by signal 9 (SIGKILL)";
  EXPECT_EQ(failure<WorkerDiedError>(running), death + " during TestWorker.block");
  EXPECT_EQ(failure<WorkerDiedError>(queued),
            "TestWorker.count refused: " + death + " during TestWorker.block");
  ASSERT_FALSE(g.alive());
  EXPECT_EQ(failure<WorkerDiedError>(g.call_rank(0, "my_rank")),
            "TestWorker.my_rank refused: " + death + " during TestWorker.block");
}

TEST(RankFailures, AMethodThatRaisesOnSeveralRanksNamesThemAllAndEachDistinctMessage) {
  ResourcePool four = ResourcePool::cpu(4);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", four);
  Future<List> mixed =
      g.call_per_rank("fail_or_sleep", {{"bad A", 0}, {"bad A", 0}, {"", 0}, {"bad B", 0}});
  try {
    mixed.get(kEventually);
    FAIL() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_STREQ(e.what(),
                 "TestWorker.fail_or_sleep failed on rank 0, 1, 3 (3 of 4 ranks): rank 0, 1: bad "
                 "A; rank 3: bad B");
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.remote_message(), "bad A");
    EXPECT_EQ(e.method(), "fail_or_sleep");
  }
  EXPECT_EQ(error_of([&] { g.call("throw_error", {"same"}).get(kEventually); }),
            "TestWorker.throw_error failed on rank 0, 1, 2, 3 (4 of 4 ranks): same");
  // A rank that does not answer is not waited for beyond a grace.
  Future<List> one_silent =
      g.call_per_rank("fail_or_sleep", {{"", 0}, {"", 60000}, {"bad C", 0}, {"", 0}});
  std::string err = error_of([&] { one_silent.get(kEventually); });
  EXPECT_EQ(err.rfind("TestWorker.fail_or_sleep failed on rank 2 (1 of 4 ranks; no answer from rank ",
                      0),
            0u)
      << err;
  // Ranks 0 and 3 answer at once; only on a very loaded machine could they miss the grace too.
  EXPECT_NE(err.find("1 within 1000 ms of the first failure): bad C"), std::string::npos) << err;
  g.shutdown(milliseconds(100));  // rank 1 is still asleep
}

TEST(Shutdown, TheDestructorWaitsForARunningCallOnlyForTheShutdownGrace) {
  ResourcePool one = ResourcePool::cpu(1);
  Future<Value> running;
  pid_t pid = -1;
  Clock::time_point t0;
  {
    WorkerGroup g = WorkerGroup::spawn(
        "TestWorker", one, {}, WorkerGroupOptions().set_shutdown_grace(milliseconds(200)));
    pid = g.pids()[0];
    running = g.call_rank(0, "block");
    t0 = Clock::now();
  }
  EXPECT_LT(Clock::now() - t0, kPrompt);  // the default grace would be 10 s
  EXPECT_TRUE(process_gone(pid));
  EXPECT_NE(failure<WorkerDiedError>(running).find("did not exit in time"), std::string::npos);
}

}  // namespace
}  // namespace baton
