#include "dispatch/data_proto.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/checksum.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "base/log.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/value_codec.h"

namespace baton {

namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "none" : out;
}

template <class M>
std::vector<std::string> keys_of(const M& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

at::Tensor index_tensor(const std::vector<int64_t>& idx) {
  return at::tensor(idx, at::TensorOptions().dtype(at::kLong));
}

List gather(const List& column, const std::vector<int64_t>& idx) {
  List out;
  out.reserve(idx.size());
  for (int64_t i : idx) out.push_back(column[static_cast<size_t>(i)]);
  return out;
}

bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a.cpu(), b.cpu());
}

}  // namespace

DataProto::DataProto(Tensors tensors, Columns columns, Dict meta)
    : meta_(std::move(meta)) {
  for (auto& [k, t] : tensors) set_tensor(k, std::move(t));
  for (auto& [k, c] : columns) set_column(k, std::move(c));
}

int64_t DataProto::size() const {
  if (!tensors_.empty()) return tensors_.begin()->second.size(0);
  if (!columns_.empty()) return static_cast<int64_t>(columns_.begin()->second.size());
  return 0;
}

std::vector<std::string> DataProto::tensor_keys() const { return keys_of(tensors_); }
std::vector<std::string> DataProto::column_keys() const { return keys_of(columns_); }

void DataProto::require_tensors(const std::vector<std::string>& keys,
                                const std::string& where) const {
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (!has_tensor(k)) missing.push_back("'" + k + "'");
  if (missing.empty()) return;
  const std::vector<std::string> have = tensor_keys();
  throw Error(where + ": the batch has no tensor" + (missing.size() > 1 ? "s " : " ") +
              join_keys(missing) + " (it has: " + (have.empty() ? "none" : join_keys(have)) + ")");
}

const at::Tensor& DataProto::tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    throw Error("DataProto: no tensor '" + key + "'; tensors: " + join_keys(tensor_keys()));
  }
  return it->second;
}

const List& DataProto::column(const std::string& key) const {
  auto it = columns_.find(key);
  if (it == columns_.end()) {
    throw Error("DataProto: no column '" + key + "'; columns: " + join_keys(column_keys()));
  }
  return it->second;
}

