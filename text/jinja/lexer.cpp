#include "text/jinja/lexer.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "text/jinja/error.h"
#include "text/utf8.h"

namespace baton::data::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Operators, longest first so that "//" wins over "/".
constexpr std::array<const char*, 26> kOperators = {
    "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
    "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

// "\r\n" and "\r" become "\n"; one trailing newline goes (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      out += '\n';
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      out += text[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body; unknown escapes stay as they
// are, as in Python.
std::string unescape(const std::string& body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const std::size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        char32_t cp = 0;
        bool ok = i + digits < body.size();
        for (std::size_t k = 1; ok && k <= digits; ++k) {
          const int h = hex_value(body[i + k]);
          if (h < 0) ok = false;
          cp = cp * 16 + static_cast<char32_t>(h);
        }
        if (!ok || cp > 0x10FFFF) throw std::invalid_argument("truncated \\" + std::string(1, c));
        utf8::append(out, cp);
        i += digits;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          unsigned v = 0;
          std::size_t k = 0;
          for (; k < 3 && i + k < body.size() && body[i + k] >= '0' && body[i + k] <= '7'; ++k) {
            v = v * 8 + static_cast<unsigned>(body[i + k] - '0');
          }
          utf8::append(out, v);
          i += k - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string text, const std::string& source) : src_(std::move(text)), source_(source) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const std::size_t tag = next_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      if (tag == std::string::npos) {
        emit_data(text);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text.erase(std::find_if_not(text.rbegin(), text.rend(), is_space).base(), text.end());
      } else if (sign != '+' && kind != '{') {
        const std::size_t line_begin = text.rfind('\n') + 1;  // 0 when npos
        if ((line_begin > 0 || line_starting) && line_begin < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_begin), text.end(),
                        is_space)) {
          text.erase(line_begin);
        }
      }
      emit_data(text);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      line_ = line_at(pos_);
      if (kind == '#') {
        line_starting = comment();
      } else {
        line_starting = tag_contents(kind == '{');
      }
    }
    tokens_.push_back({Token::Type::kEnd, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw JinjaError(source_ + ":" + std::to_string(line) + ": chat_template: " + what);
  }

  std::size_t next_tag(std::size_t from) const {
    for (std::size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
    }
    return std::string::npos;
  }

  int line_at(std::size_t p) {
    for (; counted_ < p && counted_ < src_.size(); ++counted_)
      counted_line_ += src_[counted_] == '\n';
    return counted_line_;
  }

  void emit_data(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Type::kData, text, line_at(pos_)});
  }

  // After `{#`: returns whether what the comment consumed ends with a newline.
  bool comment() {
    const std::size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail(line_, "unterminated comment (missing '#}')");
    pos_ = end + 2;
    const char sign = end > 0 ? src_[end - 1] : '\0';
    return after_tag_end(sign, /*trim=*/true);
  }

  // Skips what follows a tag's end: all whitespace after `-`, nothing after `+`, else one
  // newline when `trim` (trim_blocks). Returns whether the consumed text ends with a newline.
  bool after_tag_end(char sign, bool trim) {
    if (sign == '-') {
      const std::size_t start = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      return pos_ > start && src_[pos_ - 1] == '\n';
    }
    if (sign != '+' && trim && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  // The inside of `{{ }}` (`variable`) or `{% %}`, up to and including its end.
  bool tag_contents(bool variable) {
    tokens_.push_back(
        {variable ? Token::Type::kVariableBegin : Token::Type::kBlockBegin, "", line_});
    const int start_line = line_;
    std::vector<char> brackets;
    bool first = true;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        fail(start_line,
             variable ? "unterminated '{{' (missing '}}')" : "unterminated '{%' (missing '%}')");
      }
      const int line = line_at(pos_);
      const char* end = variable ? "}}" : "%}";
      if (brackets.empty()) {
        for (const char sign : {'-', '+', '\0'}) {
          if (sign == '+' && variable) continue;
          const std::string marker = sign ? std::string(1, sign) + end : std::string(end);
          if (src_.compare(pos_, marker.size(), marker) == 0) {
            pos_ += marker.size();
            tokens_.push_back(
                {variable ? Token::Type::kVariableEnd : Token::Type::kBlockEnd, "", line});
            return after_tag_end(sign, /*trim=*/!variable);
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const std::size_t b = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        const std::string name = src_.substr(b, pos_ - b);
        if (!variable && first && name == "raw") {
          fail(line, "'{% raw %}' is outside the Jinja subset baton supports");
        }
        tokens_.push_back({Token::Type::kName, name, line});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number(line);
      } else if (c == '\'' || c == '"') {
        string_literal(c, line);
      } else {
        bool matched = false;
        for (const char* op : kOperators) {
          const std::string o = op;
          if (src_.compare(pos_, o.size(), o) != 0) continue;
          if (o == "(" || o == "[" || o == "{") brackets.push_back(o[0]);
          if (o == ")" || o == "]" || o == "}") {
            const char open = o == ")" ? '(' : o == "]" ? '[' : '{';
            if (brackets.empty() || brackets.back() != open) fail(line, "unexpected '" + o + "'");
            brackets.pop_back();
          }
          tokens_.push_back({Token::Type::kOperator, o, line});
          pos_ += o.size();
          matched = true;
          break;
        }
        if (!matched) fail(line, std::string("unexpected character '") + c + "'");
      }
      first = false;
    }
  }

  void number(int line) {
    const std::size_t b = pos_;
    const auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      std::size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos_ = p;
        digits();
      }
    }
    std::string text = src_.substr(b, pos_ - b);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInteger, text, line});
  }

  void string_literal(char quote, int line) {
    std::size_t p = pos_ + 1;
    std::string body;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] == '\\' && p + 1 < src_.size()) body += src_[p++];
      body += src_[p++];
    }
    if (p >= src_.size()) fail(line, "unterminated string literal");
    pos_ = p + 1;
    try {
      tokens_.push_back({Token::Type::kString, unescape(body), line});
    } catch (const std::invalid_argument& e) {
      fail(line, std::string("bad escape in a string literal: ") + e.what());
    }
  }

  std::string src_;
  const std::string& source_;
  std::size_t pos_ = 0;
  int line_ = 1;
  std::size_t counted_ = 0;
  int counted_line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& text, const std::string& source) {
  return Lexer(normalize_newlines(text), source).run();
}

}  // namespace baton::data::jinja
