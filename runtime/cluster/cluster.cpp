#include "runtime/cluster/cluster.h"

#include <arpa/inet.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/errors.h"
#include "base/log.h"
#include "net/auth.h"
#include "net/handshake_gate.h"
#include "net/tls.h"
#include "runtime/cluster/agent_protocol.h"
#include "runtime/cluster/relay.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/wire.capnp.h"
#include "runtime/internal/worker_process.h"
#include "runtime/threads.h"

extern char** environ;

namespace baton {

using namespace agent_protocol;

std::string NodeInfo::describe() const {
  return "node " + std::to_string(index) + " (" + hostname + ", " + address + ")";
}

// ---------------------------------------------------------------------------
// The driver's side.

namespace {

struct Node {
  NodeInfo info;
  uint64_t session = 0;
  std::mutex write_mu;               // one writer at a time on `down`
  std::unique_ptr<auth::Conn> down;  // driver -> agent; set when the agent opened it
  int down_fd = -1;
  int up_fd = -1;                    // agent -> driver (read by the node's thread)
  bool lost = false;                 // guarded by Cluster::Impl::mu
  std::string lost_reason;
};

struct WorkerLink;

}  // namespace

struct Cluster::Impl : std::enable_shared_from_this<Cluster::Impl> {
  ClusterOptions options;
  std::string host;
  uint16_t port = 0;
  std::string token;
  std::shared_ptr<tls::Context> tls;
  // Runs every connection's handshake; serve() gets the proven ones.
  std::unique_ptr<HandshakeGate> gate;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<Node>> nodes;  // by index; null until that node came
  std::map<uint64_t, std::shared_ptr<WorkerLink>> workers;
  std::map<uint64_t, std::string> refused;  // agent sessions turned away, and why
  uint64_t next_worker = 1;
  bool stopping = false;

  int connected_locked() const {
    int n = 0;
    for (const auto& node : nodes) n += (node && node->down && !node->lost) ? 1 : 0;
    return n;
  }

  void serve(int fd, std::unique_ptr<auth::Conn> conn);
  void serve_node(std::shared_ptr<Node> node, auth::Conn& up, const wire::AgentHello::Reader& hello);
  void on_agent_message(Node& node, wire::AgentMessage::Reader m);
  void node_lost(const std::shared_ptr<Node>& node, const std::string& why);
  void send(Node& node, capnp::MessageBuilder& builder);
};

namespace {

struct WorkerLink : RemoteWorker {
  std::weak_ptr<Cluster::Impl> cluster;
  std::shared_ptr<Node> node_;
  uint64_t id = 0;
  std::string label;
  std::shared_ptr<Channel> channel;  // the driver's end of the worker's socket pair

  mutable std::mutex mu;
  std::condition_variable cv;
  pid_t pid_ = -1;
  bool answered = false;  // spawned or failed
  std::string spawn_error;
  State state_ = State::kRunning;
  int status_ = 0;
  std::string why_;
  int out_fd = -1, err_fd = -1;
  int data_fds[2] = {-1, -1};  // [from worker, to worker] while their pumps run
  bool from_attached = false;

  ~WorkerLink() override {
    close_fd(out_fd);
    close_fd(err_fd);
  }
  pid_t pid() const override {
    std::lock_guard<std::mutex> lock(mu);
    return pid_;
  }
  const NodeInfo& node() const override { return node_->info; }
  State state(int* wait_status, std::string* why) const override {
    std::lock_guard<std::mutex> lock(mu);
    if (wait_status != nullptr) *wait_status = status_;
    if (why != nullptr) *why = why_;
    return state_;
  }
  void kill() override {
    auto impl = cluster.lock();
    if (!impl) return;
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::AgentMessage>().setKill(id);
    try {
      impl->send(*node_, b);
    } catch (const std::exception&) {
      // The agent is gone: its workers went with it.
    }
  }

