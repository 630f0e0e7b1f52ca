// The Jinja interpreter on hand-written templates: whitespace control, loops, namespaces,
// macros, values printed as Python prints them, filters and tests, and its errors. The
// expected texts are what transformers' jinja2 environment renders for the same templates.
#include "text/jinja/template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <nlohmann/json.hpp>

namespace baton::data {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

struct Case {
  const char* name;
  const char* text;
  const char* variables;
  const char* expected;
};

// Rendered by transformers 5.23 / jinja2 3.1.6 (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks) with strftime_now's clock at 2025-03-14 12:00 local time.
const Case kCases[] = {
    {"ws", "  {% if true %}\n  kept\n  {%- endif %}\n{{- ' x ' -}}\n  {# c #}\ny\n", R"({})",
     "  kept x y"},
    {"plus", "a\n  {%+ if true +%}\nb{% endif %}", R"({})", "a\n  \nb"},
    {"loop",
     "{% for m in ms %}{{ loop.index }}/{{ loop.length }}:{{ m }}{% if not loop.last %},{% endif "
     "%}{% endfor %}|{% for m in [] %}x{% else %}empty{% endfor %}",
     R"({"ms": ["a", "b", "c"]})", "1/3:a,2/3:b,3/3:c|empty"},
    {"loopfilter",
     "{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{% if x == 3 %}{% "
     "continue %}{% endif %}{{ x }}{{ loop.revindex0 }} {% endfor %}",
     R"({})", "14 52 "},
    {"ns",
     "{% set ns = namespace(n=0, s='') %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% set "
     "ns.s = ns.s ~ i %}{% set local = i %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ local is defined "
     "}}",
     R"({})", "6 123 False"},
    {"macro",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ "
     "greet('B', punct='?') }} {{ greet(name='C', punct='.') }}",
     R"({})", "Hi A! Hi B? Hi C."},
    {"setblock",
     "{% set x %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper %}up{% endset %}{{ y "
     "}}{% filter trim %}   t   {% endfilter %}",
     R"({})", "[  inner 2\n]UPt"},
    {"repr",
     "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }} {{ (1,) }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 7 "
     "// 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}",
     R"({})",
     "[1, 'a', None, True, 1.5, {'k': \"it's\"}] (1,) 1e+20 0.30000000000000004 3 -4 2 3.5 1024"},
    {"tojson",
     "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'é\"\\n' | tojson }} {{ d | "
     "tojson(separators=(',', ':'), sort_keys=true) }}",
     R"({"d": {"b": [1, 2.5, null, true], "a": "x"}})",
     "{\"b\": [1, 2.5, null, true], \"a\": \"x\"} {\n  \"b\": [\n    1,\n    2.5,\n    null,\n    "
     "true\n  ],\n  \"a\": \"x\"\n} \"é\\\"\\n\" {\"a\":\"x\",\"b\":[1,2.5,null,true]}"},
    {"strings",
     "{{ '  a b  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'[::-1] "
     "}}|{{ '日本語'[1] }}|{{ '日本語' | length }}|{{ 'Hello'.startswith(('He', 'x')) }}|{{ "
     "'x-y'.replace('-', '+') }}|{{ 'hello world' | title }}|{{ 'ab' | upper }}|{{ '{} and "
     "{name}'.format(1, name='n') }}|{{ 'xxhixx'.strip('x') }}",
     R"({})", "a b|['a', 'b', '', 'c']|['a', 'b']|cba|本|3|True|x+y|Hello World|AB|1 and n|hi"},
    {"filters",
     "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}|{{ "
     "ms | rejectattr('role', 'eq', 'user') | list | length }}|{{ ms | map(attribute='role') | "
     "unique | list }}|{{ {'b': 1, 'a': 2} | dictsort }}|{{ {'b': 1, 'a': 2} | items | list }}|{{ "
     "[3, 1, 2] | sort(reverse=true) }}|{{ none | default('dflt') }}|{{ undefined_var | "
     "default('u') }}|{{ '' | default('e', true) }}|{{ [1,2,3] | first }}{{ [1,2,3] | last }}|{{ "
     "'42' | int + 1 }}|{{ 2.567 | round(2) }}|{{ 'a\nb' | indent(2, first=true) }}|{{ '<&>' | e "
     "}}",
     R"({"ms": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]})",
     "u1, u2|1|['user', 'assistant']|[('a', 2), ('b', 1)]|[('b', 1), ('a', 2)]|[3, 2, "
     "1]|None|u|e|13|43|2.57|  a\n  b|&lt;&amp;&gt;"},
    {"tests",
     "{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 's' is string }}{{ 1 is number "
     "}}{{ 1 is integer }}{{ 1.0 is float }}{{ {} is mapping }}{{ [] is sequence }}{{ 's' is "
     "iterable }}{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}{{ 'a' is in 'abc' }}{{ x is "
     "not none }}",
     R"({"x": 1})", "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"ops",
     "{{ 'a' ~ 1 ~ none }}|{{ 1 if false }}|{{ 'y' if 0 else 'n' }}|{{ 'b' in ['a','b'] }}{{ 'z' "
     "not in 'abc' }}|{{ 1 and 'x' }}|{{ 0 or 'd' }}|{{ not 0 }}|{{ 1 < 2 < 3 }}|{{ [1] + [2] "
     "}}|{{ -x }}|{{ m.role }}{{ m['content'] }}{{ m.missing }}|{{ m.get('missing', 'g') }}",
     R"({"x": 3, "m": {"role": "r", "content": "c"}})",
     "a1None||n|TrueTrue|x|d|True|True|[1, 2]|-3|rc|g"},
    {"strftime", "{{ strftime_now('%Y-%m-%d %d %b %Y %B') }}", R"({})",
     "2025-03-14 14 Mar 2025 March"},
};

std::chrono::system_clock::time_point march_14_2025_noon() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  return std::chrono::system_clock::from_time_t(std::mktime(&tm));
}

