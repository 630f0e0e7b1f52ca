// baton::Value: the typed, JSON-like value that crosses process boundaries as a
// method argument or result: none, bool, int64, float64, string, list, dict
// (string keys, insertion order kept) and tensors of any dtype and shape.
//
// Values are cheap to move; copying copies containers but shares tensor storage
// (as at::Tensor does).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace baton {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

enum class ValueKind { kNone, kBool, kInt, kFloat, kString, kList, kDict, kTensor };

// "none", "bool", "int", ...
const char* kind_name(ValueKind kind);

class Value {
 public:
  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(uint32_t i) : v_(static_cast<int64_t>(i)) {}
  Value(uint64_t i) : v_(static_cast<int64_t>(i)) {}
  Value(long long i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(float f) : v_(static_cast<double>(f)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(List l) : v_(std::move(l)) {}
  Value(Dict d) : v_(std::move(d)) {}
  Value(at::Tensor t) : v_(std::move(t)) {}

  ValueKind kind() const { return static_cast<ValueKind>(v_.index()); }
  bool is_none() const { return kind() == ValueKind::kNone; }

  // Accessors throw baton::TypeError naming the expected and actual kinds.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;  // ints convert
  const std::string& as_string() const;
  const List& as_list() const;
  List& as_list();
  const Dict& as_dict() const;
  Dict& as_dict();
  const at::Tensor& as_tensor() const;

  // Dict lookup; throws baton::TypeError if absent. `find` returns nullptr.
  const Value& at(const std::string& key) const;
  const Value* find(const std::string& key) const;

  // Typed conversion, see value_traits.h: value.as<std::vector<int64_t>>().
  template <class T>
  T as() const;

  // A short human-readable rendering, tensors shown as dtype[shape].
  std::string to_string() const;

  bool operator==(const Value& other) const;  // tensors compare by value

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, List, Dict, at::Tensor> v_;
};

}  // namespace baton

#include "runtime/value_traits.h"  // IWYU pragma: export