  // The worker is gone (exited, or its agent lost): no more output, and the
  // relay's end of its socket closes once nothing more can arrive.
  void finish(State s, int status, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (state_ == State::kRunning) {
      state_ = s;
      status_ = status;
      why_ = why;
    }
    answered = true;
    if (spawn_error.empty() && pid_ < 0) spawn_error = why.empty() ? "it exited" : why;
    close_fd(out_fd);
    close_fd(err_fd);
    // A result sent just before the exit may still be on its way over the
    // data connection; that connection's end closes the socket then.
    if (s == State::kLost || !from_attached) {
      for (int fd : data_fds)
        if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      ::shutdown(channel->fd(), SHUT_RDWR);
    }
    cv.notify_all();
  }
};

}  // namespace

void Cluster::Impl::send(Node& node, capnp::MessageBuilder& builder) {
  std::lock_guard<std::mutex> lock(node.write_mu);
  if (!node.down) throw Error(node.info.describe() + ": its agent is not connected");
  write_with_deadline(*node.down, builder);
}

// One connection from an agent, its token proven: its control connection
// (hello; then this thread reads it), its second control connection (the
// driver writes it), or one direction of a worker's data.
void Cluster::Impl::serve(int fd, std::unique_ptr<auth::Conn> conn) {
  const std::string who = auth::peer_address(fd);
  std::shared_ptr<Node> keep_down;  // a control connection the driver writes stays open
  try {
    kj::Array<capnp::word> words;
    if (!relay::read_message(*conn, words, "agent " + who)) {
      ::close(fd);
      return;
    }
    capnp::FlatArrayMessageReader reader(words, reader_options());
    auto m = reader.getRoot<wire::AgentMessage>();
    switch (m.which()) {
      case wire::AgentMessage::HELLO: {
        auto node = std::make_shared<Node>();
        node->up_fd = fd;
        serve_node(node, *conn, m.getHello());
        break;
      }
      case wire::AgentMessage::CONTROL: {
        // The agent's hello arrives on its other connection, served by
        // another thread: wait (briefly) until that thread has placed the
        // node or refused it.
        const uint64_t session = m.getControl();
        std::shared_ptr<Node> node;
        std::string why = "an unknown agent session";
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_for(lock, kHandshakeTimeout, [&] {
            for (auto& n : nodes) {
              if (n && n->session == session && !n->down && !n->lost) {
                node = n;
                return true;
              }
            }
            if (auto it = refused.find(session); it != refused.end()) {
              why = it->second;
              refused.erase(it);
              return true;
            }
            return stopping;
          });
          if (node) {
            {
              std::lock_guard<std::mutex> w(node->write_mu);
              node->down = std::move(conn);
              node->down_fd = fd;
            }
            log(LogLevel::kInfo, "baton: " + node->info.describe() + " joined (" +
                                     std::to_string(node->info.cpu_slots) + " cores, " +
                                     std::to_string(node->info.gpus) + " GPUs)");
            cv.notify_all();
            return;  // the node owns the connection now
          }
        }
        capnp::MallocMessageBuilder b;
        b.initRoot<wire::AgentMessage>().setRefused(why);
        write_with_deadline(*conn, b);
        break;
      }
      case wire::AgentMessage::ATTACH: {
        auto a = m.getAttach();
        std::shared_ptr<WorkerLink> link;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (auto it = workers.find(a.getWorkerId()); it != workers.end()) link = it->second;
        }
        if (!link) break;
        const int dir = a.getToWorker() ? 1 : 0;
        {
          std::lock_guard<std::mutex> lock(link->mu);
          if (link->state_ != RemoteWorker::State::kRunning || link->data_fds[dir] >= 0) break;
          link->data_fds[dir] = fd;
          if (dir == 0) link->from_attached = true;
        }
        std::string why = dir == 1 ? relay::pump_to_tcp(*link->channel, *conn)
                                   : relay::pump_to_unix(*conn, *link->channel, link->label);
        {
          std::lock_guard<std::mutex> lock(link->mu);
          link->data_fds[dir] = -1;
        }
        ::shutdown(fd, SHUT_RDWR);
        // The worker's messages end here: the driver's side sees its socket close.
        if (dir == 0) ::shutdown(link->channel->fd(), SHUT_RDWR);
        if (!why.empty()) log(LogLevel::kDebug, "baton: relay of " + link->label + ": " + why);
        break;
      }
      default:
        log(LogLevel::kWarn, "baton: cluster listener: " + who + " sent an unexpected message");
    }
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, "baton: cluster listener: connection from " + who + ": " + e.what());
  }
  conn.reset();
  ::close(fd);
}

