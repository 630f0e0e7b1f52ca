#include "runtime/internal/shm_pool.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/errors.h"

namespace baton {

namespace {

constexpr size_t kGranule = size_t{1} << 21;  // 2 MiB

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string errno_text() { return std::strerror(errno); }

}  // namespace

ShmPool::ShmPool(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}

ShmPool::~ShmPool() {
  for (auto& [id, e] : entries_) {
    munmap(e.seg.data, e.seg.capacity);
    close(e.seg.fd);
  }
}

ShmPool::Segment ShmPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++clock_;
  // Smallest idle segment that fits without wasting more than 4x.
  Entry* best = nullptr;
  for (auto& [id, e] : entries_) {
    if (!e.holders.empty() || e.seg.capacity < bytes) continue;
    if (e.seg.capacity > 4 * std::max(bytes, kGranule)) continue;
    if (best == nullptr || e.seg.capacity < best->seg.capacity) best = &e;
  }
  if (best == nullptr) {
    size_t capacity = round_up(std::max<size_t>(bytes, 1), kGranule);
    int fd = memfd_create("baton-tensor", MFD_CLOEXEC);
    if (fd < 0) throw Error("shared memory: memfd_create failed: " + errno_text());
    if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
      std::string why = errno_text();
      close(fd);
      throw Error("shared memory: cannot size a segment to " + std::to_string(capacity) +
                  " bytes: " + why);
    }
    void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      std::string why = errno_text();
      close(fd);
      throw Error("shared memory: cannot map " + std::to_string(capacity) + " bytes: " + why);
    }
    SegmentId id = next_id_++;
    Entry e;
    e.seg = Segment{id, fd, static_cast<std::byte*>(p), capacity};
    best = &entries_.emplace(id, std::move(e)).first->second;
  }
  best->holders.insert(kSelfPeer);
  best->last_used = clock_;
  Segment seg = best->seg;
  trim_locked();
  return seg;
}

void ShmPool::hold(SegmentId id, PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) it->second.holders.insert(peer);
}

void ShmPool::release(SegmentId id, PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto h = it->second.holders.find(peer);
  if (h != it->second.holders.end()) it->second.holders.erase(h);
  if (it->second.holders.empty()) trim_locked();
}

void ShmPool::release_peer(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) e.holders.erase(peer);
  trim_locked();
}

size_t ShmPool::segment_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t ShmPool::busy_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.holders.empty() ? 0 : 1;
  return n;
}

void ShmPool::trim_locked() {
  size_t idle = 0;
  for (const auto& [id, e] : entries_) {
    if (e.holders.empty()) idle += e.seg.capacity;
  }
  while (idle > max_idle_bytes_) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!it->second.holders.empty()) continue;
      if (victim == entries_.end() || it->second.last_used < victim->second.last_used) victim = it;
    }
    if (victim == entries_.end()) return;
    idle -= victim->second.seg.capacity;
    munmap(victim->second.seg.data, victim->second.seg.capacity);
    close(victim->second.seg.fd);
    entries_.erase(victim);
  }
}

ShmRegion::ShmRegion(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw Error("shared memory: cannot stat a received segment: " + errno_text());
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;
  // MAP_POPULATE maps every page now, in one pass, instead of faulting per page.
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    throw Error("shared memory: cannot map a received segment of " + std::to_string(size_) +
                " bytes: " + errno_text());
  }
  data_ = static_cast<std::byte*>(p);
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) munmap(data_, size_);
}

std::shared_ptr<ShmRegion> ShmRegionCache::map(SegmentId id, int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw Error("shared memory: cannot stat a received segment: " + errno_text());
  std::lock_guard<std::mutex> lock(mu_);
  ++clock_;
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (it->second.dev == st.st_dev && it->second.ino == st.st_ino) {
      it->second.last_used = clock_;
      return it->second.region;
    }
    entries_.erase(it);  // new memory under a known id
  }
  auto region = std::make_shared<ShmRegion>(fd);
  entries_[id] = Entry{region, clock_, static_cast<uint64_t>(st.st_dev),
                       static_cast<uint64_t>(st.st_ino)};
  size_t total = 0;
  for (const auto& [k, e] : entries_) total += e.region->size();
  while (total > max_bytes_ && entries_.size() > 1) {
    auto victim = entries_.end();
    for (auto e = entries_.begin(); e != entries_.end(); ++e) {
      if (e->first == id) continue;
      if (victim == entries_.end() || e->second.last_used < victim->second.last_used) victim = e;
    }
    total -= victim->second.region->size();
    entries_.erase(victim);
  }
  return region;
}

}  // namespace baton
