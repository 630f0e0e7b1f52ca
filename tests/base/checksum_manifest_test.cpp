// The checksum manifest of a directory: written and read back, a flipped byte
// in a listed file or in the manifest itself refused naming the file and the
// byte range, the switch that turns verification off.
#include "base/checksum_manifest.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "tests/engine/temp_dir.h"
#include "tests/file_faults.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using engine::testing::TempDir;
using testing::block_range;
using testing::flip_byte;

std::string random_text(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the ChecksumError `f` throws ("" and a test failure if none).
template <typename F>
std::string checksum_error(F&& f) {
  try {
    f();
  } catch (const ChecksumError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ChecksumError";
  return "";
}

// A directory of two files and their manifest, as a writer leaves it.
struct Written {
  TempDir dir;
  std::string big = random_text(3 * kChecksumBlockBytes + 100, 1);
  Written() {
    ChecksumManifest m;
    m.add("big.bin", write_file_atomically(dir / "big.bin", big));
    m.add("small.json", write_file_atomically(dir / "small.json", R"({"a": 1})"));
    m.write(dir.path());
  }
  void verify(const std::string& name) const {
    const std::string bytes = read_all(dir / name);
    verify_file_bytes(dir / name, bytes.data(), bytes.size());
  }
};

TEST(ChecksumManifest, RoundTripsThroughItsText) {
  ChecksumManifest m;
  m.add("a.json", checksum_bytes("{}", 2));
  m.add("sub/b.bin", FileChecksum{kChecksumBlockBytes + 1, {1, 0xffffffffu}});
  m.add("empty", FileChecksum{});
  const std::string text = m.to_text();
  EXPECT_EQ(text.rfind("baton-checksums-v1 crc32c 1048576\n", 0), 0u) << text;
  const ChecksumManifest back = ChecksumManifest::parse(text, "x");
  EXPECT_EQ(back.files(), m.files());
  EXPECT_EQ(back.to_text(), text);
  EXPECT_THROW(m.add("has space", {}), InvalidArgument);
  EXPECT_THROW(m.add(kChecksumManifestFile, {}), InvalidArgument);
  EXPECT_THROW(m.add("short", FileChecksum{5, {}}), InvalidArgument);
}

TEST(ChecksumManifest, WrittenFilesVerifyAndAFlippedByteIsRefusedNamingItsRange) {
  Written w;
  w.verify("big.bin");
  w.verify("small.json");
  const fs::path big = w.dir / "big.bin";
  const std::string manifest = (w.dir / kChecksumManifestFile).string();
  // Offsets in the first, a middle and the last (short) block.
  for (uint64_t offset :
       {uint64_t{0}, 2 * kChecksumBlockBytes + 17, 3 * kChecksumBlockBytes + 99}) {
    flip_byte(big, offset);
    const std::string err = checksum_error([&] { w.verify("big.bin"); });
    EXPECT_NE(err.find(big.string() + ": " +
                       block_range(offset, w.big.size(), kChecksumBlockBytes) + " do not match"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(manifest), std::string::npos) << err;
    flip_byte(big, offset);  // back as it was
    w.verify("big.bin");
  }
  flip_byte(w.dir / "small.json", 3);
  EXPECT_NE(checksum_error([&] { w.verify("small.json"); }).find("small.json: bytes [0, 8)"),
            std::string::npos);
  // Truncated: the missing bytes are the range.
  fs::resize_file(big, 1000);
  const std::string err = checksum_error([&] { w.verify("big.bin"); });
  EXPECT_NE(err.find("bytes [1000, " + std::to_string(w.big.size()) + ") are missing"),
            std::string::npos)
      << err;
}

TEST(ChecksumManifest, AFlippedByteInTheManifestItselfIsRefused) {
  Written w;
  const fs::path manifest = w.dir / kChecksumManifestFile;
  const std::string text = read_all(manifest);
  for (uint64_t offset : {uint64_t{0}, uint64_t{40}, uint64_t{text.size() - 3}}) {
    flip_byte(manifest, offset);
    const std::string err = checksum_error([&] { w.verify("small.json"); });
    EXPECT_NE(err.find(manifest.string() + ": bytes ["), std::string::npos) << err;
    flip_byte(manifest, offset);
  }
  w.verify("small.json");
}

TEST(ChecksumManifest, UnlistedFilesAndDirectoriesWithoutAManifestAreReadUnverified) {
  Written w;
  write_file_atomically(w.dir / "extra.txt", "added later");
  w.verify("extra.txt");
  remove_checksum_manifest(w.dir.path());
  EXPECT_FALSE(ChecksumManifest::read(w.dir.path()).has_value());
  flip_byte(w.dir / "small.json", 0);
  w.verify("small.json");  // nothing to check against
}

TEST(ChecksumManifest, VerificationIsOnByDefaultAndTheEnvironmentTurnsItOff) {
  Written w;
  flip_byte(w.dir / "small.json", 0);
  ASSERT_EQ(::unsetenv("BATON_VERIFY_CHECKSUMS"), 0);
  EXPECT_TRUE(checksum_verification_enabled());
  EXPECT_THROW(w.verify("small.json"), ChecksumError);
  ::setenv("BATON_VERIFY_CHECKSUMS", "0", 1);
  EXPECT_FALSE(checksum_verification_enabled());
  w.verify("small.json");
  ::setenv("BATON_VERIFY_CHECKSUMS", "1", 1);
  EXPECT_THROW(w.verify("small.json"), ChecksumError);
  ::unsetenv("BATON_VERIFY_CHECKSUMS");
}

TEST(ChecksumManifest, MalformedManifestsAreFileErrorsNamingIt) {
  const fs::path where = "dir/baton-checksums.txt";
  auto text_with_crc = [](std::string body) {
    return body + "end " + [&] {
      char buf[9];
      std::snprintf(buf, sizeof buf, "%08x", crc32c(body.data(), body.size()));
      return std::string(buf);
    }() + "\n";
  };
  for (const std::string& text :
       {std::string(""), std::string("\n"), std::string("end 0\n"),
        text_with_crc("something else\n"), text_with_crc("baton-checksums-v1 crc32c\n"),
        text_with_crc("baton-checksums-v1 crc32c 4096\n"),
        text_with_crc("baton-checksums-v1 crc32c 1048576\nfile\n"),
        text_with_crc("baton-checksums-v1 crc32c 1048576\nfile 10 zz\n"),
        text_with_crc("baton-checksums-v1 crc32c 1048576\nfile 2000000 00000000\n")}) {
    try {
      ChecksumManifest::parse(text, where);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const FileError& e) {
      EXPECT_NE(std::string(e.what()).find(where.string()), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace baton
