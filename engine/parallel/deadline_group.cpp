#include "engine/parallel/deadline_group.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "engine/errors.h"

namespace baton::engine {
namespace detail {

bool process_exited(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::FILE* f = std::fopen(cat("/proc/", pid, "/stat").c_str(), "r");
  if (!f) return false;
  // "pid (comm) state ...": comm may hold spaces, so find the last ')'.
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  char state = 0;
  if (const char* close = std::strrchr(buf, ')')) state = close[1] == ' ' ? close[2] : 0;
  return state == 'Z' || state == 'X';
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

namespace {

// What a rank entered, as recorded on the board.
enum class Op : uint8_t {
  kNone,
  kBroadcast,
  kAllReduce,
  kAllReduceCoalesced,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};

const char* op_name(Op op) {
  switch (op) {
    case Op::kNone:
      return "nothing";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllReduceCoalesced:
      return "all_reduce_coalesced";
    case Op::kReduce:
      return "reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kGather:
      return "gather";
    case Op::kScatter:
      return "scatter";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kBarrier:
      return "barrier";
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
  }
  return "?";
}

bool is_p2p(Op op) { return op == Op::kSend || op == Op::kRecv; }

// One rank's line of the board. Each word is written with one relaxed store
// by its rank alone, so a reader sees a whole record, never half of one.
struct Line {
  std::atomic<uint64_t> collective;  // (sequence number << 8) | Op of its last collective
  std::atomic<uint64_t> p2p;         // (tag << 32) | ((peer + 1) << 8) | Op of its last send/recv
  std::atomic<int64_t> pid;          // 0: no line (another host, or not joined)
};
constexpr size_t kLine = 64;
static_assert(sizeof(Line) <= kLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

uint64_t p2p_word(Op op, int peer, int tag) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 32) |
         (static_cast<uint64_t>(static_cast<uint32_t>(peer + 1) & 0xffffffu) << 8) |
         static_cast<uint64_t>(op);
}

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base) munmap(base, bytes);
  }
};

// The board named `name` in this host's /dev/shm, created by whichever rank
// comes first; null when it cannot be had (no room, no /dev/shm).
std::shared_ptr<Mapping> map_board(const std::string& name, int size) {
  const size_t bytes = static_cast<size_t>(size) * kLine;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  auto m = std::make_shared<Mapping>();
  // Every rank sizes it alike, so the later ftruncate changes nothing; the
  // pages are reserved now, so a full /dev/shm means no board, not SIGBUS.
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
      posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      m->base = p;
      m->bytes = bytes;
    }
  }
  close(fd);
  return m->base ? m : nullptr;
}

std::string cause_of(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

}  // namespace

// The board and what the messages need; shared by the group and its Works.
class GroupWatch {
 public:
  struct Ticket {
    Op op = Op::kNone;
    uint64_t seq = 0;  // collectives: this rank's count including this one
    int peer = -1;     // send/recv
    int tag = 0;
  };

  GroupWatch(int rank, int size, DeadlineGroupOptions options)
      : name_(std::move(options.name)),
        timeout_(options.timeout),
        rank_(rank),
        size_(size),
        labels_(std::move(options.global_ranks)) {
    if (labels_.empty())
      for (int r = 0; r < size; ++r) labels_.push_back(r);
    ENGINE_CHECK(static_cast<int>(labels_.size()) == size, "DeadlineGroup ", name_, ": ",
                 labels_.size(), " global ranks for ", size, " ranks");
  }

  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool has_board() const { return board_ != nullptr; }

