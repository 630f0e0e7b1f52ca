#include "text/jinja/builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "text/utf8.h"

namespace baton::data::jinja {
namespace {

const std::set<std::string> kStringMethods = {
    "startswith",   "endswith", "split",   "rsplit",  "splitlines", "strip",
    "lstrip",       "rstrip",   "upper",   "lower",   "title",      "capitalize",
    "replace",      "format",   "find",    "count",   "join",       "removeprefix",
    "removesuffix", "isdigit",  "isalpha", "isspace", "islower",    "isupper"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values", "copy"};
const std::set<std::string> kListMethods = {"index", "count"};
// Methods the immutable sandbox refuses.
const std::set<std::string> kUnsafeDictMethods = {"pop", "popitem", "setdefault", "update",
                                                  "clear"};
const std::set<std::string> kUnsafeListMethods = {"append", "pop",   "extend", "insert",
                                                  "remove", "clear", "sort",   "reverse"};

// Arguments bound to parameter names, as Python binds them.
class Bound {
 public:
  Bound(const std::string& what, CallArgs& args, const std::vector<std::string>& params,
        bool varargs = false)
      : values_(params.size()) {
    for (std::size_t i = 0; i < args.positional.size(); ++i) {
      if (i < params.size()) {
        values_[i] = args.positional[i];
      } else if (varargs) {
        rest_.push_back(args.positional[i]);
      } else {
        throw ValueError(what + "() takes at most " + std::to_string(params.size()) +
                         " argument(s) (" + std::to_string(args.positional.size()) + " given)");
      }
    }
    for (auto& [key, value] : args.keyword) {
      const auto it = std::find(params.begin(), params.end(), key);
      if (it == params.end()) {
        throw ValueError(what + "() got an unexpected keyword argument '" + key + "'");
      }
      values_[static_cast<std::size_t>(it - params.begin())] = value;
    }
  }
  bool given(std::size_t i) const { return values_[i].has_value(); }
  Value get(std::size_t i, Value fallback = Value::none()) const {
    return values_[i] ? *values_[i] : fallback;
  }
  bool flag(std::size_t i, bool fallback) const {
    return values_[i] ? values_[i]->truthy() : fallback;
  }
  // Positional arguments past the named ones.
  std::vector<Value>& rest() { return rest_; }

 private:
  std::vector<std::optional<Value>> values_;
  std::vector<Value> rest_;
};

void no_args(const std::string& what, const CallArgs& args) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    throw ValueError(what + "() takes no arguments");
  }
}

int64_t int_arg(const Value& v, const std::string& what) {
  if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
    throw ValueError(what + ": expected an integer, got " + v.type_name());
  }
  return v.as_int();
}

const std::string& str_arg(const Value& v, const std::string& what) {
  if (!v.is_string()) throw ValueError(what + ": expected a string, got " + v.type_name());
  return v.str();
}

bool is_py_space(const std::string& cp) {
  if (cp.size() == 1) {
    const auto c = static_cast<unsigned char>(cp[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  }
  const char32_t u = utf8::decode(cp)[0];
  return u == 0x85 || u == 0xa0 || u == 0x1680 || (u >= 0x2000 && u <= 0x200a) || u == 0x2028 ||
         u == 0x2029 || u == 0x202f || u == 0x205f || u == 0x3000;
}

// Python's str.strip/lstrip/rstrip: whitespace, or the code points of `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<std::string> set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = code_points(str_arg(chars, "strip"));
  const auto strippable = [&](const std::string& cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strippable(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strippable(cps[e - 1])) --e;
  }
  std::string out;
  for (std::size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's str.title: a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = previous_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      previous_cased = true;
    } else {
      previous_cased = (static_cast<unsigned char>(c) & 0x80) != 0 && previous_cased;
    }
  }
  return out;
}

// jinja2's title filter: words start after spaces and -({[<.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const char c : s) {
    const bool sep = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
                     c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += word_start ? ascii_upper(std::string(1, c)) : ascii_lower(std::string(1, c));
      word_start = false;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  return ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1));
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) {
    std::string out;
    int64_t n = 0;
    for (const auto& cp : code_points(s)) {
      if (count < 0 || n++ < count) out += to;
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  std::size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + to;
    pos = hit + from.size();
  }
  return out + s.substr(pos);
}