const Value* DataProto::meta_value(const std::string& key) const {
  for (const auto& [k, v] : meta_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void DataProto::check_rows(const std::string& key, int64_t rows) const {
  if (tensors_.empty() && columns_.empty()) return;
  // The batch's own row count, from any key other than `key`.
  for (const auto& [k, t] : tensors_) {
    if (k == key) continue;
    if (t.size(0) != rows) {
      throw Error("DataProto: '" + key + "' has " + std::to_string(rows) + " rows but tensor '" +
                  k + "' has " + std::to_string(t.size(0)));
    }
    return;
  }
  for (const auto& [k, c] : columns_) {
    if (k == key) continue;
    if (static_cast<int64_t>(c.size()) != rows) {
      throw Error("DataProto: '" + key + "' has " + std::to_string(rows) + " rows but column '" +
                  k + "' has " + std::to_string(c.size()));
    }
    return;
  }
}

void DataProto::set_tensor(const std::string& key, at::Tensor t) {
  if (!t.defined() || t.dim() == 0) {
    throw Error("DataProto: tensor '" + key + "' needs a batch dimension (got a " +
                (t.defined() ? "0-dim tensor" : std::string("undefined tensor")) + ")");
  }
  check_rows(key, t.size(0));
  tensors_[key] = std::move(t);
}

void DataProto::set_column(const std::string& key, List values) {
  check_rows(key, static_cast<int64_t>(values.size()));
  columns_[key] = std::move(values);
}

void DataProto::set_meta(const std::string& key, Value v) {
  for (auto& [k, x] : meta_) {
    if (k == key) {
      x = std::move(v);
      return;
    }
  }
  meta_.emplace_back(key, std::move(v));
}

DataProto DataProto::select(const std::vector<std::string>& tensor_keys,
                            const std::vector<std::string>& column_keys) const {
  DataProto out;
  out.meta_ = meta_;
  for (const auto& k : tensor_keys) out.tensors_[k] = tensor(k);
  for (const auto& k : column_keys) out.columns_[k] = column(k);
  return out;
}

DataProto DataProto::select_rows(const at::Tensor& index_or_mask) const {
  at::Tensor idx = index_or_mask.cpu();
  if (idx.scalar_type() == at::kBool) {
    if (idx.dim() != 1 || idx.size(0) != size()) {
      throw Error("DataProto::select_rows: a mask of " + std::to_string(idx.numel()) +
                  " entries for a batch of " + std::to_string(size()) + " rows");
    }
    idx = at::nonzero(idx).reshape({-1});
  }
  if (!at::isIntegralType(idx.scalar_type(), /*includeBool=*/false) || idx.dim() != 1) {
    throw Error("DataProto::select_rows: indices must be a 1-D integer tensor or a bool mask");
  }
  std::vector<int64_t> rows(static_cast<size_t>(idx.numel()));
  at::Tensor idx64 = idx.to(at::kLong).contiguous();
  std::memcpy(rows.data(), idx64.data_ptr<int64_t>(), rows.size() * sizeof(int64_t));
  return select_rows(rows);
}

DataProto DataProto::select_rows(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t i : indices) {
    if (i < 0 || i >= n) {
      throw Error("DataProto::select_rows: row " + std::to_string(i) + " out of range for " +
                  std::to_string(n) + " rows");
    }
  }
  DataProto out;
  out.meta_ = meta_;
  at::Tensor idx = index_tensor(indices);
  for (const auto& [k, t] : tensors_) out.tensors_[k] = at::index_select(t, 0, idx.to(t.device()));
  for (const auto& [k, c] : columns_) out.columns_[k] = gather(c, indices);
  return out;
}

DataProto DataProto::slice(int64_t start, int64_t end) const {
  const int64_t n = size();
  if (start < 0 || end < start || end > n) {
    throw Error("DataProto::slice: rows [" + std::to_string(start) + ", " + std::to_string(end) +
                ") out of range for " + std::to_string(n) + " rows");
  }
  DataProto out;
  out.meta_ = meta_;
  for (const auto& [k, t] : tensors_) out.tensors_[k] = t.slice(0, start, end);
  for (const auto& [k, c] : columns_) out.columns_[k] = List(c.begin() + start, c.begin() + end);
  return out;
}

DataProto DataProto::pop(const std::vector<std::string>& tensor_keys,
                         const std::vector<std::string>& column_keys) {
  DataProto out = select(tensor_keys, column_keys);  // throws before removing anything
  for (const auto& k : tensor_keys) tensors_.erase(k);
  for (const auto& k : column_keys) columns_.erase(k);
  return out;
}

DataProto DataProto::rename(const std::string& from, const std::string& to) const {
  DataProto out = *this;
  if (has_tensor(to) || has_column(to)) {
    throw Error("DataProto::rename: '" + to + "' already exists");
  }
  if (has_tensor(from)) {
    out.tensors_.erase(from);
    out.tensors_[to] = tensor(from);
  } else if (has_column(from)) {
    out.columns_.erase(from);
    out.columns_[to] = column(from);
  } else {
    throw Error("DataProto::rename: no tensor or column '" + from + "'");
  }
  return out;
}

DataProto DataProto::reorder(const at::Tensor& indices) const {
  at::Tensor sorted = std::get<0>(at::sort(indices.cpu().to(at::kLong)));
  if (indices.dim() != 1 || indices.numel() != size() ||
      !at::equal(sorted, at::arange(size(), at::kLong))) {
    throw Error("DataProto::reorder: indices must be a permutation of 0.." +
                std::to_string(size() - 1));
  }
  return select_rows(indices);
}

DataProto DataProto::union_with(const DataProto& other) const {
  if (!empty() && !other.empty() && size() != other.size()) {
    throw Error("DataProto::union_with: " + std::to_string(size()) + " rows and " +
                std::to_string(other.size()) + " rows");
  }
  DataProto out = *this;
  for (const auto& [k, t] : other.tensors_) {
    auto it = tensors_.find(k);
    if (it != tensors_.end() && !same_tensor(it->second, t)) {
      throw Error("DataProto::union_with: tensor '" + k + "' differs between the two batches");
    }
    out.tensors_[k] = t;
  }
  for (const auto& [k, c] : other.columns_) {
    auto it = columns_.find(k);
    if (it != columns_.end() && !(it->second == c)) {
      throw Error("DataProto::union_with: column '" + k + "' differs between the two batches");
    }
    out.columns_[k] = c;
  }
  for (const auto& [k, v] : other.meta_) {
    const Value* mine = meta_value(k);
    if (mine != nullptr && !(*mine == v)) {
      throw Error("DataProto::union_with: meta '" + k + "' differs between the two batches");
    }
    if (mine == nullptr) out.meta_.emplace_back(k, v);
  }
  return out;
}

DataProto DataProto::concat(const std::vector<DataProto>& parts) {
  if (parts.empty()) return DataProto();
  const DataProto& first = parts[0];
  DataProto out;
  for (size_t p = 1; p < parts.size(); ++p) {
    if (parts[p].tensor_keys() != first.tensor_keys() ||
        parts[p].column_keys() != first.column_keys()) {
      throw Error("DataProto::concat: part " + std::to_string(p) + " has keys {" +
                  join_keys(parts[p].tensor_keys()) + " | " + join_keys(parts[p].column_keys()) +
                  "}, part 0 has {" + join_keys(first.tensor_keys()) + " | " +
                  join_keys(first.column_keys()) + "}");
    }
  }
  for (const auto& [k, t] : first.tensors_) {
    std::vector<at::Tensor> ts;
    for (const auto& part : parts) ts.push_back(part.tensors_.at(k));
    out.tensors_[k] = at::cat(ts, 0);
  }
  for (const auto& [k, c] : first.columns_) {
    List all;
    for (const auto& part : parts) {
      const List& pc = part.columns_.at(k);
      all.insert(all.end(), pc.begin(), pc.end());
    }
    out.columns_[k] = std::move(all);
  }
  // meta: keys other than "metrics" must agree; metrics merge into lists.
  Dict metrics;
  bool any_metrics = false;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (const auto& [k, v] : parts[p].meta_) {
      if (k == "metrics") {
        any_metrics = true;
        if (v.kind() != ValueKind::kDict) {
          throw Error("DataProto::concat: meta 'metrics' of part " + std::to_string(p) +
                      " is a " + kind_name(v.kind()) + ", expected a dict");
        }
        for (const auto& [mk, mv] : v.as_dict()) {
          const std::string& name = mk;  // a lambda may not capture a structured binding (clang 14)
          auto it = std::find_if(metrics.begin(), metrics.end(),
                                 [&](const auto& e) { return e.first == name; });
          if (it == metrics.end()) it = metrics.insert(metrics.end(), {mk, Value(List{})});
          if (mv.kind() == ValueKind::kList) {
            for (const Value& x : mv.as_list()) it->second.as_list().push_back(x);
          } else {
            it->second.as_list().push_back(mv);
          }
        }
        continue;
      }
      const Value* have = out.meta_value(k);
      if (have == nullptr) {
        out.meta_.emplace_back(k, v);
      } else if (!(*have == v)) {
        throw Error("DataProto::concat: conflicting values for meta '" + k + "': " +
                    have->to_string() + " vs " + v.to_string() + " (part " + std::to_string(p) +
                    ")");
      }
    }
  }
  if (any_metrics) out.meta_.emplace_back("metrics", Value(std::move(metrics)));
  return out;
}

