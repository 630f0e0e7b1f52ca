#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "text/utf8.h"

namespace baton::data::jinja {
namespace {

std::string hex2(unsigned c) {
  static const char* digits = "0123456789abcdef";
  return std::string{digits[(c >> 4) & 15], digits[c & 15]};
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x" + hex2(c);
    } else {
      out += ch;
    }
  }
  return out + quote;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00" + hex2(c);
        } else if (c >= 0x80 && ensure_ascii) {
          const std::size_t n = std::min(utf8::sequence_length(c), s.size() - i);
          for (char32_t cp : utf8::decode(std::string_view(s).substr(i, n))) {
            const auto unit = [&](unsigned u) { out += "\\u" + hex2(u >> 8) + hex2(u & 0xff); };
            if (cp >= 0x10000) {
              cp -= 0x10000;
              unit(0xD800 + (cp >> 10));
              unit(0xDC00 + (cp & 0x3ff));
            } else {
              unit(cp);
            }
          }
          i += n - 1;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// json.dumps turns scalar keys into strings.
std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.str();
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kBool:
      return key.as_bool() ? "true" : "false";
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      return key.repr();
    default:
      throw ValueError("keys must be str, int, float, bool or None, not " + key.type_name());
  }
}

struct JsonWriter {
  int indent;
  bool sort_keys;
  bool ensure_ascii;
  std::string item_sep, key_sep;
  std::string out;

  void newline(int level) {
    out += '\n';
    out.append(static_cast<std::size_t>(indent * level), ' ');
  }
  void write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        const double f = v.as_float();
        out += std::isnan(f)   ? "NaN"
               : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                               : float_repr(f);
        return;
      }
      case Value::Kind::kString:
        json_string(out, v.str(), ensure_ascii);
        return;
      case Value::Kind::kList: {
        const auto& items = v.items();
        if (items.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          if (indent >= 0) newline(level + 1);
          write(items[i], level + 1);
        }
        if (indent >= 0) newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& [key, value] : v.dict().items) items.emplace_back(json_key(key), &value);
        if (sort_keys) {
          std::stable_sort(items.begin(), items.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        if (items.empty()) {
          out += "{}";
          return;
        }
        out += '{';
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += item_sep;
          if (indent >= 0) newline(level + 1);
          json_string(out, items[i].first, ensure_ascii);
          out += key_sep;
          write(*items[i].second, level + 1);
        }
        if (indent >= 0) newline(level);
        out += '}';
        return;
      }
      default:
        throw ValueError("Object of type " + v.type_name() + " is not JSON serializable");
    }
  }
};

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  throw ValueError(std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() +
                   "' and '" + b.type_name() + "'");
}

// An int or bool as Python's int arithmetic sees it.
bool integral(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool;
}

// Python's ints have no bound; these are 64-bit, so a result past that range fails (where
// C++ would wrap or, for signed ints, be undefined).
[[noreturn]] void overflow(const std::string& op, const Value& a, const Value& b) {
  throw ValueError("integer overflow: " + a.repr() + " " + op + " " + b.repr() +
                   " does not fit in 64 bits");
}

// a ** b for b >= 0, by squaring: a squared base that overflows means the result does too
// (it is at least that large whenever |a| > 1 and bits of b remain).
Value int_power(const Value& a, const Value& b) {
  int64_t result = 1, base = a.as_int(), e = b.as_int();
  while (true) {
    if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow("**", a, b);
    e >>= 1;
    if (e == 0) return Value(result);
    if (__builtin_mul_overflow(base, base, &base)) overflow("**", a, b);
  }
}