std::vector<Value> split(const std::string& s, const Value& sep, int64_t maxsplit,
                         bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; empty strings are dropped.
    const auto cps = code_points(s);
    std::vector<std::pair<std::size_t, std::size_t>> words;  // [begin, end) in code points
    for (std::size_t i = 0; i < cps.size();) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i == cps.size()) break;
      std::size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    const auto join = [&](std::size_t b, std::size_t e) {
      std::string out;
      for (std::size_t k = b; k < e; ++k) out += cps[k];
      return out;
    };
    if (maxsplit < 0 || static_cast<std::size_t>(maxsplit) >= words.size()) {
      for (const auto& [b, e] : words) parts.push_back(join(b, e));
    } else if (!from_right) {
      for (std::size_t k = 0; k < static_cast<std::size_t>(maxsplit); ++k) {
        parts.push_back(join(words[k].first, words[k].second));
      }
      parts.push_back(strip(join(words[static_cast<std::size_t>(maxsplit)].first, cps.size()),
                            Value::none(), false, true));
    } else {
      const std::size_t keep = words.size() - static_cast<std::size_t>(maxsplit);
      parts.push_back(strip(join(0, words[keep - 1].second), Value::none(), true, false));
      for (std::size_t k = keep; k < words.size(); ++k) {
        parts.push_back(join(words[k].first, words[k].second));
      }
    }
  } else {
    const std::string& d = str_arg(sep, "split");
    if (d.empty()) throw ValueError("empty separator");
    if (!from_right) {
      std::size_t pos = 0;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        const std::size_t hit = s.find(d, pos);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + d.size();
      }
      parts.push_back(s.substr(pos));
    } else {
      std::size_t end = s.size();
      std::vector<std::string> rev;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        if (end < d.size()) break;
        const std::size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string::npos) break;
        rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::vector<std::string> splitlines(const std::string& s) {
  std::vector<std::string> lines;
  std::string line;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r' || s[i] == '\v' || s[i] == '\f') {
      lines.push_back(line);
      line.clear();
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      line += s[i];
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// Python's str.format with {}, {0} and {name} fields (no format specs).
std::string format(const std::string& fmt, CallArgs& args) {
  std::string out;
  std::size_t auto_index = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        throw ValueError("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const std::size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw ValueError("Single '{' encountered in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      throw ValueError("str.format: the field '{" + field +
                       "}' (format specs, conversions, attributes) is not supported");
    }
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const std::size_t index = field.empty() ? auto_index++ : std::stoul(field);
      if (index >= args.positional.size()) {
        throw ValueError("Replacement index " + std::to_string(index) + " out of range");
      }
      out += args.positional[index].to_str();
    } else {
      const auto it = std::find_if(args.keyword.begin(), args.keyword.end(),
                                   [&](const auto& kv) { return kv.first == field; });
      if (it == args.keyword.end()) throw ValueError("KeyError: '" + field + "'");
      out += it->second.to_str();
    }
    i = close;
  }
  return out;
}

std::size_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return code_point_count(v.str());
    case Value::Kind::kList:
      return v.items().size();
    case Value::Kind::kDict:
      return v.dict().items.size();
    default:
      throw ValueError("object of type '" + v.type_name() + "' has no len()");
  }
}

Value pairs(const Value& dict) {
  std::vector<Value> out;
  for (const auto& [k, v] : dict.dict().items) out.push_back(Value::list({k, v}, true));
  return Value::list(std::move(out));
}

