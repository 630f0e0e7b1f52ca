#include "runtime/cluster/relay.h"

#include <capnp/serialize.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "base/errors.h"
#include "runtime/internal/channel.h"

namespace baton::relay {

namespace {

constexpr auto kForever = std::chrono::steady_clock::time_point::max();
constexpr uint32_t kMagic = 0x31465442;  // "BTF1", little-endian
constexpr size_t kKeptSegments = 16;     // a receiving relay's reused memfds
constexpr uint64_t kGranule = uint64_t{1} << 20;
constexpr uint32_t kMaxFds = 253;        // SCM_MAX_FD: what one message may pass
constexpr uint64_t kMaxWords = uint64_t{1} << 27;     // 1 GiB of message
constexpr uint64_t kMaxPayload = uint64_t{1} << 40;   // 1 TiB behind one fd

struct FrameHeader {
  uint32_t magic;
  uint32_t fd_count;
  uint64_t words;
};
static_assert(sizeof(FrameHeader) == 16);

// A read-only mapping of the first `bytes` of an fd (nothing for 0 bytes).
struct Mapping {
  Mapping(int fd, size_t n) : bytes(n) {
    if (n == 0) return;
    void* p = mmap(nullptr, n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) throw Error(std::string("cannot map a payload: ") + std::strerror(errno));
    data = p;
  }
  ~Mapping() {
    if (data != nullptr) munmap(data, bytes);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* data = nullptr;
  size_t bytes;
};

size_t fd_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) throw Error(std::string("cannot stat a payload: ") + std::strerror(errno));
  return static_cast<size_t>(st.st_size);
}

// A memfd of `bytes` (mapped read-write at `*data` when `map` is set).
int new_memfd(uint64_t bytes, std::byte** data) {
  int fd = memfd_create("baton-relay", MFD_CLOEXEC);
  if (fd < 0) throw Error(std::string("memfd_create failed: ") + std::strerror(errno));
  if (bytes == 0) return fd;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw Error("cannot size a payload of " + std::to_string(bytes) + " bytes: " + why);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw Error("cannot map a payload of " + std::to_string(bytes) + " bytes: " + why);
  }
  *data = static_cast<std::byte*>(p);
  return fd;
}

// The memfds a receiving relay keeps, one per sender segment (its id): the
// sender reuses a segment only once the receiver released it, so the next
// message in it can be written over the last, into pages that are already
// there (a fresh memfd costs the kernel a zeroed page per 4 KiB). A message
// that needs more than a kept memfd has gets a new one (a new inode: the
// receiver maps it anew, shm_pool.h). Least recently used beyond
// kKeptSegments are dropped.
class KeptSegments {
 public:
  ~KeptSegments() {
    for (auto& [id, k] : kept_) drop(k);
  }
  // The memfd to receive `bytes` of segment `id` into, and its mapping.
  int get(uint64_t id, uint64_t bytes, std::byte** data) {
    ++clock_;
    auto it = kept_.find(id);
    if (it != kept_.end() && it->second.capacity >= bytes) {
      it->second.last_used = clock_;
      *data = it->second.data;
      return it->second.fd;
    }
    if (it != kept_.end()) {
      drop(it->second);
      kept_.erase(it);
    }
    if (kept_.size() >= kKeptSegments) {
      auto victim = kept_.begin();
      for (auto k = kept_.begin(); k != kept_.end(); ++k)
        if (k->second.last_used < victim->second.last_used) victim = k;
      drop(victim->second);
      kept_.erase(victim);
    }
    const uint64_t capacity = (bytes + kGranule - 1) / kGranule * kGranule;
    Kept k;
    k.fd = new_memfd(capacity, &k.data);
    k.capacity = capacity;
    k.last_used = clock_;
    kept_[id] = k;
    *data = k.data;
    return k.fd;
  }

 private:
  struct Kept {
    int fd = -1;
    std::byte* data = nullptr;
    uint64_t capacity = 0;
    uint64_t last_used = 0;
  };
  static void drop(Kept& k) {
    if (k.data != nullptr) munmap(k.data, k.capacity);
    if (k.fd >= 0) close(k.fd);
  }
  std::map<uint64_t, Kept> kept_;
  uint64_t clock_ = 0;
};

}  // namespace

void write_message(auth::Conn& conn, capnp::MessageBuilder& builder,
                   std::chrono::steady_clock::time_point deadline) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  conn.write_all(words.begin(), words.size() * sizeof(capnp::word), deadline);
}

