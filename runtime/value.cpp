#include "runtime/value.h"

#include <ATen/ops/equal.h>

#include <sstream>

#include "base/errors.h"

namespace baton {

const char* kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kNone: return "none";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return "string";
    case ValueKind::kList: return "list";
    case ValueKind::kDict: return "dict";
    case ValueKind::kTensor: return "tensor";
  }
  return "?";
}

namespace {

[[noreturn]] void wrong_kind(ValueKind want, ValueKind got) {
  throw TypeError(std::string("expected a value of kind ") + kind_name(want) + ", got " +
                  kind_name(got));
}

}  // namespace

#define BATON_VALUE_GET(KIND, TYPE)                         \
  if (kind() != ValueKind::KIND) wrong_kind(ValueKind::KIND, kind()); \
  return std::get<TYPE>(v_)

bool Value::as_bool() const { BATON_VALUE_GET(kBool, bool); }
int64_t Value::as_int() const { BATON_VALUE_GET(kInt, int64_t); }
double Value::as_float() const {
  if (kind() == ValueKind::kInt) return static_cast<double>(std::get<int64_t>(v_));
  BATON_VALUE_GET(kFloat, double);
}
const std::string& Value::as_string() const { BATON_VALUE_GET(kString, std::string); }
const List& Value::as_list() const { BATON_VALUE_GET(kList, List); }
List& Value::as_list() { BATON_VALUE_GET(kList, List); }
const Dict& Value::as_dict() const { BATON_VALUE_GET(kDict, Dict); }
Dict& Value::as_dict() { BATON_VALUE_GET(kDict, Dict); }
const at::Tensor& Value::as_tensor() const { BATON_VALUE_GET(kTensor, at::Tensor); }
#undef BATON_VALUE_GET

const Value* Value::find(const std::string& key) const {
  for (const auto& [k, v] : as_dict()) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value& Value::at(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) throw TypeError("dict has no key '" + key + "'");
  return *v;
}

namespace {

void render(const Value& v, std::ostringstream& os) {
  switch (v.kind()) {
    case ValueKind::kNone: os << "none"; break;
    case ValueKind::kBool: os << (v.as_bool() ? "true" : "false"); break;
    case ValueKind::kInt: os << v.as_int(); break;
    case ValueKind::kFloat: os << v.as_float(); break;
    case ValueKind::kString: os << '"' << v.as_string() << '"'; break;
    case ValueKind::kList: {
      os << '[';
      const char* sep = "";
      for (const Value& x : v.as_list()) {
        os << sep;
        render(x, os);
        sep = ", ";
      }
      os << ']';
      break;
    }
    case ValueKind::kDict: {
      os << '{';
      const char* sep = "";
      for (const auto& [k, x] : v.as_dict()) {
        os << sep << '"' << k << "\": ";
        render(x, os);
        sep = ", ";
      }
      os << '}';
      break;
    }
    case ValueKind::kTensor: {
      const at::Tensor& t = v.as_tensor();
      os << t.scalar_type() << t.sizes();
      break;
    }
  }
}

}  // namespace

std::string Value::to_string() const {
  std::ostringstream os;
  render(*this, os);
  return os.str();
}

bool Value::operator==(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case ValueKind::kNone: return true;
    case ValueKind::kBool: return as_bool() == other.as_bool();
    case ValueKind::kInt: return as_int() == other.as_int();
    case ValueKind::kFloat: return as_float() == other.as_float();
    case ValueKind::kString: return as_string() == other.as_string();
    case ValueKind::kList: return as_list() == other.as_list();
    case ValueKind::kDict: return as_dict() == other.as_dict();
    case ValueKind::kTensor: {
      const at::Tensor& a = as_tensor();
      const at::Tensor& b = other.as_tensor();
      return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
    }
  }
  return false;
}

// ---- TypeSpec -------------------------------------------------------------

TypeSpec TypeSpec::any() { return TypeSpec(); }

TypeSpec TypeSpec::of(ValueKind kind) {
  TypeSpec t;
  t.any_ = false;
  t.kind_ = kind;
  return t;
}

TypeSpec TypeSpec::list_of(TypeSpec element) {
  TypeSpec t = of(ValueKind::kList);
  t.element_ = std::make_shared<const TypeSpec>(std::move(element));
  return t;
}

TypeSpec TypeSpec::dict_of(TypeSpec element) {
  TypeSpec t = of(ValueKind::kDict);
  t.element_ = std::make_shared<const TypeSpec>(std::move(element));
  return t;
}

std::string TypeSpec::name() const {
  if (any_) return "any";
  std::string n = kind_name(kind_);
  if (element_) n += "<" + element_->name() + ">";
  return n;
}

std::optional<std::string> TypeSpec::mismatch(const Value& v) const {
  if (any_) return std::nullopt;
  bool ok = v.kind() == kind_ || (kind_ == ValueKind::kFloat && v.kind() == ValueKind::kInt);
  if (!ok) return "expected " + name() + ", got " + kind_name(v.kind());
  if (!element_) return std::nullopt;
  if (kind_ == ValueKind::kList) {
    const List& xs = v.as_list();
    for (size_t i = 0; i < xs.size(); ++i) {
      if (auto m = element_->mismatch(xs[i])) return "element " + std::to_string(i) + ": " + *m;
    }
  } else {
    for (const auto& [k, x] : v.as_dict()) {
      if (auto m = element_->mismatch(x)) return "key '" + k + "': " + *m;
    }
  }
  return std::nullopt;
}

}  // namespace baton
