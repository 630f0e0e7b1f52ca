#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Same dtype, shape and bytes: the strictest equality (NaN-safe, any dtype).
bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;  // an empty tensor's data pointer may be null
  auto ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file made of a raw header and data, as a corrupt writer might produce.
void write_raw(const fs::path& file, const std::string& header, const std::string& data,
               uint64_t header_len_field) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_len_field), 8);
  out << header << data;
}
void write_raw(const fs::path& file, const std::string& header, const std::string& data) {
  write_raw(file, header, data, header.size());
}

using testing::expect_error;

TensorMap every_dtype() {
  at::manual_seed(7);
  TensorMap t;
  t["f64"] = at::randn({3, 5}, at::kDouble);
  t["f32"] = at::randn({4, 3}, at::kFloat);
  t["f16"] = at::randn({7}, at::kFloat).to(at::kHalf);
  t["bf16"] = at::randn({3, 3}, at::kFloat).to(at::kBFloat16);
  t["i64"] = at::randint(-1000, 1000, {5}, at::kLong);
  t["i32"] = at::randint(-1000, 1000, {2, 2}, at::kInt);
  t["i16"] = at::randint(-1000, 1000, {3}, at::kShort);
  t["i8"] = at::randint(-100, 100, {5}, at::kChar);
  t["u8"] = at::randint(0, 255, {9}, at::kByte);
  t["bool"] = at::randint(0, 2, {3, 1}, at::kLong).to(at::kBool);
  t["scalar"] = at::scalar_tensor(2.5, at::kFloat);
  t["empty"] = at::empty({0, 3}, at::kFloat);
  t["transposed"] = at::randn({3, 4}, at::kFloat).t();  // non-contiguous input
  return t;
}

TEST(Safetensors, RoundTripsEveryDtypeScalarsAndEmptyTensors) {
  TempDir dir;
  auto tensors = every_dtype();
  write_safetensors(dir / "x.safetensors", tensors, {{"format", "pt"}, {"note", "hi"}});
  std::map<std::string, std::string> metadata;
  auto back = read_safetensors(dir / "x.safetensors", &metadata);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(bit_equal(back.at(name), t)) << name;
  }
  EXPECT_EQ(back.at("scalar").dim(), 0);
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
  EXPECT_FALSE(fs::exists(dir / "x.safetensors.tmp"));
}

TEST(Safetensors, HeaderIsPaddedAndDataIsDenseAndAligned) {
  TempDir dir;
  write_safetensors(dir / "x.safetensors", every_dtype());
  std::string bytes = read_bytes(dir / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_FALSE(header.contains("__metadata__"));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, e] : header.items()) {
    int64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    int64_t elem = e["dtype"] == "F64" || e["dtype"] == "I64"                           ? 8
                   : e["dtype"] == "F32" || e["dtype"] == "I32"                         ? 4
                   : e["dtype"] == "F16" || e["dtype"] == "BF16" || e["dtype"] == "I16" ? 2
                                                                                        : 1;
    EXPECT_EQ(begin % elem, 0) << name;
    ranges.emplace_back(begin, end);
  }
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, at);  // no holes, no overlaps
    at = e;
  }
  EXPECT_EQ(static_cast<uint64_t>(at), bytes.size() - 8 - n);
}

TEST(Safetensors, InPlaceWritesToReadTensorsNeverReachTheFile) {
  TempDir dir;
  auto file = dir / "x.safetensors";
  write_safetensors(file, {{"w", at::ones({4, 4})}});
  {
    auto t = read_safetensors(file).at("w");  // the map is gone; the view keeps the mapping
    t.mul_(3);
    EXPECT_TRUE(at::equal(t, at::full({4, 4}, 3.0)));
  }
  EXPECT_TRUE(at::equal(read_safetensors(file).at("w"), at::ones({4, 4})));
}

TEST(Safetensors, ReadsMisalignedDataByCopying) {
  TempDir dir;
  // A u8 tensor first pushes the f32 tensor to an odd offset.
  nlohmann::json h = {{"a", {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}},
                      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {1, 9}}}}};
  float vals[2] = {1.5f, -2.0f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(vals), 8);
  write_raw(dir / "m.safetensors", h.dump(), data);
  auto t = read_safetensors(dir / "m.safetensors");
  EXPECT_EQ(t.at("a").item<uint8_t>(), 7);
  EXPECT_TRUE(at::equal(t.at("b"), at::tensor({1.5f, -2.0f})));
}