bool read_message(auth::Conn& conn, kj::Array<capnp::word>& out, const std::string& where,
                  size_t max_bytes) {
  // The stream framing: u32 segment count - 1, u32 sizes, padding to a word.
  uint32_t first[2];
  if (!conn.read_exact(first, sizeof(first), kForever)) return false;
  const uint64_t segments = uint64_t{first[0]} + 1;
  if (segments > 512) throw Error(where + ": a message of " + std::to_string(segments) + " segments");
  const uint64_t table_words = (segments + 2) / 2;  // the table, padded, in words
  std::vector<uint64_t> table(table_words);  // capnp::word cannot be moved
  std::memcpy(table.data(), first, sizeof(first));
  if (table_words > 1 &&
      !conn.read_exact(table.data() + 1, (table_words - 1) * sizeof(capnp::word), kForever))
    throw Error(where + ": the connection closed inside a message");
  const auto* sizes = reinterpret_cast<const uint32_t*>(table.data()) + 1;
  uint64_t total = table_words;
  for (uint64_t i = 0; i < segments; ++i) total += sizes[i];
  if (total * sizeof(capnp::word) > max_bytes)
    throw Error(where + ": a message of " + std::to_string(total * sizeof(capnp::word)) +
                " bytes, past the limit of " + std::to_string(max_bytes));
  out = kj::heapArray<capnp::word>(total);
  std::memcpy(static_cast<void*>(out.begin()), table.data(), table_words * sizeof(capnp::word));
  if (!conn.read_exact(out.begin() + table_words, (total - table_words) * sizeof(capnp::word),
                       kForever))
    throw Error(where + ": the connection closed inside a message");
  return true;
}

std::string pump_to_tcp(Channel& from, auth::Conn& to) {
  try {
    for (;;) {
      Channel::ReadStatus status = from.read_blocking();
      from.drain_raw([&](kj::ArrayPtr<const capnp::word> words, wire::Envelope::Reader env,
                         std::vector<int> received) {
        const OwnedFds owned(std::move(received));
        const std::vector<int>& fds = owned.fds();
        const uint64_t shared = env.getSharedBytes();
        // Per payload: its size, and the sender's segment id it may be kept
        // under (the message's segment; 0 for a shared tensor's memory).
        std::vector<uint64_t> table(2 * fds.size());
        for (size_t i = 0; i < fds.size(); ++i) {
          const size_t whole = fd_size(fds[i]);
          const bool segment = i == 0 && shared > 0;
          table[2 * i] = segment ? shared : whole;
          table[2 * i + 1] = segment ? env.getSegment() : 0;
          if (table[2 * i] > whole)
            throw Error("a message uses " + std::to_string(shared) + " bytes of a segment of " +
                        std::to_string(whole));
        }
        FrameHeader h{kMagic, static_cast<uint32_t>(fds.size()), words.size()};
        to.write_all(&h, sizeof(h), kForever);
        if (!table.empty()) to.write_all(table.data(), table.size() * sizeof(uint64_t), kForever);
        to.write_all(words.begin(), words.size() * sizeof(capnp::word), kForever);
        for (size_t i = 0; i < fds.size(); ++i) {
          Mapping m(fds[i], table[2 * i]);
          if (m.bytes > 0) to.write_all(m.data, m.bytes, kForever);
        }
      });
      if (status == Channel::ReadStatus::kClosed) return "";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string pump_to_unix(auth::Conn& from, Channel& to, const std::string& where) {
  KeptSegments kept;
  try {
    for (;;) {
      FrameHeader h{};
      if (!from.read_exact(&h, sizeof(h), kForever)) return "";
      if (h.magic != kMagic) return where + ": not a relay frame (bad magic)";
      if (h.fd_count > kMaxFds)
        return where + ": a frame with " + std::to_string(h.fd_count) + " payloads (at most " +
               std::to_string(kMaxFds) + ")";
      if (h.words == 0 || h.words > kMaxWords)
        return where + ": a frame of " + std::to_string(h.words) + " words";
      std::vector<uint64_t> table(2 * size_t{h.fd_count});
      if (!table.empty() &&
          !from.read_exact(table.data(), table.size() * sizeof(uint64_t), kForever))
        return where + ": the connection closed inside a frame";
      for (size_t i = 0; i < h.fd_count; ++i)
        if (table[2 * i] > kMaxPayload)
          return where + ": a payload of " + std::to_string(table[2 * i]) + " bytes";
      std::vector<uint64_t> words(h.words);
      if (!from.read_exact(words.data(), words.size() * sizeof(uint64_t), kForever))
        return where + ": the connection closed inside a frame";
      std::vector<int> fds;  // what goes with the message
      OwnedFds fresh;        // ... of which the new ones, closed once it has gone
      for (size_t i = 0; i < h.fd_count; ++i) {
        const uint64_t bytes = table[2 * i], key = table[2 * i + 1];
        std::byte* data = nullptr;
        int fd;
        if (key != 0) {
          fd = kept.get(key, bytes, &data);
        } else {
          fd = new_memfd(bytes, &data);
          fresh.add(fd);
        }
        bool whole = true;
        if (bytes > 0) {
          whole = from.read_exact(data, bytes, kForever);
          if (key == 0) munmap(data, bytes);
        }
        if (!whole) return where + ": the connection closed inside a frame";
        fds.push_back(fd);
      }
      if (!to.send(kj::arrayPtr(reinterpret_cast<const capnp::word*>(words.data()), words.size()),
                   fds))
        return "";
    }
  } catch (const std::exception& e) {
    return where + ": " + e.what();
  }
}

}  // namespace baton::relay
