#include "engine/optim/offload.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "engine/errors.h"

namespace baton::engine {

namespace {

// A byte tensor over all of `storage` (for device copies).
at::Tensor bytes_of(const c10::Storage& storage, int64_t nbytes) {
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {nbytes}, {1});
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

TensorOffload::TensorOffload(const std::vector<at::Tensor>& tensors, std::string spill_dir)
    : spill_dir_(std::move(spill_dir)) {
  if (spill_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    spill_dir_ = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::set<const c10::StorageImpl*> seen;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::Storage& s = t.storage();
    if (!seen.insert(s.unsafeGetStorageImpl()).second) continue;
    const auto nbytes = static_cast<int64_t>(s.nbytes());
    if (nbytes == 0) continue;
    // Only memory this process's allocator for the device gave can be freed
    // and allocated again in place.
    if (s.allocator() == nullptr || s.allocator() != c10::GetAllocator(s.device_type()) ||
        !(s.device().is_cpu() || s.device().is_cuda())) {
      kept_bytes_ += nbytes;
      continue;
    }
    entries_.push_back(Entry{s, nbytes, {}, 0});
    bytes_ += nbytes;
  }
}

TensorOffload::~TensorOffload() {
  if (spill_fd_ >= 0) ::close(spill_fd_);
}

void TensorOffload::spill_open() {
  if (spill_fd_ >= 0) return;
  // Unlinked from the start: the file goes with the process, however it ends.
  spill_fd_ = ::open(spill_dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (spill_fd_ < 0)
    throw EngineError("offload: cannot create a spill file in " + spill_dir_ + ": " + errno_text());
}

void TensorOffload::offload() {
  if (offloaded_ || entries_.empty()) {
    offloaded_ = true;
    return;
  }
  // Copy everything out first, then free: a failed write frees nothing.
  int64_t offset = 0;
  for (Entry& e : entries_) {
    if (e.storage.device().is_cuda()) {
      c10::DeviceGuard guard(e.storage.device());
      e.host = at::empty({e.nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      e.host.copy_(bytes_of(e.storage, e.nbytes));
      continue;
    }
    spill_open();
    e.offset = offset;
    const char* data = static_cast<const char*>(e.storage.data());
    for (int64_t done = 0; done < e.nbytes;) {
      const ssize_t n = ::pwrite(spill_fd_, data + done, static_cast<size_t>(e.nbytes - done),
                                 static_cast<off_t>(offset + done));
      if (n <= 0) {
        const std::string why = n < 0 ? errno_text() : "no space written";
        if (::ftruncate(spill_fd_, 0) != 0) {
          // The file is unlinked; its space returns when the process ends.
        }
        for (Entry& x : entries_) x.host = at::Tensor();
        throw EngineError("offload: writing " + std::to_string(e.nbytes) +
                          " bytes to the spill "
                          "file in " +
                          spill_dir_ + " failed: " + why);
      }
      done += n;
    }
    offset += e.nbytes;
  }
  for (Entry& e : entries_) {
    e.storage.set_data_ptr_noswap(e.storage.allocator()->allocate(0));
    e.storage.set_nbytes(0);
  }
  offloaded_ = true;
}

void TensorOffload::reload() {
  if (!offloaded_) return;
  for (Entry& e : entries_) {
    c10::DeviceGuard guard(e.storage.device());
    e.storage.set_data_ptr_noswap(e.storage.allocator()->allocate(static_cast<size_t>(e.nbytes)));
    e.storage.set_nbytes(static_cast<size_t>(e.nbytes));
    if (e.storage.device().is_cuda()) {
      bytes_of(e.storage, e.nbytes).copy_(e.host);
      e.host = at::Tensor();
      continue;
    }
    char* data = static_cast<char*>(e.storage.mutable_data());
    for (int64_t done = 0; done < e.nbytes;) {
      const ssize_t n = ::pread(spill_fd_, data + done, static_cast<size_t>(e.nbytes - done),
                                static_cast<off_t>(e.offset + done));
      if (n <= 0)
        throw EngineError("offload: reading " + std::to_string(e.nbytes) +
                          " bytes back from the spill file in " + spill_dir_ +
                          " failed: " + (n < 0 ? errno_text() : std::string("short file")));
      done += n;
    }
  }
  // The bytes are back: give the file's space back too.
  if (spill_fd_ >= 0 && ::ftruncate(spill_fd_, 0) != 0)
    throw EngineError("offload: cannot truncate the spill file in " + spill_dir_ + ": " +
                      errno_text());
  offloaded_ = false;
}

}  // namespace baton::engine
