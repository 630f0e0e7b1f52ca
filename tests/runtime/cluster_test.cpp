// Worker groups on node agents (runtime/cluster/cluster.h): real baton-agent
// processes, started here on this machine and connected to the driver over
// TCP with the cluster token. The workers' messages and tensors go through
// the relays (runtime/cluster/relay.h), their Gloo groups meet at the driver's store,
// and an agent's death fails its workers naming its node. Several machines
// proper (network namespaces) are scripts/test_multinode.sh's.
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "net/auth.h"
#include "net/tls.h"
#include "runtime/cluster/cluster.h"
#include "runtime/cluster/relay.h"
#include "runtime/internal/auth_store.h"
#include "runtime/internal/wire.capnp.h"
#include "runtime/worker_group.h"
#include "tests/runtime/process_stats.h"
#if defined(BATON_TEST_TLS)
#include <filesystem>

#include "tests/runtime/test_certificates.h"
#endif

extern char** environ;

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

// Starts baton-agent with `args` and `token` as its cluster token.
pid_t start_agent(const std::vector<std::string>& args, const std::string& token) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("BATON_CLUSTER_TOKEN", 0) != 0 && kv.rfind("BATON_WORKER_FD", 0) != 0)
      env.push_back(kv);
  }
  env.push_back("BATON_CLUSTER_TOKEN=" + token);
  std::vector<std::string> argv = {BATON_AGENT_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, BATON_AGENT_EXE, nullptr, nullptr, a.data(), e.data()), 0);
  return pid;
}

// The exit status of `pid` within `timeout`; -1 while it runs, -2 when it
// was reaped before.
int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -2;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool gone_within(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    // A zombie is gone too: only its parent's wait remains.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && line.size() > close + 2 && line[close + 2] == 'Z') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  int ppid = -1;
  char state = 0;
  std::sscanf(line.c_str() + close + 2, "%c %d", &state, &ppid);
  return ppid;
}

class ClusterTest : public ::testing::Test {
 protected:
  // A cluster of `n` agents on this machine, named node-a, node-b, ...
  std::shared_ptr<Cluster> start(int n) {
    ClusterOptions o;
    o.nodes = n;
    o.token = auth::cluster_token();  // the one the workers' store checks
    o.wait_timeout = std::chrono::seconds(60);
    auto cluster = Cluster::listen(o);
    const std::string driver = "127.0.0.1:" + std::to_string(cluster->port());
    for (int i = 0; i < n; ++i) {
      agents_.push_back(start_agent({"--driver", driver, "--node-rank", std::to_string(i),
                                     "--name", std::string("node-") + char('a' + i), "--slots",
                                     "2"},
                                    o.token));
    }
    cluster->wait_for_nodes();
    return cluster;
  }

  void TearDown() override {
    for (pid_t pid : agents_) {
      if (wait_exit(pid, std::chrono::milliseconds(0)) == -1) {
        ::kill(pid, SIGKILL);
        wait_exit(pid, std::chrono::seconds(10));
      }
    }
  }

  std::vector<pid_t> agents_;
};