Value call_method(const Value& self, const std::string& name, CallArgs& args) {
  if (self.is_string()) {
    const std::string& s = self.str();
    if (name == "startswith" || name == "endswith") {
      Bound b(name, args, {"prefix", "start", "end"});
      const Value prefix = b.get(0);
      std::vector<Value> options = prefix.is_list() ? prefix.items() : std::vector<Value>{prefix};
      if (b.given(1) || b.given(2)) throw ValueError(name + ": start and end are not supported");
      for (const Value& o : options) {
        const std::string& p = str_arg(o, name);
        const bool hit =
            name == "startswith"
                ? s.compare(0, p.size(), p) == 0
                : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
        if (hit) return Value(true);
      }
      return Value(false);
    }
    if (name == "split" || name == "rsplit") {
      Bound b(name, args, {"sep", "maxsplit"});
      return Value::list(split(s, b.get(0), int_arg(b.get(1, Value(-1)), name), name == "rsplit"));
    }
    if (name == "splitlines") {
      no_args(name, args);
      std::vector<Value> out;
      for (auto& l : splitlines(s)) out.emplace_back(std::move(l));
      return Value::list(std::move(out));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Bound b(name, args, {"chars"});
      return Value(strip(s, b.get(0), name != "rstrip", name != "lstrip"));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      no_args(name, args);
      if (name == "upper") return Value(ascii_upper(s));
      if (name == "lower") return Value(ascii_lower(s));
      if (name == "title") return Value(py_title(s));
      return Value(capitalize(s));
    }
    if (name == "replace") {
      Bound b(name, args, {"old", "new", "count"});
      return Value(replace(s, str_arg(b.get(0), name), str_arg(b.get(1), name),
                           int_arg(b.get(2, Value(-1)), name)));
    }
    if (name == "format") return Value(format(s, args));
    if (name == "find" || name == "count") {
      Bound b(name, args, {"sub"});
      const std::string& sub = str_arg(b.get(0), name);
      if (name == "find") {
        const std::size_t hit = s.find(sub);
        return Value(hit == std::string::npos
                         ? int64_t{-1}
                         : static_cast<int64_t>(code_point_count(s.substr(0, hit))));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(code_point_count(s) + 1));
      int64_t n = 0;
      for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size()))
        ++n;
      return Value(n);
    }
    if (name == "join") {
      Bound b(name, args, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& v : iterate(b.get(0))) {
        if (!first) out += s;
        out += str_arg(v, "join");
        first = false;
      }
      return Value(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      Bound b(name, args, {"affix"});
      const std::string& a = str_arg(b.get(0), name);
      if (name == "removeprefix")
        return Value(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
      const bool ends = s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
      return Value(ends ? s.substr(0, s.size() - a.size()) : s);
    }
    no_args(name, args);
    const auto all = [&](auto pred) {
      return Value(!s.empty() && std::all_of(s.begin(), s.end(), pred));
    };
    if (name == "isdigit") return all([](char c) { return c >= '0' && c <= '9'; });
    if (name == "isalpha") return all([](char c) { return is_alpha(c); });
    if (name == "isspace") {
      const auto cps = code_points(s);
      return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), is_py_space));
    }
    if (name == "islower" || name == "isupper") {
      bool cased = false;
      for (const char c : s) {
        if (!is_alpha(c)) continue;
        cased = true;
        if ((name == "islower") != (c >= 'a' && c <= 'z')) return Value(false);
      }
      return Value(cased);
    }
  }
  if (self.is_dict()) {
    if (name == "get") {
      Bound b(name, args, {"key", "default"});
      const Value* hit = self.dict().find_value(b.get(0));
      return hit ? *hit : b.get(1);
    }
    no_args(name, args);
    if (name == "items") return pairs(self);
    if (name == "copy") return Value::dict(self.dict());
    std::vector<Value> out;
    for (const auto& [k, v] : self.dict().items) out.push_back(name == "keys" ? k : v);
    return Value::list(std::move(out));
  }
  if (self.is_list()) {
    Bound b(name, args, {"value"});
    const auto& items = self.items();
    if (name == "count") {
      return Value(static_cast<int64_t>(std::count_if(
          items.begin(), items.end(), [&](const Value& v) { return equals(v, b.get(0)); })));
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (equals(items[i], b.get(0))) return Value(static_cast<int64_t>(i));
    }
    throw ValueError(b.get(0).repr() + " is not in list");
  }
  throw ValueError("'" + self.type_name() + "' object has no attribute '" + name + "'");
}

Value bound_method(const Value& self, const std::string& name) {
  return Value::callable(self.type_name() + "." + name,
                         [self, name](CallArgs& args) { return call_method(self, name, args); });
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + self.type_name() +
                          "' object is unsafe (chat templates run in jinja2's immutable sandbox)");
}

