#include "engine/parallel/shm_group.h"

#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/errors.h"
#include "engine/kernels/optimizer_kernels.h"
#include "engine/parallel/deadline_group.h"

namespace baton::engine {
namespace {

constexpr size_t kLine = 64;

// One rank's control line.
struct Control {
  std::atomic<uint64_t> epoch;  // barriers this rank has entered
  int64_t pid;
  uint64_t token;  // rank 0's: proves a peer mapped the same segment
  double value[2];  // all_reduce_sum's operand, by barrier parity
};
static_assert(sizeof(Control) <= kLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base) munmap(base, bytes);
  }
};

size_t align_up(size_t n) { return (n + kLine - 1) / kLine * kLine; }

Control* control(void* base, int64_t r) {
  return reinterpret_cast<Control*>(static_cast<char*>(base) + static_cast<size_t>(r) * kLine);
}

std::string segment_name(int64_t pid, int64_t nonce) {
  return detail::cat("/baton-shm-", pid, "-", static_cast<uint64_t>(nonce));
}

void* map_segment(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::create(const Group& group, int64_t numel,
                                           std::chrono::milliseconds timeout) {
  if (group.size <= 1) return nullptr;
  if (numel <= 0 || numel % group.size != 0)
    throw EngineError(detail::cat("ShmGroup: numel ", numel,
                                  " must be a positive multiple of the group size ", group.size));
  const size_t region_bytes = align_up(static_cast<size_t>(numel) * sizeof(float));
  const size_t bytes = align_up(static_cast<size_t>(group.size) * kLine) +
                       region_bytes * static_cast<size_t>(group.size + 1);
  auto mapping = std::make_shared<Mapping>();
  mapping->bytes = bytes;

  // Rank 0 creates the segment and names it: {pid, nonce, token}, pid < 0
  // when it could not.
  auto header = at::zeros({3}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  std::string name;
  if (group.rank == 0) {
    std::random_device rd;
    const int64_t nonce = static_cast<int64_t>((uint64_t{rd()} << 32) | rd());
    const int64_t token = static_cast<int64_t>((uint64_t{rd()} << 32) | rd());
    name = segment_name(getpid(), nonce);
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    // posix_fallocate reserves the pages now: a /dev/shm too small for the
    // segment (a container's 64 MB, say) means Gloo instead, not a SIGBUS
    // at the first touch of a page that is not there.
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
        posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0)
      mapping->base = map_segment(fd, bytes);
    if (fd >= 0) close(fd);
    if (mapping->base) {
      control(mapping->base, 0)->token = static_cast<uint64_t>(token);
      h[0] = getpid();
      h[1] = nonce;
      h[2] = token;
    } else {
      if (fd >= 0) shm_unlink(name.c_str());
      h[0] = -1;
    }
  }
  std::vector<at::Tensor> ts{header};
  group.pg->broadcast(ts)->wait();
  if (h[0] < 0) return nullptr;
  if (group.rank != 0) {
    name = segment_name(h[0], h[1]);
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes)
      mapping->base = map_segment(fd, bytes);
    if (fd >= 0) close(fd);
    if (mapping->base && control(mapping->base, 0)->token != static_cast<uint64_t>(h[2])) {
      munmap(mapping->base, bytes);
      mapping->base = nullptr;
    }
  }
  // Every rank must have mapped rank 0's segment, or none uses it.
  auto ok = at::full({1}, mapping->base ? 1 : 0, at::kLong);
  std::vector<at::Tensor> oks{ok};
  c10d::AllreduceOptions min;
  min.reduceOp = c10d::ReduceOp::MIN;
  group.pg->allreduce(oks, min)->wait();
  if (ok.item<int64_t>() == 1) {
    Control* c = control(mapping->base, group.rank);
    c->epoch.store(0, std::memory_order_relaxed);
    c->pid = getpid();
  }
  group.pg->barrier()->wait();
  // Mapped everywhere (or abandoned): the name is no longer needed, so
  // nothing outlives the processes.
  if (group.rank == 0) shm_unlink(name.c_str());
  if (ok.item<int64_t>() != 1) return nullptr;

  std::unique_ptr<ShmGroup> g(new ShmGroup());
  g->base_ = mapping->base;
  g->rank_ = group.rank;
  g->size_ = group.size;
  g->numel_ = numel;
  g->timeout_ = timeout;
  g->name_ = group.pg->getGroupDesc().empty() ? "shm" : group.pg->getGroupDesc();
  g->ranks_ = group.ranks;
  // Peers in another pid namespace (a shared /dev/shm across containers)
  // cannot be checked by pid: then only the timeout applies.
  for (int64_t r = 0; r < group.size; ++r)
    if (kill(static_cast<pid_t>(control(mapping->base, r)->pid), 0) != 0) g->check_pids_ = false;
  g->region_ = at::from_blob(
      g->region_ptr(group.rank), {numel}, [mapping](void*) {}, at::kFloat);
  g->mapping_ = mapping;
  return g;
}

ShmGroup::~ShmGroup() = default;