void Cluster::Impl::serve_node(std::shared_ptr<Node> node, auth::Conn& up,
                               const wire::AgentHello::Reader& hello) {
  const int fd = up.fd();
  node->info.hostname = hello.getHostname().cStr();
  node->info.address = auth::socket_host(fd, false);
  node->info.driver_address = auth::socket_host(fd, true);
  node->info.cpu_slots = std::max(1, hello.getCpuSlots());
  node->info.gpus = std::max(0, hello.getGpus());
  node->info.agent_pid = hello.getPid();
  node->session = hello.getSession();
  std::string refusal;
  {
    std::lock_guard<std::mutex> lock(mu);
    const int want = hello.getNodeRank();
    int index = -1;
    if (hello.getVersion() != kAgentProtocol) {
      refusal = "it speaks protocol " + std::to_string(hello.getVersion()) + ", the driver " +
                std::to_string(kAgentProtocol) + " (run the same baton build everywhere)";
    } else if (stopping) {
      refusal = "the driver is stopping";
    } else if (want >= 0) {
      if (want >= options.nodes)
        refusal = "it asked for node " + std::to_string(want) + " of a cluster of " +
                  std::to_string(options.nodes);
      else if (nodes[static_cast<size_t>(want)] && !nodes[static_cast<size_t>(want)]->lost)
        refusal = "node " + std::to_string(want) + " is already " +
                  nodes[static_cast<size_t>(want)]->info.hostname;
      else
        index = want;
    } else {
      // The first node that never came or whose agent was lost: a restarted
      // agent takes its place (the trainer's restart waits for it).
      for (int i = 0; i < options.nodes && index < 0; ++i)
        if (!nodes[static_cast<size_t>(i)] || nodes[static_cast<size_t>(i)]->lost) index = i;
      if (index < 0) refusal = "the cluster's " + std::to_string(options.nodes) + " nodes are all there";
    }
    if (refusal.empty()) {
      node->info.index = index;
      nodes[static_cast<size_t>(index)] = node;
      cv.notify_all();  // its control connection may be waiting for it
    }
  }
  if (!refusal.empty()) {
    log(LogLevel::kWarn, "baton: refused the node agent of " + node->info.hostname + " (" +
                             node->info.address + "): " + refusal);
    std::lock_guard<std::mutex> lock(mu);
    if (refused.size() < 1024) refused[node->session] = refusal;
    cv.notify_all();
    return;
  }
  std::string why = "it closed the connection";
  try {
    kj::Array<capnp::word> words;
    while (relay::read_message(up, words, node->info.describe())) {
      capnp::FlatArrayMessageReader reader(words, reader_options());
      on_agent_message(*node, reader.getRoot<wire::AgentMessage>());
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  node_lost(node, why);
}

void Cluster::Impl::on_agent_message(Node& node, wire::AgentMessage::Reader m) {
  auto find = [this](uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = workers.find(id);
    return it == workers.end() ? nullptr : it->second;
  };
  switch (m.which()) {
    case wire::AgentMessage::SPAWNED: {
      auto s = m.getSpawned();
      if (auto link = find(s.getWorkerId())) {
        std::lock_guard<std::mutex> lock(link->mu);
        link->pid_ = s.getPid();
        link->answered = true;
        link->cv.notify_all();
      }
      break;
    }
    case wire::AgentMessage::SPAWN_FAILED: {
      auto s = m.getSpawnFailed();
      if (auto link = find(s.getWorkerId())) {
        std::lock_guard<std::mutex> lock(link->mu);
        link->spawn_error = s.getMessage().cStr();
        link->answered = true;
        link->cv.notify_all();
      }
      break;
    }
    case wire::AgentMessage::OUTPUT: {
      auto o = m.getOutput();
      if (auto link = find(o.getWorkerId())) {
        std::lock_guard<std::mutex> lock(link->mu);
        const int fd = o.getStderr() ? link->err_fd : link->out_fd;
        if (fd >= 0) write_fully(fd, o.getData().begin(), o.getData().size());
      }
      break;
    }
    case wire::AgentMessage::EXITED: {
      auto e = m.getExited();
      std::shared_ptr<WorkerLink> link;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = workers.find(e.getWorkerId()); it != workers.end()) {
          link = it->second;
          workers.erase(it);
        }
      }
      if (link) link->finish(RemoteWorker::State::kExited, e.getWaitStatus(), "");
      break;
    }
    default:
      throw Error(node.info.describe() + ": its agent sent an unexpected message");
  }
}