// An item's attribute named by a dotted path ("function.name"), as jinja2's filters read it.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  std::size_t pos = 0;
  while (true) {
    const std::size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? dot : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    int64_t index = 0;
    if (digits &&
        std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc()) {
      // Python's ints are unbounded: an index past int64's range is past every list's end.
      if (v.is_undefined()) v.fail_undefined();
      v = Value::undefined("'" + v.type_name() + " object' has no element " + part);
    } else {
      v = get_item(v, digits ? Value(index) : Value(part));
    }
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

// The key sort, unique, min and max compare by: lower-cased strings unless case-sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(ascii_lower(v.str())) : v;
}

// A float's integer part, as Python's int() gives it for one that fits 64 bits.
std::optional<int64_t> truncated(double f) {
  const double t = std::trunc(f);
  if (!(t >= -0x1p63 && t < 0x1p63)) return std::nullopt;  // NaN, infinite or too large
  return static_cast<int64_t>(t);
}

// The filters. Each gets the name it was called by (a family's members, and an alias such as `d`
// for `default`, name themselves in their errors), the value piped into it and its arguments.
using Filter = Value (*)(const std::string& name, const Value& value, CallArgs& args);

Value filter_default(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"default_value", "boolean"});
  const bool use = value.is_undefined() || (b.flag(1, false) && !value.truthy());
  return use ? b.get(0, Value("")) : value;
}

Value filter_tojson(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  const Value indent = b.get(1);
  const int width = indent.is_none() ? -1 : static_cast<int>(int_arg(indent, "tojson indent"));
  std::string item_sep = width < 0 ? ", " : ",", key_sep = ": ";
  if (b.given(2) && !b.get(2).is_none()) {
    const Value seps = b.get(2);
    if (!seps.is_list() || seps.items().size() != 2) {
      throw ValueError("tojson: separators must be a pair of strings");
    }
    item_sep = str_arg(seps.items()[0], "tojson separators");
    key_sep = str_arg(seps.items()[1], "tojson separators");
  }
  return Value(to_json(value, width, b.flag(3, false), b.flag(0, false), item_sep, key_sep));
}

// length, count
Value filter_length(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value(static_cast<int64_t>(length(value)));
}

Value filter_string(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return value.is_string() ? value : Value(value.to_str());
}

Value filter_safe(const std::string&, const Value& value, CallArgs&) {
  return value.is_string() && value.is_safe() ? value : Value(value.to_str(), true);
}

// e, escape
Value filter_escape(const std::string&, const Value& value, CallArgs&) {
  if (value.is_safe()) return value;
  return Value(html_escape(value.to_str()), true);
}

Value filter_trim(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"chars"});
  return Value(strip(value.to_str(), b.get(0), true, true));
}

Value filter_upper(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value(ascii_upper(value.to_str()));
}

Value filter_lower(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value(ascii_lower(value.to_str()));
}

Value filter_title(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value(jinja_title(value.to_str()));
}

Value filter_capitalize(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value(capitalize(value.to_str()));
}

Value filter_replace(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"old", "new", "count"});
  const Value count = b.get(2);
  return Value(replace(value.to_str(), b.get(0).to_str(), b.get(1).to_str(),
                       count.is_none() ? -1 : int_arg(count, name)));
}

Value filter_items(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  if (value.is_undefined()) return Value::list({});
  if (!value.is_dict()) throw ValueError("Can only get item pairs from a mapping.");
  return pairs(value);
}

Value filter_dictsort(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"case_sensitive", "by", "reverse"});
  if (!value.is_dict()) throw ValueError("dictsort: expected a mapping, got " + value.type_name());
  const bool by_value = b.get(1, Value("key")).to_str() == "value";
  const bool cs = b.flag(0, false);
  std::vector<Value> items = pairs(value).items();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const std::size_t i = by_value ? 1 : 0;
    return less(sort_key(x.items()[i], cs), sort_key(y.items()[i], cs));
  });
  if (b.flag(2, false)) std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_list(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  return Value::list(iterate(value));
}

