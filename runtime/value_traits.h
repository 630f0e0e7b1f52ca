// Conversions between C++ types and baton::Value, used by typed method
// registration (method_table.h), by call arguments (call_args.h) and by
// Value::as<T>(). Supported: Value itself, bool, integral types, floating
// types, std::string, at::Tensor, DataProto (dispatch/data_proto.h), and
// std::vector<T> / std::map<std::string, T> of those, nested.
//
// To support your own type, specialise ValueTraits<T> with to_value,
// from_value and spec(). Any other type fails to compile with a
// static_assert "baton::ValueTraits: unsupported type" whose instantiation
// context names the type ("[with T = ...]").
#pragma once

#include <exception>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/type_spec.h"

namespace baton {

namespace detail {
template <class T>
inline constexpr bool dependent_false_v = false;
// Marks the primary ValueTraits template: the types without a specialisation.
struct UnsupportedValueType {};
}  // namespace detail

#define BATON_UNSUPPORTED_VALUE_TYPE                                                           \
  "baton::ValueTraits: unsupported type (see 'with T = ...' above). A method parameter, "        \
  "result or call argument must be one of: baton::Value, bool, an integral type, a "              \
  "floating-point type, std::string, at::Tensor, baton::DataProto (include "                      \
  "dispatch/data_proto.h), or std::vector<T> / std::map<std::string, T> of those; or specialise " \
  "baton::ValueTraits<T> (runtime/value_traits.h) for your type"

// The primary template is the "no conversion" case. Its members exist only to
// fail: a method parameter or result, a Value::as<T>() or a call argument of
// an unsupported type stops the compilation here, naming the type. (They are
// templates so that merely asking is_value_type_v<T> declares nothing invalid.)
template <class T, class Enable = void>
struct ValueTraits : detail::UnsupportedValueType {
  template <class U = T>
  static Value to_value(const U&) {
    static_assert(detail::dependent_false_v<U>, BATON_UNSUPPORTED_VALUE_TYPE);
    std::terminate();
  }
  template <class U = T>
  static U from_value(const Value&) {
    static_assert(detail::dependent_false_v<U>, BATON_UNSUPPORTED_VALUE_TYPE);
    std::terminate();
  }
  template <class U = T>
  static TypeSpec spec() {
    static_assert(detail::dependent_false_v<U>, BATON_UNSUPPORTED_VALUE_TYPE);
    std::terminate();
  }
};

#undef BATON_UNSUPPORTED_VALUE_TYPE

// True for the types above (and those with your own ValueTraits specialisation).
template <class T>
inline constexpr bool is_value_type_v =
    !std::is_base_of_v<detail::UnsupportedValueType, ValueTraits<T>>;

template <>
struct ValueTraits<Value> {
  static Value to_value(Value v) { return v; }
  static Value from_value(const Value& v) { return v; }
  static TypeSpec spec() { return TypeSpec::any(); }
};

template <>
struct ValueTraits<bool> {
  static Value to_value(bool b) { return Value(b); }
  static bool from_value(const Value& v) { return v.as_bool(); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kBool); }
};

template <class T>
struct ValueTraits<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static Value to_value(T i) { return Value(static_cast<int64_t>(i)); }
  static T from_value(const Value& v) { return static_cast<T>(v.as_int()); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kInt); }
};

template <class T>
struct ValueTraits<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static Value to_value(T d) { return Value(static_cast<double>(d)); }
  static T from_value(const Value& v) { return static_cast<T>(v.as_float()); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kFloat); }
};

template <>
struct ValueTraits<std::string> {
  static Value to_value(std::string s) { return Value(std::move(s)); }
  static std::string from_value(const Value& v) { return v.as_string(); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kString); }
};

template <>
struct ValueTraits<at::Tensor> {
  static Value to_value(at::Tensor t) { return Value(std::move(t)); }
  static at::Tensor from_value(const Value& v) { return v.as_tensor(); }
  static TypeSpec spec() { return TypeSpec::of(ValueKind::kTensor); }
};

// Containers of unsupported types are unsupported themselves, so that the
// error names the container.
template <class T>
struct ValueTraits<std::vector<T>, std::enable_if_t<is_value_type_v<T>>> {
  static Value to_value(std::vector<T> xs) {
    List out;
    out.reserve(xs.size());
    for (auto& x : xs) out.push_back(ValueTraits<T>::to_value(std::move(x)));
    return Value(std::move(out));
  }
  static std::vector<T> from_value(const Value& v) {
    std::vector<T> out;
    out.reserve(v.as_list().size());
    for (const Value& x : v.as_list()) out.push_back(ValueTraits<T>::from_value(x));
    return out;
  }
  static TypeSpec spec() { return TypeSpec::list_of(ValueTraits<T>::spec()); }
};

template <class T>
struct ValueTraits<std::map<std::string, T>, std::enable_if_t<is_value_type_v<T>>> {
  static Value to_value(std::map<std::string, T> xs) {
    Dict out;
    for (auto& [k, x] : xs) out.emplace_back(k, ValueTraits<T>::to_value(std::move(x)));
    return Value(std::move(out));
  }
  static std::map<std::string, T> from_value(const Value& v) {
    std::map<std::string, T> out;
    for (const auto& [k, x] : v.as_dict()) out.emplace(k, ValueTraits<T>::from_value(x));
    return out;
  }
  static TypeSpec spec() { return TypeSpec::dict_of(ValueTraits<T>::spec()); }
};

template <class T>
T Value::as() const {
  return ValueTraits<T>::from_value(*this);
}

}  // namespace baton
