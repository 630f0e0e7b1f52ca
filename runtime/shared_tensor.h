// Tensors in shared memory: a call argument or result that is a shared
// tensor (or a contiguous view of one) travels as its memory, not as a copy.
// The receiver gets a CPU tensor viewing the same pages, so the bytes are
// written once, by whoever fills the tensor, and never copied by the runtime.
// Other tensors keep copy semantics (the runtime copies them into a segment
// of its own, and a receiver's writes are its own).
//
// Sharing means sharing: both sides see each other's writes, as with
// torch.multiprocessing's shared tensors. Do not write a tensor while a
// worker may still read it, or read a result the worker keeps writing.
//
// Example:
//   at::Tensor batch = baton::shared_empty({4096, 4096});   // 64 MiB, not yet sent
//   fill(batch);                                            // written once, here
//   group.call("train_step", {batch});                      // no copy on the way
//   at::Tensor copy = baton::to_shared(existing);           // one copy, then none
//
// Memory: a memfd per tensor (an open file descriptor and a mapping while it
// lives), reserved when it is made (ENOMEM from the kernel becomes
// baton::Error); it is freed when the last tensor viewing it, in any process,
// is gone. Tensors under 64 KiB, and those of more than 64 distinct shared
// memories in one message, are copied as ordinary ones. A receiver keeps the
// mappings of recently received shared tensors (up to 64 and 1 GiB, each an
// fd and a mapping) so that sending the same tensor again costs no
// page-table setup; that can hold a freed tensor's pages a while longer.
//
// Thread safety: the functions are thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace baton {

// An uninitialised contiguous CPU tensor in shared memory.
at::Tensor shared_empty(at::IntArrayRef sizes, at::ScalarType dtype = at::kFloat);
// A copy of `t` (any device, any strides) in shared memory.
at::Tensor to_shared(const at::Tensor& t);
// Whether `t`'s storage is shared memory from shared_empty / to_shared (or a
// shared tensor received from another process).
bool is_shared(const at::Tensor& t);

namespace detail {
// The memfd behind a shared tensor's storage: what the codec passes.
struct SharedMemory {
  uint64_t id = 0;  // unique in its creating process; the high bit set
  int fd = -1;
  std::byte* data = nullptr;
  size_t bytes = 0;
  ~SharedMemory();
};
// The shared memory behind `t`'s storage, or null.
std::shared_ptr<SharedMemory> shared_memory_of(const at::Tensor& t);
// A tensor over `memory` at byte `offset` (a received one).
at::Tensor tensor_over(std::shared_ptr<SharedMemory> memory, size_t offset, at::IntArrayRef sizes,
                       at::ScalarType dtype);
}  // namespace detail

}  // namespace baton