Value filter_first(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value filter_last(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  if (value.kind() == Value::Kind::kGenerator) {
    throw ValueError("'generator' object is not reversible");
  }
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value filter_reverse(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  if (value.is_string()) {
    auto cps = code_points(value.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value(std::move(out));
  }
  std::vector<Value> items = iterate(value);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_join(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"d", "attribute"});
  const std::string sep = b.get(0, Value("")).to_str();
  std::string out;
  bool first = true, safe = false;
  for (const Value& item : iterate(value)) {
    const Value v =
        b.given(1) && !b.get(1).is_none() ? attribute_path(item, b.get(1).to_str()) : item;
    if (!first) out += sep;
    out += v.to_str();
    safe = safe || v.is_safe();
    first = false;
  }
  return Value(std::move(out));
}

Value filter_map(const std::string& name, const Value& value, CallArgs& args) {
  std::vector<Value> out;
  const std::vector<Value> items = value.truthy() ? iterate(value) : std::vector<Value>{};
  const auto attr = std::find_if(args.keyword.begin(), args.keyword.end(),
                                 [](const auto& kv) { return kv.first == "attribute"; });
  if (attr != args.keyword.end()) {
    Bound b(name, args, {"attribute", "default"});
    for (const Value& item : items) {
      Value v = attribute_path(item, b.get(0).to_str());
      if (v.is_undefined() && b.given(1)) v = b.get(1);
      out.push_back(v);
    }
    return Value::generator(std::move(out));
  }
  if (args.positional.empty()) throw ValueError("map: expected a filter name or attribute=");
  const std::string filter = str_arg(args.positional[0], "map");
  if (!is_filter(filter)) throw ValueError("map: no filter named '" + filter + "'");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    CallArgs a = rest;
    out.push_back(apply_filter(filter, item, a));
  }
  return Value::generator(std::move(out));
}

// select, reject, selectattr, rejectattr
Value filter_select(const std::string& name, const Value& value, CallArgs& args) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep_when = name == "select" || name == "selectattr";
  std::size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) throw ValueError(name + ": missing the attribute");
    attribute = str_arg(args.positional[next++], name);
  }
  std::string test;
  if (next < args.positional.size()) test = str_arg(args.positional[next++], name);
  if (!test.empty() && !is_test(test)) throw ValueError(name + ": no test named '" + test + "'");
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                              args.positional.end());
  test_args.keyword = args.keyword;
  std::vector<Value> out;
  // jinja2 iterates only a true value (`if seq:`), so none selects nothing.
  for (const Value& item : value.truthy() ? iterate(value) : std::vector<Value>{}) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    CallArgs a = test_args;
    const bool pass = test.empty() ? subject.truthy() : apply_test(test, subject, a);
    if (pass == keep_when) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

// The key sort, unique, min and max order an item by: the item or its `attribute`, through
// sort_key.
Value item_key(const Value& item, const Value& attribute, bool case_sensitive) {
  return sort_key(attribute.is_none() ? item : attribute_path(item, attribute.to_str()),
                  case_sensitive);
}

Value filter_sort(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"reverse", "case_sensitive", "attribute"});
  const bool cs = b.flag(1, false);
  const Value attribute = b.get(2);
  const auto key = [&](const Value& item) { return item_key(item, attribute, cs); };
  std::vector<Value> items = iterate(value);
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return less(key(x), key(y)); });
  if (b.flag(0, false)) {
    // Python's reverse sort keeps equal items in their order.
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& x, const Value& y) { return less(key(y), key(x)); });
  }
  return Value::list(std::move(items));
}

Value filter_unique(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"case_sensitive", "attribute"});
  const bool cs = b.flag(0, false);
  const Value attribute = b.get(1);
  std::vector<Value> out, seen;
  for (const Value& item : iterate(value)) {
    const Value k = item_key(item, attribute, cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

// min, max
Value filter_min_max(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"case_sensitive", "attribute"});
  const bool cs = b.flag(0, false);
  const Value attribute = b.get(1);
  const auto key = [&](const Value& item) { return item_key(item, attribute, cs); };
  const std::vector<Value> items = iterate(value);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool min = name == "min";
  Value best = items[0];
  for (const Value& item : items) {
    if (min ? less(key(item), key(best)) : less(key(best), key(item))) best = item;
  }
  return best;
}

