// Shared-memory segments for tensor payloads (internal to the runtime).
//
// The sender copies a tensor's bytes into a segment from its ShmPool and passes
// the segment's memfd to each receiver with the message (SCM_RIGHTS). The
// receiver maps it (ShmMapping) and, when the last tensor viewing the mapping
// is gone, tells the sender, which may then reuse the segment. Segments are
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

// A receiver's read-write mapping of [0, length) of a sender's segment. The
// destructor unmaps and calls `on_release(segment)`.
class ShmMapping {
 public:
  // Maps `length` bytes of `fd` (which the caller keeps ownership of).
  // Throws baton::Error on failure.
  ShmMapping(int fd, size_t length, SegmentId segment, std::function<void(SegmentId)> on_release);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  std::byte* data() const { return data_; }
  size_t length() const { return length_; }

 private:
  std::byte* data_ = nullptr;
  size_t length_ = 0;
  SegmentId segment_;
  std::function<void(SegmentId)> on_release_;
};

}  // namespace baton
