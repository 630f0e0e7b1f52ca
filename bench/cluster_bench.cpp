// cluster_bench: what a node agent between the driver and a worker costs
// (runtime/cluster/cluster.h, runtime/cluster/relay.h). The same calls to one worker started
// locally and to one started by a baton-agent on this machine (so the
// worker's messages and tensors cross two relays and a loopback TCP
// connection each way), next to the floors of that path measured in the same
// run: a raw 64-byte TCP ping-pong and a raw TCP stream between two processes.
//
//   ./build/bench/cluster_bench        # the last line of stdout is JSON
//
// tensor_gbps: a 256 MiB float tensor sent to the worker, which sums it
// (median of 5 after a warm-up). Through the agent the bytes are written once
// into the socket from the driver's segment and read once into a memfd on the
// agent's side; the raw TCP stream is one such copy pair with nothing else.
#include <ATen/ops/ones.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/call_timing.h"
#include "net/auth.h"
#include "runtime/baton.h"
#include "runtime/cluster/cluster.h"

extern char** environ;

namespace {

using bench::Clock;
using bench::median;
using bench::micros;
using bench::sync_call_us;

class Bench : public baton::Worker {
 public:
  void noop() {}
  double sum(const at::Tensor& t) { return t.sum().item<double>(); }
  at::Tensor make(int64_t n) { return at::ones({n}, at::kFloat); }
  static void register_methods(baton::MethodTable<Bench>& t) {
    t.def("noop", &Bench::noop);
    t.def("sum", &Bench::sum);
    t.def("make", &Bench::make);
  }
};
BATON_WORKER(Bench);

// A connected loopback TCP pair: {client, server}.
std::pair<int, int> tcp_pair() {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  listen(l, 1);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  int s = accept(l, nullptr, nullptr);
  close(l);
  const int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {c, s};
}

// 64-byte ping-pong between two processes over loopback TCP.
double tcp_rtt_us() {
  auto [c, s] = tcp_pair();
  pid_t child = fork();
  char buf[64] = {};
  if (child == 0) {
    close(c);
    while (read(s, buf, sizeof(buf)) == sizeof(buf))
      if (write(s, buf, sizeof(buf)) != sizeof(buf)) break;
    _exit(0);
  }
  close(s);
  std::vector<double> rtts;
  for (int i = 0; i < 20000; ++i) {
    auto t0 = Clock::now();
    if (write(c, buf, sizeof(buf)) != sizeof(buf)) break;
    if (read(c, buf, sizeof(buf)) != sizeof(buf)) break;
    if (i >= 1000) rtts.push_back(micros(Clock::now() - t0));
  }
  close(c);
  waitpid(child, nullptr, 0);
  return median(rtts);
}

// `bytes` streamed from one process to another over loopback TCP, written
// from and read into buffers (median of 5).
double tcp_stream_gbps(size_t bytes) {
  auto [c, s] = tcp_pair();
  pid_t child = fork();
  if (child == 0) {
    close(c);
    std::vector<char> in(bytes);
    for (int round = 0; round < 6; ++round) {
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = read(s, in.data() + got, bytes - got);
        if (n <= 0) _exit(1);
        got += static_cast<size_t>(n);
      }
      char ack = 1;
      if (write(s, &ack, 1) != 1) _exit(1);
    }
    _exit(0);
  }
  close(s);
  std::vector<char> out(bytes, 1);
  std::vector<double> secs;
  for (int round = 0; round < 6; ++round) {
    auto t0 = Clock::now();
    for (size_t put = 0; put < bytes;) {
      ssize_t n = write(c, out.data() + put, bytes - put);
      if (n <= 0) return -1;
      put += static_cast<size_t>(n);
    }
    char ack = 0;
    if (read(c, &ack, 1) != 1) return -1;
    if (round > 0) secs.push_back(micros(Clock::now() - t0) / 1e6);
  }
  close(c);
  waitpid(child, nullptr, 0);
  return bytes / median(secs) / 1e9;
}


struct Figures {
  double sync_us, async_per_s, to_worker_gbps, from_worker_gbps;
};

