// TypeSpec: the declared type of a method parameter or result, checked against
// a Value before a call is sent (so a wrong argument fails at the driver,
// before anything runs) and again in the worker.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace baton {

class Value;
enum class ValueKind;

class TypeSpec {
 public:
  static TypeSpec any();
  static TypeSpec of(ValueKind kind);
  static TypeSpec list_of(TypeSpec element);
  static TypeSpec dict_of(TypeSpec element);

  // "int", "list<float>", "dict<tensor>", "any".
  std::string name() const;

  // Returns a description of the first mismatch ("expected int, got string"
  // or "element 3: expected float, got list"), or nullopt if `v` conforms.
  // An int conforms to float.
  std::optional<std::string> mismatch(const Value& v) const;

 private:
  bool any_ = true;
  ValueKind kind_{};
  std::shared_ptr<const TypeSpec> element_;  // for lists and dicts
};

}  // namespace baton