  // Maps the board and meets the other ranks through `store`; see the
  // constructor of DeadlineGroup.
  void join(c10d::Store& store) {
    const std::string name_key = "baton_board/name";
    std::string segment;
    if (rank_ == 0) {
      std::random_device rd;
      segment = cat("/baton-board-", getpid(), "-", (uint64_t{rd()} << 32) | rd());
      store.set(name_key, std::vector<uint8_t>(segment.begin(), segment.end()));
    } else {
      wait_for(store, {name_key}, {0});
      const std::vector<uint8_t> v = store.get(name_key);
      segment.assign(v.begin(), v.end());
    }
    board_ = map_board(segment, size_);
    if (board_) line(rank_)->pid.store(getpid(), std::memory_order_relaxed);
    std::vector<std::string> keys;
    std::vector<int> ranks;
    for (int r = 0; r < size_; ++r) {
      keys.push_back(cat("baton_board/joined/", r));
      ranks.push_back(r);
    }
    store.set(keys[static_cast<size_t>(rank_)], std::vector<uint8_t>{1});
    try {
      wait_for(store, keys, ranks);
    } catch (...) {
      shm_unlink(segment.c_str());
      throw;
    }
    // Every rank has mapped it (or has none): the name is no longer needed.
    shm_unlink(segment.c_str());
    // Peers in another pid namespace (a /dev/shm shared across containers)
    // cannot be checked by pid: every peer is alive now, so a pid that
    // cannot be signalled is one of those.
    if (board_)
      for (int r = 0; r < size_; ++r) {
        const int64_t pid = line(r)->pid.load(std::memory_order_relaxed);
        if (pid != 0 && kill(static_cast<pid_t>(pid), 0) != 0) pids_visible_ = false;
      }
  }

  Ticket enter(Op op, int peer, int tag) {
    Ticket t{op, 0, peer, tag};
    if (is_p2p(op)) {
      if (board_) line(rank_)->p2p.store(p2p_word(op, peer, tag), std::memory_order_relaxed);
    } else {
      t.seq = collectives_.fetch_add(1, std::memory_order_relaxed) + 1;
      if (board_)
        line(rank_)->collective.store((t.seq << 8) | static_cast<uint64_t>(op),
                                      std::memory_order_relaxed);
    }
    return t;
  }

  // "group tp (ranks 0, 1): all_reduce #4 on rank 0"
  std::string where(const Ticket& t) const {
    std::string what = is_p2p(t.op) ? cat(op_name(t.op), t.op == Op::kSend ? " to " : " from ",
                                          label(t.peer), " (tag ", t.tag, ")")
                                    : cat(op_name(t.op), " #", t.seq);
    return cat("group ", name_, " (", rank_list(labels_), "): ", what, " on ", label(rank_));
  }

  // The message of a wait that failed with `cause`.
  std::string failure(const Ticket& t, const std::string& cause) const {
    return cat(where(t), " failed (collective deadline ", timeout_.count(), " ms): ", missing(t),
               " [", cause, "]");
  }

 private:
  Line* line(int r) const {
    return reinterpret_cast<Line*>(static_cast<char*>(board_->base) +
                                   static_cast<size_t>(r) * kLine);
  }
  std::string label(int r) const {
    if (r < 0 || r >= size_) return cat("rank ", r);
    return cat("rank ", labels_[static_cast<size_t>(r)]);
  }

