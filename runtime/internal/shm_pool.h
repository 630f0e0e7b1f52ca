// Shared-memory segments for tensor payloads (internal to the runtime).
//
// The sender copies a message's large tensors into one segment from its
// ShmPool and passes the segment's memfd to each receiver with the message
// (SCM_RIGHTS). The receiver maps it (ShmRegion, cached per segment id in a
// ShmRegionCache) and, when the last tensor decoded from the message is gone
// (ShmLease), tells the sender, which may then reuse the segment. Segments are
// memfds, not named objects: they vanish with the last process that maps
// them, so a crash on either side can never leak one.
//
// Reuse matters: a fresh segment costs a page fault per 4 KiB on first touch,
// which is slower than the copy itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <vector>

namespace baton {

using SegmentId = uint64_t;
using PeerId = uint64_t;
// The pool's own hold while a segment is being filled and sent.
inline constexpr PeerId kSelfPeer = 0;

class ShmPool {
 public:
  struct Segment {
    SegmentId id;
    int fd;
    std::byte* data;
    size_t capacity;
  };

  // `max_idle_bytes`: idle segments beyond this total are unmapped.
  explicit ShmPool(size_t max_idle_bytes = size_t{1} << 30);
  ~ShmPool();
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;

  // A segment of at least `bytes`, held by kSelfPeer until release(id, kSelfPeer).
  // Throws baton::Error if the kernel refuses memory.
  Segment acquire(size_t bytes);

  // Adds / drops one hold of `peer` on segment `id`. A segment with no holds is idle
  // and may be handed out again. Unknown ids are ignored (a confused peer
  // cannot corrupt the pool).
  void hold(SegmentId id, PeerId peer);
  void release(SegmentId id, PeerId peer);
  // Drops every hold of `peer` (it died).
  void release_peer(PeerId peer);

  size_t segment_count() const;
  size_t busy_count() const;

 private:
  struct Entry {
    Segment seg;
    std::multiset<PeerId> holders;
    uint64_t last_used = 0;
  };
  void trim_locked();

  size_t max_idle_bytes_;
  mutable std::mutex mu_;
  std::map<SegmentId, Entry> entries_;
  SegmentId next_id_ = 1;
  uint64_t clock_ = 0;
};

// A receiver's read-write mapping of a whole segment of a sender's.
class ShmRegion {
 public:
  // Maps all of `fd` (which the caller keeps ownership of), every page at
  // once. Throws baton::Error on failure.
  explicit ShmRegion(int fd);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// A receiver's cache of the regions of one sender, by segment id. A sender
// reuses its segments, so mapping each one once saves a page-table walk of
// the whole payload per message. A hit is checked against the passed fd's
// inode: a relay between nodes (runtime/cluster/relay.h) passes a new memfd under an
// old id, and that maps the new memory. Least recently used regions beyond
// `max_bytes` are dropped (tensors still viewing them keep them mapped).
// Thread-safe.
class ShmRegionCache {
 public:
  explicit ShmRegionCache(size_t max_bytes = size_t{1} << 30) : max_bytes_(max_bytes) {}
  std::shared_ptr<ShmRegion> map(SegmentId id, int fd);

 private:
  struct Entry {
    std::shared_ptr<ShmRegion> region;
    uint64_t last_used;
    uint64_t dev;
    uint64_t ino;
  };
  size_t max_bytes_;
  std::mutex mu_;
  std::map<SegmentId, Entry> entries_;
  uint64_t clock_ = 0;
};

// One message's use of a segment: when the last tensor decoded from it is
// destroyed, `on_release(segment)` tells the sender it may reuse the segment.
class ShmLease {
 public:
  ShmLease(std::shared_ptr<ShmRegion> region, SegmentId segment,
           std::function<void(SegmentId)> on_release)
      : region_(std::move(region)), segment_(segment), on_release_(std::move(on_release)) {}
  ~ShmLease() {
    if (on_release_) on_release_(segment_);
  }
  ShmLease(const ShmLease&) = delete;
  ShmLease& operator=(const ShmLease&) = delete;

  const ShmRegion& region() const { return *region_; }

 private:
  std::shared_ptr<ShmRegion> region_;
  SegmentId segment_;
  std::function<void(SegmentId)> on_release_;
};

}  // namespace baton