Value repeat(const Value& seq, int64_t n) {
  const bool string = seq.is_string();
  const std::size_t size = string ? seq.str().size() : seq.items().size();
  // An empty sequence stays empty however often it repeats (without looping n times), and a
  // length no string or vector can have fails as Python's OverflowError does.
  if (n <= 0 || size == 0) n = 0;
  std::size_t total = 0;
  const std::size_t most = string ? std::string().max_size() : std::vector<Value>().max_size();
  if (__builtin_mul_overflow(size, static_cast<uint64_t>(n), &total) || total > most) {
    throw ValueError("repeated " + seq.type_name() + " is too long (" + std::to_string(size) +
                     " * " + std::to_string(n) + ")");
  }
  if (string) {
    std::string out;
    out.reserve(total);
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items) {
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  }
  return nullptr;
}

const Value* Dict::find_value(const Value& key) const {
  for (const auto& kv : items) {
    if (equals(kv.first, key)) return &kv.second;
  }
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& kv : items) {
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string why) {
  Value v;
  v.s_ = std::move(why);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double f) : kind_(Kind::kFloat), f_(f) {}
Value::Value(std::string s, bool safe) : kind_(Kind::kString), safe_(safe), s_(std::move(s)) {}

Value Value::list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(List{std::move(items), tuple});
  return v;
}

Value Value::generator(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kGenerator;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::namespace_(Dict attrs) {
  Value v = dict(std::move(attrs));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::callable(std::string name, std::function<Value(CallArgs&)> call) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(call)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : json) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : json.items()) d.items.emplace_back(Value(k), from_json(e));
      return dict(std::move(d));
    }
    default:
      throw ValueError("a JSON value of type " + std::string(json.type_name()) +
                       " has no Jinja form");
  }
}

int64_t Value::as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }

double Value::as_float() const {
  return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int());
}

const std::vector<Value>& Value::items() const { return list_->items; }
bool Value::is_tuple() const { return list_ && list_->tuple; }
const Dict& Value::dict() const { return *dict_; }
Dict& Value::mutable_namespace() const { return *dict_; }
const Callable& Value::callable() const { return *fn_; }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->items.empty();
    case Kind::kDict:
      return !dict_->items.empty();
    default:
      return true;
  }
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return float_repr(f_);
    case Kind::kString:
      return string_repr(s_);
    case Kind::kList: {
      std::string out = list_->tuple ? "(" : "[";
      for (std::size_t i = 0; i < list_->items.size(); ++i) {
        if (i > 0) out += ", ";
        out += list_->items[i].repr();
      }
      if (list_->tuple && list_->items.size() == 1) out += ",";
      return out + (list_->tuple ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = "{";
      for (std::size_t i = 0; i < dict_->items.size(); ++i) {
        if (i > 0) out += ", ";
        out += dict_->items[i].first.repr() + ": " + dict_->items[i].second.repr();
      }
      out += "}";
      return kind_ == Kind::kNamespace ? "<Namespace " + out + ">" : out;
    }
    case Kind::kCallable:
      return "<function " + fn_->name + ">";
    case Kind::kGenerator:
      return "<generator object>";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return list_->tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
    case Kind::kGenerator:
      return "generator";
  }
  return "";
}

void Value::fail_undefined() const { throw ValueError(s_.empty() ? "undefined value" : s_); }

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::kBool; };
  if (numeric(a) && numeric(b)) {
    if (integral(a) && integral(b)) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.str() == b.str();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (std::size_t i = 0; i < a.items().size(); ++i) {
        if (!equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* other = b.dict().find_value(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.dict() == &b.dict();
    case K::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  const auto numeric = [](const Value& v) {
    return v.is_number() || v.kind() == Value::Kind::kBool;
  };
  if (numeric(a) && numeric(b)) {
    if (integral(a) && integral(b)) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw ValueError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                   b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw ValueError("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return equals(v, item); });
    case Value::Kind::kDict:
      return container.dict().find_value(item) != nullptr;
    case Value::Kind::kGenerator:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return equals(v, item); });
    default:
      throw ValueError("argument of type '" + container.type_name() + "' is not iterable");
  }
}

Value add(const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (integral(a) && integral(b)) {
    int64_t sum = 0;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &sum)) overflow("+", a, b);
    return Value(sum);
  }
  if ((a.is_number() || integral(a)) && (b.is_number() || integral(b))) {
    return Value(a.as_float() + b.as_float());
  }
  if (a.is_string() && b.is_string()) {
    // jinja2's Markup (|safe) escapes the plain string it is added to.
    if (a.is_safe() && !b.is_safe()) return Value(a.str() + html_escape(b.str()), true);
    if (b.is_safe() && !a.is_safe()) return Value(html_escape(a.str()) + b.str(), true);
    return Value(a.str() + b.str(), a.is_safe());
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(items), a.is_tuple());
  }
  if (a.is_string()) {
    throw ValueError("can only concatenate str (not \"" + b.type_name() + "\") to str");
  }
  unsupported("+", a, b);
}

