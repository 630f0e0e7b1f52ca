#include "text/jinja/template.h"

#include <ctime>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "text/jinja/builtins.h"
#include "text/jinja/parser.h"
#include "text/jinja/value.h"

namespace baton::data {

struct JinjaTemplate::Program {
  jinja::Body body;
};

namespace {

using jinja::Body;
using jinja::CallArgs;
using jinja::Expr;
using jinja::Node;
using jinja::Value;
using jinja::ValueError;

// A scope: jinja2 gives each for-loop iteration and each macro call its own, so that `set`
// inside them does not change the variables outside.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      if (const auto it = f->vars.find(name); it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

FramePtr child(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

class Renderer {
 public:
  Renderer(const std::string& source, const JinjaRenderOptions& options)
      : source_(source), options_(options) {}

  std::string run(const Body& body, const nlohmann::ordered_json& variables) {
    if (!variables.is_object() && !variables.is_null()) {
      throw JinjaError(source_ + ": chat_template: the render variables must be a JSON object");
    }
    auto globals = std::make_shared<Frame>();
    define_globals(*globals);
    FramePtr root = child(globals);
    if (variables.is_object()) {
      for (const auto& [name, value] : variables.items()) {
        root->vars[name] = Value::from_json(value);
      }
    }
    std::string out;
    exec(body, root, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  [[noreturn]] void fail(int line, const std::string& what) const {
    throw JinjaError(source_ + ":" + std::to_string(line) + ": chat_template: " + what);
  }

  // One level of rendering below another (an expression in an expression, a statement in a
  // block, a macro's body in its call): each is a recursive call here, so a bound keeps a
  // template that recurses without end from overflowing the stack. jinja2 stops such a
  // template with Python's RecursionError.
  static constexpr int kMaxDepth = 400;
  class Depth {
   public:
    Depth(Renderer& r, int line) : r_(r) {
      if (r_.depth_ == kMaxDepth) {
        r_.fail(line, "rendering nests more than " + std::to_string(kMaxDepth) +
                          " levels deep (a macro that calls itself without end?)");
      }
      ++r_.depth_;
    }
    ~Depth() { --r_.depth_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;

   private:
    Renderer& r_;
  };

  void define_globals(Frame& g) {
    g.vars["range"] = Value::callable("range", [](CallArgs& a) {
      if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3) {
        throw ValueError("range() takes 1 to 3 positional arguments");
      }
      std::vector<int64_t> v;
      for (const Value& x : a.positional) {
        if (!x.is_int() && x.kind() != Value::Kind::kBool) {
          throw ValueError("'" + x.type_name() + "' object cannot be interpreted as an integer");
        }
        v.push_back(x.as_int());
      }
      const int64_t start = v.size() > 1 ? v[0] : 0, stop = v.size() > 1 ? v[1] : v[0];
      const int64_t step = v.size() > 2 ? v[2] : 1;
      if (step == 0) throw ValueError("range() arg 3 must not be zero");
      std::vector<Value> items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (items.size() >= 100000) throw ValueError("range too big (the sandbox allows 100000)");
        items.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;  // past int64, so past stop
      }
      return Value::list(std::move(items));
    });
    const auto mapping = [](const std::string& what, CallArgs& a) {
      jinja::Dict d;
      if (a.positional.size() > 1)
        throw ValueError(what + "() takes at most 1 positional argument");
      if (!a.positional.empty()) {
        const Value& init = a.positional[0];
        if (init.is_dict()) {
          d = init.dict();
        } else {
          for (const Value& pair : jinja::iterate(init)) {
            if (!pair.is_list() || pair.items().size() != 2) {
              throw ValueError(what + "(): expected a mapping or (key, value) pairs");
            }
            d.set(pair.items()[0], pair.items()[1]);
          }
        }
      }
      for (const auto& [k, v] : a.keyword) d.set(Value(k), v);
      return d;
    };
    g.vars["namespace"] = Value::callable("namespace", [mapping](CallArgs& a) {
      jinja::Dict d = mapping("namespace", a);
      for (const auto& kv : d.items) {
        if (kv.first.is_string() && !kv.first.str().empty() && kv.first.str()[0] == '_') {
          throw ValueError(
              "chat templates cannot store underscore-prefixed attributes on a "
              "namespace, but got '" +
              kv.first.str() + "'");
        }
      }
      return Value::namespace_(std::move(d));
    });
    g.vars["dict"] =
        Value::callable("dict", [mapping](CallArgs& a) { return Value::dict(mapping("dict", a)); });
    g.vars["raise_exception"] = Value::callable("raise_exception", [](CallArgs& a) -> Value {
      const std::string message = a.positional.empty() ? "" : a.positional[0].to_str();
      throw ValueError("the template raised an exception: " + message);
    });
    g.vars["strftime_now"] = Value::callable("strftime_now", [this](CallArgs& a) {
      if (a.positional.size() != 1 || !a.positional[0].is_string() || !a.keyword.empty()) {
        throw ValueError("strftime_now() takes one format string");
      }
      const auto now = options_.now.value_or(std::chrono::system_clock::now());
      const std::time_t t = std::chrono::system_clock::to_time_t(now);
      std::tm tm{};
      localtime_r(&t, &tm);
      const std::string& fmt = a.positional[0].str();
      if (fmt.empty()) return Value("");
      for (std::size_t size = 64; size <= 65536; size *= 4) {
        std::string buf(size, '\0');
        const std::size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
        if (n > 0) return Value(buf.substr(0, n));
      }
      return Value("");
    });
  }

  Flow exec(const Body& body, const FramePtr& frame, std::string& out) {
    for (const auto& node : body) {
      const Flow flow = exec(*node, frame, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, const FramePtr& frame, std::string& out) {
    try {
      return exec_node(n, frame, out);
    } catch (const ValueError& e) {
      fail(n.line, e.what());
    }
  }

  std::string capture(const Body& body, const FramePtr& frame) {
    std::string out;
    exec(body, frame, out);
    return out;
  }

  Flow exec_node(const Node& n, const FramePtr& frame, std::string& out) {
    const Depth depth(*this, n.line);
    switch (n.kind) {
      case Node::Kind::kText:
        out += n.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += eval(*n.expr, frame).to_str();
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (std::size_t i = 0; i < n.conditions.size(); ++i) {
          if (eval(*n.conditions[i], frame).truthy()) return exec(n.bodies[i], frame, out);
        }
        return exec(n.else_body, frame, out);
      case Node::Kind::kFor:
        return exec_for(n, frame, out);
      case Node::Kind::kSet: {
        const Value v = eval(*n.expr, frame);
        if (!n.attribute.empty()) {
          const Value* ns = frame->find(n.targets[0]);
          if (!ns || ns->kind() != Value::Kind::kNamespace) {
            throw ValueError("cannot assign attribute on non-namespace object '" + n.targets[0] +
                             "'");
          }
          if (n.attribute[0] == '_') {
            throw ValueError(
                "chat templates cannot store underscore-prefixed attributes on a "
                "namespace, but got '" +
                n.attribute + "'");
          }
          ns->mutable_namespace().set(Value(n.attribute), v);
        } else {
          assign(n.targets, v, *frame);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        Value v(capture(n.body, frame));
        if (n.expr) v = filter_chain(*n.expr, v, frame);
        frame->vars[n.targets[0]] = v;
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        frame->vars[n.name] = macro(n, frame);
        return Flow::kNormal;
      case Node::Kind::kFilterBlock:
        out += filter_chain(*n.expr, Value(capture(n.body, frame)), frame).to_str();
        return Flow::kNormal;
      case Node::Kind::kGeneration:
        return exec(n.body, frame, out);
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  static void assign(const std::vector<std::string>& targets, const Value& v, Frame& frame) {
    if (targets.size() == 1) {
      frame.vars[targets[0]] = v;
      return;
    }
    const std::vector<Value> items = jinja::iterate(v);
    if (items.size() != targets.size()) {
      throw ValueError("cannot unpack " + std::to_string(items.size()) + " values into " +
                       std::to_string(targets.size()) + " names");
    }
    for (std::size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
  }

  Flow exec_for(const Node& n, const FramePtr& frame, std::string& out) {
    const Value iterable = eval(*n.expr, frame);
    std::vector<Value> items = jinja::iterate(iterable);
    if (n.condition) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        auto scope = child(frame);
        assign(n.targets, item, *scope);
        if (eval(*n.condition, scope).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, frame, out);
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      auto scope = child(frame);
      assign(n.targets, items[static_cast<std::size_t>(i)], *scope);
      jinja::Dict loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(length - i));
      loop.set("revindex0", Value(length - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == length - 1));
      loop.set("length", Value(length));
      loop.set("depth", Value(1));
      loop.set("depth0", Value(0));
      if (i > 0) loop.set("previtem", items[static_cast<std::size_t>(i - 1)]);
      if (i + 1 < length) loop.set("nextitem", items[static_cast<std::size_t>(i + 1)]);
      scope->vars["loop"] = Value::dict(std::move(loop));
      if (exec(n.body, scope, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value macro(const Node& n, const FramePtr& defined_in) {
    // Weak: the macro lives in the frame it was defined in, which must not own itself.
    std::weak_ptr<Frame> scope_of_definition = defined_in;
    return Value::callable(n.name, [this, &n, scope_of_definition](CallArgs& a) {
      const FramePtr parent = scope_of_definition.lock();
      if (!parent) throw ValueError("macro '" + n.name + "' called outside its scope");
      if (a.positional.size() > n.params.size()) {
        throw ValueError("macro '" + n.name + "' takes not more than " +
                         std::to_string(n.params.size()) + " argument(s)");
      }
      auto scope = child(parent);
      std::vector<bool> given(n.params.size(), false);
      for (std::size_t i = 0; i < a.positional.size(); ++i) {
        scope->vars[n.params[i].first] = a.positional[i];
        given[i] = true;
      }
      for (const auto& [key, value] : a.keyword) {
        std::size_t i = 0;
        while (i < n.params.size() && n.params[i].first != key) ++i;
        if (i == n.params.size()) {
          throw ValueError("macro '" + n.name + "' takes no keyword argument '" + key + "'");
        }
        scope->vars[key] = value;
        given[i] = true;
      }
      for (std::size_t i = 0; i < n.params.size(); ++i) {
        if (given[i]) continue;
        const auto& [param, fallback] = n.params[i];
        scope->vars[param] =
            fallback ? eval(*fallback, scope) : Value::undefined("'" + param + "' is undefined");
      }
      return Value(capture(n.body, scope));
    });
  }

  CallArgs call_args(const Expr& e, std::size_t first, const FramePtr& frame) {
    CallArgs a;
    for (std::size_t i = first; i < e.args.size(); ++i)
      a.positional.push_back(eval(*e.args[i], frame));
    for (const auto& [key, value] : e.keywords) a.keyword.emplace_back(key, eval(*value, frame));
    return a;
  }

  // Applies a filter expression parsed with a null value (filter blocks, set blocks) to `v`.
  Value filter_chain(const Expr& f, const Value& v, const FramePtr& frame) {
    const Value input = f.args[0] ? filter_chain(*f.args[0], v, frame) : v;
    CallArgs a = call_args(f, 1, frame);
    return jinja::apply_filter(f.name, input, a);
  }

  Value eval(const Expr& e, const FramePtr& frame) {
    const Depth depth(*this, e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        if (const Value* v = frame->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList: {
        std::vector<Value> items;
        for (const auto& a : e.args) items.push_back(eval(*a, frame));
        return Value::list(std::move(items), e.tuple);
      }
      case Expr::Kind::kDict: {
        jinja::Dict d;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i], frame);
          if (key.is_list() || key.is_dict() || key.kind() == Value::Kind::kNamespace) {
            throw ValueError("unhashable type: '" + key.type_name() + "'");
          }
          d.set(key, eval(*e.args[i + 1], frame));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kGetattr:
        return jinja::get_attribute(eval(*e.args[0], frame), e.name);
      case Expr::Kind::kGetitem:
        return jinja::get_item(eval(*e.args[0], frame), eval(*e.args[1], frame));
      case Expr::Kind::kSlice: {
        const auto bound = [&](const jinja::ExprPtr& b) {
          return b ? eval(*b, frame) : Value::none();
        };
        return jinja::get_slice(eval(*e.args[0], frame), bound(e.args[1]), bound(e.args[2]),
                                bound(e.args[3]));
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.args[0], frame);
        CallArgs a = call_args(e, 1, frame);
        if (callee.is_undefined()) callee.fail_undefined();
        if (callee.kind() != Value::Kind::kCallable) {
          throw ValueError("'" + callee.type_name() + "' object is not callable");
        }
        return callee.callable().call(a);
      }
      case Expr::Kind::kFilter: {
        const Value v = eval(*e.args[0], frame);
        CallArgs a = call_args(e, 1, frame);
        return jinja::apply_filter(e.name, v, a);
      }
      case Expr::Kind::kTest: {
        const Value v = eval(*e.args[0], frame);
        CallArgs a = call_args(e, 1, frame);
        return Value(jinja::apply_test(e.name, v, a) != e.negated);
      }
      case Expr::Kind::kNot:
        return Value(!eval(*e.args[0], frame).truthy());
      case Expr::Kind::kNegate:
      case Expr::Kind::kPlus: {
        const Value v = eval(*e.args[0], frame);
        if (v.is_undefined()) v.fail_undefined();
        const bool negate = e.kind == Expr::Kind::kNegate;
        if (v.kind() == Value::Kind::kFloat) return Value(negate ? -v.as_float() : v.as_float());
        if (v.is_int() || v.kind() == Value::Kind::kBool) {
          return negate ? jinja::arithmetic('-', Value(0), v) : Value(v.as_int());
        }
        throw ValueError(std::string("bad operand type for unary ") + (negate ? "-" : "+") + ": '" +
                         v.type_name() + "'");
      }
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.args[0], frame);
        const Value b = eval(*e.args[1], frame);
        if (e.name == "~") return Value(a.to_str() + b.to_str());
        if (e.name == "+") return jinja::add(a, b);
        const char op = e.name == "//" ? 'f' : e.name == "**" ? 'p' : e.name[0];
        return jinja::arithmetic(op, a, b);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0], frame);
        return a.truthy() ? eval(*e.args[1], frame) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0], frame);
        return a.truthy() ? a : eval(*e.args[1], frame);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.args[0], frame);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], frame);
          const std::string& op = e.ops[i];
          bool r = false;
          if (op == "==")
            r = jinja::equals(left, right);
          else if (op == "!=")
            r = !jinja::equals(left, right);
          else if (op == "<")
            r = jinja::less(left, right);
          else if (op == ">")
            r = jinja::less(right, left);
          else if (op == "<=")
            r = !jinja::less(right, left);
          else if (op == ">=")
            r = !jinja::less(left, right);
          else if (op == "in")
            r = jinja::contains(right, left);
          else
            r = !jinja::contains(right, left);
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition: {
        if (eval(*e.args[0], frame).truthy()) return eval(*e.args[1], frame);
        if (e.args[2]) return eval(*e.args[2], frame);
        return Value::undefined("the condition of an inline if without else was false");
      }
    }
    return Value();
  }

  const std::string& source_;
  const JinjaRenderOptions& options_;
  int depth_ = 0;  // the Depth levels open
};

}  // namespace

JinjaTemplate::JinjaTemplate(std::shared_ptr<const Program> program, std::string source)
    : program_(std::move(program)), source_(std::move(source)) {}

JinjaTemplate JinjaTemplate::parse(const std::string& text, const std::string& source) {
  auto program = std::make_shared<Program>();
  program->body = jinja::parse(text, source);
  return JinjaTemplate(std::move(program), source);
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables,
                                  const JinjaRenderOptions& options) const {
  return Renderer(source_, options).run(program_->body, variables);
}

}  // namespace baton::data