Value filter_sum(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"attribute", "start"});
  Value total = b.get(1, Value(0));
  for (const Value& item : iterate(value)) {
    total = add(total, b.get(0).is_none() ? item : attribute_path(item, b.get(0).to_str()));
  }
  return total;
}

Value filter_abs(const std::string& name, const Value& value, CallArgs& args) {
  no_args(name, args);
  if (value.kind() == Value::Kind::kFloat) return Value(std::fabs(value.as_float()));
  if (value.is_int() || value.kind() == Value::Kind::kBool) {
    return value.as_int() < 0 ? arithmetic('-', Value(0), value) : Value(value.as_int());
  }
  throw ValueError("bad operand type for abs(): '" + value.type_name() + "'");
}

Value filter_int(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"default", "base"});
  const Value fallback = b.get(0, Value(0));
  if (value.kind() == Value::Kind::kInt || value.kind() == Value::Kind::kBool) {
    return Value(value.as_int());
  }
  // jinja2 gives the default for NaN; Python's int() of a larger float is past 64 bits.
  const auto from_float = [&](double f) {
    if (std::isnan(f)) return fallback;
    if (const auto i = truncated(f)) return Value(*i);
    throw ValueError("int: " + Value(f).repr() + " does not fit in 64 bits");
  };
  if (value.kind() == Value::Kind::kFloat) return from_float(value.as_float());
  if (value.is_string()) {
    const std::string s = strip(value.str(), Value::none(), true, true);
    try {
      std::size_t used = 0;
      const int64_t i = std::stoll(s, &used, static_cast<int>(int_arg(b.get(1, Value(10)), name)));
      if (used == s.size()) return Value(i);
    } catch (const std::exception&) {
    }
    std::optional<double> f;
    try {
      std::size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) f = d;
    } catch (const std::exception&) {
    }
    if (f) return from_float(*f);
  }
  return fallback;
}

Value filter_float(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"default"});
  if (value.is_number() || value.kind() == Value::Kind::kBool) return Value(value.as_float());
  if (value.is_string()) {
    const std::string s = strip(value.str(), Value::none(), true, true);
    try {
      std::size_t used = 0;
      const double f = std::stod(s, &used);
      if (used == s.size()) return Value(f);
    } catch (const std::exception&) {
    }
  }
  return b.get(0, Value(0.0));
}

Value filter_round(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"precision", "method"});
  const int64_t precision = int_arg(b.get(0, Value(0)), name);
  const std::string method = b.get(1, Value("common")).to_str();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = value.as_float() * scale;
  double r = 0;
  if (method == "common") {
    r = std::round(x);  // half away from zero
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    throw ValueError("round: method must be 'common', 'ceil' or 'floor'");
  }
  return Value(r / scale);
}

Value filter_indent(const std::string& name, const Value& value, CallArgs& args) {
  Bound b(name, args, {"width", "first", "blank"});
  const Value width = b.get(0, Value(4));
  const std::string pad =
      width.is_string()
          ? width.str()
          : std::string(static_cast<std::size_t>(std::max<int64_t>(int_arg(width, name), 0)),
                        ' ');  // ' ' * -1 is '' in Python
  std::vector<std::string> lines = splitlines(value.to_str() + "\n");
  std::string out;
  if (b.flag(2, false)) {
    for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + pad : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (std::size_t i = 1; i < lines.size(); ++i) {
      out += "\n" + (lines[i].empty() ? lines[i] : pad + lines[i]);
    }
  }
  if (b.flag(1, false)) out = pad + out;
  return Value(std::move(out));
}

// Every filter by name (is_filter reads it too), built on first use.
const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"abs", filter_abs},           {"capitalize", filter_capitalize},
      {"count", filter_length},      {"d", filter_default},
      {"default", filter_default},   {"dictsort", filter_dictsort},
      {"e", filter_escape},          {"escape", filter_escape},
      {"first", filter_first},       {"float", filter_float},
      {"indent", filter_indent},     {"int", filter_int},
      {"items", filter_items},       {"join", filter_join},
      {"last", filter_last},         {"length", filter_length},
      {"list", filter_list},         {"lower", filter_lower},
      {"map", filter_map},           {"max", filter_min_max},
      {"min", filter_min_max},       {"reject", filter_select},
      {"rejectattr", filter_select}, {"replace", filter_replace},
      {"reverse", filter_reverse},   {"round", filter_round},
      {"safe", filter_safe},         {"select", filter_select},
      {"selectattr", filter_select}, {"sort", filter_sort},
      {"string", filter_string},     {"sum", filter_sum},
      {"title", filter_title},       {"tojson", filter_tojson},
      {"trim", filter_trim},         {"unique", filter_unique},
      {"upper", filter_upper},
  };
  return table;
}

