// Reading fields of the tokenizer's JSON files with errors that name the file and JSON path
// (`where`, e.g. "dir/tokenizer.json: pre_tokenizer.pretokenizers[1]").
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace baton::data {

// The object's "type" string.
std::string json_type(const nlohmann::json& object, const std::string& where);
const nlohmann::json& json_field(const nlohmann::json& object, const char* key,
                                 const std::string& where);
const nlohmann::json& json_array(const nlohmann::json& object, const char* key,
                                 const std::string& where);
std::string json_string(const nlohmann::json& object, const char* key, const std::string& where);
bool json_bool(const nlohmann::json& object, const char* key, bool fallback,
               const std::string& where);
int64_t json_int(const nlohmann::json& object, const char* key, const std::string& where);

}  // namespace baton::data
