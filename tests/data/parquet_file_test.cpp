// verl's parquet prompt files (fixtures/make_parquet_fixtures.py): read as the
// same rows the JSONL copy holds, and a bad file names itself.
#include "data/parquet_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "data/prompt_dataset.h"
#include "text/tokenizer/tokenizer.h"

namespace baton::data {
namespace {

const std::string kParquet = std::string(BATON_DATA_FIXTURES_DIR) + "/parquet/gsm8k.parquet";
const std::string kJsonl = std::string(BATON_DATA_FIXTURES_DIR) + "/parquet/gsm8k.jsonl";

TEST(ParquetFile, RowsAreTheJsonlRowsWithColumnOrderKept) {
  if (!parquet_supported()) GTEST_SKIP() << "built without pyarrow's Arrow";
  const auto rows = read_parquet_rows(kParquet);
  std::ifstream in(kJsonl);
  std::vector<nlohmann::ordered_json> expected;
  for (std::string line; std::getline(in, line);) expected.push_back(nlohmann::ordered_json::parse(line));
  ASSERT_EQ(rows.size(), expected.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].dump(), expected[i].dump()) << i;
  // Integers stay integers, structs keep their fields' order (role before content).
  EXPECT_TRUE(rows[0]["extra_info"]["index"].is_number_integer());
  EXPECT_EQ(rows[1]["prompt"][0].begin().key(), "role");
}

TEST(ParquetFile, PromptDatasetLoadsParquetAsItLoadsTheJsonlCopy) {
  if (!parquet_supported()) GTEST_SKIP() << "built without pyarrow's Arrow";
  const Tokenizer tok = Tokenizer::load(std::string(BATON_FIXTURES_DIR) + "/bpe");
  const auto options = PromptDatasetOptions().set_max_prompt_length(256).set_truncation(Truncation::kLeft);
  const PromptDataset from_parquet = PromptDataset::load({kParquet}, tok, options);
  const PromptDataset from_jsonl = PromptDataset::load({kJsonl}, tok, options);
  ASSERT_EQ(from_parquet.size(), 4u);
  ASSERT_EQ(from_parquet.size(), from_jsonl.size());
  for (size_t i = 0; i < from_parquet.size(); ++i) {
    const PromptRow& a = from_parquet.row(i);
    const PromptRow& b = from_jsonl.row(i);
    EXPECT_EQ(a.prompt_text, b.prompt_text) << i;
    EXPECT_EQ(a.prompt_ids, b.prompt_ids) << i;
    EXPECT_EQ(a.data_source, b.data_source);
    EXPECT_EQ(a.ground_truth, b.ground_truth);
    EXPECT_EQ(a.extra_info, b.extra_info);
    EXPECT_EQ(a.file, kParquet);
    EXPECT_EQ(a.line, static_cast<int64_t>(i) + 1);
  }
  EXPECT_EQ(from_parquet.row(2).ground_truth, "7");
  EXPECT_NE(from_parquet.row(1).prompt_text.find("You are a careful solver."), std::string::npos);
}

TEST(ParquetFile, ACorruptOrMissingFileNamesItself) {
  const std::string bad = (std::filesystem::temp_directory_path() /
                           ("baton_bad_" + std::to_string(::getpid()) + ".parquet"))
                              .string();
  { std::ofstream(bad) << "PAR1 this is not a parquet file"; }
  for (const std::string& path : {bad, std::string("/nonexistent/train.parquet")}) {
    try {
      read_parquet_rows(path);
      FAIL() << path;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace baton::data