TEST_F(ClusterTest, AGroupOnTwoNodeAgentsWorksAsOnOneMachine) {
  std::vector<int64_t> worker_pids;
  {
    auto cluster = start(2);
    const std::vector<NodeInfo> nodes = cluster->nodes();
    ASSERT_EQ(nodes.size(), 2u);
    EXPECT_EQ(nodes[0].hostname, "node-a");
    EXPECT_EQ(nodes[1].hostname, "node-b");
    EXPECT_EQ(nodes[1].cpu_slots, 2);
    EXPECT_EQ(nodes[1].describe(), "node 1 (node-b, 127.0.0.1)");

    ResourcePool pool(ResourcePoolOptions().set_processes_on_nodes({2, 1}).set_cluster(cluster));
    WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
    ASSERT_EQ(g.world_size(), 3);
    List infos = g.call("info").get().as_list();
    for (int r = 0; r < 3; ++r) {
      const Value& i = infos[static_cast<size_t>(r)];
      EXPECT_EQ(i.at("rank").as_int(), r);
      EXPECT_EQ(i.at("local_rank").as_int(), r < 2 ? r : 0);
      EXPECT_EQ(i.at("local_world_size").as_int(), r < 2 ? 2 : 1);
      // The node's 2 cores shared by its workers.
      EXPECT_EQ(i.at("threads").as_int(), r < 2 ? 1 : 2);
      EXPECT_EQ(i.at("master_addr").as_string(), "127.0.0.1");
      EXPECT_EQ(i.at("token_env").as_string(), "");  // read and removed at start
      const auto pid = static_cast<pid_t>(i.at("pid").as_int());
      worker_pids.push_back(pid);
      // Started by its node's agent, not by the driver.
      EXPECT_EQ(parent_of(pid), agents_[r < 2 ? 0 : 1]) << "rank " << r;
    }

    // Tensors past the inline limit travel as relay payloads, both ways.
    at::Tensor big = at::arange(1 << 20, at::kFloat);
    const Value echoed = g.call("echo", {big}).get();
    for (const Value& v : echoed.as_list()) EXPECT_TRUE(v.as_tensor().equal(big));
    // Segments reused under the same ids, growing past what the far relay kept.
    for (int64_t n : {300000, 300001, 3000000, 300002}) {
      const Value made = g.call("make", {n}).get();
      for (const Value& v : made.as_list())
        EXPECT_TRUE(v.as_tensor().equal(at::arange(n, at::kFloat)));
    }
    // A Gloo group across the nodes, meeting at the driver's store.
    const Value reduced = g.call("all_reduce", {at::full({4}, 1.5)}).get();
    for (const Value& v : reduced.as_list()) EXPECT_TRUE(v.as_tensor().equal(at::full({4}, 4.5)));

    // The workers' output reaches the driver's console with their prefix.
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    std::fflush(stdout);
    const int saved = dup(1);
    dup2(out[1], 1);
    g.call("print", {"remote-marker-3"}).get();
    std::string seen;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (seen.find("[TestWorker:2] remote-marker-3\n") == std::string::npos &&
           Clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 100) == 1) {
        char buf[4096];
        const ssize_t n = read(out[0], buf, sizeof(buf));
        if (n > 0) seen.append(buf, static_cast<size_t>(n));
      }
    }
    std::fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(out[0]);
    close(out[1]);
    EXPECT_NE(seen.find("[TestWorker:2] remote-marker-3\n"), std::string::npos) << seen;
    g.shutdown();
  }
  // The driver is gone: the agents stop their workers and exit cleanly.
  for (pid_t a : agents_) {
    const int status = wait_exit(a, std::chrono::seconds(20));
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  for (int64_t pid : worker_pids) EXPECT_TRUE(gone_within(static_cast<pid_t>(pid), std::chrono::seconds(10)));
}

TEST_F(ClusterTest, AWorkerThatDiesOnANodeIsReportedWithItsSignalAndItsNode) {
  auto cluster = start(2);
  ResourcePool pool(ResourcePoolOptions().set_processes_on_nodes({1, 1}).set_cluster(cluster));
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
  try {
    g.call_rank(1, "crash", {"abort"}).get();
    FAIL() << "the crash did not fail the call";
  } catch (const WorkerDiedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("on node 1 (node-b, 127.0.0.1)"), std::string::npos) << what;
    EXPECT_NE(what.find("SIGABRT"), std::string::npos) << what;
  }
}

TEST_F(ClusterTest, AKilledAgentFailsTheRunningCallPromptlyNamingItsNodeAndLeavesNoWorker) {
  auto cluster = start(2);
  ResourcePool pool(ResourcePoolOptions().set_processes_on_nodes({1, 1}).set_cluster(cluster));
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
  const auto remote_pid = static_cast<pid_t>(g.call_rank(1, "info", {}).get().at("pid").as_int());
  Future<Value> running = g.call("sleep_ms", {int64_t{60000}});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto killed = Clock::now();
  ::kill(agents_[1], SIGKILL);
  try {
    running.get();
    FAIL() << "the call outlived its node";
  } catch (const WorkerDiedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("node 1 (node-b, 127.0.0.1)"), std::string::npos) << what;
    EXPECT_NE(what.find("disconnected"), std::string::npos) << what;
  }
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(10));
  // The agent's worker died with it (its parent-death signal).
  EXPECT_TRUE(gone_within(remote_pid, std::chrono::seconds(10)));
  // The node is gone: a new group cannot be placed on it.
  EXPECT_THROW(
      {
        ResourcePool again(ResourcePoolOptions().set_processes_on_nodes({1, 1}).set_cluster(cluster));
        WorkerGroup::spawn("TestWorker", again);
      },
      Error);
}

