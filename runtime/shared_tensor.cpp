#include "runtime/shared_tensor.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>
#include <c10/util/strides.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/errors.h"

namespace baton {
namespace detail {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

void delete_shared(void* ctx) { delete static_cast<std::shared_ptr<SharedMemory>*>(ctx); }

// Unique on this host: the creating process's pid and a counter, high bit set
// (the runtime's own segment ids never have it).
uint64_t next_id() {
  static std::atomic<uint32_t> counter{0};
  const auto pid = static_cast<uint64_t>(getpid()) & 0x7fffffffULL;
  return (uint64_t{1} << 63) | (pid << 32) | counter.fetch_add(1);
}

std::shared_ptr<SharedMemory> create(size_t bytes) {
  auto m = std::make_shared<SharedMemory>();
  m->id = next_id();
  m->bytes = bytes;
  m->fd = memfd_create("baton-shared-tensor", MFD_CLOEXEC);
  if (m->fd < 0) throw Error("shared_empty: memfd_create failed: " + errno_text(errno));
  if (bytes == 0) return m;
  if (ftruncate(m->fd, static_cast<off_t>(bytes)) != 0)
    throw Error("shared_empty: cannot size shared memory to " + std::to_string(bytes) +
                " bytes: " + errno_text(errno));
  // Reserve the pages now: running out later would be a SIGBUS on first touch.
  if (int rc = posix_fallocate(m->fd, 0, static_cast<off_t>(bytes)); rc != 0)
    throw Error("shared_empty: cannot reserve " + std::to_string(bytes) +
                " bytes of shared memory: " + errno_text(rc));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  if (p == MAP_FAILED)
    throw Error("shared_empty: cannot map " + std::to_string(bytes) +
                " bytes of shared memory: " + errno_text(errno));
  m->data = static_cast<std::byte*>(p);
  return m;
}

}  // namespace

SharedMemory::~SharedMemory() {
  if (data != nullptr) munmap(data, bytes);
  if (fd >= 0) close(fd);
}

std::shared_ptr<SharedMemory> shared_memory_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_shared) return nullptr;
  return *static_cast<std::shared_ptr<SharedMemory>*>(dp.get_context());
}

at::Tensor tensor_over(std::shared_ptr<SharedMemory> memory, size_t offset, at::IntArrayRef sizes,
                       at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  std::byte* data = memory->data != nullptr ? memory->data + offset : nullptr;
  auto* ctx = new std::shared_ptr<SharedMemory>(std::move(memory));
  c10::DataPtr dp(data, ctx, &delete_shared, at::Device(at::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), nullptr, false);
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  t.set_(storage, 0, sizes, c10::contiguous_strides(sizes));
  return t;
}

}  // namespace detail

at::Tensor shared_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    if (s < 0) throw Error("shared_empty: negative size in " + c10::str(sizes));
    if (__builtin_mul_overflow(numel, s, &numel))
      throw Error("shared_empty: sizes " + c10::str(sizes) + " have more than 2^63 elements");
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), c10::elementSize(dtype), &bytes))
    throw Error("shared_empty: sizes " + c10::str(sizes) + " need more than 2^64 bytes");
  auto memory = detail::create(bytes);
  return detail::tensor_over(std::move(memory), 0, sizes, dtype);
}

at::Tensor to_shared(const at::Tensor& t) {
  at::Tensor out = shared_empty(t.sizes(), t.scalar_type());
  out.copy_(t);
  return out;
}

bool is_shared(const at::Tensor& t) { return detail::shared_memory_of(t) != nullptr; }

}  // namespace baton
