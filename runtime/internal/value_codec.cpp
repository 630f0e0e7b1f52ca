#include "runtime/internal/value_codec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "base/errors.h"

namespace baton {

namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t tensor_bytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

at::Tensor cpu_contiguous(const at::Tensor& t) {
  at::Tensor c = t.device().is_cpu() ? t : t.cpu();
  return c.contiguous();
}

// Copies `t`'s bytes to `dst`. A contiguous CPU tensor is a plain memcpy,
// split over the intra-op threads (ATen's copy_ is slower than memcpy for
// this case); anything else goes through copy_, which handles strides and
// device-to-host in one pass.
void copy_into(const at::Tensor& t, std::byte* dst) {
  if (t.device().is_cpu() && t.is_contiguous()) {
    const auto* src = static_cast<const std::byte*>(t.data_ptr());
    const int64_t n = static_cast<int64_t>(tensor_bytes(t));
    constexpr int64_t kGrain = int64_t{8} << 20;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
    });
    return;
  }
  at::from_blob(dst, t.sizes(), t.options().device(at::kCPU)).copy_(t);
}

constexpr uint64_t kSharedTensorBit = uint64_t{1} << 63;

// A received shared tensor's memory, mapped once per process and kept for
// the next message that passes it (a sender's recurring tensor costs no new
// mapping). Bounded: at most 64 memories and 1 GiB, least recently used
// first, those no tensor views any more before those some tensor does (a
// dropped entry's tensors keep their own reference). A hit is checked
// against the received fd's inode: an id reused by another process after a
// pid wrap maps the new memory, not the old one.
std::shared_ptr<detail::SharedMemory> received_shared_memory(uint64_t id, int fd) {
  struct Entry {
    std::shared_ptr<detail::SharedMemory> memory;
    dev_t dev;
    ino_t ino;
    uint64_t last_used;
  };
  static std::mutex mu;
  static std::map<uint64_t, Entry> entries;
  static uint64_t clock = 0;
  constexpr size_t kMaxBytes = size_t{1} << 30, kMaxEntries = 64;
  struct stat st {};
  if (fstat(fd, &st) != 0) throw Error("shared tensor: cannot stat a received memfd");
  std::lock_guard<std::mutex> lock(mu);
  ++clock;
  if (auto it = entries.find(id); it != entries.end()) {
    if (it->second.dev == st.st_dev && it->second.ino == st.st_ino) {
      it->second.last_used = clock;
      return it->second.memory;
    }
    entries.erase(it);  // another memory under a reused id
  }
  auto m = std::make_shared<detail::SharedMemory>();
  m->id = id;
  m->bytes = static_cast<size_t>(st.st_size);
  m->fd = dup(fd);  // kept for passing the tensor on
  if (m->fd < 0) throw Error("shared tensor: cannot keep a received memfd (dup failed)");
  if (m->bytes > 0) {
    void* p = mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
      throw Error("shared tensor: cannot map a received tensor of " + std::to_string(m->bytes) +
                  " bytes");
    m->data = static_cast<std::byte*>(p);
  }
  entries[id] = Entry{m, st.st_dev, st.st_ino, clock};
  size_t total = 0;
  for (const auto& [k, e] : entries) total += e.memory->bytes;
  while ((total > kMaxBytes || entries.size() > kMaxEntries) && entries.size() > 1) {
    auto victim = entries.end();
    auto worse = [](const Entry& a, const Entry& b) {  // a goes before b
      const bool a_idle = a.memory.use_count() == 1, b_idle = b.memory.use_count() == 1;
      if (a_idle != b_idle) return a_idle;
      return a.last_used < b.last_used;
    };
    for (auto e = entries.begin(); e != entries.end(); ++e)
      if (e->first != id && (victim == entries.end() || worse(e->second, victim->second)))
        victim = e;
    total -= victim->second.memory->bytes;
    entries.erase(victim);
  }
  return m;
}

}  // namespace

bool ValueEncoder::goes_shared(const at::Tensor& t) const {
  return pool_ != nullptr && tensor_bytes(t) >= kInlineTensorBytes;
}

std::shared_ptr<detail::SharedMemory> ValueEncoder::by_reference(const at::Tensor& t) const {
  if (!goes_shared(t) || !t.device().is_cpu() || !t.is_contiguous()) return nullptr;
  auto mem = detail::shared_memory_of(t);
  if (!mem) return nullptr;
  for (const auto& m : passed_)
    if (m == mem) return mem;
  return nullptr;
}

void ValueEncoder::plan_tensor(const at::Tensor& t) {
  if (!goes_shared(t)) return;
  if (by_reference(t)) return;  // its memory already goes
  // One fd per distinct memory, and a message can carry only so many
  // (SCM_MAX_FD); past kMaxPassedMemories the tensors are copied.
  if (t.device().is_cpu() && t.is_contiguous() && passed_.size() < kMaxPassedMemories) {
    if (auto mem = detail::shared_memory_of(t)) {
      passed_.push_back(std::move(mem));
      return;
    }
  }
  planned_ += align_up(tensor_bytes(t));
}

