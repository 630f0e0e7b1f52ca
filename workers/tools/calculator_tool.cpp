#include "workers/tools/calculator_tool.h"

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>

#include "base/errors.h"

namespace baton::tools {
namespace {

using detail::cat;

// A reduced fraction: den > 0, gcd(num, den) == 1, and num != INT64_MIN, so that every value
// negates and std::gcd never sees a magnitude it cannot represent.
struct Fraction {
  int64_t num = 0;
  int64_t den = 1;
};

// A recursive-descent evaluator, one precedence level per function:
//   sum     := product (('+' | '-') product)*
//   product := unary (('*' | '/') unary)*
//   unary   := ('-' | '+') unary | power
//   power   := primary ('^' unary)?
//   primary := number | '(' sum ')'
class Evaluator {
 public:
  explicit Evaluator(std::string_view text) : text_(text) {}

  Fraction evaluate() {
    skip_space();
    if (pos_ == text_.size()) fail("the expression is empty", pos_);
    const Fraction value = sum();
    skip_space();
    if (pos_ < text_.size()) unexpected("expected an operator or the end of the expression");
    return value;
  }

 private:
  // Counts one level of nesting for as long as it lives.
  class Nesting {
   public:
    Nesting(Evaluator& e, size_t at) : e_(e) {
      if (++e_.depth_ > kMaxNestingDepth)
        e_.fail(cat("more than ", kMaxNestingDepth, " nested parentheses or signs"), at);
    }
    ~Nesting() { --e_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Evaluator& e_;
  };

  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw InvalidArgument(cat(what, " at position ", at + 1));
  }

  // The character at pos_ is not what the grammar allows there.
  [[noreturn]] void unexpected(const std::string& expected) const {
    if (pos_ == text_.size()) fail("unexpected end of the expression: " + expected, pos_);
    const char c = text_[pos_];
    if (c == '*' && pos_ > 0 && text_[pos_ - 1] == '*')
      fail("'**' is not supported (use '^' for powers)", pos_ - 1);
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (letter)
      fail(cat("unexpected '", c, "': names and functions are not allowed, only numbers, ",
               "+ - * / ^ and parentheses"),
           pos_);
    if (c > ' ' && c < 127) fail(cat("unexpected '", c, "': ", expected), pos_);
    fail("unexpected character: " + expected, pos_);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  bool is_digit(size_t at) const {
    return at < text_.size() && text_[at] >= '0' && text_[at] <= '9';
  }

  [[noreturn]] void overflow(size_t at) const {
    fail("overflow: a value does not fit in 64-bit integers", at);
  }

  int64_t checked_add(int64_t a, int64_t b, size_t at) const {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r) || r == std::numeric_limits<int64_t>::min()) overflow(at);
    return r;
  }

  int64_t checked_mul(int64_t a, int64_t b, size_t at) const {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || r == std::numeric_limits<int64_t>::min()) overflow(at);
    return r;
  }

  // num/den reduced. REQUIRES: den != 0; neither is INT64_MIN.
  static Fraction reduced(int64_t num, int64_t den) {
    if (den < 0) {
      num = -num;
      den = -den;
    }
    const int64_t g = std::gcd(num, den);
    return {num / g, den / g};
  }

  Fraction add(Fraction a, Fraction b, size_t at) const {
    const int64_t g = std::gcd(a.den, b.den);
    const int64_t num =
        checked_add(checked_mul(a.num, b.den / g, at), checked_mul(b.num, a.den / g, at), at);
    return reduced(num, checked_mul(a.den / g, b.den, at));
  }

  Fraction multiply(Fraction a, Fraction b, size_t at) const {
    // Cross-reduce first, so that only a product that really overflows does.
    const int64_t g1 = std::gcd(a.num, b.den);
    const int64_t g2 = std::gcd(b.num, a.den);
    return reduced(checked_mul(a.num / g1, b.num / g2, at),
                   checked_mul(a.den / g2, b.den / g1, at));
  }

  Fraction divide(Fraction a, Fraction b, size_t at) const {
    if (b.num == 0) fail("division by zero", at);
    return multiply(a, reduced(b.den, b.num), at);
  }

