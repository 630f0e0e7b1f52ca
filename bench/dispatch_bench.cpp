// dispatch_bench: DataProto dispatch throughput, next to memcpy measured in
// the same run.
//
//   ./build/bench/dispatch_bench            # the last line of stdout is JSON
#include <ATen/ops/ones.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

class Echo : public baton::Worker {
 public:
  // Returns a tensor of the same size as the chunk it got.
  baton::DataProto echo(const baton::DataProto& b) {
    return baton::DataProto({{"y", b.tensor("x")}});
  }
  static void register_methods(baton::MethodTable<Echo>& t) {
    namespace mode = baton::dispatch_mode;
    t.def("dp", &Echo::echo, baton::MethodOptions().set_dispatch_mode(mode::kDpComputeProto));
    t.def("mesh", &Echo::echo, baton::MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  }
};
BATON_WORKER(Echo);

double time_call(baton::WorkerGroup& g, const char* method, const baton::Value& batch,
                 int64_t rows) {
  std::vector<double> secs;
  for (int i = 0; i < 6; ++i) {
    auto t0 = Clock::now();
    baton::Value out = g.call(method, {batch}).get();
    if (i > 0) secs.push_back(seconds(Clock::now() - t0));
    if (baton::DataProto::from_value(out).size() != rows) std::abort();
  }
  return median(secs);
}

}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);
  const size_t kBytes = size_t{64} << 20;
  double memcpy_gbps;
  {
    std::vector<char> a(kBytes, 1), b(kBytes, 0);
    std::vector<double> secs;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), kBytes);
      secs.push_back(seconds(Clock::now() - t0));
    }
    memcpy_gbps = kBytes / median(secs) / 1e9;
  }
  // 64 MiB of float32: 256 rows of 65536 values.
  const int64_t rows = 256;
  baton::DataProto batch({{"x", at::ones({rows, static_cast<int64_t>(kBytes / 4 / rows)})}});
  baton::Value value = batch.to_value();

  baton::ResourcePool pool = baton::ResourcePool::cpu(4);
  // The same batch with its tensor in shared memory (baton::to_shared): the
  // DP chunks are views of it and travel by reference; each worker's echo of
  // its chunk comes back by reference too, and only the collect's
  // concatenation copies.
  baton::Value shared_value =
      baton::DataProto({{"x", baton::to_shared(batch.tensor("x"))}}).to_value();
  double dp_s, dp_shared_s;
  {
    baton::WorkerGroup g = baton::WorkerGroup::spawn("Echo", pool);
    dp_s = time_call(g, "dp", value, rows);
    dp_shared_s = time_call(g, "dp", shared_value, rows);
  }
  double mesh_s;
  {
    baton::WorkerGroup g = baton::WorkerGroup::spawn(
        "Echo", pool, {},
        baton::WorkerGroupOptions().set_layout(baton::ParallelLayout{.tp = 2, .dp = 2}));
    mesh_s = time_call(g, "mesh", value, rows);
  }
  double dp_gbps = 2.0 * kBytes / dp_s / 1e9;  // out and back
  double dp_shared_gbps = 2.0 * kBytes / dp_shared_s / 1e9;
  double mesh_gbps = 1.0 * kBytes / mesh_s / 1e9;
  std::fprintf(stderr, "dp call %.1f ms (shared batch %.1f ms), mesh call %.1f ms\n", dp_s * 1e3,
               dp_shared_s * 1e3, mesh_s * 1e3);
  std::printf(
      "{\"memcpy_gbps\": %.2f, \"dp_proto_gbps\": %.2f, \"mesh_replica_gbps\": %.2f, "
      "\"dp_over_memcpy\": %.2f, \"mesh_call_over_dp_call\": %.2f, "
      "\"dp_proto_shared_gbps\": %.2f, \"dp_shared_over_memcpy\": %.2f}\n",
      memcpy_gbps, dp_gbps, mesh_gbps, dp_gbps / memcpy_gbps, mesh_s / dp_s, dp_shared_gbps,
      dp_shared_gbps / memcpy_gbps);
  return 0;
}
