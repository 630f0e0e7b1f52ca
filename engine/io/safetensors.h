// Safetensors: the file format HF checkpoints use (an 8-byte little-endian
// header length, a JSON header naming every tensor's dtype, shape and byte
// range, then the raw little-endian data), and HF model directories holding
// one such file or several shards listed in `model.safetensors.index.json`.
//
// Example:
//   TensorMap w = read_hf_weights("models/qwen2-0.5b");   // single or sharded
//   write_hf_weights("out/", w, /*max_shard_bytes=*/1 << 30);
//   write_safetensors("x.safetensors", {{"a", at::ones({2, 3})}}, {{"format", "pt"}});
//
// Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
//
// Checksums: the writers return the CRC-32C of every 1 MiB block of what they
// wrote (base/checksum.h); a directory's writer lists them in its manifest
// (base/checksum_manifest.h: save_hf_model, save_sharded, checkpoints). The
// readers check each file against the manifest of its directory, when there
// is one and it lists the file (verification is on unless
// BATON_VERIFY_CHECKSUMS=0): a flipped byte is an EngineError naming the file
// and the byte range, never a tensor of garbage.
//
// Errors: every malformed or unreadable input throws EngineError naming the
// file and, where one is involved, the tensor. Blocking: all functions do
// synchronous file I/O on the calling thread. Thread safety: independent calls
// may run concurrently; concurrent writers to the same path race (the last
// rename wins, neither file is ever half-written).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "base/checksum_manifest.h"

namespace baton::engine {

// Tensors by name; std::map so that iteration (and every file written from
// one) is in name order.
using TensorMap = std::map<std::string, at::Tensor>;

// Reads every tensor of a .safetensors file. The file is memory-mapped
// privately: tensors whose data is suitably aligned are views of the mapping
// (which stays alive while any of them does; writing to them in place is
// copy-on-write and never reaches the file), the others are copied. The
// file's `__metadata__` goes to `metadata` when given.
// Throws EngineError for a missing file, a file shorter than 8 bytes, a header
// length beyond the file, a malformed JSON header, an unknown dtype, or
// data_offsets that are outside the data area (truncated file) or do not
// match shape × dtype size, and for bytes that do not match the checksums of
// the directory's manifest.
TensorMap read_safetensors(const std::filesystem::path& file,
                           std::map<std::string, std::string>* metadata = nullptr);

// Writes `tensors` (any device, any strides; copied to contiguous CPU bytes)
// to `file`, atomically: a temporary file in the same directory is written,
// flushed to disk and renamed over `file`. The header's keys are sorted by
// name and padded with spaces to a multiple of 8 bytes; the data is laid out
// by decreasing element size, then by name, so that every tensor starts at an
// offset aligned to its element size (as the reference implementation does).
// Returns the file's checksums. Throws EngineError for an unsupported dtype
// (naming the tensor), FileError (base/errors.h) for an I/O failure such as a
// full disk (naming the file).
FileChecksum write_safetensors(const std::filesystem::path& file, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads an HF model's weights. `path` may be a .safetensors file, or a
// directory holding (checked in this order, as HF does) `model.safetensors`,
// `model.safetensors.index.json` with its shards, or exactly one
// `*.safetensors` file. Besides read_safetensors' errors, throws EngineError
// when no weights are found, the index is malformed or names a missing shard,
// a tensor listed in the index is not in its shard, or a tensor name appears
// in two shards.
TensorMap read_hf_weights(const std::filesystem::path& path);

constexpr int64_t kDefaultMaxShardBytes = int64_t{2} << 30;  // 2 GiB

// Writes `tensors` into directory `dir` (created if missing) the way HF's
// save_pretrained does: `model.safetensors` when the data fits in
// `max_shard_bytes`, else shards `model-00001-of-0000N.safetensors` filled in
// name order (a tensor larger than the limit gets a shard of its own) plus
// `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}).
// Every file carries the metadata {"format": "pt"} that HF's loader expects.
// Weight files of a previous save in `dir` that the new set does not use are
// removed afterwards, so HF never picks a stale file. Each file is written
// atomically; the set as a whole is not (see checkpoint.h for that). The
// directory's checksum manifest, if any, is removed first (the files it lists
// are about to change); the checksums of the files written are returned for
// the caller's new manifest (save_hf_model writes it).
ChecksumManifest write_hf_weights(const std::filesystem::path& dir, const TensorMap& tensors,
                      int64_t max_shard_bytes = kDefaultMaxShardBytes);

// Checks `size` bytes at `data`, the whole contents of `file`, against the
// checksum manifest of the file's directory (base/checksum_manifest.h's
// verify_file_bytes); EngineError naming the file and the byte range that does
// not match, or the manifest when it is corrupt.
void verify_checksums(const std::filesystem::path& file, const void* data, size_t size);

// The dtype name used in safetensors headers ("F32", "BF16", ...); throws
// EngineError for a dtype the format does not support here.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace baton::engine