Value arithmetic(char op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  const bool ints = integral(a) && integral(b);
  const bool nums = (a.is_number() || integral(a)) && (b.is_number() || integral(b));
  const std::string name = op == 'f' ? "//" : op == 'p' ? "**" : std::string(1, op);
  if (op == '*') {
    if ((a.is_string() || a.is_list()) && integral(b)) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && integral(a)) return repeat(b, a.as_int());
  }
  if (!nums) unsupported(name.c_str(), a, b);
  const bool zero = ints ? b.as_int() == 0 : b.as_float() == 0;
  if (zero && (op == '/' || op == 'f' || op == '%')) throw ValueError("division by zero");
  int64_t result = 0;
  switch (op) {
    case '-':
      if (!ints) return Value(a.as_float() - b.as_float());
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &result)) overflow(name, a, b);
      return Value(result);
    case '*':
      if (!ints) return Value(a.as_float() * b.as_float());
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &result)) overflow(name, a, b);
      return Value(result);
    case '/':
      return Value(a.as_float() / b.as_float());
    case 'f':
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow(name, a, b);
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      return Value(std::floor(a.as_float() / b.as_float()));
    case '%':
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == -1) return Value(int64_t{0});  // x % -1 is undefined in C++ for the least x
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
      } else {
        const double y = b.as_float();
        double r = std::fmod(a.as_float(), y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value(r);
      }
    case 'p':
      if (ints && b.as_int() >= 0) return int_power(a, b);
      return Value(std::pow(a.as_float(), b.as_float()));
    default:
      unsupported(name.c_str(), a, b);
  }
}

std::string to_json(const Value& value, int indent, bool sort_keys, bool ensure_ascii,
                    const std::string& item_sep, const std::string& key_sep) {
  JsonWriter w{indent, sort_keys, ensure_ascii, item_sep, key_sep, {}};
  w.write(value, 0);
  return w.out;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  // sci is [-]d[.ddd]e(+|-)XX: Python prints the shortest digits in fixed notation when
  // -4 <= exponent < 16, else in scientific notation with at least two exponent digits.
  const bool negative = sci[0] == '-';
  const std::size_t e = sci.find('e');
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<std::size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp + 1)) + "." +
             digits.substr(static_cast<std::size_t>(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const std::string mag = std::to_string(exp < 0 ? -exp : exp);
  return out + "e" + (exp < 0 ? "-" : "+") + (mag.size() < 2 ? "0" : "") + mag;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  const bool valid = utf8::is_valid(s);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n =
        valid ? std::min(utf8::sequence_length(static_cast<unsigned char>(s[i])), s.size() - i) : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::size_t code_point_count(const std::string& s) {
  if (!utf8::is_valid(s)) return s.size();
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<Value> iterate(const Value& value) {
  std::vector<Value> out;
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return out;
    case Value::Kind::kList:
      return value.items();
    case Value::Kind::kDict:
      for (const auto& kv : value.dict().items) out.push_back(kv.first);
      return out;
    case Value::Kind::kGenerator:
      return value.items();
    case Value::Kind::kString:
      for (auto& c : code_points(value.str())) out.emplace_back(std::move(c));
      return out;
    default:
      throw ValueError("'" + value.type_name() + "' object is not iterable");
  }
}

}  // namespace baton::data::jinja
