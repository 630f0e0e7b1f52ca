#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <regex>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/hf_model.h"

namespace baton::engine {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts need a byte swap");

namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};

constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

bool dtype_from_name(const std::string& name, at::ScalarType* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

std::string errno_text() { return std::strerror(errno); }

// A private, writable (copy-on-write) mapping of a whole file. Tensors that
// view it hold a shared_ptr, so it lives as long as the last of them.
class Mapping {
 public:
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~Mapping() { ::munmap(addr_, size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_;
  size_t size_;
};

std::shared_ptr<Mapping> map_file(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw EngineError(detail::cat(file.string(), ": cannot open: ", errno_text()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    throw EngineError(detail::cat(file.string(), ": cannot stat: ", why));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw EngineError(detail::cat(file.string(), ": not a regular file"));
  }
  auto size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw EngineError(detail::cat(file.string(), ": not a safetensors file: ", size,
                                  " bytes, shorter than the 8-byte header length"));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  std::string why = errno_text();
  ::close(fd);
  if (addr == MAP_FAILED) throw EngineError(detail::cat(file.string(), ": cannot map: ", why));
  return std::make_shared<Mapping>(addr, size);
}

int64_t json_nonnegative(const nlohmann::json& v, const fs::path& file, const std::string& tensor,
                         const char* what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    throw EngineError(detail::cat(file.string(), ": tensor \"", tensor, "\": ", what,
                                  " must hold non-negative integers, got ", v.dump()));
  return v.get<int64_t>();
}

struct PreparedTensor {
  std::string name;
  at::Tensor data;  // contiguous, CPU
  int64_t bytes = 0;
};

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype) return d.name;
  throw EngineError(
      detail::cat("dtype ", c10::toString(dtype), " cannot be stored in a safetensors file"));
}

void verify_checksums(const fs::path& file, const void* data, size_t size) {
  try {
    verify_file_bytes(file, data, size);
  } catch (const FileError& e) {
    throw EngineError(e.what());
  }
}

TensorMap read_safetensors(const fs::path& file, std::map<std::string, std::string>* metadata) {
  auto mapping = map_file(file);
  const uint8_t* base = mapping->data();
  const uint64_t file_size = mapping->size();
  verify_checksums(file, base, file_size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > file_size - 8)
    throw EngineError(detail::cat(file.string(), ": header length ", header_len,
                                  " runs past the end of the file (", file_size,
                                  " bytes); truncated or not a safetensors file"));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw EngineError(detail::cat(file.string(), ": malformed JSON header: ", e.what()));
  }
  if (!header.is_object())
    throw EngineError(detail::cat(file.string(), ": malformed header: not a JSON object"));

  const uint8_t* data_area = base + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;
  TensorMap out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw EngineError(detail::cat(file.string(), ": __metadata__ is not a JSON object"));
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          throw EngineError(
              detail::cat(file.string(), ": __metadata__ value of \"", k, "\" is not a string"));
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      throw EngineError(detail::cat(file.string(), ": tensor \"", name,
                                    "\": malformed header entry (needs dtype, shape and two "
                                    "data_offsets): ",
                                    entry.dump()));
    std::string dtype_name = entry["dtype"].get<std::string>();
    at::ScalarType dtype{};
    if (!dtype_from_name(dtype_name, &dtype))
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": unknown dtype \"",
                                    dtype_name, "\""));
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      int64_t n = json_nonnegative(d, file, name, "shape");
      shape.push_back(n);
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(n), &numel))
        throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": shape ",
                                      entry["shape"].dump(), " overflows"));
    }
    auto begin = static_cast<uint64_t>(
        json_nonnegative(entry["data_offsets"][0], file, name, "data_offsets"));
    auto end = static_cast<uint64_t>(
        json_nonnegative(entry["data_offsets"][1], file, name, "data_offsets"));
    const auto elem = static_cast<uint64_t>(c10::elementSize(dtype));
    uint64_t expected = 0;
    if (__builtin_mul_overflow(numel, elem, &expected))
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": shape ",
                                    entry["shape"].dump(), " overflows"));
    if (begin > end)
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": data_offsets [", begin,
                                    ", ", end, "] are reversed"));
    if (end - begin != expected)
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": data_offsets [", begin,
                                    ", ", end, "] hold ", end - begin, " bytes but shape ",
                                    entry["shape"].dump(), " of ", dtype_name, " needs ",
                                    expected));
    if (end > data_size)
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": data_offsets [", begin,
                                    ", ", end, "] lie outside the data area of ", data_size,
                                    " bytes (truncated file?)"));

    auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
    const uint8_t* ptr = data_area + begin;
    at::Tensor t;
    if (expected == 0) {
      t = at::empty(shape, options);
    } else if (reinterpret_cast<uintptr_t>(ptr) % elem == 0) {
      t = at::from_blob(
          const_cast<uint8_t*>(ptr), shape, [keep = mapping](void*) {}, options);
    } else {
      t = at::empty(shape, options);
      std::memcpy(t.data_ptr(), ptr, expected);
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

FileChecksum write_safetensors(const fs::path& file, const TensorMap& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<PreparedTensor> prepared;
  prepared.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\" is undefined"));
    try {
      safetensors_dtype_name(t.scalar_type());
    } catch (const EngineError& e) {
      throw EngineError(detail::cat(file.string(), ": tensor \"", name, "\": ", e.what()));
    }
    auto c = t.detach().to(at::kCPU).contiguous();
    prepared.push_back({name, c, static_cast<int64_t>(c.numel() * c.element_size())});
  }
  // Larger elements first keeps every tensor aligned to its element size, so
  // that readers can map the data without copying.
  std::stable_sort(prepared.begin(), prepared.end(), [](const auto& a, const auto& b) {
    return a.data.element_size() > b.data.element_size();
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& p : prepared) {
    header[p.name] = {{"dtype", safetensors_dtype_name(p.data.scalar_type())},
                      {"shape", p.data.sizes().vec()},
                      {"data_offsets", {offset, offset + p.bytes}}};
    offset += p.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  return write_file_atomically(file, [&](const AppendFn& append) {
    append(&header_len, 8);
    append(text.data(), text.size());
    for (const auto& p : prepared)
      if (p.bytes > 0) append(p.data.data_ptr(), static_cast<size_t>(p.bytes));
  });
}

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

TensorMap read_hf_index(const fs::path& index_file) {
  const fs::path dir = index_file.parent_path();
  const nlohmann::json index = read_json_file(index_file);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw EngineError(detail::cat(index_file.string(), ": no \"weight_map\" object"));

  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensor names
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      throw EngineError(detail::cat(index_file.string(), ": weight_map entry of \"", name,
                                    "\" is not a file name"));
    by_shard[shard.get<std::string>()].push_back(name);
  }
  TensorMap out;
  std::map<std::string, std::string> origin;  // tensor -> shard it came from
  for (const auto& [shard, names] : by_shard) {
    const fs::path shard_path = dir / shard;
    if (!fs::exists(shard_path))
      throw EngineError(detail::cat(index_file.string(), ": shard \"", shard, "\" (holding \"",
                                    names.front(), "\") is missing: ", shard_path.string()));
    TensorMap part = read_safetensors(shard_path);
    for (const auto& name : names)
      if (!part.count(name))
        throw EngineError(detail::cat(index_file.string(), ": tensor \"", name,
                                      "\" is listed in shard \"", shard, "\" but ",
                                      shard_path.string(), " does not hold it"));
    for (auto& [name, t] : part) {
      auto [it, inserted] = origin.emplace(name, shard);
      if (!inserted)
        throw EngineError(detail::cat(dir.string(), ": tensor \"", name,
                                      "\" appears in two shards: \"", it->second, "\" and \"",
                                      shard, "\""));
      out.emplace(name, std::move(t));
    }
  }
  return out;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

bool is_hf_weight_file(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
}

}  // namespace