Figures measure(baton::WorkerGroup& g, size_t bytes) {
  Figures f{};
  f.sync_us = sync_call_us(g, 5000);
  f.async_per_s = bench::async_calls_per_s(g, 5);
  at::Tensor t = at::ones({static_cast<int64_t>(bytes / sizeof(float))}, at::kFloat);
  std::vector<double> to, from;
  for (int i = 0; i < 6; ++i) {
    auto t0 = Clock::now();
    const double s = g.call_rank(0, "sum", {t}).get().as_float();
    if (i > 0) to.push_back(micros(Clock::now() - t0) / 1e6);
    if (s != static_cast<double>(t.numel())) std::fprintf(stderr, "wrong sum %f\n", s);
    t0 = Clock::now();
    at::Tensor back = g.call_rank(0, "make", {t.numel()}).get().as_tensor();
    if (i > 0) from.push_back(micros(Clock::now() - t0) / 1e6);
    if (back.numel() != t.numel()) std::fprintf(stderr, "wrong size\n");
  }
  f.to_worker_gbps = bytes / median(to) / 1e9;
  f.from_worker_gbps = bytes / median(from) / 1e9;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);
  const size_t kBytes = size_t{256} << 20;
  // The floors first, before the runtime starts any thread (fork is used).
  const double rtt = tcp_rtt_us();
  const double stream = tcp_stream_gbps(kBytes);
  std::fprintf(stderr, "tcp_rtt_us %.2f, tcp_stream_gbps %.2f\n", rtt, stream);

  Figures local{}, remote{};
  {
    baton::ResourcePool one = baton::ResourcePool::cpu(1);
    baton::WorkerGroup g = baton::WorkerGroup::spawn("Bench", one);
    local = measure(g, kBytes);
    g.shutdown();
  }
  std::fprintf(stderr, "local: sync %.2f us, %.0f calls/s, to %.2f GB/s, from %.2f GB/s\n",
               local.sync_us, local.async_per_s, local.to_worker_gbps, local.from_worker_gbps);
  {
    baton::ClusterOptions o;
    o.token = baton::auth::cluster_token();
    auto cluster = baton::Cluster::listen(o);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "BATON_CLUSTER_TOKEN", 19) != 0) env.emplace_back(*e);
    env.push_back("BATON_CLUSTER_TOKEN=" + o.token);
    std::string driver = "127.0.0.1:" + std::to_string(cluster->port());
    std::vector<std::string> args = {BATON_AGENT_EXE, "--driver", driver, "--slots", "1"};
    std::vector<char*> a, e;
    for (auto& s : args) a.push_back(s.data());
    a.push_back(nullptr);
    for (auto& s : env) e.push_back(s.data());
    e.push_back(nullptr);
    pid_t agent = -1;
    if (posix_spawn(&agent, BATON_AGENT_EXE, nullptr, nullptr, a.data(), e.data()) != 0) return 1;
    {
      baton::ResourcePool pool = baton::ResourcePool::from_cluster(cluster, 1);
      baton::WorkerGroup g = baton::WorkerGroup::spawn("Bench", pool);
      remote = measure(g, kBytes);
      g.shutdown();
    }
    cluster.reset();
    waitpid(agent, nullptr, 0);
  }
  std::fprintf(stderr, "agent: sync %.2f us, %.0f calls/s, to %.2f GB/s, from %.2f GB/s\n",
               remote.sync_us, remote.async_per_s, remote.to_worker_gbps,
               remote.from_worker_gbps);
  std::printf(
      "{\"tcp_rtt_us\": %.2f, \"tcp_stream_gbps\": %.2f, "
      "\"local_sync_call_us\": %.2f, \"agent_sync_call_us\": %.2f, "
      "\"local_async_calls_per_s\": %.0f, \"agent_async_calls_per_s\": %.0f, "
      "\"local_to_worker_gbps\": %.2f, \"agent_to_worker_gbps\": %.2f, "
      "\"local_from_worker_gbps\": %.2f, \"agent_from_worker_gbps\": %.2f, "
      "\"agent_sync_over_tcp_rtt\": %.2f, \"agent_to_worker_over_tcp_stream\": %.2f}\n",
      rtt, stream, local.sync_us, remote.sync_us, local.async_per_s, remote.async_per_s,
      local.to_worker_gbps, remote.to_worker_gbps, local.from_worker_gbps,
      remote.from_worker_gbps, remote.sync_us / rtt, remote.to_worker_gbps / stream);
  return 0;
}
