#include "base/checksum_manifest.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "base/atomic_file.h"

namespace baton {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kHeader = "baton-checksums-v1 crc32c";
constexpr std::string_view kEnd = "end ";

// The next space-separated word of `line` from `pos`; empty at the end.
std::string_view next_word(std::string_view line, size_t& pos) {
  while (pos < line.size() && line[pos] == ' ') ++pos;
  const size_t begin = pos;
  while (pos < line.size() && line[pos] != ' ') ++pos;
  return line.substr(begin, pos - begin);
}

bool parse_decimal(std::string_view word, uint64_t& out) {
  if (word.empty()) return false;
  auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), out, 10);
  return ec == std::errc() && end == word.data() + word.size();
}

// Exactly crc32c_hex's form: eight lower-case hex digits, so that no flipped
// byte (an upper-case letter) reads as the same value.
bool parse_hex32(std::string_view word, uint32_t& out) {
  if (word.size() != 8) return false;
  out = 0;
  for (char c : word) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return false;
    out = out << 4 | static_cast<uint32_t>(digit);
  }
  return true;
}

}  // namespace

void ChecksumManifest::add(const std::string& name, FileChecksum sum) {
  bool ok = !name.empty() && name != kChecksumManifestFile;
  for (unsigned char c : name) ok = ok && c > ' ' && c != 0x7f;
  if (!ok)
    throw InvalidArgument(detail::cat("ChecksumManifest: \"", name,
                                      "\" cannot be listed (empty, the manifest itself, or "
                                      "holding whitespace or a control character)"));
  if (sum.blocks.size() != checksum_blocks(sum.size))
    throw InvalidArgument(detail::cat("ChecksumManifest: \"", name, "\": ", sum.blocks.size(),
                                      " block checksums for ", sum.size, " bytes"));
  files_[name] = std::move(sum);
}

void ChecksumManifest::merge(const ChecksumManifest& other) {
  for (const auto& [name, sum] : other.files_) files_[name] = sum;
}

const FileChecksum* ChecksumManifest::find(const std::string& name) const {
  auto it = files_.find(name);
  return it == files_.end() ? nullptr : &it->second;
}

std::string ChecksumManifest::to_text() const {
  std::string text = detail::cat(kHeader, " ", kChecksumBlockBytes, "\n");
  for (const auto& [name, sum] : files_) {
    text += detail::cat(name, " ", sum.size);
    for (uint32_t b : sum.blocks) text += " " + crc32c_hex(b);
    text += "\n";
  }
  return text + std::string(kEnd) + crc32c_hex(crc32c(text.data(), text.size())) + "\n";
}

ChecksumManifest ChecksumManifest::parse(std::string_view text, const fs::path& file) {
  auto malformed = [&](const std::string& why) {
    return FileError(detail::cat(file.string(), ": not a baton checksum manifest: ", why));
  };
  // The last line holds the CRC of everything before it.
  if (text.size() < 2 || text.back() != '\n') throw malformed("it does not end with a newline");
  const size_t last = text.rfind('\n', text.size() - 2);
  const size_t body_size = last == std::string_view::npos ? 0 : last + 1;
  const std::string_view end_line = text.substr(body_size, text.size() - 1 - body_size);
  uint32_t want = 0;
  if (end_line.substr(0, kEnd.size()) != kEnd || !parse_hex32(end_line.substr(kEnd.size()), want))
    throw ChecksumError(detail::cat(file.string(), ": bytes [", body_size, ", ", text.size(),
                                    ") (its last line, \"end <CRC-32C>\") are corrupt or cut off"));
  const uint32_t got = crc32c(text.data(), body_size);
  if (got != want)
    throw ChecksumError(detail::cat(
        file.string(), ": bytes [0, ", body_size, ") do not match the CRC-32C on its last line (",
        crc32c_hex(got), ", expected ", crc32c_hex(want), "); the manifest is corrupt"));

  ChecksumManifest m;
  size_t pos = 0;
  bool header = true;
  while (pos < body_size) {
    const size_t eol = text.find('\n', pos);
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (header) {
      uint64_t block = 0;
      if (line.size() <= kHeader.size() + 1 || line.substr(0, kHeader.size()) != kHeader ||
          line[kHeader.size()] != ' ' || !parse_decimal(line.substr(kHeader.size() + 1), block))
        throw malformed(detail::cat("its first line is not \"", kHeader, " <block bytes>\""));
      if (block != kChecksumBlockBytes)
        throw malformed(detail::cat("blocks of ", block, " bytes (this baton reads blocks of ",
                                    kChecksumBlockBytes, ")"));
      header = false;
      continue;
    }
    size_t at = 0;
    const std::string name(next_word(line, at));
    FileChecksum sum;
    if (!parse_decimal(next_word(line, at), sum.size))
      throw malformed(detail::cat("the entry of \"", name, "\" has no size"));
    for (std::string_view w = next_word(line, at); !w.empty(); w = next_word(line, at)) {
      uint32_t b = 0;
      if (!parse_hex32(w, b))
        throw malformed(
            detail::cat("the entry of \"", name, "\" holds \"", w, "\", not a CRC-32C"));
      sum.blocks.push_back(b);
    }
    try {
      m.add(name, std::move(sum));
    } catch (const InvalidArgument& e) {
      throw malformed(e.what());
    }
  }
  if (header) throw malformed("it is empty");
  return m;
}