TEST(Safetensors, MissingFileNamesIt) {
  TempDir dir;
  expect_error([&] { read_safetensors(dir / "nope.safetensors"); }, {"nope.safetensors"});
}

TEST(Safetensors, FileShorterThanEightBytes) {
  TempDir dir;
  { std::ofstream(dir / "short.safetensors") << "abc"; }
  expect_error([&] { read_safetensors(dir / "short.safetensors"); },
               {"short.safetensors", "shorter than"});
}

TEST(Safetensors, HeaderLengthBeyondTheFile) {
  TempDir dir;
  write_raw(dir / "h.safetensors", "{}", "", 1000);
  expect_error([&] { read_safetensors(dir / "h.safetensors"); }, {"h.safetensors", "1000"});
}

TEST(Safetensors, MalformedJsonHeader) {
  TempDir dir;
  write_raw(dir / "j.safetensors", "{\"a\": [", "");
  expect_error([&] { read_safetensors(dir / "j.safetensors"); }, {"j.safetensors", "JSON"});
  write_raw(dir / "k.safetensors", "[1, 2]", "");
  expect_error([&] { read_safetensors(dir / "k.safetensors"); }, {"k.safetensors"});
  write_raw(dir / "l.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd");
  expect_error([&] { read_safetensors(dir / "l.safetensors"); }, {"l.safetensors", "\"w\""});
}

TEST(Safetensors, UnknownDtypeNamesTheTensor) {
  TempDir dir;
  write_raw(dir / "d.safetensors",
            R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "ab");
  expect_error([&] { read_safetensors(dir / "d.safetensors"); },
               {"d.safetensors", "\"w\"", "F8_E4M3"});
}

TEST(Safetensors, OffsetsNotMatchingShapeTimesDtype) {
  TempDir dir;
  write_raw(dir / "s.safetensors",
            R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678");
  expect_error([&] { read_safetensors(dir / "s.safetensors"); },
               {"s.safetensors", "\"w\"", "needs 12"});
  write_raw(dir / "r.safetensors",
            R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", "12345678");
  expect_error([&] { read_safetensors(dir / "r.safetensors"); }, {"r.safetensors", "\"w\""});
}

TEST(Safetensors, OffsetsOutsideTheDataArea) {
  TempDir dir;
  write_raw(dir / "o.safetensors",
            R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [100, 108]}})", "12345678");
  expect_error([&] { read_safetensors(dir / "o.safetensors"); },
               {"o.safetensors", "\"w\"", "outside the data area"});
}

TEST(Safetensors, TruncatedDataNamesTheTensor) {
  TempDir dir;
  auto file = dir / "t.safetensors";
  write_safetensors(file, {{"a", at::ones({4})}, {"z", at::ones({16})}});
  fs::resize_file(file, fs::file_size(file) - 10);
  expect_error([&] { read_safetensors(file); }, {"t.safetensors", "truncated"});
}

TEST(Safetensors, WriteRejectsUndefinedTensorsNamingThem) {
  TempDir dir;
  expect_error(
      [&] {
        write_safetensors(dir / "u.safetensors", {{"w", at::Tensor()}});
      },
      {"u.safetensors", "\"w\""});
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TensorMap small_model() {
  at::manual_seed(3);
  TensorMap t;
  for (int i = 0; i < 6; ++i) t["layer." + std::to_string(i) + ".w"] = at::randn({8, 8});
  t["embed"] = at::randn({16, 8}).to(at::kBFloat16);
  return t;
}

TEST(HfWeights, ShardsWithIndexWhenOverTheLimitAndRoundTrips) {
  TempDir dir;
  auto tensors = small_model();  // 6 × 256 B + 256 B
  write_hf_weights(dir.path(), tensors, /*max_shard_bytes=*/600);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 7 * 256);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  EXPECT_EQ(index["weight_map"]["embed"], "model-00001-of-00004.safetensors");
  for (int i = 1; i <= 4; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-00004.safetensors", i);
    EXPECT_TRUE(fs::exists(dir / name)) << name;
  }
  std::map<std::string, std::string> metadata;
  read_safetensors(dir / "model-00001-of-00004.safetensors", &metadata);
  EXPECT_EQ(metadata.at("format"), "pt");  // HF's loader rejects other metadata

  auto back = read_hf_weights(dir.path());
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(bit_equal(back.at(name), t)) << name;

  // Saving again as one file removes the stale shards and index.
  write_hf_weights(dir.path(), tensors);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00004.safetensors"));
  back = read_hf_weights(dir.path());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(bit_equal(back.at(name), t)) << name;
}

