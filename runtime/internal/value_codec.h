// Value <-> Cap'n Proto (internal to the runtime).
//
// Tensors of at least kInlineTensorBytes are copied into one shared-memory
// segment per message; smaller ones travel inline. Non-contiguous tensors are
// made contiguous on the way. A contiguous CPU tensor of at least
// kInlineTensorBytes in shared memory of its own (shared_tensor.h) is not
// copied: the message passes its memfd (one fd per distinct memory, after the
// message's segment, at most kMaxPassedMemories) and the receiver maps it.
//
// Device tensors travel through host memory: the encoder copies a CUDA
// tensor device-to-host straight into the shared segment (or the inline
// bytes), and the decoder always yields CPU tensors (a view of the segment).
// A receiver that computes on its GPU moves them there itself
// (DataProto::to(device)). No CUDA IPC: nothing device-side is shared.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/internal/shm_pool.h"
#include "runtime/internal/wire.capnp.h"
#include "runtime/shared_tensor.h"
#include "runtime/value.h"

namespace baton {

inline constexpr size_t kInlineTensorBytes = 64 * 1024;
// Distinct shared memories one message passes by reference (one fd each);
// tensors of further ones are copied. Well under SCM_MAX_FD (253).
inline constexpr size_t kMaxPassedMemories = 64;

class ValueEncoder {
 public:
  // `pool` supplies the segment for large tensors; it must outlive the encoder.
  explicit ValueEncoder(ShmPool& pool) : pool_(&pool) {}
  // Every tensor inline (for files); a tensor over 512 MiB is an error.
  ValueEncoder() = default;

  // Call for every value the message will carry, before any encode(): sizes
  // the message's segment.
  void plan(const Value& v);
  void plan(const List& vs) {
    for (const Value& v : vs) plan(v);
  }

  void encode(const Value& v, wire::Value::Builder out);
  void encode(const List& vs, capnp::List<wire::Value>::Builder out);

  // Fills fdCount and sharedBytes of `env` and returns the fds to pass.
  std::vector<int> finish(wire::Envelope::Builder env) const;

  // The segment used, if any; held by kSelfPeer until the caller releases it.
  std::optional<SegmentId> segment() const;
  // The shared tensors' memory whose fds finish() returned: keep it until
  // the message is written (null when there is none).
  std::shared_ptr<void> keep_alive() const;

 private:
  bool goes_shared(const at::Tensor& t) const;
  // A shared tensor's memory, when plan() chose to pass `t` by reference.
  std::shared_ptr<detail::SharedMemory> by_reference(const at::Tensor& t) const;
  void plan_tensor(const at::Tensor& t);

  ShmPool* pool_ = nullptr;
  size_t planned_ = 0;
  size_t used_ = 0;
  std::optional<ShmPool::Segment> seg_;
  std::vector<std::shared_ptr<detail::SharedMemory>> passed_;  // fds after the segment's
};

class ValueDecoder {
 public:
  // `fds`: those passed with the message (the decoder closes them).
  // `regions`: the receiver's cache of the sender's segments.
  // `on_release(segment)` runs when the last tensor decoded from the message's
  // segment is destroyed, possibly on another thread and long after.
  ValueDecoder(std::vector<int> fds, uint64_t shared_bytes, ShmRegionCache& regions,
               std::function<void(SegmentId)> on_release);
  // For inline values only (files).
  ValueDecoder() = default;
  ~ValueDecoder();
  ValueDecoder(const ValueDecoder&) = delete;
  ValueDecoder& operator=(const ValueDecoder&) = delete;

  // Throws baton::Error for a malformed value (bad dtype, sizes that do not add up).
  Value decode(wire::Value::Reader in);
  List decode(capnp::List<wire::Value>::Reader in);

 private:
  std::shared_ptr<ShmLease> lease(SegmentId segment);

  std::vector<int> fds_;
  uint64_t shared_bytes_ = 0;
  ShmRegionCache* regions_ = nullptr;
  std::function<void(SegmentId)> on_release_;
  std::shared_ptr<ShmLease> lease_;
};

}  // namespace baton
