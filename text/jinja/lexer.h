// Splits a Jinja template into tokens as jinja2's lexer does under transformers' settings
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//   - text between tags becomes one kData token; "\r\n" and "\r" become "\n", and one trailing
//     newline at the end of the template is dropped;
//   - `{%-`, `{{-`, `{#-` strip all whitespace before the tag, `-%}`, `-}}`, `-#}` all
//     whitespace after it;
//   - a block or comment tag removes the first newline after it (trim_blocks) unless it ends
//     with `+%}`, and spaces and tabs between the start of its line and the tag (lstrip_blocks)
//     unless it starts with `{%+`;
//   - comments produce no tokens; the inside of `{{ }}` and `{% %}` becomes name, string,
//     number and operator tokens (string literals unescaped as Python's).
// Throws JinjaError naming `source` and the line for an unterminated tag, comment or string,
// and for `{% raw %}` (outside the supported subset).
#pragma once

#include <string>
#include <vector>

namespace baton::data::jinja {

struct Token {
  enum class Type {
    kData,
    kVariableBegin,
    kVariableEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInteger,
    kFloat,
    kOperator,
    kEnd,
  };
  Type type;
  std::string value;  // the text, the unescaped string, the digits or the operator
  int line = 1;
};

std::vector<Token> tokenize(const std::string& text, const std::string& source);

}  // namespace baton::data::jinja