TEST_F(ClusterTest, AnAgentWithAnotherTokenIsRefusedAndTheWaitSaysWhoCame) {
  ClusterOptions o;
  o.nodes = 1;
  o.token = auth::cluster_token();
  o.wait_timeout = std::chrono::milliseconds(1500);
  auto cluster = Cluster::listen(o);
  const std::string driver = "127.0.0.1:" + std::to_string(cluster->port());
  agents_.push_back(start_agent({"--driver", driver, "--connect-timeout", "5"},
                                "another-token-of-32-bytes-000000"));
  const int status = wait_exit(agents_.back(), std::chrono::seconds(20));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  try {
    cluster->wait_for_nodes();
    FAIL() << "no agent was let in, yet the wait returned";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("0 of 1 node agent(s) connected to 127.0.0.1:" +
                        std::to_string(cluster->port())),
              std::string::npos)
        << what;
  }
}

TEST_F(ClusterTest, SilentConnectionsOnTheClusterPortCostNoThreadAndAnAgentStillJoins) {
  ClusterOptions o;
  o.nodes = 1;
  o.token = auth::cluster_token();
  o.wait_timeout = std::chrono::seconds(60);
  auto cluster = Cluster::listen(o);
  const int threads = test::threads_now();
  std::vector<int> silent;
  for (int i = 0; i < 300; ++i) {
    std::string why;
    const int fd = auth::tcp_connect("127.0.0.1", cluster->port(), Clock::now() + std::chrono::seconds(5), why);
    ASSERT_GE(fd, 0) << why;
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // The listener's one thread holds every handshake (it was a thread each).
  EXPECT_LE(test::threads_now(), threads + 1);
  // 64 in their handshake, the rest refused: the agent is refused too while
  // they last, retries, and joins.
  agents_.push_back(start_agent({"--driver", "127.0.0.1:" + std::to_string(cluster->port()),
                                 "--name", "after-the-flood"},
                                o.token));
  cluster->wait_for_nodes();
  ASSERT_EQ(cluster->nodes().size(), 1u);
  EXPECT_EQ(cluster->nodes()[0].hostname, "after-the-flood");
  for (int fd : silent) ::close(fd);
}

TEST_F(ClusterTest, AnAgentForANodeTheClusterDoesNotHaveIsToldSoAndExits) {
  ClusterOptions o;
  o.nodes = 1;
  o.token = auth::cluster_token();
  auto cluster = Cluster::listen(o);
  const std::string driver = "127.0.0.1:" + std::to_string(cluster->port());
  agents_.push_back(start_agent({"--driver", driver, "--node-rank", "5"}, o.token));
  const int status = wait_exit(agents_.back(), std::chrono::seconds(20));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;  // refused
  EXPECT_TRUE(cluster->nodes().empty());
}

#if defined(BATON_TEST_TLS)
// With BATON_TLS_CERT/KEY on the driver and BATON_TLS_CA on the agents, every
// connection of the cluster is TLS 1.3: the agents' control and data
// connections, and the workers' rendezvous at the driver's store.
TEST_F(ClusterTest, AgentsAndTheirWorkersConnectOverTlsWhenTheEnvironmentAsksForIt) {
  if (!tls::available()) GTEST_SKIP() << "this build has no TLS";
  char dir[] = "/tmp/baton_cluster_tls_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string d = dir;
  test::write_test_certificates(d);
  ::setenv("BATON_TLS_CERT", (d + "/server.pem").c_str(), 1);
  ::setenv("BATON_TLS_KEY", (d + "/server.key").c_str(), 1);
  ::setenv("BATON_TLS_CA", (d + "/ca.pem").c_str(), 1);  // the agents inherit it
  {
    auto cluster = start(2);
    ResourcePool pool(ResourcePoolOptions().set_processes_on_nodes({1, 1}).set_cluster(cluster));
    WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
    const Value reduced = g.call("all_reduce", {at::full({3}, 2.0)}).get();
    for (const Value& v : reduced.as_list()) EXPECT_TRUE(v.as_tensor().equal(at::full({3}, 4.0)));
    const Value echoed = g.call("echo", {at::arange(100000, at::kFloat)}).get();
    for (const Value& v : echoed.as_list())
      EXPECT_TRUE(v.as_tensor().equal(at::arange(100000, at::kFloat)));
    // Both listeners take TLS only: a plain client with the right token is
    // refused by the agents' port and by the group's store.
    std::string why;
    const int fd = auth::tcp_connect("127.0.0.1", cluster->port(),
                                     Clock::now() + std::chrono::seconds(5), why);
    ASSERT_GE(fd, 0) << why;
    EXPECT_THROW(auth::client_handshake(fd, auth::cluster_token(), std::chrono::seconds(1),
                                        "the cluster listener"),
                 auth::AuthError);
    ::close(fd);
    const auto store_port =
        static_cast<uint16_t>(g.call_rank(0, "info", {}).get().at("master_port").as_int());
    ::unsetenv("BATON_TLS_CA");
    EXPECT_THROW(c10::make_intrusive<AuthStore>("127.0.0.1", store_port, std::string(),
                                                std::chrono::seconds(2), std::chrono::seconds(2)),
                 auth::AuthError);
    g.shutdown();
  }
  ::unsetenv("BATON_TLS_CERT");
  ::unsetenv("BATON_TLS_KEY");
  ::unsetenv("BATON_TLS_CA");
  std::filesystem::remove_all(d);
}
#endif

// An agent opens two connections, its hello on one and its control channel on
// the other, and the driver serves each on a thread of its own: the second
// may well be read first. It waits for the first (a CI run once refused an
// agent that way).
TEST(ClusterProtocolTest, AControlConnectionThatArrivesBeforeItsHelloWaitsForIt) {
  ClusterOptions o;
  o.nodes = 1;
  o.token = auth::cluster_token();
  o.wait_timeout = std::chrono::seconds(20);
  auto cluster = Cluster::listen(o);
  auto dial = [&] {
    std::string why;
    const int fd = auth::tcp_connect("127.0.0.1", cluster->port(),
                                     Clock::now() + std::chrono::seconds(5), why);
    EXPECT_GE(fd, 0) << why;
    auth::client_handshake(fd, o.token, std::chrono::seconds(5), "the cluster listener");
    return fd;
  };
  const uint64_t session = 0x5eed;
  const int control = dial();
  auth::Conn control_conn(control);
  {
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::AgentMessage>().setControl(session);
    relay::write_message(control_conn, b);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int hello = dial();
  auth::Conn hello_conn(hello);
  {
    capnp::MallocMessageBuilder b;
    auto h = b.initRoot<wire::AgentMessage>().initHello();
    h.setVersion(1);
    h.setHostname("late-hello");
    h.setNodeRank(-1);
    h.setCpuSlots(1);
    h.setPid(1);
    h.setSession(session);
    relay::write_message(hello_conn, b);
  }
  cluster->wait_for_nodes();
  ASSERT_EQ(cluster->nodes().size(), 1u);
  EXPECT_EQ(cluster->nodes()[0].hostname, "late-hello");
  cluster.reset();  // tells the "agent" to stop, on its control connection
  kj::Array<capnp::word> words;
  ASSERT_TRUE(relay::read_message(control_conn, words, "the driver"));
  capnp::FlatArrayMessageReader reader(words);
  EXPECT_TRUE(reader.getRoot<wire::AgentMessage>().isShutdown());
  ::close(control);
  ::close(hello);
}

TEST(ClusterOptionsTest, BadSetupsFailNamingWhatIsWrong) {
  try {
    ResourcePool p(ResourcePoolOptions().set_processes_on_nodes({2, 2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a cluster"), std::string::npos) << e.what();
  }
  ClusterOptions o;
  o.listen = "127.0.0.1";
  o.token = auth::cluster_token();
  try {
    Cluster::listen(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'127.0.0.1' is not host:port"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace baton
