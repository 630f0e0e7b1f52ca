// Parquet prompt files, as verl's preprocessing scripts write them
// (examples/data_preprocess/gsm8k.py and the like: pandas/pyarrow tables whose
// columns are data_source, prompt — a list of {role, content} structs —,
// ability, reward_model {ground_truth, style} and extra_info {...}).
//
// Each row is read as the JSON object a JSONL file would hold for it, so the
// dataset treats both formats alike: strings, booleans, integers and floats
// as themselves, structs as objects (fields in the file's order), lists as
// arrays, nulls as null. Other column types (binary, dates, maps, ...) fail
// naming the file, the column and the type.
//
// Built with Apache Arrow's C++ libraries from the `pyarrow` wheel in the
// venv (as LibTorch comes from torch's); a build without it (BATON_PARQUET
// off) throws, saying how to get it.
//
// Example:
//   for (const auto& row : baton::data::read_parquet_rows("data/gsm8k/train.parquet"))
//     std::cout << row["data_source"] << "\n";
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace baton::data {

// Every row of `path`, in order. Throws std::runtime_error naming the file
// (unreadable, not Parquet, an unsupported column type, or no Arrow in this
// build).
std::vector<nlohmann::ordered_json> read_parquet_rows(const std::string& path);

// Whether this build reads Parquet (it was configured with pyarrow's Arrow).
bool parquet_supported();

}  // namespace baton::data
