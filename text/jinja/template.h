// A Jinja template, for the subset of Jinja that Hugging Face chat templates use, rendering
// byte for byte what transformers' apply_chat_template renders with jinja2 (its sandboxed
// environment with trim_blocks and lstrip_blocks, the loopcontrols and generation extensions,
// and its globals raise_exception, strftime_now, namespace and dict, and its tojson filter).
//
// The template is parsed to a tree at load; a construct outside the subset (include, import,
// extends, call blocks, recursive loops, an unknown filter, test, method or function) fails
// there, with a JinjaError naming the source, the line and the construct. What is supported:
//   {{ }}, {% %}, {# #}, whitespace control with - and +;
//   if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/
//   first/last/length/previtem/nextitem/depth, break, continue), set (incl. namespace
//   attributes and {% set x %}...{% endset %}), macro (with defaults), filter blocks,
//   generation blocks;
//   literals (strings with Python escapes, ints, floats, lists, tuples, dicts, true/false/none),
//   attribute and item access, slices, calls with keyword arguments, the operators
//   + - * / // % ** ~ == != < > <= >= in, not in, and, or, not, is [not], x if c else y;
//   the filters, tests and methods listed in jinja_builtins.h.
// Values have Python's semantics (jinja_value.h); an undefined variable renders as "", and
// using it otherwise (an attribute of it, arithmetic) fails, as jinja2's default Undefined does.
//
// Render errors (raise_exception('...'), a type error, an undefined value used) throw
// JinjaError naming the source and the line, with raise_exception's message.
//
// Nesting is bounded where jinja2 hits Python's recursion limit: a template nested more than
// 200 levels deep (brackets, unary operators, blocks) fails at parse, and rendering more than
// 400 levels deep (a macro that calls itself without end) fails at render, each with a
// JinjaError, never a stack overflow.
//
// Example:
//   auto t = baton::data::JinjaTemplate::parse("{{ greeting }}, {{ name | upper }}!", "hello");
//   std::string s = t.render({{"greeting", "Hi"}, {"name", "ada"}});  // "Hi, ADA!"
//
// Thread safety: a parsed template is immutable; render may run concurrently.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "text/jinja/error.h"

namespace baton::data {

struct JinjaRenderOptions {
  // The time strftime_now() formats, in the local time zone; the current time when unset.
  // Tests set it to render dates reproducibly.
  std::optional<std::chrono::system_clock::time_point> now;
};

class JinjaTemplate {
 public:
  // Parses `text`; `source` names the template in errors (e.g. "models/m/tokenizer_config.json").
  static JinjaTemplate parse(const std::string& text, const std::string& source);

  // Renders with `variables` (a JSON object: name -> value; objects keep their key order,
  // as Python dicts do).
  std::string render(const nlohmann::ordered_json& variables,
                     const JinjaRenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  struct Program;
  JinjaTemplate(std::shared_ptr<const Program> program, std::string source);
  std::shared_ptr<const Program> program_;
  std::string source_;
};

}  // namespace baton::data
