#include "dispatch/data_proto.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "base/checksum.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "runtime/internal/wire.capnp.h"
#include "tests/file_faults.h"

namespace baton {
namespace {

// 6 rows: ids [6, 3] (row r = r*3 .. r*3+2), mask [6] bool, column "prompt" = "p<r>".
DataProto six_rows() {
  List prompts;
  for (int r = 0; r < 6; ++r) prompts.push_back("p" + std::to_string(r));
  return DataProto({{"ids", at::arange(18, at::kLong).reshape({6, 3})},
                    {"mask", at::arange(6, at::kLong).remainder(2).to(at::kBool)}},
                   {{"prompt", prompts}}, Dict{{"temperature", 0.7}});
}

std::vector<int64_t> first_ids(const DataProto& d) {
  at::Tensor col = d.tensor("ids").select(1, 0).contiguous();
  return std::vector<int64_t>(col.data_ptr<int64_t>(), col.data_ptr<int64_t>() + col.numel());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DataProto, ConstructionChecksRowCountsNamingTheKeys) {
  DataProto d = six_rows();
  EXPECT_EQ(d.size(), 6);
  EXPECT_EQ(d.tensor_keys(), (std::vector<std::string>{"ids", "mask"}));
  std::string err = error_of([] {
    DataProto({{"a", at::ones({4, 2})}, {"b", at::ones({3})}});
  });
  EXPECT_NE(err.find("'b' has 3 rows but tensor 'a' has 4"), std::string::npos) << err;
  err = error_of([] { DataProto({{"a", at::ones({2})}}, {{"c", List{1, 2, 3}}}); });
  EXPECT_NE(err.find("'c' has 3 rows but tensor 'a' has 2"), std::string::npos) << err;
  err = error_of([] { DataProto({{"s", at::ones({})}}); });
  EXPECT_NE(err.find("needs a batch dimension"), std::string::npos) << err;
  err = error_of([&] { d.tensor("nope"); });
  EXPECT_NE(err.find("no tensor 'nope'; tensors: ids, mask"), std::string::npos) << err;
  EXPECT_EQ(DataProto({}, {{"only", List{1, 2}}}).size(), 2);
  EXPECT_EQ(DataProto().size(), 0);
}

// The one check every worker method starts with names the method, every
// missing tensor and the tensors there are.
TEST(DataProto, RequireTensorsNamesTheCallerAndEveryMissingKey) {
  const DataProto d = six_rows();
  d.require_tensors({"ids", "mask"}, "m");  // all there: no throw
  std::string err = error_of([&] { d.require_tensors({"ids", "responses", "values"}, "update_critic"); });
  EXPECT_NE(err.find("update_critic: the batch has no tensors 'responses', 'values' (it has: ids, mask)"),
            std::string::npos)
      << err;
  err = error_of([] { DataProto().require_tensors({"input_ids"}, "generate_sequences"); });
  EXPECT_NE(err.find("generate_sequences: the batch has no tensor 'input_ids' (it has: none)"),
            std::string::npos)
      << err;
}

TEST(DataProto, SelectKeysRowsSliceAndPop) {
  DataProto d = six_rows();
  DataProto s = d.select({"ids"}, {"prompt"});
  EXPECT_FALSE(s.has_tensor("mask"));
  EXPECT_EQ(s.meta_value("temperature")->as_float(), 0.7);  // copied: bit-exact
  EXPECT_THROW(d.select({"missing"}), Error);

  DataProto r = d.select_rows(std::vector<int64_t>{4, 0, 4});
  EXPECT_EQ(first_ids(r), (std::vector<int64_t>{12, 0, 12}));
  EXPECT_EQ(r.column("prompt")[0].as_string(), "p4");
  DataProto m = d.select_rows(d.tensor("mask"));  // rows 1, 3, 5
  EXPECT_EQ(first_ids(m), (std::vector<int64_t>{3, 9, 15}));
  EXPECT_NE(error_of([&] { d.select_rows(std::vector<int64_t>{6}); }).find("row 6 out of range for 6"),
            std::string::npos);
  EXPECT_THROW(d.select_rows(at::ones({3}, at::kBool)), Error);

  DataProto sl = d.slice(2, 4);
  EXPECT_EQ(first_ids(sl), (std::vector<int64_t>{6, 9}));
  EXPECT_THROW(d.slice(4, 7), Error);

  DataProto popped = d.pop({"mask"}, {"prompt"});
  EXPECT_TRUE(popped.has_tensor("mask") && popped.has_column("prompt"));
  EXPECT_FALSE(d.has_tensor("mask") || d.has_column("prompt"));
  EXPECT_THROW(d.pop({"mask"}), Error);
}

TEST(DataProto, RenameReorderAndUnion) {
  DataProto d = six_rows();
  DataProto r = d.rename("ids", "input_ids");
  EXPECT_TRUE(r.has_tensor("input_ids") && !r.has_tensor("ids"));
  EXPECT_TRUE(d.has_tensor("ids"));  // the original is unchanged
  EXPECT_THROW(d.rename("ids", "mask"), Error);
  EXPECT_THROW(d.rename("none", "x"), Error);

  DataProto o = d.reorder(at::tensor(std::vector<int64_t>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(first_ids(o), (std::vector<int64_t>{15, 12, 9, 6, 3, 0}));
  EXPECT_THROW(d.reorder(at::tensor(std::vector<int64_t>{0, 0, 1, 2, 3, 4})), Error);

  DataProto extra({{"values", at::ones({6})}, {"ids", d.tensor("ids").clone()}}, {},
                  Dict{{"temperature", 0.7}, {"step", 3}});
  DataProto u = d.union_with(extra);
  EXPECT_TRUE(u.has_tensor("values") && u.has_column("prompt"));
  EXPECT_EQ(u.meta_value("step")->as_int(), 3);
  DataProto clash({{"ids", d.tensor("ids") + 1}});
  EXPECT_NE(error_of([&] { d.union_with(clash); }).find("tensor 'ids' differs"), std::string::npos);
  DataProto meta_clash({}, {}, Dict{{"temperature", 1.0}});
  EXPECT_NE(error_of([&] { d.union_with(meta_clash); }).find("meta 'temperature' differs"),
            std::string::npos);
  EXPECT_THROW(d.union_with(DataProto({{"x", at::ones({2})}})), Error);
}

TEST(DataProto, ConcatRequiresAgreeingMetaAndMergesMetrics) {
  DataProto d = six_rows();
  std::vector<DataProto> parts = d.chunk(3);
  ASSERT_EQ(parts.size(), 3u);
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i].set_meta("metrics", Dict{{"loss", 0.1 * (i + 1)}});
  }
  DataProto back = DataProto::concat(parts);
  EXPECT_EQ(first_ids(back), first_ids(d));
  EXPECT_EQ(back.column("prompt"), d.column("prompt"));
  const Value* metrics = back.meta_value("metrics");
  ASSERT_NE(metrics, nullptr);
  EXPECT_EQ(metrics->at("loss").as_list().size(), 3u);
  // Part 2's value, carried over unchanged.
  EXPECT_EQ(metrics->at("loss").as_list()[2].as_float(), 0.1 * 3);

  parts[1].set_meta("temperature", 1.0);
  std::string err = error_of([&] { DataProto::concat(parts); });
  EXPECT_NE(err.find("conflicting values for meta 'temperature'"), std::string::npos) << err;
  std::vector<DataProto> mixed{d.slice(0, 2), d.select({"ids"})};
  EXPECT_NE(error_of([&] { DataProto::concat(mixed); }).find("part 1 has keys"), std::string::npos);
}

TEST(DataProto, ChunkSplitRepeatAndPadding) {
  DataProto d = six_rows();
  std::string err = error_of([&] { d.chunk(4); });
  EXPECT_NE(err.find("6 rows do not split into 4 equal chunks"), std::string::npos) << err;
  std::vector<DataProto> parts = d.split(4);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].size(), 2);

