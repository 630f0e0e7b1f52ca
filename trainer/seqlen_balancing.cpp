#include "trainer/seqlen_balancing.h"

#include <algorithm>
#include <numeric>
#include <queue>

#include "base/errors.h"

namespace baton::trainer {
namespace {

// k parts, each with its items and their total, kept sorted by total
// (largest first); `spread` = largest total - smallest total.
struct State {
  std::vector<std::vector<int64_t>> items;
  std::vector<int64_t> totals;
  int64_t spread = 0;
  int64_t first = 0;  // the smallest index it holds: a deterministic tie-break

  void sort_parts() {
    std::vector<size_t> idx(totals.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return totals[a] > totals[b]; });
    std::vector<std::vector<int64_t>> i2;
    std::vector<int64_t> t2;
    for (size_t j : idx) {
      i2.push_back(std::move(items[j]));
      t2.push_back(totals[j]);
    }
    items = std::move(i2);
    totals = std::move(t2);
    spread = totals.front() - totals.back();
  }
};

struct WiderFirst {
  bool operator()(const State& a, const State& b) const {
    if (a.spread != b.spread) return a.spread < b.spread;  // max-heap on spread
    return a.first > b.first;
  }
};

}  // namespace

std::vector<std::vector<int64_t>> balanced_partitions(const std::vector<int64_t>& sizes, int64_t k) {
  const auto n = static_cast<int64_t>(sizes.size());
  if (k < 1 || n % k != 0) {
    throw Error("balanced_partitions: " + std::to_string(n) + " rows do not split into " +
                std::to_string(k) + " equal parts");
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return sizes[a] < sizes[b]; });
  std::priority_queue<State, std::vector<State>, WiderFirst> heap;
  for (int64_t g = 0; g < n; g += k) {
    State s;
    s.first = n;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = order[static_cast<size_t>(g + j)];
      s.items.push_back({i});
      s.totals.push_back(sizes[static_cast<size_t>(i)]);
      s.first = std::min(s.first, i);
    }
    s.sort_parts();
    heap.push(std::move(s));
  }
  while (heap.size() > 1) {
    State a = heap.top();
    heap.pop();
    State b = heap.top();
    heap.pop();
    // a's largest part with b's smallest, and so on: the spreads cancel.
    for (int64_t j = 0; j < k; ++j) {
      auto& into = a.items[static_cast<size_t>(j)];
      auto& from = b.items[static_cast<size_t>(k - 1 - j)];
      into.insert(into.end(), from.begin(), from.end());
      a.totals[static_cast<size_t>(j)] += b.totals[static_cast<size_t>(k - 1 - j)];
    }
    a.first = std::min(a.first, b.first);
    a.sort_parts();
    heap.push(std::move(a));
  }
  std::vector<std::vector<int64_t>> parts;
  if (!heap.empty()) parts = heap.top().items;
  for (auto& p : parts) std::sort(p.begin(), p.end());
  std::sort(parts.begin(), parts.end(),
            [](const auto& x, const auto& y) { return x.front() < y.front(); });
  return parts;
}

std::vector<int64_t> balanced_order(const std::vector<std::vector<int64_t>>& parts) {
  std::vector<int64_t> order;
  for (const auto& part : parts) order.insert(order.end(), part.begin(), part.end());
  return order;
}

std::map<std::string, double> seqlen_balance_metrics(const std::vector<int64_t>& sizes,
                                                     const std::vector<std::vector<int64_t>>& parts,
                                                     const std::string& prefix) {
  const auto k = static_cast<int64_t>(parts.size());
  const auto n = static_cast<int64_t>(sizes.size());
  std::map<std::string, double> m;
  if (k == 0 || n == 0) return m;
  std::vector<int64_t> contiguous(static_cast<size_t>(k), 0), balanced;
  for (int64_t i = 0; i < n; ++i) contiguous[static_cast<size_t>(i / (n / k))] += sizes[static_cast<size_t>(i)];
  for (const auto& p : parts) {
    int64_t t = 0;
    for (int64_t i : p) t += sizes[static_cast<size_t>(i)];
    balanced.push_back(t);
  }
  const auto [cmin, cmax] = std::minmax_element(contiguous.begin(), contiguous.end());
  const auto [bmin, bmax] = std::minmax_element(balanced.begin(), balanced.end());
  m[prefix + "/min"] = static_cast<double>(*cmin);
  m[prefix + "/max"] = static_cast<double>(*cmax);
  m[prefix + "/minmax_diff"] = static_cast<double>(*cmax - *cmin);
  m[prefix + "/balanced_min"] = static_cast<double>(*bmin);
  m[prefix + "/balanced_max"] = static_cast<double>(*bmax);
  m[prefix + "/mean"] = static_cast<double>(std::accumulate(sizes.begin(), sizes.end(), int64_t{0})) /
                        static_cast<double>(k);
  return m;
}

}  // namespace baton::trainer
