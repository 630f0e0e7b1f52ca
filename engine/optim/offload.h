// Offload: the memory behind a set of tensors leaves the compute device
// between the phases that need it, and comes back before the next one
// (verl's param_offload / grad_offload / optimizer_offload).
//
// It works on storages, not tensors: offload() copies each distinct storage's
// bytes out and frees the storage's memory in place (the StorageImpl stays,
// with 0 bytes); reload() allocates it again and copies the bytes back. Every
// tensor that views the storage — a parameter, the distributed optimizer's
// flat buffer the parameters are views of, a gradient bucket — is therefore
// valid again after reload(), unchanged and bit-identical, and nothing that
// holds a tensor has to be told. Between the two, reading any of those
// tensors is a bug (their data pointer is null); the roles reload before each
// phase that reads them.
//
// Where the bytes go: a GPU storage to pinned host memory (copied at bus
// speed); a CPU storage to a file (unlinked, in `spill_dir`), so that the
// process's resident memory really drops — the OS may keep the pages in its
// cache, and writes them to disk under memory pressure (DeepSpeed's NVMe
// offload is the same idea). Storages another allocator owns (a shared-memory
// segment's, a from_blob view's) cannot be freed and re-allocated in place:
// they are left resident and counted in kept_bytes().
//
// Example (a frozen reference model, resident only while it computes):
//   TensorOffload ref_params(model.named_params() tensors..., "/tmp");
//   ref_params.offload();            // after init
//   ref_params.reload(); forward...; ref_params.offload();
//
// Thread safety: none; the worker's thread drives it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace baton::engine {

class TensorOffload {
 public:
  // `tensors` may share storages (each is moved once) and may be undefined
  // (skipped). `spill_dir`: where CPU storages are written ("" = $TMPDIR or
  // /tmp).
  TensorOffload(const std::vector<at::Tensor>& tensors, std::string spill_dir = "");
  ~TensorOffload();
  TensorOffload(const TensorOffload&) = delete;
  TensorOffload& operator=(const TensorOffload&) = delete;

  // Frees the storages' memory, their bytes kept off the device. A no-op
  // when offloaded. Every storage is copied out before any is freed, so a
  // spill write that fails (EngineError naming the directory) frees nothing.
  void offload();
  // Allocates the storages again and restores their bytes. A no-op when
  // resident.
  void reload();
  bool offloaded() const { return offloaded_; }

  // Bytes of the storages that move, wherever they are now, and of those
  // kept resident because another allocator owns them.
  int64_t bytes() const { return bytes_; }
  int64_t kept_bytes() const { return kept_bytes_; }
  // Bytes of these storages on the compute device now: bytes() + kept_bytes()
  // when resident, kept_bytes() when offloaded.
  int64_t resident_bytes() const { return offloaded_ ? kept_bytes_ : bytes_ + kept_bytes_; }

 private:
  struct Entry {
    c10::Storage storage;
    int64_t nbytes = 0;
    at::Tensor host;     // GPU storages: the pinned copy while offloaded
    int64_t offset = 0;  // CPU storages: where its bytes are in the spill file
  };
  void spill_open();

  std::vector<Entry> entries_;
  std::string spill_dir_;
  int spill_fd_ = -1;
  int64_t bytes_ = 0, kept_bytes_ = 0;
  bool offloaded_ = false;
};

}  // namespace baton::engine