void Cluster::Impl::node_lost(const std::shared_ptr<Node>& node, const std::string& why) {
  std::vector<std::shared_ptr<WorkerLink>> links;
  bool was_stopping;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (node->lost) return;
    node->lost = true;
    node->lost_reason = why;
    was_stopping = stopping;
    for (auto it = workers.begin(); it != workers.end();) {
      if (it->second->node_ == node) {
        links.push_back(it->second);
        it = workers.erase(it);
      } else {
        ++it;
      }
    }
    cv.notify_all();
  }
  const std::string what = "lost with its node: the node agent of " + node->info.describe() +
                           " disconnected (" + why + ")";
  if (!was_stopping) log(LogLevel::kError, "baton: the node agent of " + node->info.describe() +
                                               " disconnected: " + why);
  for (auto& link : links) link->finish(RemoteWorker::State::kLost, 0, what);
  {
    std::lock_guard<std::mutex> w(node->write_mu);
    if (node->down_fd >= 0) ::shutdown(node->down_fd, SHUT_RDWR);
  }
}

std::shared_ptr<Cluster> Cluster::listen(ClusterOptions options) {
  if (options.nodes < 1) throw Error("Cluster: nodes must be at least 1");
  auto impl = std::make_shared<Impl>();
  auto [host, port] = auth::split_host_port(options.listen, "Cluster: the listen address");
  impl->host = host;
  if (!options.token.empty()) {
    impl->token = options.token;
  } else if (!auth::token_configured()) {
    throw Error("Cluster: no cluster token is configured: set BATON_CLUSTER_TOKEN_FILE (a file "
                "of at least 16 random bytes, mode 0600) or BATON_CLUSTER_TOKEN, the same on "
                "the driver and on every node agent");
  } else {
    impl->token = auth::cluster_token();
  }
  impl->tls = options.tls ? options.tls : tls::Context::server_from_environment();
  impl->nodes.resize(static_cast<size_t>(options.nodes));
  std::string why;
  const int listen_fd = auth::tcp_listen(host, port, &impl->port, why);
  if (listen_fd < 0)
    throw Error("Cluster: cannot listen for node agents on " + options.listen + ": " + why);
  impl->options = std::move(options);
  HandshakeGateOptions gate;
  gate.name = "baton: cluster listener";
  gate.token = impl->token;
  gate.tls = impl->tls;
  gate.handshake_timeout = kHandshakeTimeout;
  impl->gate = std::make_unique<HandshakeGate>(
      listen_fd, std::move(gate),
      [weak = std::weak_ptr<Impl>(impl)](int fd, std::unique_ptr<auth::Conn> conn) {
        auto self = weak.lock();
        if (!self) {
          conn.reset();
          ::close(fd);
          return;
        }
        keep_alive(fd);
        std::thread(&Impl::serve, self, fd, std::move(conn)).detach();
      });
  log(LogLevel::kInfo, "baton: waiting for " + std::to_string(impl->options.nodes) +
                           " node agent(s) on " + impl->host + ":" + std::to_string(impl->port));
  return std::shared_ptr<Cluster>(new Cluster(impl));
}

Cluster::Cluster(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cluster::~Cluster() {
  std::vector<std::shared_ptr<Node>> nodes;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    nodes = impl_->nodes;
  }
  impl_->gate.reset();  // no new connections
  for (auto& node : nodes) {
    if (!node) continue;
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::AgentMessage>().setShutdown();
    try {
      impl_->send(*node, b);
    } catch (const std::exception&) {
      // Gone already.
    }
  }
}

