#include "data/parquet_file.h"

#include <stdexcept>

#if defined(BATON_PARQUET)
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include "base/errors.h"
#endif

namespace baton::data {

#if defined(BATON_PARQUET)
namespace {

using Json = nlohmann::ordered_json;

Json to_json(const arrow::Scalar& s, const std::string& where);

Json array_to_json(const arrow::Array& array, const std::string& where) {
  Json out = Json::array();
  for (int64_t i = 0; i < array.length(); ++i) {
    auto item = array.GetScalar(i);
    if (!item.ok()) throw Error(where + ": " + item.status().ToString());
    out.push_back(to_json(**item, where));
  }
  return out;
}

template <typename T>
Json number(const arrow::Scalar& s) {
  return static_cast<const T&>(s).value;
}

Json to_json(const arrow::Scalar& s, const std::string& where) {
  if (!s.is_valid) return nullptr;
  switch (s.type->id()) {
    case arrow::Type::NA:
      return nullptr;
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanScalar&>(s).value;
    case arrow::Type::INT8: return number<arrow::Int8Scalar>(s);
    case arrow::Type::INT16: return number<arrow::Int16Scalar>(s);
    case arrow::Type::INT32: return number<arrow::Int32Scalar>(s);
    case arrow::Type::INT64: return number<arrow::Int64Scalar>(s);
    case arrow::Type::UINT8: return number<arrow::UInt8Scalar>(s);
    case arrow::Type::UINT16: return number<arrow::UInt16Scalar>(s);
    case arrow::Type::UINT32: return number<arrow::UInt32Scalar>(s);
    case arrow::Type::UINT64: return number<arrow::UInt64Scalar>(s);
    case arrow::Type::FLOAT: return number<arrow::FloatScalar>(s);
    case arrow::Type::DOUBLE: return number<arrow::DoubleScalar>(s);
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::BaseBinaryScalar&>(s).view());
    case arrow::Type::LIST:
    case arrow::Type::LARGE_LIST:
    case arrow::Type::FIXED_SIZE_LIST:
    case arrow::Type::LIST_VIEW:
    case arrow::Type::LARGE_LIST_VIEW:
      return array_to_json(*static_cast<const arrow::BaseListScalar&>(s).value, where);
    case arrow::Type::STRUCT: {
      const auto& st = static_cast<const arrow::StructScalar&>(s);
      const auto& type = static_cast<const arrow::StructType&>(*s.type);
      Json out = Json::object();
      for (int i = 0; i < type.num_fields(); ++i) {
        out[type.field(i)->name()] = to_json(*st.value[static_cast<size_t>(i)], where);
      }
      return out;
    }
    default:
      throw Error(where + ": column type " + s.type->ToString() +
                               " is not supported (strings, numbers, booleans, lists and "
                               "structs are)");
  }
}

}  // namespace

std::vector<nlohmann::ordered_json> read_parquet_rows(const std::string& path) {
  auto file = arrow::io::ReadableFile::Open(path);
  if (!file.ok()) {
    throw Error(path + ": cannot open the dataset file (" +
                             file.status().ToString() + ")");
  }
  std::shared_ptr<arrow::Table> table;
  try {
    auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
    if (!reader.ok()) throw Error(reader.status().ToString());
    auto read = (*reader)->ReadTable();
    if (!read.ok()) throw Error(read.status().ToString());
    table = *read;
  } catch (const std::exception& e) {  // parquet throws ParquetException for a bad footer
    throw Error(path + ": not a readable Parquet file (" + e.what() + ")");
  }
  const auto& schema = *table->schema();
  std::vector<nlohmann::ordered_json> rows(static_cast<size_t>(table->num_rows()),
                                           Json::object());
  for (int c = 0; c < table->num_columns(); ++c) {
    const std::string name = schema.field(c)->name();
    const std::string where = path + ": column '" + name + "'";
    int64_t r = 0;
    for (const auto& chunk : table->column(c)->chunks()) {
      for (int64_t i = 0; i < chunk->length(); ++i, ++r) {
        auto s = chunk->GetScalar(i);
        if (!s.ok()) throw Error(where + ": " + s.status().ToString());
        rows[static_cast<size_t>(r)][name] = to_json(**s, where);
      }
    }
  }
  return rows;
}

bool parquet_supported() { return true; }

#else

std::vector<nlohmann::ordered_json> read_parquet_rows(const std::string& path) {
  throw Error(path +
                           ": this build of baton reads no Parquet (it was configured without "
                           "Apache Arrow: install pyarrow in BATON_PYTHON's environment, "
                           "scripts/setup_python.sh does, and configure again)");
}

bool parquet_supported() { return false; }

#endif

}  // namespace baton::data