std::vector<DataProto> DataProto::chunk(int64_t n) const {
  if (n <= 0) throw Error("DataProto::chunk: " + std::to_string(n) + " chunks");
  if (size() % n != 0) {
    throw Error("DataProto::chunk: " + std::to_string(size()) + " rows do not split into " +
                std::to_string(n) + " equal chunks; pad first (pad_to_multiple)");
  }
  return split(size() / n == 0 ? 1 : size() / n);
}

std::vector<DataProto> DataProto::split(int64_t rows) const {
  if (rows <= 0) throw Error("DataProto::split: chunk size " + std::to_string(rows));
  std::vector<DataProto> out;
  for (int64_t start = 0; start < size(); start += rows) {
    out.push_back(slice(start, std::min(size(), start + rows)));
  }
  return out;
}

DataProto DataProto::repeat(int64_t times, bool interleave) const {
  if (times < 1) throw Error("DataProto::repeat: times = " + std::to_string(times));
  std::vector<int64_t> idx;
  const int64_t n = size();
  for (int64_t a = 0; a < (interleave ? n : times); ++a) {
    for (int64_t b = 0; b < (interleave ? times : n); ++b) idx.push_back(interleave ? a : b);
  }
  return select_rows(idx);
}

DataProto DataProto::repeat_rows(const std::vector<int64_t>& counts) const {
  if (static_cast<int64_t>(counts.size()) != size()) {
    throw Error("DataProto::repeat_rows: " + std::to_string(counts.size()) + " counts for " +
                std::to_string(size()) + " rows");
  }
  std::vector<int64_t> idx;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) throw Error("DataProto::repeat_rows: negative count for row " + std::to_string(i));
    for (int64_t c = 0; c < counts[i]; ++c) idx.push_back(static_cast<int64_t>(i));
  }
  return select_rows(idx);
}