uint16_t Cluster::port() const { return impl_->port; }
const std::string& Cluster::bind_host() const { return impl_->host; }

void Cluster::wait_for_nodes() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  const int want = impl_->options.nodes;
  if (impl_->cv.wait_for(lock, impl_->options.wait_timeout,
                         [&] { return impl_->connected_locked() == want; }))
    return;
  std::string came;
  for (const auto& node : impl_->nodes)
    if (node && node->down && !node->lost) came += "\n  " + node->info.describe();
  throw Error("Cluster: " + std::to_string(impl_->connected_locked()) + " of " +
              std::to_string(want) + " node agent(s) connected to " + impl_->host + ":" +
              std::to_string(impl_->port) + " within " +
              std::to_string(impl_->options.wait_timeout.count()) + " ms" +
              (came.empty() ? std::string(" (none)") : ":" + came) +
              "\n(start `baton-agent --driver <this host>:" + std::to_string(impl_->port) +
              "` on every node, with the same cluster token)");
}

std::vector<NodeInfo> Cluster::nodes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<NodeInfo> out;
  for (const auto& node : impl_->nodes)
    if (node) out.push_back(node->info);
  return out;
}

int Cluster::size() const { return impl_->options.nodes; }

std::shared_ptr<RemoteWorker> Cluster::spawn(int node_index, const std::string& label,
                                             const std::string& exe,
                                             const std::vector<std::string>& argv,
                                             const std::vector<std::string>& env, int relay_fd,
                                             int out_fd, int err_fd) {
  auto link = std::make_shared<WorkerLink>();
  link->cluster = impl_;
  link->label = label;
  link->channel = std::make_shared<Channel>(relay_fd);
  link->out_fd = out_fd;
  link->err_fd = err_fd;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (node_index < 0 || node_index >= static_cast<int>(impl_->nodes.size()) ||
        !impl_->nodes[static_cast<size_t>(node_index)])
      throw Error("cannot start " + label + " on node " + std::to_string(node_index) +
                  ": no such node in the cluster");
    link->node_ = impl_->nodes[static_cast<size_t>(node_index)];
    if (link->node_->lost)
      throw Error("cannot start " + label + " on " + link->node_->info.describe() +
                  ": its agent disconnected (" + link->node_->lost_reason + ")");
    link->id = impl_->next_worker++;
    impl_->workers[link->id] = link;
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->workers.erase(link->id);
  };
  capnp::MallocMessageBuilder b;
  auto s = b.initRoot<wire::AgentMessage>().initSpawn();
  s.setWorkerId(link->id);
  s.setExe(exe);
  s.setLabel(label);
  auto a = s.initArgv(static_cast<unsigned>(argv.size()));
  for (size_t i = 0; i < argv.size(); ++i) a.set(static_cast<unsigned>(i), argv[i]);
  auto e = s.initEnv(static_cast<unsigned>(env.size()));
  for (size_t i = 0; i < env.size(); ++i) e.set(static_cast<unsigned>(i), env[i]);
  try {
    impl_->send(*link->node_, b);
  } catch (const std::exception& ex) {
    forget();
    throw Error("cannot start " + label + " on " + link->node_->info.describe() + ": " + ex.what());
  }
  std::unique_lock<std::mutex> lock(link->mu);
  if (!link->cv.wait_for(lock, impl_->options.spawn_timeout, [&] { return link->answered; })) {
    lock.unlock();
    forget();
    link->kill();
    throw Error("cannot start " + label + " on " + link->node_->info.describe() +
                ": its agent did not answer within " +
                std::to_string(impl_->options.spawn_timeout.count()) + " ms");
  }
  if (link->pid_ < 0) {
    const std::string why = link->spawn_error;
    lock.unlock();
    forget();
    throw Error("cannot start " + label + " on " + link->node_->info.describe() + ": " + why);
  }
  return link;
}

}  // namespace baton