  DataProto two = d.slice(0, 2);
  EXPECT_EQ(first_ids(two.repeat(2, true)), (std::vector<int64_t>{0, 0, 3, 3}));
  EXPECT_EQ(first_ids(two.repeat(2, false)), (std::vector<int64_t>{0, 3, 0, 3}));
  EXPECT_EQ(first_ids(d.slice(0, 3).repeat_rows({2, 0, 1})), (std::vector<int64_t>{0, 0, 6}));
  EXPECT_THROW(d.repeat_rows({1, 2}), Error);

  auto [padded, pad] = d.pad_to_multiple(4);
  EXPECT_EQ(pad, 2);
  EXPECT_EQ(padded.size(), 8);
  EXPECT_EQ(first_ids(padded), (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 15, 15}));  // last row
  EXPECT_EQ(d.size(), 6);  // the caller's batch is not padded
  EXPECT_EQ(padded.chunk(4).size(), 4u);
  EXPECT_EQ(first_ids(padded.unpad(pad)), first_ids(d));
  EXPECT_EQ(d.pad_to_multiple(3).second, 0);
}

TEST(DataProto, MiniBatchesAreSeededAndCapped) {
  DataProto d = six_rows();
  auto a = d.mini_batches(2, 2, true, 42);
  auto b = d.mini_batches(2, 2, true, 42);
  auto c = d.mini_batches(2, 2, true, 7);
  ASSERT_EQ(a.size(), 6u);  // 2 epochs x 3
  std::vector<int64_t> seen_a, seen_b, seen_c;
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = first_ids(a[i]), y = first_ids(b[i]), z = first_ids(c[i]);
    seen_a.insert(seen_a.end(), x.begin(), x.end());
    seen_b.insert(seen_b.end(), y.begin(), y.end());
    seen_c.insert(seen_c.end(), z.begin(), z.end());
  }
  EXPECT_EQ(seen_a, seen_b);
  EXPECT_NE(seen_a, seen_c);
  std::vector<int64_t> epoch0(seen_a.begin(), seen_a.begin() + 6);
  std::sort(epoch0.begin(), epoch0.end());
  EXPECT_EQ(epoch0, first_ids(d));  // each epoch is a permutation
  EXPECT_EQ(d.mini_batches(64).size(), 1u);  // capped at the batch size
  EXPECT_THROW(d.mini_batches(4), Error);
}

