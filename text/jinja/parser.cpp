#include "text/jinja/parser.h"

#include <set>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/lexer.h"

namespace baton::data::jinja {
namespace {

using T = Token::Type;

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprPtr unary(Expr::Kind kind, ExprPtr arg, int line) {
  auto e = make(kind, line);
  e->args.push_back(std::move(arg));
  return e;
}

// The deepest nesting a template may have (see Parser::Nesting).
constexpr int kMaxNesting = 200;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& source)
      : tokens_(std::move(tokens)), source_(source) {}

  Body run() {
    Body body = subparse({});
    if (cur().type != T::kEnd) fail(cur().line, "unexpected '" + cur().value + "'");
    check(body, /*soft=*/false);
    for (const auto& [name, line] : called_) {
      if (!macros_.count(name) && !is_global_function(name)) {
        fail(line, "the function '" + name +
                       "' is outside the Jinja subset baton supports (it is neither a macro of "
                       "the template nor one of range, namespace, dict, raise_exception, "
                       "strftime_now)");
      }
    }
    return body;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw JinjaError(source_ + ":" + std::to_string(line) + ": chat_template: " + what);
  }
  [[noreturn]] void outside(int line, const std::string& construct) const {
    fail(line, construct + " is outside the Jinja subset baton supports");
  }

  // The value of an integer or float token (ints are 64-bit here, unbounded in Python).
  Value number(const Token& t) const {
    try {
      return t.type == T::kInteger ? Value(static_cast<int64_t>(std::stoll(t.value)))
                                   : Value(std::stod(t.value));
    } catch (const std::exception&) {
      fail(t.line, "the number " + t.value + " is out of range");
    }
  }

  // One level of nesting (a bracket, a unary operator, an inline `else`, a block): the parser
  // recurses at each, so a bound keeps a hostile template from overflowing the stack. jinja2
  // refuses such templates too (Python's recursion and parenthesis limits).
  class Nesting {
   public:
    Nesting(Parser& parser, int line) : parser_(parser) {
      if (parser_.depth_ == kMaxNesting) {
        parser_.fail(line, "the template nests more than " + std::to_string(kMaxNesting) +
                               " levels deep (brackets, operators, blocks)");
      }
      ++parser_.depth_;
    }
    ~Nesting() { --parser_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser& parser_;
  };