void ValueEncoder::plan(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kTensor: {
      plan_tensor(v.as_tensor());
      break;
    }
    case ValueKind::kList:
      for (const Value& x : v.as_list()) plan(x);
      break;
    case ValueKind::kDict:
      for (const auto& [k, x] : v.as_dict()) plan(x);
      break;
    default:
      break;
  }
}

void ValueEncoder::encode(const List& vs, capnp::List<wire::Value>::Builder out) {
  for (size_t i = 0; i < vs.size(); ++i) encode(vs[i], out[static_cast<unsigned>(i)]);
}

void ValueEncoder::encode(const Value& v, wire::Value::Builder out) {
  switch (v.kind()) {
    case ValueKind::kNone: out.setNone(); break;
    case ValueKind::kBool: out.setBool(v.as_bool()); break;
    case ValueKind::kInt: out.setInt(v.as_int()); break;
    case ValueKind::kFloat: out.setFloat(v.as_float()); break;
    case ValueKind::kString: out.setString(v.as_string()); break;
    case ValueKind::kList: encode(v.as_list(), out.initList(static_cast<unsigned>(v.as_list().size()))); break;
    case ValueKind::kDict: {
      const Dict& d = v.as_dict();
      auto entries = out.initDict(static_cast<unsigned>(d.size()));
      for (size_t i = 0; i < d.size(); ++i) {
        entries[static_cast<unsigned>(i)].setKey(d[i].first);
        encode(d[i].second, entries[static_cast<unsigned>(i)].initValue());
      }
      break;
    }
    case ValueKind::kTensor: {
      const at::Tensor& t = v.as_tensor();
      auto wt = out.initTensor();
      wt.setDtype(static_cast<int8_t>(t.scalar_type()));
      auto shape = wt.initShape(static_cast<unsigned>(t.dim()));
      for (int64_t i = 0; i < t.dim(); ++i) shape.set(static_cast<unsigned>(i), t.size(i));
      size_t nbytes = tensor_bytes(t);
      if (auto mem = by_reference(t)) {
        // Its own shared memory: pass the memfd, copy nothing. Fd index:
        // after the message's segment (there is one iff anything was planned).
        size_t j = 0;
        while (passed_[j] != mem) ++j;
        auto shared = wt.initShared();
        shared.setSegment(mem->id);
        shared.setFdIndex(static_cast<int32_t>(j + (planned_ > 0 ? 1 : 0)));
        shared.setOffset(nbytes == 0 ? 0
                                     : static_cast<uint64_t>(static_cast<const std::byte*>(
                                                                 t.data_ptr()) -
                                                             mem->data));
        shared.setLength(nbytes);
        break;
      }
      if (!goes_shared(t)) {
        if (nbytes >= (size_t{1} << 29)) {
          throw Error("a tensor of " + std::to_string(nbytes) +
                      " bytes is too large to store inline (limit 512 MiB)");
        }
        at::Tensor c = cpu_contiguous(t);
        auto data = wt.initInline(static_cast<unsigned>(nbytes));
        if (nbytes > 0) std::memcpy(data.begin(), c.data_ptr(), nbytes);
        break;
      }
      if (!seg_) {
        if (planned_ == 0) throw Error("ValueEncoder: encode() of a large tensor without plan()");
        seg_ = pool_->acquire(planned_);
      }
      if (used_ + align_up(nbytes) > seg_->capacity) {
        throw Error("ValueEncoder: more tensor bytes encoded than planned");
      }
      copy_into(t, seg_->data + used_);
      auto shared = wt.initShared();
      shared.setSegment(seg_->id);
      shared.setFdIndex(0);
      shared.setOffset(used_);
      shared.setLength(nbytes);
      used_ += align_up(nbytes);
      break;
    }
  }
}

std::vector<int> ValueEncoder::finish(wire::Envelope::Builder env) const {
  std::vector<int> fds;
  if (planned_ > 0) {
    if (!seg_) throw Error("ValueEncoder: finish() before the planned tensors were encoded");
    fds.push_back(seg_->fd);
    env.setSharedBytes(used_);
    env.setSegment(seg_->id);
  }
  for (const auto& m : passed_) fds.push_back(m->fd);
  env.setFdCount(static_cast<uint32_t>(fds.size()));
  return fds;
}

std::shared_ptr<void> ValueEncoder::keep_alive() const {
  if (passed_.empty()) return nullptr;
  return std::make_shared<std::vector<std::shared_ptr<detail::SharedMemory>>>(passed_);
}

std::optional<SegmentId> ValueEncoder::segment() const {
  if (!seg_) return std::nullopt;
  return seg_->id;
}

ValueDecoder::ValueDecoder(std::vector<int> fds, uint64_t shared_bytes, ShmRegionCache& regions,
                           std::function<void(SegmentId)> on_release)
    : fds_(std::move(fds)),
      shared_bytes_(shared_bytes),
      regions_(&regions),
      on_release_(std::move(on_release)) {}

ValueDecoder::~ValueDecoder() {
  for (int fd : fds_) close(fd);
}