TEST(HfWeights, AcceptsADirectoryWithExactlyOneSafetensorsFile) {
  TempDir dir;
  write_safetensors(dir / "weights.safetensors", {{"w", at::ones({2})}});
  EXPECT_TRUE(at::equal(read_hf_weights(dir.path()).at("w"), at::ones({2})));
  EXPECT_TRUE(at::equal(read_hf_weights(dir / "weights.safetensors").at("w"), at::ones({2})));
  write_safetensors(dir / "other.safetensors", {{"w", at::ones({2})}});
  expect_error([&] { read_hf_weights(dir.path()); }, {dir.path().string(), "2 *.safetensors"});
}

TEST(HfWeights, MissingDirectoryOrNoWeights) {
  TempDir dir;
  expect_error([&] { read_hf_weights(dir / "absent"); }, {"absent"});
  expect_error([&] { read_hf_weights(dir.path()); }, {dir.path().string(), "no weights"});
}

TEST(HfWeights, IndexNamingAMissingShard) {
  TempDir dir;
  write_hf_weights(dir.path(), small_model(), 600);
  fs::remove(dir / "model-00003-of-00004.safetensors");
  expect_error([&] { read_hf_weights(dir.path()); },
               {"model.safetensors.index.json", "model-00003-of-00004.safetensors", "missing"});
}

TEST(HfWeights, DuplicateTensorAcrossShards) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"w", at::ones({2})}, {"x", at::ones({1})}});
  write_safetensors(dir / "b.safetensors", {{"w", at::zeros({2})}});
  nlohmann::json index = {{"metadata", {{"total_size", 20}}},
                          {"weight_map", {{"w", "b.safetensors"}, {"x", "a.safetensors"}}}};
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  expect_error([&] { read_hf_weights(dir.path()); }, {"\"w\"", "two shards"});
}

TEST(HfWeights, IndexListingATensorItsShardLacks) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"x", at::ones({1})}});
  nlohmann::json index = {{"weight_map", {{"w", "a.safetensors"}, {"x", "a.safetensors"}}}};
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  expect_error([&] { read_hf_weights(dir.path()); }, {"\"w\"", "a.safetensors"});
}

TEST(HfWeights, ReadsTheShardedQwen2Fixture) {
  const fs::path dir = fs::path(BATON_FIXTURES_DIR) / "tiny-qwen2";
  if (!fs::exists(dir / "model.safetensors.index.json")) GTEST_SKIP() << "no fixture";
  auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  auto w = read_hf_weights(dir);
  EXPECT_EQ(w.size(), index["weight_map"].size());
  int64_t total = 0;
  for (const auto& [name, t] : w) total += t.numel() * t.element_size();
  EXPECT_EQ(total, index["metadata"]["total_size"].get<int64_t>());
  EXPECT_EQ(w.at("model.embed_tokens.weight").sizes(), (at::IntArrayRef{128, 64}));
}

// remove_tree (what baton calls instead of std::filesystem::remove_all)
// removes a nested tree, removes a symbolic link without following it, and
// takes a missing path as already removed.
TEST(RemoveTree, RemovesNestedTreesAndLinksButNotWhatLinksPointTo) {
  TempDir tmp;
  const fs::path keep = tmp / "keep";
  fs::create_directories(keep);
  write_file_atomically(keep / "kept.txt", "still here");
  const fs::path tree = tmp / "tree";
  fs::create_directories(tree / "a" / "b");
  write_file_atomically(tree / "top.txt", "1");
  write_file_atomically(tree / "a" / "b" / "deep.txt", "2");
  fs::create_directory_symlink(keep, tree / "a" / "link_to_keep");
  EXPECT_EQ(remove_tree(tree), 6u);  // 2 files, 1 link, 3 directories
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(keep / "kept.txt"));
  EXPECT_EQ(remove_tree(tree), 0u);
  EXPECT_EQ(remove_tree(keep / "kept.txt"), 1u);
}

}  // namespace
}  // namespace baton::engine