TEST(DataProto, SavesAndLoadsAndRejectsCorruptFiles) {
  DataProto d = six_rows();
  d.set_tensor("big", at::ones({6, 40000}));  // 960 KB
  std::string path = ::testing::TempDir() + "/batch_" + std::to_string(getpid()) + ".baton";
  d.save(path);
  DataProto back = DataProto::load(path);
  EXPECT_EQ(back.to_value(), d.to_value());
  EXPECT_EQ(DataProto::from_value(d.to_value()).to_value(), d.to_value());

  {  // truncate it
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  std::string err = error_of([&] { DataProto::load(path); });
  EXPECT_NE(err.find(path + " is truncated or corrupt"), std::string::npos) << err;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "not a batch";
  }
  EXPECT_NE(error_of([&] { DataProto::load(path); }).find("not a baton DataProto file"),
            std::string::npos);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "BATONDP1";  // the magic and nothing after it (found by fuzz_data_proto)
  }
  EXPECT_NE(error_of([&] { DataProto::load(path); }).find(path + " is truncated or corrupt"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(error_of([&] { DataProto::load(path); }).find("cannot open"), std::string::npos);
}

// A flipped byte anywhere in a saved DataProto (its header, a tensor's bytes
// in any block, the checksum table) is refused naming the file and the byte
// range; a file of the first version (no checksums) still loads.
TEST(DataProto, AFlippedByteAnywhereInAFileIsRefusedNamingTheByteRange) {
  DataProto d = six_rows();
  d.set_tensor("big", at::arange(6 * 100000, at::kFloat).reshape({6, 100000}));  // 2.4 MB
  const std::string path =
      ::testing::TempDir() + "/flipped_" + std::to_string(getpid()) + ".baton";
  d.save(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t payload = 0;
  std::memcpy(&payload, bytes.data() + 8, 8);
  const uint64_t blocks = checksum_blocks(payload);
  ASSERT_GE(blocks, 3u);
  ASSERT_EQ(bytes.size(), 24 + payload + 4 * blocks);
  struct Damage {
    uint64_t offset;
    std::string range;
  };
  auto payload_range = [&](uint64_t offset) {
    const uint64_t begin = 24 + (offset - 24) / kChecksumBlockBytes * kChecksumBlockBytes;
    return "bytes [" + std::to_string(begin) + ", " +
           std::to_string(std::min<uint64_t>(begin + kChecksumBlockBytes, 24 + payload)) + ")";
  };
  const std::string table = "bytes [" + std::to_string(24 + payload) + ", " +
                            std::to_string(bytes.size()) + ") (the checksum table)";
  for (const Damage& damage : std::vector<Damage>{
           {3, "bytes [0, 24) (the header)"},   // the magic's
           {9, "bytes [0, 24) (the header)"},   // the payload's size
           {22, "bytes [0, 24) (the header)"},  // the header's own CRC
           {40, payload_range(40)},
           {24 + kChecksumBlockBytes + 12345, payload_range(24 + kChecksumBlockBytes + 12345)},
           {24 + payload - 1, payload_range(24 + payload - 1)},
           {24 + payload + 2, table},
       }) {
    SCOPED_TRACE(damage.offset);
    baton::testing::flip_byte(path, damage.offset);
    const std::string err = error_of([&] { DataProto::load(path); });
    if (damage.offset < 8) {
      EXPECT_NE(err.find(path + " is not a baton DataProto file"), std::string::npos) << err;
    } else {
      EXPECT_NE(err.find("DataProto::load: " + path + ": " + damage.range), std::string::npos)
          << err;
      EXPECT_THROW(DataProto::load(path), ChecksumError);
    }
    baton::testing::flip_byte(path, damage.offset);
  }
  EXPECT_EQ(DataProto::load(path).to_value(), d.to_value());

  // The first version: the magic, then the payload as it is.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write("BATONDP1", 8);
    out.write(bytes.data() + 24, static_cast<std::streamsize>(payload));
  }
  EXPECT_EQ(DataProto::load(path).to_value(), d.to_value());
  std::remove(path.c_str());
}

// A DataProto file is a wire message: the reader charges what it traverses
// against a limit in proportion to the file (as the channel does), so a list
// of 2^28 elements of no size in a few hundred bytes is refused instead of
// making the decoder build 2^28 Values (it used a fixed 2^40-word limit).
TEST(DataProto, AFileWhoseListClaimsMoreThanItCarriesIsRefused) {
  DataProto d = six_rows();
  List five;
  for (int64_t i = 0; i < 5; ++i) five.emplace_back(i);
  d.set_meta("list", five);  // the file's only list of 5 Values
  std::string path = ::testing::TempDir() + "/amplified_" + std::to_string(getpid()) + ".baton";
  d.save(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The list's tag word: a struct "pointer" whose offset is the element
  // count, 5 here; the first such word after the key "list" (a struct
  // pointer to a Value 5 words on looks the same).
  const auto size = capnp::_::structSize<wire::Value>();
  const uint64_t tag =
      (uint64_t{5} << 2) | (uint64_t{size.data} << 32) | (uint64_t{size.pointers} << 48);
  const size_t key = bytes.find(std::string("list\0", 5));
  ASSERT_NE(key, std::string::npos);
  size_t patched = 0;
  for (size_t off = key / 8 * 8 + 8; off + 8 <= bytes.size() && patched == 0; off += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + off, 8);
    if (word != tag) continue;
    word = uint64_t{1} << 28 << 2;  // 2^28 elements of no size
    std::memcpy(bytes.data() + off, &word, 8);
    ++patched;
  }
  ASSERT_EQ(patched, 1u);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // A crafted file carries checksums that match: verification off stands for it.
  ::setenv("BATON_VERIFY_CHECKSUMS", "0", 1);
  std::string err = error_of([&] { DataProto::load(path); });
  ::unsetenv("BATON_VERIFY_CHECKSUMS");
  EXPECT_NE(err.find(path + " is truncated or corrupt"), std::string::npos) << err;
  EXPECT_NE(err.find("traversal limit"), std::string::npos) << err;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace baton
