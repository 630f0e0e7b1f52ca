// Collective deadlines over real Gloo processes (deadline_group.h): a rank
// that stops arriving makes the others throw within the deadline, naming the
// group, the operation and the missing rank; with every rank arriving in time
// nothing changes. Deadlines are 1-2 s so each test stays short.
#include "engine/parallel/deadline_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/errors.h"
#include "engine/parallel/parallel_state.h"
#include "engine/parallel/shm_group.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using test::run_world;

constexpr milliseconds kDeadline{1000};
// How much later than the deadline a failure may come on a loaded 2-core
// machine (Gloo's timeout applies to each wait inside an algorithm).
constexpr milliseconds kSlack{5000};

// The ranks that expect a failure report here once they have checked it; the
// rank that stopped arriving stays alive until all have (a rank that exited
// would close its connections and turn the others' timeouts into another
// error), and so do they.
void finish(c10d::Store& store, int64_t failing_ranks) {
  if (failing_ranks > 0 && store.add("test/checked", 1) == failing_ranks)
    store.set("test/released", std::vector<uint8_t>{1});
  store.wait({"test/released"}, std::chrono::seconds(60));
}

// The message of the EngineError `f` throws, after checking that it came
// once the deadline had passed and not much later.
template <typename F>
std::string failure_of(F&& f, milliseconds deadline = kDeadline) {
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const EngineError& e) {
    const auto waited = Clock::now() - t0;
    EXPECT_GE(waited, deadline - milliseconds(50)) << e.what();
    EXPECT_LT(waited, 2 * deadline + kSlack) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no EngineError";
  return "";
}

void expect_names(const std::string& message, const std::vector<std::string>& needles) {
  for (const auto& n : needles)
    EXPECT_NE(message.find(n), std::string::npos) << "\"" << n << "\" not in: " << message;
}

TEST(DeadlineGroup, EveryRankArrivingInTimeChangesNothing) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.tp = 3;
    auto ps = ParallelState::create(store, rank, cfg, milliseconds(2000));
    EXPECT_EQ(ps->collective_timeout(), milliseconds(2000));
    const Group& tp = ps->tp();
    auto* deadline = dynamic_cast<DeadlineGroup*>(tp.pg.get());
    ASSERT_NE(deadline, nullptr);
    EXPECT_EQ(deadline->name(), "world/tp/model_parallel");
    EXPECT_EQ(deadline->timeout(), milliseconds(2000));
    EXPECT_TRUE(deadline->has_board());

    // A rank that comes late, but within the deadline, is waited for.
    if (rank == 1) std::this_thread::sleep_for(milliseconds(300));
    const auto x = at::full({2}, static_cast<double>(rank + 1), at::kDouble);
    EXPECT_TRUE(at::equal(collective::all_reduce(x, tp), at::full({2}, 6.0, at::kDouble)));
    EXPECT_TRUE(at::equal(collective::all_gather(x, 0, tp),
                          at::tensor(std::vector<double>{1, 1, 2, 2, 3, 3}, at::kDouble)));
    const auto y = at::arange(6, at::kDouble) * static_cast<double>(rank + 1);
    EXPECT_TRUE(at::equal(collective::reduce_scatter(y, 0, tp),
                          at::arange(rank * 2, rank * 2 + 2, at::kDouble) * 6));
    std::vector<at::Tensor> b{at::full({1}, static_cast<double>(rank), at::kDouble)};
    c10d::BroadcastOptions root;
    root.rootRank = 2;
    tp.pg->broadcast(b, root)->wait();
    EXPECT_EQ(b[0].item<double>(), 2.0);
    barrier(tp);
    // Point to point around the ring, each send posted before its receive.
    std::vector<at::Tensor> out{at::full({1}, static_cast<double>(rank), at::kDouble)};
    std::vector<at::Tensor> in{at::empty({1}, at::kDouble)};
    auto sent = tp.pg->send(out, static_cast<int>((rank + 1) % 3), 7);
    tp.pg->recv(in, static_cast<int>((rank + 2) % 3), 7)->wait();
    sent->wait();
    EXPECT_EQ(in[0].item<double>(), static_cast<double>((rank + 2) % 3));
  });
}

TEST(DeadlineGroup, ARankThatStopsArrivingFailsTheOthersNamingIt) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.tp = 3;
    auto ps = ParallelState::create(store, rank, cfg, kDeadline);
    const at::Tensor x = at::ones({4}, at::kFloat);
    collective::all_reduce(x, ps->tp());
    if (rank == 2) {  // stops arriving: alive, never calls the next one
      finish(*store, 0);
      return;
    }
    const std::string message = failure_of([&] { collective::all_reduce(x, ps->tp()); });
    expect_names(message, {"group world/tp/model_parallel (ranks 0, 1, 2)",
                           "all_reduce #2 on rank " + std::to_string(rank),
                           "collective deadline 1000 ms", "rank 2 did not arrive",
                           "its last collective on this group: all_reduce #1", "alive"});
    EXPECT_EQ(message.find("rank 1 did not arrive"), std::string::npos) << message;
    finish(*store, 2);
  });
}

TEST(DeadlineGroup, ARecvWhoseSenderNeverSendsNamesTheSender) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.pp = 2;
    auto ps = ParallelState::create(store, rank, cfg, kDeadline);
    if (rank == 1) {
      finish(*store, 0);
      return;
    }
    std::vector<at::Tensor> buf{at::empty({3}, at::kFloat)};
    const std::string message = failure_of([&] { ps->pp().pg->recv(buf, 1, 5)->wait(); });
    expect_names(message, {"recv from rank 1 (tag 5) on rank 0", "rank 1 did not arrive",
                           "collective deadline 1000 ms"});
    finish(*store, 1);
  });
}

TEST(DeadlineGroup, ARankThatNeverJoinsTheGroupIsNamed) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    if (rank == 2) {
      finish(*store, 0);
      return;
    }
    const std::string message =
        failure_of([&] { make_gloo_group(store, rank, 3, kDeadline, "late"); });
    expect_names(message, {"group late: rank 2 did not join within 1000 ms"});
    finish(*store, 2);
  });
}

TEST(DeadlineGroup, AShmGroupRankThatStopsArrivingIsNamed) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig cfg;
    cfg.dp = 2;
    auto ps = ParallelState::create(store, rank, cfg, kDeadline);
    auto shm = ShmGroup::create(ps->dp(), 8, ps->collective_timeout());
    ASSERT_NE(shm, nullptr);
    EXPECT_EQ(shm->all_reduce_sum(1.0), 2.0);
    if (rank == 1) {
      finish(*store, 0);
      return;
    }
    at::Tensor out = at::empty({4});
    const std::string message = failure_of([&] { shm->reduce_scatter(out); });
    expect_names(message, {"group world/dp/dp_cp (ranks 0, 1) in shared memory",
                           "reduce_scatter", "on rank 0", "collective deadline 1000 ms",
                           "rank 1 (pid", "alive", "did not arrive"});
    finish(*store, 1);
  });
}

}  // namespace
}  // namespace baton::engine