// The tests. Most look at the value alone (and ignore any arguments); the others compare it with
// one argument, which they require.
using ValueTest = bool (*)(const Value& value);
struct ArgumentTest {
  const char* param;  // the argument's name, for keyword calls
  bool (*test)(const Value& value, const Value& arg);
};

bool is_same_object(const Value& value, const Value& other) {
  using K = Value::Kind;
  if (value.kind() != other.kind()) return false;
  switch (value.kind()) {
    case K::kNone:
    case K::kUndefined:
      return true;
    case K::kBool:
      return value.as_bool() == other.as_bool();
    case K::kList:
      return &value.items() == &other.items();
    case K::kDict:
    case K::kNamespace:
      return &value.dict() == &other.dict();
    default:
      return equals(value, other);
  }
}

bool is_ascii_cased(const Value& value, const char* method) {
  const std::string s = value.to_str();
  CallArgs none;
  return call_method(Value(s), method, none).truthy();
}

const std::unordered_map<std::string_view, ValueTest>& value_tests() {
  using K = Value::Kind;
  static const std::unordered_map<std::string_view, ValueTest> table = {
      {"defined", [](const Value& v) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v) { return v.is_undefined(); }},
      {"none", [](const Value& v) { return v.is_none(); }},
      {"boolean", [](const Value& v) { return v.kind() == K::kBool; }},
      {"true", [](const Value& v) { return v.kind() == K::kBool && v.as_bool(); }},
      {"false", [](const Value& v) { return v.kind() == K::kBool && !v.as_bool(); }},
      {"string", [](const Value& v) { return v.is_string(); }},
      {"number", [](const Value& v) { return v.is_number() || v.kind() == K::kBool; }},
      {"integer", [](const Value& v) { return v.is_int(); }},
      {"float", [](const Value& v) { return v.kind() == K::kFloat; }},
      {"mapping", [](const Value& v) { return v.is_dict(); }},
      {"sequence",
       [](const Value& v) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"iterable",
       [](const Value& v) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() ||
                v.kind() == K::kGenerator;
       }},
      {"callable", [](const Value& v) { return v.kind() == K::kCallable; }},
      {"odd", [](const Value& v) { return arithmetic('%', v, Value(2)).as_int() == 1; }},
      {"even", [](const Value& v) { return arithmetic('%', v, Value(2)).as_int() != 1; }},
      {"lower", [](const Value& v) { return is_ascii_cased(v, "islower"); }},
      {"upper", [](const Value& v) { return is_ascii_cased(v, "isupper"); }},
  };
  return table;
}