TensorMap read_hf_weights(const fs::path& path) {
  if (!fs::exists(path))
    throw EngineError(detail::cat(path.string(), ": no such file or directory"));
  if (!fs::is_directory(path)) return read_safetensors(path);
  if (fs::exists(path / kSingleFile)) return read_safetensors(path / kSingleFile);
  if (fs::exists(path / kIndexFile)) return read_hf_index(path / kIndexFile);
  std::vector<fs::path> candidates;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      candidates.push_back(entry.path());
  if (candidates.size() == 1) return read_safetensors(candidates.front());
  if (candidates.empty())
    throw EngineError(detail::cat(path.string(), ": no weights: neither ", kSingleFile, " nor ",
                                  kIndexFile, " nor any *.safetensors file"));
  throw EngineError(detail::cat(path.string(), ": ", candidates.size(),
                                " *.safetensors files and no ", kIndexFile,
                                "; cannot tell which hold the weights"));
}

ChecksumManifest write_hf_weights(const fs::path& dir, const TensorMap& tensors,
                                  int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0)
    throw EngineError(
        detail::cat("write_hf_weights: max_shard_bytes must be positive, got ", max_shard_bytes));
  fs::create_directories(dir);
  remove_checksum_manifest(dir);
  ChecksumManifest written;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  std::vector<TensorMap> shards(1);
  int64_t current = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (!shards.back().empty() && current + bytes > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, t);
    current += bytes;
    total += bytes;
  }

  if (shards.size() == 1) {
    written.add(kSingleFile, write_safetensors(dir / kSingleFile, shards.front(), metadata));
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string name = shard_name(i + 1, shards.size());
      written.add(name, write_safetensors(dir / name, shards[i], metadata));
      for (const auto& entry : shards[i]) weight_map[entry.first] = name;
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    written.add(kIndexFile, write_file_atomically(dir / kIndexFile, index.dump(2) + "\n"));
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (is_hf_weight_file(name) && !written.find(name)) fs::remove(entry.path());
  }
  return written;
}

}  // namespace baton::engine