float* ShmGroup::region_ptr(int64_t r) const {
  const size_t region_bytes = align_up(static_cast<size_t>(numel_) * sizeof(float));
  return reinterpret_cast<float*>(static_cast<char*>(base_) +
                                  align_up(static_cast<size_t>(size_) * kLine) +
                                  region_bytes * static_cast<size_t>(r));
}

void ShmGroup::barrier() { wait_all("barrier"); }

void ShmGroup::wait_all(const char* op) {
  ++epoch_;
  control(base_, rank_)->epoch.store(epoch_, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  auto next_check = start + std::chrono::milliseconds(50);
  // "group dp (ranks 0, 1) in shared memory: reduce_scatter (barrier #3) on rank 0"
  auto where = [&] {
    return detail::cat("group ", name_, " (", detail::rank_list(ranks_),
                       ") in shared memory: ", op, " (barrier #", epoch_, ") on rank ",
                       ranks_[rank_]);
  };
  // The ranks that have not reached this barrier (only those that exited),
  // with their pids and last barriers.
  auto behind = [&](bool exited_only) {
    std::vector<int64_t> who;
    std::vector<std::string> state;
    for (int64_t r = 0; r < size_; ++r) {
      const Control* c = control(base_, r);
      const uint64_t reached = c->epoch.load(std::memory_order_acquire);
      if (r == rank_ || reached >= epoch_) continue;
      const bool exited = check_pids_ && detail::process_exited(c->pid);
      if (exited_only && !exited) continue;
      who.push_back(ranks_[r]);
      state.push_back(detail::cat("pid ", c->pid, exited ? ", exited" : ", alive",
                                  "; its last barrier: #", reached));
    }
    std::string out = detail::rank_list(who) + " (";
    for (size_t i = 0; i < who.size(); ++i) {
      if (i) out += "; ";
      if (who.size() > 1) out += detail::cat("rank ", who[i], ": ");
      out += state[i];
    }
    return out + ")";
  };
  for (int64_t r = 0; r < size_; ++r) {
    Control* c = control(base_, r);
    int spins = 0;
    while (c->epoch.load(std::memory_order_acquire) < epoch_) {
      if (++spins < 2048) {
        _mm_pause();
        continue;
      }
      // A long wait (a slower rank's backward) sleeps in short naps instead
      // of holding a core the slower rank may need.
      const auto now = std::chrono::steady_clock::now();
      if (now - start < std::chrono::milliseconds(1))
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(50);
      if (check_pids_ && detail::process_exited(c->pid))
        throw EngineError(where() + ": " + behind(true) + " exited while rank " +
                          std::to_string(ranks_[rank_]) + " waited for it");
      if (now - start > timeout_)
        throw EngineError(detail::cat(where(), " failed (collective deadline ", timeout_.count(),
                                      " ms): ", behind(false),
                                      " did not arrive (a collective called on some ranks "
                                      "only?)"));
    }
  }
}

double ShmGroup::reduce_scatter(at::Tensor& out) {
  const int64_t shard = shard_numel();
  if (!out.is_cpu() || out.scalar_type() != at::kFloat || !out.is_contiguous() ||
      out.numel() != shard)
    throw EngineError(detail::cat("ShmGroup::reduce_scatter: out must be a contiguous CPU fp32 [",
                                  shard, "], got ", out.toString(), " ", out.sizes()));
  wait_all("reduce_scatter");  // every region is final
  // In rank order on every rank, so every shard's sums round alike (tied
  // copies of one parameter in different shards stay equal). `out` may be
  // this rank's own slice (the other ranks read only their own slices).
  std::vector<const float*> in;
  for (int64_t r = 0; r < size_; ++r) in.push_back(region_ptr(r) + rank_ * shard);
  const double squares = cpu::sum_arrays(out.data_ptr<float>(), in.data(), size_, shard);
  wait_all("reduce_scatter");  // nobody rewrites a region before every rank has read it
  return squares;
}

double ShmGroup::all_reduce_sum(double x) {
  // The slot of the coming barrier's parity: a rank reaches the next call's
  // barrier only after every rank has passed this one, and that call writes
  // the other slot.
  const size_t slot = (epoch_ + 1) % 2;
  control(base_, rank_)->value[slot] = x;
  wait_all("all_reduce_sum");
  double sum = 0;
  for (int64_t r = 0; r < size_; ++r) sum += control(base_, r)->value[slot];
  return sum;
}

void ShmGroup::all_gather(const at::Tensor& shard, at::Tensor& out) {
  const int64_t n = shard_numel();
  auto bad = [](const at::Tensor& t, int64_t want) {
    return !t.is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.numel() != want;
  };
  if (bad(shard, n) || bad(out, numel_))
    throw EngineError(detail::cat("ShmGroup::all_gather: shard [", n, "] and out [", numel_,
                                  "] must be contiguous CPU fp32, got ", shard.sizes(), " and ",
                                  out.sizes()));
  float* gather = region_ptr(size_);
  std::memcpy(gather + rank_ * n, shard.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
  wait_all("all_gather");
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < size_; ++r) {
    if (dst + r * n == shard.data_ptr<float>()) continue;  // already in place
    std::memcpy(dst + r * n, gather + r * n, static_cast<size_t>(n) * sizeof(float));
  }
  wait_all("all_gather");  // the gather area is free again
}

}  // namespace baton::engine