DataProto DataProto::padded(int64_t pad) const {
  if (pad < 0) throw Error("DataProto::padded: pad = " + std::to_string(pad));
  if (pad == 0) return *this;
  if (empty()) throw Error("DataProto::padded: cannot pad an empty batch");
  std::vector<int64_t> idx(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) idx[static_cast<size_t>(i)] = i;
  idx.insert(idx.end(), static_cast<size_t>(pad), size() - 1);
  return select_rows(idx);
}

std::pair<DataProto, int64_t> DataProto::pad_to_multiple(int64_t divisor) const {
  if (divisor <= 0) throw Error("DataProto::pad_to_multiple: divisor " + std::to_string(divisor));
  int64_t pad = (divisor - size() % divisor) % divisor;
  return {padded(pad), pad};
}

DataProto DataProto::unpad(int64_t pad) const {
  if (pad < 0 || pad > size()) {
    throw Error("DataProto::unpad: pad " + std::to_string(pad) + " for " + std::to_string(size()) +
                " rows");
  }
  return slice(0, size() - pad);
}

std::vector<DataProto> DataProto::mini_batches(int64_t mini_batch_size, int64_t epochs,
                                               bool shuffle, uint64_t seed) const {
  if (mini_batch_size <= 0) {
    throw Error("DataProto::mini_batches: mini-batch size " + std::to_string(mini_batch_size));
  }
  const int64_t n = size();
  const int64_t mb = std::min(mini_batch_size, std::max<int64_t>(n, 1));
  if (n % mb != 0) {
    throw Error("DataProto::mini_batches: " + std::to_string(n) +
                " rows do not divide into mini-batches of " + std::to_string(mb));
  }
  std::vector<DataProto> out;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (int64_t e = 0; e < epochs; ++e) {
    DataProto epoch = shuffle ? select_rows(at::randperm(n, gen, at::kLong)) : *this;
    std::vector<DataProto> parts = epoch.split(mb);
    out.insert(out.end(), parts.begin(), parts.end());
  }
  return out;
}

DataProto DataProto::to(at::Device device) const {
  DataProto out = *this;
  for (auto& [k, t] : out.tensors_) t = t.to(device);
  return out;
}

Value DataProto::to_value() const {
  Dict tensors, columns;
  for (const auto& [k, t] : tensors_) tensors.emplace_back(k, Value(t));
  for (const auto& [k, c] : columns_) columns.emplace_back(k, Value(c));
  return Value(Dict{{"tensors", Value(std::move(tensors))},
                    {"columns", Value(std::move(columns))},
                    {"meta", Value(meta_)}});
}

DataProto DataProto::from_value(const Value& v) {
  if (v.kind() != ValueKind::kDict || v.find("tensors") == nullptr ||
      v.find("columns") == nullptr || v.find("meta") == nullptr) {
    throw Error("DataProto::from_value: expected a dict with tensors, columns and meta, got " +
                std::string(kind_name(v.kind())));
  }
  Tensors tensors;
  Columns columns;
  for (const auto& [k, t] : v.at("tensors").as_dict()) tensors[k] = t.as_tensor();
  for (const auto& [k, c] : v.at("columns").as_dict()) columns[k] = c.as_list();
  return DataProto(std::move(tensors), std::move(columns), v.at("meta").as_dict());
}

