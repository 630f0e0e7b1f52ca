// The built-in "calculator" tool: exact integer and rational arithmetic, nothing else, so a model
// can check its sums without running code.
//
// The language:
//   numbers      integers (42) and decimals (1.25, read exactly as 5/4); no exponent notation,
//                no thousands separators
//   operators    + - * /, unary - and +, and ^ (power: an integer exponent, right-associative,
//                binding tighter than unary minus as Python's ** does: -2^2 = -4, 2^-1 = 1/2)
//   grouping     parentheses; spaces, tabs and newlines anywhere between tokens
// No names, functions, `**`, `%` or anything else. Values are fractions of 64-bit integers,
// always reduced; a result or an intermediate value that does not fit is an "overflow" error
// (never a wrapped or rounded value). The result prints as an integer ("56088") or as "p/q"
// with the sign on p ("-1/2").
//
// Limits: at most kMaxExpressionLength characters and kMaxNestingDepth nested parentheses or
// unary operators.
//
// Example:
//   evaluate_expression("123 * 456");      // "56088"
//   evaluate_expression("1/3 + 1/6");      // "1/2"
//   evaluate_expression("(2 + 3) * -1.5"); // "-15/2"
//   evaluate_expression("1/0");            // throws: division by zero at position 2
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "workers/tools/tool_registry.h"

namespace baton::tools {

inline constexpr size_t kMaxExpressionLength = 1000;
inline constexpr int kMaxNestingDepth = 100;

// The exact value of `expression`. Throws baton::InvalidArgument saying what is wrong and at
// which position (1-based, in bytes): a character or token outside the language, a missing
// operand or parenthesis, division by zero, overflow, a non-integer exponent, too long or too
// deeply nested input.
std::string evaluate_expression(std::string_view expression);

// The tool's schema: {"type": "function", "function": {"name": "calculator", ...}} with one
// required string argument "expression".
nlohmann::ordered_json calculator_tool_schema();

// The tool: evaluate_expression(arguments["expression"]) as its text. Throws
// baton::InvalidArgument when "expression" is not a string or does not evaluate (call_tool
// turns that into an error result).
ToolResult calculator_tool(const nlohmann::json& arguments, const nlohmann::json& tools_kwargs);

}  // namespace baton::tools
