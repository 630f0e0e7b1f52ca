// DataProto: a batch. Named tensors that share dimension 0 (any dtype, any
// trailing shape), per-row non-tensor columns (strings, JSON-like values:
// prompts, ground truths, data sources), and meta_info (a dict; its
// "metrics" entry is merged, not compared, by concat).
//
// Value semantics: every operation returns a new DataProto and leaves its
// inputs as they were (unlike verl, where padding, union and reorder work in
// place); pop() and the setters are the only mutators. Tensors are shared,
// not copied, wherever no new rows are made.
//
// Errors are baton::Error with a message naming the key and the sizes.
//
// Example:
//   DataProto batch({{"input_ids", ids}, {"attention_mask", mask}},
//                   {{"prompt", prompts}}, Dict{{"temperature", 1.0}});
//   for (const DataProto& part : batch.chunk(4)) ...
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/value.h"

namespace baton {

class DataProto {
 public:
  using Tensors = std::map<std::string, at::Tensor>;
  using Columns = std::map<std::string, List>;

  DataProto() = default;
  // Checks that every tensor has at least one dimension and that all tensors
  // and columns have the same number of rows.
  DataProto(Tensors tensors, Columns columns = {}, Dict meta = {});

  // Rows: dimension 0 of the tensors, else the length of the columns, else 0.
  int64_t size() const;
  bool empty() const { return size() == 0; }

  const Tensors& tensors() const { return tensors_; }
  const Columns& columns() const { return columns_; }
  const Dict& meta() const { return meta_; }
  Dict& meta() { return meta_; }
  std::vector<std::string> tensor_keys() const;
  std::vector<std::string> column_keys() const;
  bool has_tensor(const std::string& key) const { return tensors_.count(key) > 0; }
  bool has_column(const std::string& key) const { return columns_.count(key) > 0; }

  // What a worker method checks first: throws baton::Error "<where>: the
  // batch has no tensor 'k' (it has: a, b)" naming every missing key.
  void require_tensors(const std::vector<std::string>& keys, const std::string& where) const;

  // Throw naming the missing key and the keys there are.
  const at::Tensor& tensor(const std::string& key) const;
  const List& column(const std::string& key) const;
  // Meta value, or nullptr.
  const Value* meta_value(const std::string& key) const;

  // Add or replace; the row count must match (unless the batch is empty).
  void set_tensor(const std::string& key, at::Tensor t);
  void set_column(const std::string& key, List values);
  void set_meta(const std::string& key, Value v);

  // A batch with only these keys (missing keys are an error); meta is kept.
  DataProto select(const std::vector<std::string>& tensor_keys,
                   const std::vector<std::string>& column_keys = {}) const;
  // Rows by int64 indices (any order, repeats allowed) or by a bool mask of size().
  DataProto select_rows(const at::Tensor& index_or_mask) const;
  DataProto select_rows(const std::vector<int64_t>& indices) const;
  // Rows [start, end).
  DataProto slice(int64_t start, int64_t end) const;
  // Removes the keys from this batch and returns them (with a copy of meta).
  DataProto pop(const std::vector<std::string>& tensor_keys,
                const std::vector<std::string>& column_keys = {});
  DataProto rename(const std::string& from, const std::string& to) const;
  // The rows permuted by `indices` (a permutation of 0..size-1).
  DataProto reorder(const at::Tensor& indices) const;
  // Keys of both; a key in both must hold equal values (tensors, columns, meta).
  DataProto union_with(const DataProto& other) const;

  // Rows of all parts in order. Parts must have the same keys; meta keys other
  // than "metrics" must agree; "metrics" dicts merge into a dict of lists.
  static DataProto concat(const std::vector<DataProto>& parts);
  // `n` parts of equal size; size() must divide by n (pad first otherwise).
  std::vector<DataProto> chunk(int64_t n) const;
  // Consecutive parts of `rows` rows; the last may be shorter.
  std::vector<DataProto> split(int64_t rows) const;
  // Each row `times` times: a,a,b,b (interleave) or a,b,a,b (tiled).
  DataProto repeat(int64_t times, bool interleave = true) const;
  // Row i `counts[i]` times, in order.
  DataProto repeat_rows(const std::vector<int64_t>& counts) const;

  // `pad` copies of the last row appended (the row dispatch padding uses).
  DataProto padded(int64_t pad) const;
  // Padded to a multiple of `divisor`; returns the batch and the pad count.
  std::pair<DataProto, int64_t> pad_to_multiple(int64_t divisor) const;
  // Without the last `pad` rows.
  DataProto unpad(int64_t pad) const;

  // Mini-batches of `mini_batch_size` rows for `epochs` epochs, each epoch a
  // fresh permutation when `shuffle` (seeded: same seed, same batches). A
  // batch smaller than mini_batch_size is one mini-batch (the size is capped);
  // otherwise size() must divide by it.
  std::vector<DataProto> mini_batches(int64_t mini_batch_size, int64_t epochs = 1,
                                      bool shuffle = false, uint64_t seed = 0) const;

  DataProto to(at::Device device) const;

  // {"tensors": {...}, "columns": {...}, "meta": {...}}: how a batch travels.
  Value to_value() const;
  // The same, implicitly, so that a batch is a call argument as it is:
  // group.call("compute_log_prob", {batch}). Tensors are shared, not copied.
  operator Value() const { return to_value(); }
  static DataProto from_value(const Value& v);

  // A file in baton's Cap'n Proto value format, every byte covered by a
  // CRC-32C (written atomically: a temporary file renamed over `path`). load
  // throws baton::Error naming the path for an unreadable, truncated or
  // corrupt file; ChecksumError (base/checksum_manifest.h) naming the byte
  // range for bytes that do not match their checksum (unless
  // BATON_VERIFY_CHECKSUMS=0). A file of the first version, which had no
  // checksums, loads unverified with a warning. save throws FileError naming
  // the file when it cannot be written (a full disk).
  void save(const std::string& path) const;
  static DataProto load(const std::string& path);

 private:
  void check_rows(const std::string& key, int64_t rows) const;

  Tensors tensors_;
  Columns columns_;
  Dict meta_;
};

// DataProto as a typed method argument or result: `DataProto f(const DataProto&)`.
template <>
struct ValueTraits<DataProto> {
  static Value to_value(const DataProto& d) { return d.to_value(); }
  static DataProto from_value(const Value& v) { return DataProto::from_value(v); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kDict); }
};

}  // namespace baton