namespace {

// A DataProto file (version 2): every byte is covered by a CRC-32C, so that a
// flipped one is refused naming its range.
//   [0, 8)          "BATONDP2"
//   [8, 16)         P, the payload's bytes (little-endian; a multiple of 8)
//   [16, 20)        the CRC-32C of the block table
//   [20, 24)        the CRC-32C of bytes [0, 20)
//   [24, 24 + P)    the payload: the batch as one Cap'n Proto message
//   [24 + P, end)   the block table: the CRC-32C of each kChecksumBlockBytes
//                   of the payload (little-endian)
// Version 1 ("BATONDP1" then the payload) had no checksums; it is still read.
constexpr char kMagic[8] = {'B', 'A', 'T', 'O', 'N', 'D', 'P', '2'};
constexpr char kMagicV1[8] = {'B', 'A', 'T', 'O', 'N', 'D', 'P', '1'};
constexpr size_t kHeaderBytes = 24;
static_assert(kHeaderBytes % sizeof(capnp::word) == 0);

// A file's bytes, in words (the payload of either version starts at a word
// boundary, so that the message is read in place; capnp::word cannot be
// copied, hence no std::vector).
struct FileWords {
  kj::Array<capnp::word> words;
  size_t size = 0;  // bytes read

  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(words.begin()); }
  // Whole words [begin, begin + count).
  kj::ArrayPtr<const capnp::word> view(size_t begin, size_t count) const {
    return kj::ArrayPtr<const capnp::word>(words.begin() + begin, count);
  }
};

FileWords read_words(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw FileError("DataProto::load: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  FileWords out;
  int error = ::fstat(fd, &st) == 0 ? 0 : errno;
  // Up to the size fstat gave and one word more (a file that grew meanwhile
  // is refused by its size check).
  if (error == 0)
    out.words =
        kj::heapArray<capnp::word>(static_cast<size_t>(st.st_size) / sizeof(capnp::word) + 1);
  char* data = reinterpret_cast<char*>(out.words.begin());
  const size_t capacity = out.words.size() * sizeof(capnp::word);
  for (ssize_t n = 1; error == 0 && n > 0 && out.size < capacity;) {
    n = ::read(fd, data + out.size, capacity - out.size);
    if (n > 0) out.size += static_cast<size_t>(n);
    if (n < 0 && errno != EINTR) error = errno;
    if (n < 0) n = 1;
  }
  ::close(fd);
  if (error != 0) {
    throw FileError("DataProto::load: cannot read " + path + ": " + std::strerror(error));
  }
  return out;
}

DataProto decode(const std::string& path, kj::ArrayPtr<const capnp::word> view) {
  try {
    if (view.size() == 0 || capnp::expectedSizeInWordsFromPrefix(view) != view.size()) {
      throw Error("size mismatch");
    }
    capnp::FlatArrayMessageReader reader(view, wire_reader_options(view.size()));
    auto args = reader.getRoot<wire::Envelope>().getCall().getArgs();
    if (args.size() != 1) throw Error("no value");
    ValueDecoder dec;
    return DataProto::from_value(dec.decode(args[0]));
  } catch (const std::exception& e) {
    throw Error("DataProto::load: " + path + " is truncated or corrupt (" + e.what() + ")");
  } catch (const kj::Exception& e) {
    throw Error("DataProto::load: " + path + " is truncated or corrupt (" +
                std::string(e.getDescription().cStr()) + ")");
  }
}

}  // namespace