  // Waits for `keys` (of ranks `ranks`) in the store for the deadline; throws
  // EngineError naming the ranks whose keys are not there.
  void wait_for(c10d::Store& store, const std::vector<std::string>& keys,
                const std::vector<int>& ranks) const {
    try {
      store.wait(keys, timeout_);
      return;
    } catch (const std::exception& e) {
      std::vector<int64_t> missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        bool there = false;
        try {
          there = store.check({keys[i]});
        } catch (const std::exception&) {
        }
        if (!there) missing.push_back(labels_[static_cast<size_t>(ranks[i])]);
      }
      throw EngineError(cat("group ", name_, ": ", rank_list(missing), " did not join within ",
                            timeout_.count(), " ms (the collective deadline; ", label(rank_),
                            " waited) [", cause_of(e), "]"));
    }
  }

  // What the board says of the peers of a failed operation.
  std::string missing(const Ticket& t) const {
    if (!board_)
      return "which ranks did not arrive is unknown (this group has no shared-memory arrival "
             "board)";
    auto state = [&](int r) {
      const int64_t pid = line(r)->pid.load(std::memory_order_relaxed);
      const uint64_t c = line(r)->collective.load(std::memory_order_relaxed);
      const uint64_t p = line(r)->p2p.load(std::memory_order_relaxed);
      std::string s = cat("pid ", pid);
      if (pids_visible_) s += detail::process_exited(pid) ? ", exited" : ", alive";
      s += "; its last collective on this group: ";
      s += (c >> 8) == 0 ? std::string("none")
                         : cat(op_name(static_cast<Op>(c & 0xff)), " #", c >> 8);
      if ((p & 0xff) != 0) {
        const int peer = static_cast<int>((p >> 8) & 0xffffff) - 1;
        const auto op = static_cast<Op>(p & 0xff);
        s += cat(", its last send/recv: ", op_name(op), op == Op::kSend ? " to " : " from ",
                 label(peer), " (tag ", static_cast<int32_t>(p >> 32), ")");
      }
      return s;
    };
    auto here = [&](int r) { return line(r)->pid.load(std::memory_order_relaxed) != 0; };
    if (is_p2p(t.op)) {
      if (t.peer < 0 || t.peer >= size_) return cat(label(t.peer), " is not in the group");
      if (!here(t.peer)) return cat(label(t.peer), " could not be checked (not on this host)");
      const Op match = t.op == Op::kSend ? Op::kRecv : Op::kSend;
      if (line(t.peer)->p2p.load(std::memory_order_relaxed) == p2p_word(match, rank_, t.tag))
        return cat(label(t.peer), " arrived (its last operation is the matching ", op_name(match),
                   "; ", state(t.peer), ")");
      return cat(label(t.peer), " did not arrive (", state(t.peer), ")");
    }
    std::vector<int64_t> absent, unseen;
    std::vector<std::string> absent_state, elsewhere;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (!here(r)) {
        unseen.push_back(labels_[static_cast<size_t>(r)]);
        continue;
      }
      const uint64_t c = line(r)->collective.load(std::memory_order_relaxed);
      const uint64_t seq = c >> 8;
      const auto op = static_cast<Op>(c & 0xff);
      if (seq < t.seq) {
        absent.push_back(labels_[static_cast<size_t>(r)]);
        absent_state.push_back(state(r));
      } else if (seq == t.seq && op != t.op) {
        elsewhere.push_back(cat(label(r), " entered ", op_name(op), " as its #", seq));
      }
    }
    std::vector<std::string> parts;
    if (!absent.empty()) {
      std::string s = cat(rank_list(absent), " did not arrive (");
      for (size_t i = 0; i < absent.size(); ++i) {
        if (i) s += "; ";
        if (absent.size() > 1) s += cat("rank ", absent[i], ": ");
        s += absent_state[i];
      }
      parts.push_back(s + ")");
    }
    if (!elsewhere.empty()) {
      std::string s = "the ranks called different collectives: ";
      for (size_t i = 0; i < elsewhere.size(); ++i) s += (i ? ", " : "") + elsewhere[i];
      parts.push_back(s);
    }
    if (!unseen.empty())
      parts.push_back(cat(rank_list(unseen), " could not be checked (not on this host)"));
    if (parts.empty()) return "every rank entered it (the operation itself failed)";
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
    return out;
  }

  std::string name_;
  std::chrono::milliseconds timeout_;
  int rank_, size_;
  std::vector<int64_t> labels_;  // by group rank: the rank shown in messages
  std::shared_ptr<Mapping> board_;
  bool pids_visible_ = true;              // every peer's pid can be checked from here
  std::atomic<uint64_t> collectives_{0};  // entered by this rank
};

namespace {

// The backend's Work, whose failed wait() names the group, the operation and
// who is missing.
class DeadlineWork final : public c10d::Work {
 public:
  DeadlineWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<const GroupWatch> watch,
               GroupWatch::Ticket ticket, int rank)
      : c10d::Work(rank, inner->retrieveOpType()),
        inner_(std::move(inner)),
        watch_(std::move(watch)),
        ticket_(ticket) {}

  bool wait(std::chrono::milliseconds timeout) override {
    try {
      return inner_->wait(timeout);
    } catch (const std::exception& e) {
      throw EngineError(watch_->failure(ticket_, cause_of(e)));
    }
  }
  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<const GroupWatch> watch_;
  GroupWatch::Ticket ticket_;
};

}  // namespace
}  // namespace detail

using detail::Op;