const std::unordered_map<std::string_view, ArgumentTest>& argument_tests() {
  const auto eq = [](const Value& v, const Value& o) { return equals(v, o); };
  const auto ne = [](const Value& v, const Value& o) { return !equals(v, o); };
  const auto lt = [](const Value& v, const Value& o) { return less(v, o); };
  const auto gt = [](const Value& v, const Value& o) { return less(o, v); };
  const auto le = [](const Value& v, const Value& o) { return !less(o, v); };
  const auto ge = [](const Value& v, const Value& o) { return !less(v, o); };
  static const std::unordered_map<std::string_view, ArgumentTest> table = {
      {"divisibleby",
       {"num",
        [](const Value& v, const Value& n) { return arithmetic('%', v, n).as_float() == 0; }}},
      {"eq", {"other", eq}},
      {"equalto", {"other", eq}},
      {"==", {"other", eq}},
      {"ne", {"other", ne}},
      {"!=", {"other", ne}},
      {"lt", {"other", lt}},
      {"lessthan", {"other", lt}},
      {"<", {"other", lt}},
      {"gt", {"other", gt}},
      {"greaterthan", {"other", gt}},
      {">", {"other", gt}},
      {"le", {"other", le}},
      {"<=", {"other", le}},
      {"ge", {"other", ge}},
      {">=", {"other", ge}},
      {"in", {"seq", [](const Value& v, const Value& seq) { return contains(seq, v); }}},
      {"sameas", {"other", is_same_object}},
  };
  return table;
}

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) > 0; }
bool is_test(const std::string& name) {
  return value_tests().count(name) > 0 || argument_tests().count(name) > 0;
}
bool is_method(const std::string& name) {
  return kStringMethods.count(name) || kDictMethods.count(name) || kListMethods.count(name) ||
         kUnsafeDictMethods.count(name) || kUnsafeListMethods.count(name);
}
bool is_global_function(const std::string& name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      obj.fail_undefined();
    case Value::Kind::kString:
      if (kStringMethods.count(name)) return bound_method(obj, name);
      break;
    case Value::Kind::kDict: {
      if (kDictMethods.count(name)) return bound_method(obj, name);
      if (kUnsafeDictMethods.count(name)) return unsafe(obj, name);
      if (const Value* v = obj.dict().find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.dict().find(name)) return *v;
      break;
    case Value::Kind::kList:
      if (kListMethods.count(name)) return bound_method(obj, name);
      if (kUnsafeListMethods.count(name)) return unsafe(obj, name);
      break;
    default:
      break;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  const bool int_key = key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().find_value(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && int_key) {
    const bool list = obj.is_list();
    std::vector<std::string> cps;
    if (!list) cps = code_points(obj.str());
    const auto n = static_cast<int64_t>(list ? obj.items().size() : cps.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      return list ? obj.items()[static_cast<std::size_t>(i)]
                  : Value(cps[static_cast<std::size_t>(i)]);
    }
    return Value::undefined(obj.type_name() + " object has no element " + key.repr());
  }
  if (key.is_string()) {
    Value v = get_attribute(obj, key.str());
    if (obj.is_dict() && v.is_undefined() && v.str().find("unsafe") == std::string::npos) {
      return Value::undefined("'dict object' has no attribute '" + key.str() + "'");
    }
    return v;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no element " + key.repr());
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (!obj.is_list() && !obj.is_string()) {
    throw ValueError("'" + obj.type_name() + "' object is not subscriptable");
  }
  const bool list = obj.is_list();
  std::vector<std::string> cps;
  if (!list) cps = code_points(obj.str());
  const auto n = static_cast<int64_t>(list ? obj.items().size() : cps.size());
  const auto bound = [](const Value& v) { return v.is_none() || v.is_undefined(); };
  const int64_t st = bound(step) ? 1 : int_arg(step, "slice step");
  if (st == 0) throw ValueError("slice step cannot be zero");
  const auto clamp = [&](const Value& v, int64_t fallback) {
    if (bound(v)) return fallback;
    int64_t i = int_arg(v, "slice index");
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, st > 0 ? n : -1);
  std::vector<Value> items;
  std::string s;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    if (list) {
      items.push_back(obj.items()[static_cast<std::size_t>(i)]);
    } else {
      s += cps[static_cast<std::size_t>(i)];
    }
    if (__builtin_add_overflow(i, st, &i)) break;  // a step past int64 leaves the sequence
  }
  return list ? Value::list(std::move(items), obj.is_tuple()) : Value(std::move(s));
}

bool apply_test(const std::string& name, const Value& value, CallArgs& args) {
  if (const auto it = value_tests().find(name); it != value_tests().end()) return it->second(value);
  const auto it = argument_tests().find(name);
  if (it == argument_tests().end()) {
    throw ValueError("the test '" + name + "' is outside the Jinja subset baton supports");
  }
  Bound b(name, args, {it->second.param});
  if (!b.given(0)) throw ValueError("the test '" + name + "' takes an argument");
  return it->second.test(value, b.get(0));
}

Value apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) {
    throw ValueError("the filter '" + name + "' is outside the Jinja subset baton supports");
  }
  return it->second(name, value, args);
}

}  // namespace baton::data::jinja