  // Unknown filters and tests fail here, except where jinja2 defers the error to when the
  // expression runs: directly inside an `if` (its tests and branches, not a loop or macro
  // within it) and inside `x if c else y`.
  void check(const Body& body, bool soft) const {
    for (const auto& n : body) check(*n, soft);
  }
  void check(const Node& n, bool soft) const {
    const auto expr = [&](const ExprPtr& e, bool s) {
      if (e) check(*e, s);
    };
    switch (n.kind) {
      case Node::Kind::kIf:
        for (const auto& c : n.conditions) expr(c, true);
        for (const auto& b : n.bodies) check(b, true);
        check(n.else_body, true);
        return;
      case Node::Kind::kFor:
        expr(n.expr, soft);
        expr(n.condition, false);
        check(n.body, false);
        check(n.else_body, false);
        return;
      case Node::Kind::kMacro:
        for (const auto& p : n.params) expr(p.second, false);
        check(n.body, false);
        return;
      default:
        expr(n.expr, soft);
        check(n.body, false);
    }
  }
  void check(const Expr& e, bool soft) const {
    if (e.kind == Expr::Kind::kFilter && !soft && !is_filter(e.name)) {
      outside(e.line, "the filter '" + e.name + "'");
    }
    if (e.kind == Expr::Kind::kTest && !soft && !is_test(e.name)) {
      outside(e.line, "the test '" + e.name + "'");
    }
    for (const auto& a : e.args) {
      if (a) check(*a, soft || e.kind == Expr::Kind::kCondition);
    }
    for (const auto& k : e.keywords) check(*k.second, soft || e.kind == Expr::Kind::kCondition);
  }

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(std::size_t n = 1) const {
    return tokens_[std::min(pos_ + n, tokens_.size() - 1)];
  }
  Token next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op) const { return cur().type == T::kOperator && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == T::kName && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case T::kEnd:
        return "end of template";
      case T::kBlockEnd:
        return "end of statement block";
      case T::kVariableEnd:
        return "end of print statement";
      case T::kData:
        return "template data";
      default:
        return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      fail(cur().line, std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != T::kName) fail(cur().line, "expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect(T type, const char* what) {
    if (cur().type != type)
      fail(cur().line, std::string("expected ") + what + ", got " + describe(cur()));
    ++pos_;
  }

  // Nodes up to a `{% name %}` with name in `ends` (left at that name) or the end of input.
  Body subparse(const std::set<std::string>& ends) {
    Body body;
    while (cur().type != T::kEnd) {
      const Token& t = cur();
      if (t.type == T::kData) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = t.line;
        n->text = t.value;
        body.push_back(std::move(n));
        ++pos_;
      } else if (t.type == T::kVariableBegin) {
        ++pos_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = t.line;
        n->expr = parse_tuple(true);
        expect(T::kVariableEnd, "'}}'");
        body.push_back(std::move(n));
      } else if (t.type == T::kBlockBegin) {
        ++pos_;
        if (cur().type == T::kName && ends.count(cur().value)) return body;
        body.push_back(statement());
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
    if (!ends.empty()) {
      std::string names;
      for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
      fail(cur().line, "unexpected end of template: expected " + names);
    }
    return body;
  }

  // A statement after its `{%`, through its (last) `%}`.
  NodePtr statement() {
    const Token t = cur();
    const Nesting nesting(*this, t.line);
    if (t.type != T::kName) fail(t.line, "expected a statement name, got " + describe(t));
    auto n = std::make_unique<Node>();
    n->line = t.line;
    const std::string& s = t.value;
    ++pos_;
    const auto block_end = [&] { expect(T::kBlockEnd, "'%}'"); };
    if (s == "if") {
      n->kind = Node::Kind::kIf;
      n->conditions.push_back(parse_tuple(true));
      block_end();
      while (true) {
        n->bodies.push_back(subparse({"elif", "else", "endif"}));
        const std::string tag = next().value;
        if (tag == "elif") {
          n->conditions.push_back(parse_tuple(true));
          block_end();
          continue;
        }
        if (tag == "else") {
          block_end();
          n->else_body = subparse({"endif"});
          ++pos_;
        }
        break;
      }
    } else if (s == "for") {
      n->kind = Node::Kind::kFor;
      do {
        n->targets.push_back(expect_name());
      } while (skip_op(","));
      if (!skip_name("in")) fail(cur().line, "expected 'in' in a for loop, got " + describe(cur()));
      n->expr = parse_tuple(false);
      if (skip_name("if")) n->condition = parse_expression(true);
      if (is_name("recursive")) outside(cur().line, "a recursive for loop");
      block_end();
      n->body = subparse({"endfor", "else"});
      if (next().value == "else") {
        block_end();
        n->else_body = subparse({"endfor"});
        ++pos_;
      }
    } else if (s == "set") {
      n->targets.push_back(expect_name());
      if (skip_op(".")) {
        n->attribute = expect_name();
      } else {
        while (skip_op(",")) n->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        n->kind = Node::Kind::kSet;
        n->expr = parse_tuple(true);
      } else {
        if (n->targets.size() != 1 || !n->attribute.empty()) {
          fail(t.line, "a block set takes one name");
        }
        n->kind = Node::Kind::kSetBlock;
        if (is_op("|")) n->expr = parse_filter(nullptr, false);
        block_end();
        n->body = subparse({"endset"});
        ++pos_;
      }
    } else if (s == "macro") {
      n->kind = Node::Kind::kMacro;
      n->name = expect_name();
      macros_.insert(n->name);
      expect_op("(");
      while (!is_op(")")) {
        if (!n->params.empty()) expect_op(",");
        if (is_op(")")) break;
        std::string param = expect_name();
        ExprPtr fallback;
        if (skip_op("=")) fallback = parse_expression(true);
        n->params.emplace_back(std::move(param), std::move(fallback));
      }
      expect_op(")");
      block_end();
      n->body = subparse({"endmacro"});
      ++pos_;
    } else if (s == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      n->expr = parse_filter(nullptr, true);
      block_end();
      n->body = subparse({"endfilter"});
      ++pos_;
    } else if (s == "generation") {
      n->kind = Node::Kind::kGeneration;
      block_end();
      n->body = subparse({"endgeneration"});
      ++pos_;
    } else if (s == "break" || s == "continue") {
      n->kind = s == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    } else {
      outside(t.line, "the statement '" + s + "'");
    }
    block_end();
    return n;
  }

  // Expressions separated by commas make a tuple (`for` iterables: without `x if c else y`).
  ExprPtr parse_tuple(bool with_condition) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (cur().type == T::kBlockEnd || cur().type == T::kVariableEnd || is_op(")") ||
          (!items.empty() && (is_name("if") || is_name("recursive")))) {
        break;
      }
      items.push_back(with_condition ? parse_expression(true) : parse_or());
    }
    if (!comma) {
      if (items.empty()) fail(line, "expected an expression, got " + describe(cur()));
      return std::move(items[0]);
    }
    auto e = make(Expr::Kind::kList, line);
    e->tuple = true;
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condition) {
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      const Nesting nesting(*this, line);
      auto c = make(Expr::Kind::kCondition, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      c->args.push_back(skip_name("else") ? parse_condition() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto o = make(Expr::Kind::kOr, next().line);
      o->args.push_back(std::move(e));
      o->args.push_back(parse_and());
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto a = make(Expr::Kind::kAnd, next().line);
      a->args.push_back(std::move(e));
      a->args.push_back(parse_not());
      e = std::move(a);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      const Nesting nesting(*this, line);
      return unary(Expr::Kind::kNot, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    auto c = make(Expr::Kind::kCompare, line);
    c->args.push_back(std::move(first));
    while (true) {
      std::string op;
      if (cur().type == T::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        ++pos_;
        op = "in";
      } else if (is_name("not") && peek().type == T::kName && peek().value == "in") {
        pos_ += 2;
        op = "notin";
      } else {
        break;
      }
      c->ops.push_back(op);
      c->args.push_back(parse_math1());
    }
    if (c->ops.empty()) return std::move(c->args[0]);
    return c;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::kBinary, line);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      e = binary(op.value, std::move(e), parse_concat(), op.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token op = next();
      e = binary("~", std::move(e), parse_math2(), op.line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      e = binary(op.value, std::move(e), parse_pow(), op.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token op = next();
      e = binary("**", std::move(e), parse_unary(true), op.line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      const Nesting nesting(*this, op.line);
      e = unary(op.value == "-" ? Expr::Kind::kNegate : Expr::Kind::kPlus, parse_unary(false),
                op.line);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    const Nesting nesting(*this, t.line);
    switch (t.type) {
      case T::kName: {
        ++pos_;
        auto e = make(Expr::Kind::kLiteral, t.line);
        if (t.value == "true" || t.value == "True") {
          e->value = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->value = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        return e;
      }
      case T::kString: {
        std::string s;
        while (cur().type == T::kString) s += next().value;
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->value = Value(std::move(s));
        return e;
      }
      case T::kInteger:
      case T::kFloat: {
        ++pos_;
        auto e = make(Expr::Kind::kLiteral, t.line);
        e->value = number(t);
        return e;
      }
      case T::kOperator:
        if (t.value == "(") {
          ++pos_;
          if (skip_op(")")) {
            auto e = make(Expr::Kind::kList, t.line);
            e->tuple = true;
            return e;
          }
          ExprPtr e = parse_tuple(true);
          expect_op(")");
          return e;
        }
        if (t.value == "[" || t.value == "{") {
          ++pos_;
          const bool list = t.value == "[";
          auto e = make(list ? Expr::Kind::kList : Expr::Kind::kDict, t.line);
          const char* close = list ? "]" : "}";
          while (!is_op(close)) {
            if (!e->args.empty()) expect_op(",");
            if (is_op(close)) break;
            e->args.push_back(parse_expression(true));
            if (!list) {
              expect_op(":");
              e->args.push_back(parse_expression(true));
            }
          }
          expect_op(close);
          return e;
        }
        break;
      default:
        break;
    }
    fail(t.line, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (cur().type == T::kInteger) {
          auto index = make(Expr::Kind::kLiteral, line);
          index->value = number(next());
          auto g = make(Expr::Kind::kGetitem, line);
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(index));
          e = std::move(g);
        } else {
          auto g = make(Expr::Kind::kGetattr, line);
          g->name = expect_name();
          g->args.push_back(std::move(e));
          e = std::move(g);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    const int line = next().line;  // '['
    std::vector<ExprPtr> bounds;
    bool slice = false;
    for (int part = 0; part < 3; ++part) {
      if (is_op(":") || is_op("]")) {
        bounds.push_back(nullptr);
      } else {
        bounds.push_back(parse_expression(true));
      }
      if (!skip_op(":")) break;
      slice = true;
    }
    expect_op("]");
    if (!slice) {
      if (!bounds[0]) fail(line, "expected a subscript");
      auto g = make(Expr::Kind::kGetitem, line);
      g->args.push_back(std::move(e));
      g->args.push_back(std::move(bounds[0]));
      return g;
    }
    auto s = make(Expr::Kind::kSlice, line);
    s->args.push_back(std::move(e));
    bounds.resize(3);
    for (auto& b : bounds) s->args.push_back(std::move(b));
    return s;
  }

  // `(args)` into `e`'s args (after e->args[0] or from index `first`) and keywords.
  void parse_args(Expr& e) {
    expect_op("(");
    bool any = false;
    while (!is_op(")")) {
      if (any) expect_op(",");
      if (is_op(")")) break;
      any = true;
      if (is_op("*") || is_op("**")) outside(cur().line, "'*' and '**' arguments");
      if (cur().type == T::kName && peek().type == T::kOperator && peek().value == "=") {
        std::string key = next().value;
        ++pos_;
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty())
          fail(cur().line, "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    const int line = cur().line;
    if (callee->kind == Expr::Kind::kName) {
      called_.emplace_back(callee->name, line);
    } else if (callee->kind == Expr::Kind::kGetattr && !is_method(callee->name)) {
      outside(line, "the method '" + callee->name + "'");
    }
    auto c = make(Expr::Kind::kCall, line);
    c->args.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == T::kName) {
      ++pos_;
      name += "." + next().value;
    }
    return name;
  }

  // `| name(args) | ...` applied to `value`; `start_inline`: the first filter has no '|'.
  ExprPtr parse_filter(ExprPtr value, bool start_inline) {
    while (start_inline || skip_op("|")) {
      start_inline = false;
      const int line = cur().line;
      auto f = make(Expr::Kind::kFilter, line);
      f->name = dotted_name();
      f->args.push_back(std::move(value));
      if (is_op("(")) parse_args(*f);
      value = std::move(f);
    }
    return value;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e), false);
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::Kind::kTest, line);
        t->negated = skip_name("not");
        t->name = dotted_name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == T::kName || cur().type == T::kString ||
                    cur().type == T::kInteger || cur().type == T::kFloat || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur().line, "you cannot chain multiple tests with is");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  const std::string& source_;
  std::size_t pos_ = 0;
  int depth_ = 0;  // the Nesting levels open
  std::set<std::string> macros_;
  std::vector<std::pair<std::string, int>> called_;
};

}  // namespace

Body parse(const std::string& text, const std::string& source) {
  return Parser(tokenize(text, source), source).run();
}

}  // namespace baton::data::jinja