std::shared_ptr<ShmLease> ValueDecoder::lease(SegmentId segment) {
  if (!lease_) {
    if (fds_.empty() || regions_ == nullptr) {
      throw Error("malformed message: a shared tensor but no segment was passed");
    }
    auto region = regions_->map(segment, fds_[0]);
    if (region->size() < shared_bytes_) {
      throw Error("malformed message: segment of " + std::to_string(region->size()) +
                  " bytes, message uses " + std::to_string(shared_bytes_));
    }
    lease_ = std::make_shared<ShmLease>(std::move(region), segment, on_release_);
  }
  return lease_;
}

List ValueDecoder::decode(capnp::List<wire::Value>::Reader in) {
  List out;
  out.reserve(in.size());
  for (auto v : in) out.push_back(decode(v));
  return out;
}

Value ValueDecoder::decode(wire::Value::Reader in) {
  switch (in.which()) {
    case wire::Value::NONE: return Value();
    case wire::Value::BOOL: return Value(in.getBool());
    case wire::Value::INT: return Value(static_cast<int64_t>(in.getInt()));
    case wire::Value::FLOAT: return Value(in.getFloat());
    case wire::Value::STRING: return Value(std::string(in.getString().cStr()));
    case wire::Value::LIST: return Value(decode(in.getList()));
    case wire::Value::DICT: {
      Dict d;
      d.reserve(in.getDict().size());
      for (auto e : in.getDict()) d.emplace_back(std::string(e.getKey().cStr()), decode(e.getValue()));
      return Value(std::move(d));
    }
    case wire::Value::TENSOR: {
      auto wt = in.getTensor();
      int dtype = wt.getDtype();
      if (dtype < 0 || dtype >= static_cast<int>(at::ScalarType::NumOptions)) {
        throw Error("malformed message: unknown tensor dtype code " + std::to_string(dtype));
      }
      // Plain element types only: a quantized or bit-packed dtype would make
      // a tensor of another backend that no operation of ours expects (found
      // by fuzz_data_proto: a sum over a QuantizedCPU tensor threw).
      const auto st = static_cast<at::ScalarType>(dtype);
      if (!c10::isIntegralType(st, /*includeBool=*/true) && !c10::isFloatingType(st) &&
          !c10::isComplexType(st)) {
        throw Error(std::string("malformed message: tensors of dtype ") + c10::toString(st) +
                    " are not carried");
      }
      std::vector<int64_t> shape;
      // Sizes from the wire: a product past int64 (or a byte count past
      // size_t) is refused, not wrapped into a small one.
      int64_t numel = 1;
      for (int64_t s : wt.getShape()) {
        if (s < 0) throw Error("malformed message: negative tensor dimension");
        shape.push_back(s);
        if (__builtin_mul_overflow(numel, s, &numel))
          throw Error("malformed message: a tensor of more than 2^63 elements");
      }
      auto options = at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype));
      size_t nbytes = 0;
      if (__builtin_mul_overflow(static_cast<size_t>(numel),
                                 c10::elementSize(static_cast<at::ScalarType>(dtype)), &nbytes))
        throw Error("malformed message: a tensor of more than 2^64 bytes");
      // Whether [offset, offset + nbytes) lies within `limit` bytes (no wrap).
      auto within = [nbytes](uint64_t offset, uint64_t limit) {
        return offset <= limit && nbytes <= limit - offset;
      };
      if (wt.isInline()) {
        auto data = wt.getInline();
        if (data.size() != nbytes) {
          throw Error("malformed message: tensor of " + std::to_string(nbytes) + " bytes carries " +
                      std::to_string(data.size()));
        }
        at::Tensor t = at::empty(shape, options);
        if (nbytes > 0) std::memcpy(t.data_ptr(), data.begin(), nbytes);
        return Value(std::move(t));
      }
      auto shared = wt.getShared();
      if (shared.getSegment() & kSharedTensorBit) {
        if (shared.getLength() != nbytes) throw Error("malformed message: shared tensor length");
        const int32_t idx = shared.getFdIndex();
        if (idx < 0 || static_cast<size_t>(idx) >= fds_.size())
          throw Error("malformed message: a shared tensor names fd " + std::to_string(idx) +
                      " of " + std::to_string(fds_.size()));
        auto mem = received_shared_memory(shared.getSegment(), fds_[static_cast<size_t>(idx)]);
        if (!within(shared.getOffset(), mem->bytes))
          throw Error("malformed message: shared tensor bytes out of range");
        return Value(detail::tensor_over(std::move(mem), shared.getOffset(), shape,
                                         static_cast<at::ScalarType>(dtype)));
      }
      if (shared.getLength() != nbytes || !within(shared.getOffset(), shared_bytes_)) {
        throw Error("malformed message: shared tensor bytes out of range");
      }
      std::shared_ptr<ShmLease> l = lease(shared.getSegment());
      return Value(at::from_blob(
          l->region().data() + shared.getOffset(), shape, [l](void*) mutable { l.reset(); },
          options));
    }
  }
  throw Error("malformed message: unknown value kind");
}

}  // namespace baton