void ChecksumManifest::write(const fs::path& dir, const std::string& name) const {
  write_file_atomically(dir / name, to_text());
}

std::optional<ChecksumManifest> ChecksumManifest::read(const fs::path& dir,
                                                       const std::string& name) {
  const fs::path file = dir / name;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    if (!fs::exists(file)) return std::nullopt;
    throw FileError(detail::cat(file.string(), ": cannot read: ", std::strerror(errno)));
  }
  const std::string text(std::istreambuf_iterator<char>(in), {});
  return parse(text, file);
}

void ChecksumManifest::verify(const fs::path& file, const std::string& name, const void* data,
                              size_t size, const fs::path& manifest_file) const {
  const FileChecksum* want = find(name);
  if (want == nullptr)
    throw InvalidArgument(
        detail::cat(manifest_file.string(), " does not list \"", name, "\" (", file.string(), ")"));
  const std::string edited =
      " (or it was changed after it was written: BATON_VERIFY_CHECKSUMS=0 reads it unverified)";
  if (size != want->size) {
    const uint64_t lo = std::min<uint64_t>(size, want->size);
    const uint64_t hi = std::max<uint64_t>(size, want->size);
    throw ChecksumError(detail::cat(
        file.string(), ": ", size, " bytes, but ", manifest_file.string(), " lists ", want->size,
        ": bytes [", lo, ", ", hi, ") are ", size < want->size ? "missing (truncated)" : "extra",
        "; the file is corrupt", edited));
  }
  const std::optional<BlockMismatch> bad = find_mismatch(*want, data, size);
  if (!bad) return;
  const uint64_t begin = bad->block * kChecksumBlockBytes;
  const uint64_t end = std::min<uint64_t>(begin + kChecksumBlockBytes, size);
  throw ChecksumError(
      detail::cat(file.string(), ": bytes [", begin, ", ", end, ") do not match their CRC-32C in ",
                  manifest_file.string(), " (", crc32c_hex(bad->found), ", expected ",
                  crc32c_hex(want->blocks[bad->block]), ")",
                  bad->count > 1 ? detail::cat(", nor do ", bad->count - 1, " later blocks of ",
                                               kChecksumBlockBytes, " bytes")
                                 : std::string(),
                  "; the file is corrupt", edited));
}

bool checksum_verification_enabled() {
  const char* v = std::getenv("BATON_VERIFY_CHECKSUMS");
  if (v == nullptr) return true;
  for (const char* off : {"0", "false", "off", "no"})
    if (::strcasecmp(v, off) == 0) return false;
  return true;
}

void verify_file_bytes(const fs::path& file, const void* data, size_t size) {
  if (!checksum_verification_enabled() || file.filename() == kChecksumManifestFile) return;
  const fs::path dir = file.parent_path();
  const std::optional<ChecksumManifest> manifest = ChecksumManifest::read(dir);
  if (!manifest) return;
  const std::string name = file.filename().string();
  if (manifest->find(name) == nullptr) return;
  manifest->verify(file, name, data, size, dir / kChecksumManifestFile);
}

void remove_checksum_manifest(const fs::path& dir) {
  const fs::path file = dir / kChecksumManifestFile;
  std::error_code ec;
  const bool removed = fs::remove(file, ec);
  if (ec) throw FileError(detail::cat(file.string(), ": cannot remove: ", ec.message()));
  if (removed) fsync_directory(dir);
}

}  // namespace baton