DeadlineGroup::DeadlineGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             DeadlineGroupOptions options)
    : c10d::ProcessGroup(store, rank, size) {
  ENGINE_CHECK(size >= 1 && rank >= 0 && rank < size, "DeadlineGroup: rank ", rank, " of ", size);
  const std::string name = options.name;
  watch_ = std::make_shared<detail::GroupWatch>(rank, size, std::move(options));
  if (size > 1) {
    ENGINE_CHECK(store, "DeadlineGroup ", name, ": no store");
    watch_->join(*store);
  }
  setGroupDesc(name);
}

DeadlineGroup::~DeadlineGroup() = default;

void DeadlineGroup::set_backend(c10::DeviceType device, BackendType type,
                                c10::intrusive_ptr<c10d::Backend> backend) {
  backend->setGroupDesc(watch_->name());
  setDefaultBackend(type);
  setBackend(device, type, std::move(backend));
}

const std::string& DeadlineGroup::name() const { return watch_->name(); }
std::chrono::milliseconds DeadlineGroup::timeout() const { return watch_->timeout(); }
bool DeadlineGroup::has_board() const { return watch_->has_board(); }

template <typename Issue>
c10::intrusive_ptr<c10d::Work> DeadlineGroup::record(uint8_t op, int peer, int tag, Issue&& issue) {
  const detail::GroupWatch::Ticket t = watch_->enter(static_cast<Op>(op), peer, tag);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    throw EngineError(watch_->where(t) + ": " + detail::cause_of(e));
  }
  return c10::make_intrusive<detail::DeadlineWork>(std::move(work), watch_, t, getRank());
}

namespace {
constexpr uint8_t code(Op op) { return static_cast<uint8_t>(op); }
}  // namespace

c10::intrusive_ptr<c10d::Work> DeadlineGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  return record(code(Op::kBroadcast), -1, 0,
                [&] { return ProcessGroup::broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  return record(code(Op::kAllReduce), -1, 0,
                [&] { return ProcessGroup::allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return record(code(Op::kAllReduceCoalesced), -1, 0,
                [&] { return ProcessGroup::allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  return record(code(Op::kReduce), -1, 0, [&] { return ProcessGroup::reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return record(code(Op::kAllGather), -1, 0,
                [&] { return ProcessGroup::allgather(outputs, inputs, opts); });
}

// _allgather_base and _reduce_scatter_base are the names LibTorch 2.11 to
// 2.15 all have (2.15 deprecates them for *_single, which 2.11 lacks); the
// engine calls them (optimizer.cpp), so they are the ones recorded.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
c10::intrusive_ptr<c10d::Work> DeadlineGroup::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return record(code(Op::kAllGather), -1, 0,
                [&] { return ProcessGroup::_allgather_base(output, input, opts); });
}
#pragma GCC diagnostic pop

c10::intrusive_ptr<c10d::Work> DeadlineGroup::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  return record(code(Op::kGather), -1, 0,
                [&] { return ProcessGroup::gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  return record(code(Op::kScatter), -1, 0,
                [&] { return ProcessGroup::scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return record(code(Op::kReduceScatter), -1, 0,
                [&] { return ProcessGroup::reduce_scatter(outputs, inputs, opts); });
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
c10::intrusive_ptr<c10d::Work> DeadlineGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return record(code(Op::kReduceScatter), -1, 0,
                [&] { return ProcessGroup::_reduce_scatter_base(output, input, opts); });
}
#pragma GCC diagnostic pop

c10::intrusive_ptr<c10d::Work> DeadlineGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  return record(code(Op::kAllToAll), -1, 0,
                [&] { return ProcessGroup::alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::BATON_C10D_ALL_TO_ALL_SINGLE(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return record(code(Op::kAllToAll), -1, 0, [&] {
    return ProcessGroup::BATON_C10D_ALL_TO_ALL_SINGLE(output, input, output_split_sizes,
                                                      input_split_sizes, opts);
  });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::barrier(const c10d::BarrierOptions& opts) {
  return record(code(Op::kBarrier), -1, 0, [&] { return ProcessGroup::barrier(opts); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  return record(code(Op::kSend), dst, tag, [&] { return ProcessGroup::send(tensors, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> DeadlineGroup::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  return record(code(Op::kRecv), src, tag, [&] { return ProcessGroup::recv(tensors, src, tag); });
}

}  // namespace baton::engine