void DataProto::save(const std::string& path) const {
  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  ValueEncoder enc;  // every tensor inline
  Value v = to_value();
  auto call = env.initCall();
  call.setMethod("DataProto");
  enc.encode(v, call.initArgs(1)[0]);
  auto words = capnp::messageToFlatArray(builder);
  auto payload = words.asBytes();
  const FileChecksum sum = checksum_bytes(payload.begin(), payload.size());
  const size_t table_bytes = sum.blocks.size() * sizeof(uint32_t);
  char header[kHeaderBytes];
  const uint64_t payload_size = payload.size();
  const uint32_t table_crc = crc32c(sum.blocks.data(), table_bytes);
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &payload_size, 8);
  std::memcpy(header + 16, &table_crc, 4);
  const uint32_t header_crc = crc32c(header, 20);
  std::memcpy(header + 20, &header_crc, 4);
  try {
    write_file_atomically(path, [&](const AppendFn& append) {
      append(header, kHeaderBytes);
      append(payload.begin(), payload.size());
      append(sum.blocks.data(), table_bytes);
    });
  } catch (const FileError& e) {
    throw FileError(std::string("DataProto::save: ") + e.what());
  }
}

DataProto DataProto::load(const std::string& path) {
  const FileWords file = read_words(path);
  const size_t size = file.size;
  const uint8_t* bytes = file.bytes();
  const std::string where = "DataProto::load: " + path;
  if (size >= 8 && std::memcmp(bytes, kMagicV1, 8) == 0) {
    const std::string note =
        where +
        ": no checksums (written before DataProto files carried them); loading it "
        "unverified";
    log(LogLevel::kWarn, note);
    if (size % sizeof(capnp::word) != 0) throw Error(where + " is truncated or corrupt");
    return decode(path, file.view(1, size / sizeof(capnp::word) - 1));
  }
  if (size < 8 || std::memcmp(bytes, kMagic, 8) != 0) {
    throw Error(where + " is not a baton DataProto file");
  }
  const bool verify = checksum_verification_enabled();
  auto corrupt = [&](uint64_t begin, uint64_t end, const std::string& what) {
    return ChecksumError(
        detail::cat(where, ": bytes [", begin, ", ", end, ") ", what, "; the file is corrupt"));
  };
  if (size < kHeaderBytes) {
    throw Error(detail::cat(where, " is truncated or corrupt (", size, " bytes, shorter than its ",
                            kHeaderBytes, "-byte header)"));
  }
  uint64_t payload = 0;
  uint32_t table_crc = 0, header_crc = 0;
  std::memcpy(&payload, bytes + 8, 8);
  std::memcpy(&table_crc, bytes + 16, 4);
  std::memcpy(&header_crc, bytes + 20, 4);
  if (verify && crc32c(bytes, 20) != header_crc) {
    throw corrupt(0, kHeaderBytes, "(the header) do not match their CRC-32C");
  }
  const uint64_t blocks = checksum_blocks(payload);
  if (payload > size || payload % sizeof(capnp::word) != 0 ||
      size != kHeaderBytes + payload + blocks * sizeof(uint32_t)) {
    throw Error(detail::cat(where, " is truncated or corrupt (", size, " bytes; its header says ",
                            payload, " bytes of payload)"));
  }
  if (verify) {
    FileChecksum sum;
    sum.size = payload;
    sum.blocks.resize(blocks);
    std::memcpy(sum.blocks.data(), bytes + kHeaderBytes + payload, blocks * sizeof(uint32_t));
    const uint32_t found = crc32c(sum.blocks.data(), blocks * sizeof(uint32_t));
    if (found != table_crc) {
      throw corrupt(kHeaderBytes + payload, size,
                    detail::cat("(the checksum table) do not match their CRC-32C (",
                                crc32c_hex(found), ", expected ", crc32c_hex(table_crc), ")"));
    }
    if (const std::optional<BlockMismatch> bad =
            find_mismatch(sum, bytes + kHeaderBytes, payload)) {
      const uint64_t begin = kHeaderBytes + bad->block * kChecksumBlockBytes;
      const uint64_t end =
          kHeaderBytes + std::min<uint64_t>((bad->block + 1) * kChecksumBlockBytes, payload);
      throw corrupt(
          begin, end,
          detail::cat("do not match their CRC-32C (", crc32c_hex(bad->found), ", expected ",
                      crc32c_hex(sum.blocks[bad->block]), ")",
                      bad->count > 1 ? detail::cat(", nor do ", bad->count - 1, " later blocks")
                                     : std::string()));
    }
  }
  return decode(path, file.view(kHeaderBytes / sizeof(capnp::word), payload / sizeof(capnp::word)));
}

}  // namespace baton
