// Sequence-length balancing (verl's balance_batch) over DP ranks.
#include "trainer/seqlen_balancing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace baton::trainer {
namespace {

std::vector<int64_t> totals(const std::vector<int64_t>& sizes, const std::vector<std::vector<int64_t>>& parts) {
  std::vector<int64_t> t;
  for (const auto& p : parts) {
    int64_t s = 0;
    for (int64_t i : p) s += sizes[static_cast<size_t>(i)];
    t.push_back(s);
  }
  return t;
}

void expect_equal_size_cover(const std::vector<std::vector<int64_t>>& parts, int64_t n, int64_t k) {
  ASSERT_EQ(static_cast<int64_t>(parts.size()), k);
  std::vector<int64_t> all;
  for (const auto& p : parts) {
    EXPECT_EQ(static_cast<int64_t>(p.size()), n / k);
    EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
    all.insert(all.end(), p.begin(), p.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
}

// A tenth of the responses 8x longer, all at the front (the contiguous split's
// worst case): the balanced split spreads the long ones one per rank.
TEST(SeqlenBalancing, SpreadsTheLongSequencesOverTheRanks) {
  std::vector<int64_t> sizes(40, 100);
  for (int i = 0; i < 4; ++i) sizes[static_cast<size_t>(i)] = 800;
  const auto parts = balanced_partitions(sizes, 4);
  expect_equal_size_cover(parts, 40, 4);
  const auto t = totals(sizes, parts);
  EXPECT_EQ(*std::min_element(t.begin(), t.end()), 1700);  // 800 + 9 x 100 each
  EXPECT_EQ(*std::max_element(t.begin(), t.end()), 1700);
  const auto m = seqlen_balance_metrics(sizes, parts);
  EXPECT_EQ(m.at("global_seqlen/max"), 4 * 800 + 6 * 100);  // the first rank, unbalanced
  EXPECT_EQ(m.at("global_seqlen/min"), 1000);
  EXPECT_EQ(m.at("global_seqlen/minmax_diff"), 2800);
  EXPECT_EQ(m.at("global_seqlen/balanced_min"), 1700);
  EXPECT_EQ(m.at("global_seqlen/balanced_max"), 1700);
  EXPECT_EQ(m.at("global_seqlen/mean"), 1700);
  // The order gives rank r part r under an equal contiguous split.
  const auto order = balanced_order(parts);
  ASSERT_EQ(order.size(), 40u);
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_TRUE(std::equal(parts[r].begin(), parts[r].end(), order.begin() + 10 * r));
}

// Random lengths: every part has n/k rows, and the spread is no wider than
// the largest single length (each merge pairs one state's largest part with
// the other's smallest, so the spread never grows past the widest state's,
// and a first state of k single rows spreads at most that); the same input
// gives the same parts.
TEST(SeqlenBalancing, RandomLengthsGiveEqualCountsAndANarrowSpread) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t k = 1 + trial % 8, n = k * (1 + static_cast<int64_t>(rng() % 16));
    std::vector<int64_t> sizes(static_cast<size_t>(n));
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 512);
    const auto parts = balanced_partitions(sizes, k);
    expect_equal_size_cover(parts, n, k);
    const auto t = totals(sizes, parts);
    const int64_t spread = *std::max_element(t.begin(), t.end()) - *std::min_element(t.begin(), t.end());
    EXPECT_LE(spread, *std::max_element(sizes.begin(), sizes.end())) << "trial " << trial;
    EXPECT_EQ(balanced_partitions(sizes, k), parts);
  }
}

TEST(SeqlenBalancing, RowsThatDoNotSplitEquallyAreAnErrorNamingBoth) {
  try {
    balanced_partitions({1, 2, 3}, 2);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("3 rows do not split into 2 equal parts"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(balanced_partitions({1, 2}, 0), std::exception);
  EXPECT_TRUE(balanced_partitions({}, 3).empty());
}

}  // namespace
}  // namespace baton::trainer
