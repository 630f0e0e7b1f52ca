// The parse tree of a Jinja template, and the parser that builds it from jinja_lexer's tokens
// with jinja2's grammar and operator precedence.
//
// Supported statements: if/elif/else, for (tuple targets, `if` filter, else; loop.* and
// break/continue), set (names, tuples, `ns.attr`, and the block form with endset), macro (with
// defaults), filter blocks, generation/endgeneration (transformers' extension: the body
// renders as it is). Anything else (include, import, extends, block, call, raw, recursive
// loops, an unknown filter, test or method) fails at parse, naming the source, the line and
// the construct, so that a template either loads whole or not at all.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace baton::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args (tuple: a tuple literal)
    kDict,     // args: key, value, key, value, ...
    kGetattr,  // args[0].name
    kGetitem,  // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null for a bound left out)
    kCall,     // args[0](args[1..], keywords)
    kFilter,   // args[0] | name(args[1..], keywords); args[0] null in a filter block
    kTest,     // args[0] is [not] name(args[1..])
    kNot,      // not args[0]
    kNegate,   // -args[0]
    kPlus,     // +args[0]
    kBinary,   // args[0] op args[1]; op is one of + - * / // % ** ~
    kAnd,
    kOr,
    kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ... (== != < > <= >= in notin)
    kCondition,  // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test or binary operator
  bool tuple = false;
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  // kCompare
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if condition]: body; else_body
    kSet,          // targets = expr, or (attribute non-empty) targets[0].attribute = expr
    kSetBlock,     // {% set targets[0] %}body{% endset %}, filtered by expr when not null
    kMacro,        // {% macro name(params) %}body
    kFilterBlock,  // {% filter expr %}body (expr is a kFilter with a null value)
    kGeneration,   // {% generation %}body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attribute;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null when none
};

// Parses `text` (a template named `source` in errors). Throws JinjaError naming the source,
// the line and the construct for a syntax error or a construct outside the subset.
Body parse(const std::string& text, const std::string& source);

}  // namespace baton::data::jinja
