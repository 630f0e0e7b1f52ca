// soak: the runtime under calls at full rate for a long time (issue 26:
// nothing may grow). A driver and --workers worker processes; each call sends
// a DataProto of --rows rows × --width floats, split over the workers
// (DP_COMPUTE_PROTO), each worker returns its rows doubled, and the driver
// checks the sum of what came back. Every --window seconds it records the
// calls per second of the window and, for the driver and every worker, the
// resident set (VmRSS), the open file descriptors and how many of them are
// shared-memory segments (memfd or /dev/shm), plus the entries of /dev/shm.
//
//   build/bench/soak [--seconds 600] [--window 30] [--workers 2] [--rows 64] [--width 1024]
//
// Prints one JSON line: the first and the last window's figures, every
// window's call rate, and the changes between first and last window (the
// claim is that they are flat: RSS within a few MB, fds and segments equal,
// the call rate steady). Nothing else should run meanwhile.
#include <ATen/ATen.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"

namespace {

using baton::DataProto;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class SoakWorker : public baton::Worker {
 public:
  DataProto doubled(const DataProto& d) {
    DataProto out;
    out.set_tensor("x", d.tensor("x") * 2);
    return out;
  }
  static void register_methods(baton::MethodTable<SoakWorker>& t) {
    t.def("doubled", &SoakWorker::doubled,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
  }
};
BATON_WORKER(SoakWorker);

struct ProcessFigures {
  double rss_mb = 0;
  int64_t fds = 0, shm_fds = 0;
};

ProcessFigures figures_of(pid_t pid) {
  ProcessFigures f;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream status(proc + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) f.rss_mb = std::stod(line.substr(6)) / 1024.0;
  }
  if (DIR* d = ::opendir((proc + "/fd").c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      ++f.fds;
      char target[512] = {};
      const std::string link = proc + "/fd/" + e->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      const std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (t.rfind("/memfd:", 0) == 0 || t.rfind("/dev/shm/", 0) == 0) ++f.shm_fds;
    }
    ::closedir(d);
  }
  return f;
}

int64_t dev_shm_entries() {
  int64_t n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

json snapshot(const std::vector<pid_t>& workers, double calls_per_s) {
  json j = {{"calls_per_s", calls_per_s}, {"dev_shm_entries", dev_shm_entries()}};
  auto put = [&](const std::string& who, pid_t pid) {
    const ProcessFigures f = figures_of(pid);
    j[who] = {{"rss_mb", f.rss_mb}, {"fds", f.fds}, {"shm_fds", f.shm_fds}};
  };
  put("driver", ::getpid());
  for (size_t i = 0; i < workers.size(); ++i) put("worker" + std::to_string(i), workers[i]);
  return j;
}

double arg(int argc, char** argv, const std::string& key, double fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == key) return std::stod(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);
  const double seconds = arg(argc, argv, "--seconds", 600);
  const double window = arg(argc, argv, "--window", 30);
  const int workers = static_cast<int>(arg(argc, argv, "--workers", 2));
  const int64_t rows = static_cast<int64_t>(arg(argc, argv, "--rows", 64));
  const int64_t width = static_cast<int64_t>(arg(argc, argv, "--width", 1024));

  baton::ResourcePool pool = baton::ResourcePool::cpu(workers);
  baton::WorkerGroup group = baton::WorkerGroup::spawn("SoakWorker", pool);
  const std::vector<pid_t> pids = group.pids();
  DataProto batch;
  batch.set_tensor("x", at::arange(rows * width, at::kFloat).view({rows, width}).remainder(7));
  const double want = batch.tensor("x").sum().item<double>() * 2;

  std::vector<json> windows;
  std::vector<double> rates;
  int64_t total = 0;
  const auto start = Clock::now();
  auto window_start = start;
  int64_t in_window = 0;
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const DataProto out = group.call("doubled", {batch}).get().as<DataProto>();
    const double got = out.tensor("x").sum().item<double>();
    if (std::abs(got - want) > 1e-6 * std::abs(want)) {
      std::fprintf(stderr, "soak: call %lld returned sum %f, want %f\n",
                   static_cast<long long>(total), got, want);
      return 1;
    }
    ++total;
    ++in_window;
    const double elapsed = std::chrono::duration<double>(Clock::now() - window_start).count();
    if (elapsed >= window) {
      rates.push_back(static_cast<double>(in_window) / elapsed);
      windows.push_back(snapshot(pids, rates.back()));
      std::fprintf(stderr, "soak: window %zu: %s\n", windows.size(), windows.back().dump().c_str());
      window_start = Clock::now();
      in_window = 0;
    }
  }
  if (windows.size() < 2) {
    std::fprintf(stderr, "soak: fewer than two windows; raise --seconds or lower --window\n");
    return 1;
  }
  const json& first = windows.front();
  const json& last = windows.back();
  json change = {{"dev_shm_entries", last["dev_shm_entries"].get<int64_t>() -
                                         first["dev_shm_entries"].get<int64_t>()}};
  for (const auto& [who, v] : first.items()) {
    if (!v.is_object()) continue;
    change[who] = {{"rss_mb", last[who]["rss_mb"].get<double>() - v["rss_mb"].get<double>()},
                   {"fds", last[who]["fds"].get<int64_t>() - v["fds"].get<int64_t>()},
                   {"shm_fds", last[who]["shm_fds"].get<int64_t>() - v["shm_fds"].get<int64_t>()}};
  }
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  double mean = 0;
  for (double r : rates) mean += r / static_cast<double>(rates.size());
  json out = {{"seconds", seconds},
              {"window_s", window},
              {"workers", workers},
              {"bytes_per_call", rows * width * 4},
              {"calls", total},
              {"first_window", first},
              {"last_window", last},
              {"change", change},
              {"calls_per_s", rates},
              {"rate_min_over_max", *lo / *hi},
              {"rate_mean", mean}};
  std::printf("%s\n", out.dump().c_str());
  group.shutdown();
  return 0;
}
