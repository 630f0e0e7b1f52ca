#include "runtime/future.h"

#include <gtest/gtest.h>

#include <thread>

namespace baton {
namespace {

TEST(Future, CompletesOnceAndRethrowsErrors) {
  Promise<int> p;
  Future<int> f = p.future();
  EXPECT_FALSE(f.ready());
  EXPECT_TRUE(p.set_value(3));
  EXPECT_FALSE(p.set_value(4));  // first completion wins
  EXPECT_EQ(f.get(), 3);

  Promise<int> q;
  q.fail(Error("boom"));
  EXPECT_THROW(q.future().get(), Error);
  EXPECT_NE(q.future().error(), nullptr);
}

TEST(Future, GetWithTimeoutThrowsTimeoutErrorAndLeavesTheFuturePending) {
  Promise<int> p;
  Future<int> f = p.future();
  EXPECT_THROW(f.get(std::chrono::milliseconds(10)), TimeoutError);
  p.set_value(1);
  EXPECT_EQ(f.get(std::chrono::milliseconds(10)), 1);
}

TEST(Future, ThenChainsValuesAndPropagatesErrors) {
  Promise<int> p;
  Future<std::string> s = p.future().then([](const int& x) { return std::to_string(x * 2); });
  Future<int> bad = p.future().then([](const int&) -> int { throw Error("in then"); });
  p.set_value(21);
  EXPECT_EQ(s.get(), "42");
  EXPECT_THROW(bad.get(), Error);

  Promise<int> q;
  Future<int> chained = q.future().then([](const int& x) { return x + 1; });
  q.fail(TimeoutError("late"));
  EXPECT_THROW(chained.get(), TimeoutError);
}

TEST(Future, CallbackRunsOnTheCompletingThreadOrInline) {
  Promise<int> p;
  std::thread::id ran_on;
  p.future().on_complete([&](const Future<int>&) { ran_on = std::this_thread::get_id(); });
  std::thread t([&] { p.set_value(1); });
  std::thread::id completer = t.get_id();
  t.join();
  EXPECT_EQ(ran_on, completer);
  bool inline_ran = false;
  p.future().on_complete([&](const Future<int>&) { inline_ran = true; });
  EXPECT_TRUE(inline_ran);
}

TEST(Future, WaitAnyReturnsTheCompletedOneOrNulloptOnTimeout) {
  Promise<int> a, b;
  std::vector<Future<int>> fs{a.future(), b.future()};
  EXPECT_FALSE(wait_any(fs, std::chrono::milliseconds(5)).has_value());
  std::thread t([&] { b.set_value(2); });
  auto i = wait_any(fs);
  t.join();
  ASSERT_TRUE(i.has_value());
  EXPECT_EQ(*i, 1u);
  a.set_value(1);
  wait_all(fs);
  EXPECT_TRUE(fs[0].ready() && fs[1].ready());
}

}  // namespace
}  // namespace baton
