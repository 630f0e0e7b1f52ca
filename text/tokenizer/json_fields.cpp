#include "text/tokenizer/json_fields.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/tokenizer_error.h"

namespace baton::data {

const nlohmann::json& json_field(const nlohmann::json& object, const char* key,
                                 const std::string& where) {
  if (!object.is_object()) throw TokenizerError(where + ": expected a JSON object");
  const auto it = object.find(key);
  if (it == object.end()) throw TokenizerError(where + ": missing field '" + key + "'");
  return *it;
}

std::string json_type(const nlohmann::json& object, const std::string& where) {
  return json_string(object, "type", where);
}

const nlohmann::json& json_array(const nlohmann::json& object, const char* key,
                                 const std::string& where) {
  const auto& value = json_field(object, key, where);
  if (!value.is_array()) throw TokenizerError(where + "." + key + ": expected a JSON array");
  return value;
}

std::string json_string(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& value = json_field(object, key, where);
  if (!value.is_string()) throw TokenizerError(where + "." + key + ": expected a string");
  return value.get<std::string>();
}

bool json_bool(const nlohmann::json& object, const char* key, bool fallback,
               const std::string& where) {
  if (!object.is_object()) throw TokenizerError(where + ": expected a JSON object");
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw TokenizerError(where + "." + key + ": expected true or false");
  return it->get<bool>();
}

int64_t json_int(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto& value = json_field(object, key, where);
  if (!value.is_number_integer()) throw TokenizerError(where + "." + key + ": expected an integer");
  return value.get<int64_t>();
}

}  // namespace baton::data