  Fraction power(Fraction base, Fraction exponent, size_t at) const {
    if (exponent.den != 1) fail("the exponent of '^' must be an integer", at);
    int64_t e = exponent.num;
    if (e < 0) {
      if (base.num == 0) fail("division by zero (0 to a negative power)", at);
      base = reduced(base.den, base.num);
      e = -e;
    }
    if (e == 0) return {1, 1};
    if (base.num == 0) return {0, 1};
    if (base.den == 1 && (base.num == 1 || base.num == -1)) return {e % 2 == 0 ? 1 : base.num, 1};
    // |num| >= 2 or den >= 2: this overflows within 63 steps, however large e is.
    Fraction result{1, 1};
    for (int64_t i = 0; i < e; ++i) result = multiply(result, base, at);
    return result;
  }

  Fraction sum() {
    Fraction value = product();
    for (;;) {
      skip_space();
      if (pos_ == text_.size() || (text_[pos_] != '+' && text_[pos_] != '-')) return value;
      const size_t at = pos_++;
      Fraction rhs = product();
      if (text_[at] == '-') rhs.num = -rhs.num;
      value = add(value, rhs, at);
    }
  }

  Fraction product() {
    Fraction value = unary();
    for (;;) {
      skip_space();
      if (pos_ == text_.size() || (text_[pos_] != '*' && text_[pos_] != '/')) return value;
      const size_t at = pos_++;
      const Fraction rhs = unary();
      value = text_[at] == '*' ? multiply(value, rhs, at) : divide(value, rhs, at);
    }
  }

  Fraction unary() {
    skip_space();
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) {
      const Nesting nesting(*this, pos_);
      const bool negate = text_[pos_++] == '-';
      Fraction value = unary();
      if (negate) value.num = -value.num;
      return value;
    }
    return power_expression();
  }

  Fraction power_expression() {
    const Fraction base = primary();
    skip_space();
    if (pos_ == text_.size() || text_[pos_] != '^') return base;
    const size_t at = pos_++;
    const Nesting nesting(*this, at);
    return power(base, unary(), at);
  }

  Fraction primary() {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '(') {
      const size_t open = pos_++;
      const Nesting nesting(*this, open);
      const Fraction value = sum();
      skip_space();
      if (pos_ == text_.size() || text_[pos_] != ')')
        unexpected(cat("expected ')' to close the '(' at position ", open + 1));
      ++pos_;
      return value;
    }
    if (is_digit(pos_)) return number();
    unexpected("expected a number or '('");
  }

  // digits ('.' digits)?, exactly: 1.25 is 125/100 = 5/4.
  Fraction number() {
    const size_t start = pos_;
    int64_t num = 0;
    int64_t den = 1;
    while (is_digit(pos_))
      num = checked_add(checked_mul(num, 10, start), text_[pos_++] - '0', start);
    if (pos_ < text_.size() && text_[pos_] == '.') {
      if (!is_digit(pos_ + 1)) fail("a decimal point must be followed by digits", pos_);
      ++pos_;
      const size_t digits = pos_;
      while (is_digit(pos_)) ++pos_;
      // Trailing zeros add nothing (1.500 is 1.5); skipping them keeps den small.
      size_t end = pos_;
      while (end > digits && text_[end - 1] == '0') --end;
      for (size_t i = digits; i < end; ++i) {
        num = checked_add(checked_mul(num, 10, start), text_[i] - '0', start);
        den = checked_mul(den, 10, start);
      }
    }
    return reduced(num, den);
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string evaluate_expression(std::string_view expression) {
  if (expression.size() > kMaxExpressionLength)
    throw InvalidArgument(cat("the expression has ", expression.size(), " characters; at most ",
                              kMaxExpressionLength, " are allowed"));
  const Fraction value = Evaluator(expression).evaluate();
  if (value.den == 1) return std::to_string(value.num);
  return cat(value.num, "/", value.den);
}

nlohmann::ordered_json calculator_tool_schema() {
  return nlohmann::ordered_json::parse(R"({
    "type": "function",
    "function": {
      "name": "calculator",
      "description": "Evaluates an arithmetic expression exactly: integers and decimals, + - * / ^ (integer powers) and parentheses. The result is an integer or a reduced fraction p/q.",
      "parameters": {
        "type": "object",
        "properties": {
          "expression": {
            "type": "string",
            "description": "The expression, e.g. \"(12 + 30) * 3 / 4\"."
          }
        },
        "required": ["expression"]
      }
    }
  })");
}

ToolResult calculator_tool(const nlohmann::json& arguments, const nlohmann::json& tools_kwargs) {
  const auto it = arguments.find("expression");
  if (it == arguments.end() || !it->is_string())
    throw InvalidArgument(R"("expression" must be a string, e.g. "(3 + 4) * 2")");
  ToolResult r;
  r.text = evaluate_expression(it->get_ref<const std::string&>());
  return r;
}

}  // namespace baton::tools
