// The values a Jinja template computes with, with Python's semantics as jinja2 gives them:
// truthiness, str() and repr(), ==, <, `in`, and json.dumps as transformers' `tojson` filter
// writes it. Strings are UTF-8; their length, indices and slices count code points, as Python's.
//
// Lists and dicts are shared (copying a Value copies a pointer), as Python objects are; a
// namespace() is the only value a template can change after creating it. Dict keys are strings
// (JSON's) or other scalars; dicts keep their insertion order, as Python's. The select, reject
// and map filters give generators, as jinja2's do: iterable once converted (|list), always
// true, without a length or a JSON form.
//
// Operations that Python would refuse (1 + 'a', an undefined value used in arithmetic) throw
// ValueError; the interpreter adds the template's name and line.
// Ints are 64-bit where Python's have no bound: arithmetic whose result does not fit throws
// ValueError rather than wrapping.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/errors.h"

namespace baton::data::jinja {

// A type or value error while rendering; template.cpp names the template's
// source and line and rethrows it as JinjaError.
class ValueError : public Error {
 public:
  using Error::Error;
};

class Value;

struct List {
  std::vector<Value> items;
  bool tuple = false;  // prints as (a, b), as the pairs items() and dictsort give
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;     // insertion order; keys compare as Python's
  const Value* find(std::string_view key) const;  // a string key
  const Value* find_value(const Value& key) const;
  void set(Value key, Value value);
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A macro, a global function (namespace, range, ...) or a bound method ('a'.upper).
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
    kGenerator
  };

  // Undefined. `why` is the message of the error using it raises ("'x' is undefined").
  Value() = default;
  static Value undefined(std::string why);
  static Value none();
  Value(bool b);  // NOLINT(google-explicit-constructor): Values are built from scalars freely.
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s, bool safe = false);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value generator(std::vector<Value> items);
  static Value dict(Dict d);
  static Value namespace_(Dict attrs);
  static Value callable(std::string name, std::function<Value(CallArgs&)> call);
  // JSON null becomes None; objects keep their order.
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  // Python's isinstance(x, int) with bool excluded.
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // Strings marked safe (|safe, |e): `safe + text` escapes the text, as jinja2's Markup does.
  bool is_safe() const { return safe_; }

  bool as_bool() const { return b_; }            // REQUIRES: kBool
  int64_t as_int() const;                        // kBool or kInt
  double as_float() const;                       // kBool, kInt or kFloat
  const std::string& str() const { return s_; }  // REQUIRES: kString (the message: kUndefined)
  const std::vector<Value>& items() const;       // REQUIRES: kList or kGenerator
  bool is_tuple() const;
  const Dict& dict() const;          // REQUIRES: kDict or kNamespace
  Dict& mutable_namespace() const;   // REQUIRES: kNamespace
  const Callable& callable() const;  // REQUIRES: kCallable

  // Python's bool(x); an undefined value is false.
  bool truthy() const;
  // Python's str(x) (True, None, 1.0, ['a', 1]); an undefined value prints as "".
  std::string to_str() const;
  // Python's repr(x).
  std::string repr() const;
  // The type's Python name, for errors ("str", "dict", "NoneType").
  std::string type_name() const;
  // Throws ValueError with the message of an undefined value.
  [[noreturn]] void fail_undefined() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool safe_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's <, for numbers, strings and lists; throws ValueError for others.
bool less(const Value& a, const Value& b);
// Python's `a in b` (substring, list element, dict key; false for undefined `b`).
bool contains(const Value& container, const Value& item);

// Python's +, -, *, /, //, %, **; throws ValueError for operand types Python refuses.
Value add(const Value& a, const Value& b);
Value arithmetic(char op, const Value& a,
                 const Value& b);  // '-', '*', '/', 'f' (//), '%', 'p' (**)

// json.dumps(x, ensure_ascii=..., indent=indent, separators=(item_sep, key_sep),
// sort_keys=...); indent < 0 for None. Throws ValueError for values JSON has no form for.
std::string to_json(const Value& value, int indent, bool sort_keys, bool ensure_ascii,
                    const std::string& item_sep, const std::string& key_sep);

// HTML escaping as markupsafe's escape (& < > " '), which |e and `safe + text` use.
std::string html_escape(const std::string& s);

// Python's float repr ("1.0", "1e-05", "0.30000000000000004").
std::string float_repr(double f);

// Code points of a UTF-8 string, and back (strings with invalid UTF-8 count bytes).
std::vector<std::string> code_points(const std::string& s);
std::size_t code_point_count(const std::string& s);

// The elements iterating a value gives: a list's items, a dict's keys, a string's characters;
// nothing for undefined. Throws ValueError for values that are not iterable.
std::vector<Value> iterate(const Value& value);

}  // namespace baton::data::jinja