TEST(JinjaTemplate, RendersAsJinja2) {
  JinjaRenderOptions options;
  options.now = march_14_2025_noon();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const JinjaTemplate t = JinjaTemplate::parse(c.text, c.name);
    EXPECT_EQ(t.render(nlohmann::ordered_json::parse(c.variables), options), c.expected);
  }
}

// The message of the error parsing (and, if it parses, rendering) `text` throws.
std::string error_of(const std::string& text, const std::string& variables = "{}") {
  try {
    JinjaTemplate::parse(text, "models/m/tokenizer_config.json")
        .render(nlohmann::ordered_json::parse(variables));
  } catch (const JinjaError& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaTemplate, ConstructsOutsideTheSubsetFailAtLoadNamingLineAndConstruct) {
  for (const auto& [text, construct] : std::vector<std::pair<std::string, std::string>>{
           {"a\nb\n{% include 'x.jinja' %}", "the statement 'include'"},
           {"a\n\n{% for x in y recursive %}{% endfor %}", "a recursive for loop"},
           {"\n\n{{ x | wordwrap(3) }}", "the filter 'wordwrap'"},
           {"\n\n{% for m in ms %}{{ m is divisibleby3 }}{% endfor %}", "the test 'divisibleby3'"},
           {"\n\n{{ 'a'.zfill(3) }}", "the method 'zfill'"},
           {"\n\n{{ cycler('a', 'b') }}", "the function 'cycler'"},
           {"\n\n{% raw %}{{ x }}{% endraw %}", "'{% raw %}'"},
       }) {
    SCOPED_TRACE(text);
    try {
      JinjaTemplate::parse(text, "models/m/tokenizer_config.json");
      FAIL() << "parsed";
    } catch (const JinjaError& e) {
      EXPECT_CONTAINS(e.what(), "models/m/tokenizer_config.json:3: ");
      EXPECT_CONTAINS(e.what(), construct);
      EXPECT_CONTAINS(e.what(), "outside the Jinja subset");
    }
  }
}

TEST(JinjaTemplate, UnknownFilterInsideAnIfFailsOnlyWhenReached) {
  // jinja2 defers these to render time; so does baton (DeepSeek-V3.2's template relies on it).
  const JinjaTemplate t = JinjaTemplate::parse("{% if x %}{{ x | from_json }}{% endif %}ok", "m");
  EXPECT_EQ(t.render({{"x", false}}), "ok");
  try {
    t.render({{"x", "{}"}});
    FAIL() << "rendered";
  } catch (const JinjaError& e) {
    EXPECT_CONTAINS(e.what(), "m:1: ");
    EXPECT_CONTAINS(e.what(), "the filter 'from_json'");
  }
}

TEST(JinjaTemplate, SyntaxErrorsNameTheLine) {
  EXPECT_CONTAINS(error_of("ok\n{% if x %}\nno end"), "tokenizer_config.json:3: ");
  EXPECT_CONTAINS(error_of("ok\n{% if x %}\nno end"), "'endif'");
  EXPECT_CONTAINS(error_of("\n{{ x + }}"), "tokenizer_config.json:2: ");
  EXPECT_CONTAINS(error_of("{{ 'unterminated }}"), "unterminated string");
  EXPECT_CONTAINS(error_of("{% if x %}"), "unexpected end of template");
}

TEST(JinjaTemplate, RaiseExceptionFailsWithItsMessageAndLine) {
  const std::string e = error_of(
      "{% if messages[0]['role'] == 'system' %}\n"
      "{{ raise_exception('System role not supported') }}\n{% endif %}",
      R"({"messages": [{"role": "system", "content": "s"}]})");
  EXPECT_CONTAINS(e, "tokenizer_config.json:2: ");
  EXPECT_CONTAINS(e, "System role not supported");
}

TEST(JinjaTemplate, UndefinedValuesPrintEmptyButFailWhenUsed) {
  EXPECT_EQ(JinjaTemplate::parse("[{{ nothing }}][{{ m.missing }}]", "m")
                .render({{"m", nlohmann::ordered_json::object()}}),
            "[][]");
  EXPECT_CONTAINS(error_of("{{ nothing.attribute }}"), "'nothing' is undefined");
  EXPECT_CONTAINS(error_of("{{ messages[0]['content'] }}", R"({"messages": []})"),
                  "list object has no element 0");
  EXPECT_CONTAINS(error_of("{{ 'a' + 1 }}"), "can only concatenate str");
  EXPECT_CONTAINS(error_of("{{ x | tojson }}"), "not JSON serializable");
}

TEST(JinjaTemplate, TheSandboxRefusesChangingLists) {
  EXPECT_CONTAINS(error_of("{% set l = [] %}{{ l.append(1) }}"), "unsafe");
  EXPECT_CONTAINS(error_of("{% set ns = namespace() %}{% set ns._x = 1 %}"), "underscore");
}

// Found by tests/fuzz/fuzz_chat_template: these crashed the process (an escaped std::out_of_range)
// instead of failing with a JinjaError or rendering what jinja2 renders.
TEST(JinjaTemplate, NumbersPastInt64FailOrAreUndefined) {
  EXPECT_CONTAINS(error_of("{{ loop.99999999999999999999 }}"),
                  "the number 99999999999999999999 is out of range");
  // jinja2 prints [Undefined]: no list is that long.
  EXPECT_EQ(JinjaTemplate::parse("{{ m | map(attribute='99999999999999999999') | list }}", "m")
                .render(nlohmann::ordered_json::parse(R"({"m": [{"role": "user"}]})")),
            "[Undefined]");
}

// Found by fuzz_chat_template (round) and then by reading the arithmetic: each of these was
// undefined behaviour (signed overflow, INT64_MIN / -1, a float cast past int64's range), a
// std::length_error, or a loop of 10^18 steps.
TEST(JinjaTemplate, IntegersPast64BitsFailInsteadOfWrapping) {
  for (const char* text :
       {"{{ 9223372036854775807 + 1 }}", "{{ 3037000500 * 3037000500 }}",
        "{{ -9223372036854775807 - 2 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}", "{{ 3 ** 99999999999999 }}"}) {
    EXPECT_CONTAINS(error_of(text), "integer overflow");
  }
  EXPECT_CONTAINS(error_of("{{ 1e30 | int }}"), "does not fit in 64 bits");
  EXPECT_CONTAINS(error_of("{{ 'ab' * 9223372036854775807 }}"), "repeated str is too long");
  // The rest renders what jinja2 renders.
  EXPECT_EQ(JinjaTemplate::parse("{{ (-9223372036854775807 - 1) % -1 }}|{{ '' * 10 ** 18 }}"
                                 "{{ [] * 10 ** 18 }}|{{ 'a\nb' | indent(-1) }}|"
                                 "{{ 'abc'[2::9223372036854775807] }}|"
                                 "{{ range(9223372036854775800, 9223372036854775807, 5) | list }}|"
                                 "{{ 2.567 | round(24) }}|{{ 2 ** 62 }}|{{ (-2) ** 63 }}|"
                                 "{{ 'nan' | int(7) }}|{{ -7 | abs }}",
                                 "m")
                .render({}),
            "0|[]|a\nb|c|[9223372036854775800, 9223372036854775805]|2.567|4611686018427387904|"
            "-9223372036854775808|7|7");
}

// Each of these overflowed the stack (the parser and the renderer recurse once per level).
TEST(JinjaTemplate, NestingTooDeepFailsInsteadOfOverflowingTheStack) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_CONTAINS(error_of(parens), "nests more than 200 levels deep");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_CONTAINS(error_of(blocks), "nests more than 200 levels deep");
  EXPECT_CONTAINS(error_of("{{ " + std::string(5000, '-') + "1 }}"), "nests more than 200");
  // jinja2 stops these with Python's RecursionError.
  EXPECT_CONTAINS(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                  "rendering nests more than 400 levels deep");
  std::string sum = "{{ 1";
  for (int i = 0; i < 5000; ++i) sum += " + 1";
  EXPECT_CONTAINS(error_of(sum + " }}"), "rendering nests more than 400 levels deep");
  // What real templates do stays well inside the bounds.
  EXPECT_EQ(JinjaTemplate::parse("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}"
                                 "{% endmacro %}{{ f(20) }}|{{ ((((1 + 2)))) * -(-3) }}",
                                 "m")
                .render({}),
            "1234567891011121314151617181920|9");
}

TEST(JinjaTemplate, StrftimeNowUsesTheGivenClock) {
  JinjaRenderOptions options;
  options.now = march_14_2025_noon();
  EXPECT_EQ(JinjaTemplate::parse("{{ strftime_now('%d %b %Y') }}", "m").render({}, options),
            "14 Mar 2025");
}

}  // namespace
}  // namespace baton::data
