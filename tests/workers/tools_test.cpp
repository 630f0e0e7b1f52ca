// The tool registry, the built-in calculator and verl-format tool config files
// (workers/tools/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "workers/tools/calculator_tool.h"
#include "workers/tools/tool_config.h"
#include "workers/tools/tool_registry.h"

namespace baton::tools {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// The message evaluate_expression throws for `expression` ("" if it does not throw).
std::string calculator_error(const std::string& expression) {
  try {
    evaluate_expression(expression);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// The message `fn` throws as an InvalidArgument ("" if it does not throw).
template <typename Fn>
std::string invalid_argument_message(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Registered before main(), as a driver's tools are: echoes "text", prefixed with the row's
// tools_kwargs "prefix" when it has one.
BATON_TOOL("test_echo", R"({"type": "function", "function": {"name": "test_echo",
    "description": "Repeats the text.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}})",
           [](const nlohmann::json& arguments, const nlohmann::json& tools_kwargs) {
             std::string text = arguments.at("text").get<std::string>();
             if (tools_kwargs.contains("prefix"))
               text = tools_kwargs["prefix"].get<std::string>() + text;
             return ToolResult{.text = text, .reward = 0.5, .metrics = {{"length", 4.0}}};
           });

BATON_TOOL("test_throws", R"({"type": "function", "function": {"name": "test_throws",
    "parameters": {"type": "object", "properties": {}}}})",
           [](const nlohmann::json&, const nlohmann::json&) -> ToolResult {
             throw std::runtime_error("the backend is down");
           });

namespace {

// ---- Registry --------------------------------------------------------------------------------

nlohmann::ordered_json schema_named(const std::string& name) {
  return {
      {"type", "function"},
      {"function",
       {{"name", name},
        {"parameters", {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}}}}}};
}

ToolResult ok_tool(const nlohmann::json&, const nlohmann::json&) {
  ToolResult r;
  r.text = "ok";
  return r;
}

TEST(ToolRegistry, StaticRegistrationRunsBeforeMain) {
  const std::vector<std::string> names = tool_names();
  for (const char* name : {"calculator", "test_echo", "test_throws"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  EXPECT_EQ(find_tool("test_echo").schema["function"]["description"], "Repeats the text.");
  // The schema keeps the keys in the order written (the template prints it so).
  EXPECT_EQ(find_tool("test_echo").schema.begin().key(), "type");
}

TEST(ToolRegistry, CallPassesArgumentsAndToolsKwargs) {
  const ToolResult r = call_tool("test_echo", {{"text", "hi"}}, {{"prefix", ">> "}});
  EXPECT_FALSE(r.error);
  EXPECT_EQ(r.text, ">> hi");
  EXPECT_EQ(r.reward, 0.5);
  EXPECT_EQ(r.metrics.at("length"), 4.0);
  EXPECT_EQ(call_tool("test_echo", {{"text", "hi"}}, nlohmann::json::object()).text, "hi");
}

TEST(ToolRegistry, RejectsDuplicateAndEmptyNames) {
  EXPECT_CONTAINS(invalid_argument_message([] {
                    register_tool("calculator", calculator_tool_schema(), calculator_tool);
                  }),
                  "already registered");
  EXPECT_CONTAINS(invalid_argument_message(
                      [] { register_tool("test_echo", schema_named("test_echo"), ok_tool); }),
                  "already registered");
  EXPECT_CONTAINS(invalid_argument_message([] { register_tool("", schema_named(""), ok_tool); }),
                  "empty");
  EXPECT_CONTAINS(invalid_argument_message(
                      [] { register_tool("no_function", schema_named("no_function"), nullptr); }),
                  "empty function");
}

TEST(ToolRegistry, RejectsASchemaThatDoesNotNameTheTool) {
  EXPECT_CONTAINS(
      invalid_argument_message([] { register_tool("mismatch", schema_named("other"), ok_tool); }),
      "names the function 'other'");
  EXPECT_CONTAINS(invalid_argument_message([] {
                    register_tool("no_function_key", {{"type", "function"}}, ok_tool);
                  }),
                  "no \"function\" object");
  EXPECT_CONTAINS(invalid_argument_message([] {
                    register_tool("nameless", {{"function", {{"description", "x"}}}}, ok_tool);
                  }),
                  "function.name");
  EXPECT_CONTAINS(invalid_argument_message([] {
                    register_tool("array", {1, 2}, ok_tool);
                  }),
                  "not a JSON object");
  // None of them was registered.
  for (const char* name : {"mismatch", "no_function_key", "nameless", "array"})
    EXPECT_THROW(find_tool(name), InvalidArgument) << name;
}

TEST(ToolRegistry, RegistersAtRunTime) {
  register_tool("run_time_tool", schema_named("run_time_tool"), ok_tool);
  EXPECT_EQ(find_tool("run_time_tool").name, "run_time_tool");
  EXPECT_EQ(call_tool("run_time_tool", nlohmann::json::object(), {}).text, "ok");
}

TEST(ToolRegistry, FindUnknownNamesItAndEveryTool) {
  const std::string message = invalid_argument_message([] { find_tool("calculater"); });
  EXPECT_CONTAINS(message, "'calculater'");
  EXPECT_CONTAINS(message, "did you mean 'calculator'");
  EXPECT_CONTAINS(message, "test_echo");
  EXPECT_CONTAINS(message, "BATON_TOOL");
}

TEST(ToolRegistry, CallErrorsAreResultsNotExceptions) {
  ToolResult r = call_tool("no_such_tool", nlohmann::json::object(), {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "'no_such_tool' is not registered");

  r = call_tool("test_echo", nlohmann::json::array({"hi"}), {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "must be a JSON object");

  r = call_tool("test_echo", {{"txt", "hi"}}, {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "missing the required argument \"text\"");

  r = call_tool("test_throws", nlohmann::json::object(), {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "'test_throws'");
  EXPECT_CONTAINS(r.text, "the backend is down");

  r = call_tool("calculator", {{"expression", "1/0"}}, {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "'calculator'");
  EXPECT_CONTAINS(r.text, "division by zero");
  EXPECT_FALSE(r.reward.has_value());

  r = call_tool("calculator", {{"expression", 12}}, {});
  EXPECT_TRUE(r.error);
  EXPECT_CONTAINS(r.text, "must be a string");
}

// ---- Calculator ------------------------------------------------------------------------------

TEST(Calculator, ExactIntegerAndRationalResults) {
  EXPECT_EQ(evaluate_expression("123*456"), "56088");
  EXPECT_EQ(evaluate_expression("1/3+1/6"), "1/2");
  EXPECT_EQ(evaluate_expression("1/3 - 1/2"), "-1/6");
  EXPECT_EQ(evaluate_expression("7/-14"), "-1/2");
  EXPECT_EQ(evaluate_expression("6/3"), "2");
  EXPECT_EQ(evaluate_expression("0/5"), "0");
  EXPECT_EQ(evaluate_expression("1.25*4"), "5");
  EXPECT_EQ(evaluate_expression("0.1+0.2"), "3/10");
  EXPECT_EQ(evaluate_expression("1.500"), "3/2");
  EXPECT_EQ(evaluate_expression("007"), "7");
  EXPECT_EQ(evaluate_expression(" \t1 +\n 2\r\n"), "3");
  EXPECT_EQ(call_tool("calculator", {{"expression", "1/3 + 1/6"}}, {}).text, "1/2");
}

TEST(Calculator, PrecedenceAndAssociativity) {
  EXPECT_EQ(evaluate_expression("2+3*4"), "14");
  EXPECT_EQ(evaluate_expression("(2+3)*4"), "20");
  EXPECT_EQ(evaluate_expression("10-4-3"), "3");
  EXPECT_EQ(evaluate_expression("8/4/2"), "1");
  EXPECT_EQ(evaluate_expression("2*3/4"), "3/2");
  EXPECT_EQ(evaluate_expression("((1))+((2)*(3))"), "7");
}

TEST(Calculator, UnaryMinusAndPlus) {
  EXPECT_EQ(evaluate_expression("-3+5"), "2");
  EXPECT_EQ(evaluate_expression("-(2+3)"), "-5");
  EXPECT_EQ(evaluate_expression("2*-3"), "-6");
  EXPECT_EQ(evaluate_expression("--4"), "4");
  EXPECT_EQ(evaluate_expression("+4 - -1"), "5");
}

TEST(Calculator, PowersWithIntegerExponents) {
  EXPECT_EQ(evaluate_expression("2^10"), "1024");
  EXPECT_EQ(evaluate_expression("2^-2"), "1/4");
  EXPECT_EQ(evaluate_expression("-2^2"), "-4");  // as Python's -2**2
  EXPECT_EQ(evaluate_expression("(-2)^3"), "-8");
  EXPECT_EQ(evaluate_expression("2^3^2"), "512");  // right-associative
  EXPECT_EQ(evaluate_expression("(1/2)^3"), "1/8");
  EXPECT_EQ(evaluate_expression("0^0"), "1");
  EXPECT_EQ(evaluate_expression("1^1000000000000"), "1");
  EXPECT_EQ(evaluate_expression("(-1)^1000000000001"), "-1");
  EXPECT_EQ(evaluate_expression("2^62"), "4611686018427387904");
  EXPECT_CONTAINS(calculator_error("2^(1/2)"), "must be an integer");
  EXPECT_CONTAINS(calculator_error("0^-1"), "division by zero");
  EXPECT_CONTAINS(calculator_error("2^63"), "overflow");
  EXPECT_CONTAINS(calculator_error("3^1000000000000"), "overflow");
}

TEST(Calculator, OverflowIsAnErrorNotAWrappedValue) {
  EXPECT_EQ(evaluate_expression("9223372036854775807"), "9223372036854775807");
  EXPECT_EQ(evaluate_expression("-9223372036854775807"), "-9223372036854775807");
  EXPECT_EQ(evaluate_expression("9223372036854775807*-1"), "-9223372036854775807");
  // (2^62/3) * (3/2): 2^62 * 3 would overflow; cross-reducing first keeps it exact.
  EXPECT_EQ(evaluate_expression("4611686018427387904/3 * (3/2)"), "2305843009213693952");
  for (const char* expression :
       {"9223372036854775807+1", "9223372036854775808", "3037000500*3037000500",
        "-9223372036854775807-1", "1/3037000500/3037000500", "0.0000000000000000000001",
        "4611686018427387904*2"}) {
    EXPECT_CONTAINS(calculator_error(expression), "overflow");
  }
  // The error names where: the '+' is the 20th character.
  EXPECT_CONTAINS(calculator_error("9223372036854775807+1"), "at position 20");
}

TEST(Calculator, DivisionByZeroNamesThePosition) {
  EXPECT_CONTAINS(calculator_error("1/0"), "division by zero at position 2");
  EXPECT_CONTAINS(calculator_error("5 + 1/(2-2)"), "division by zero at position 6");
  EXPECT_CONTAINS(calculator_error("1/0.0"), "division by zero");
}

TEST(Calculator, RejectsAnythingButArithmetic) {
  EXPECT_CONTAINS(calculator_error("__import__('os')"), "names and functions are not allowed");
  EXPECT_CONTAINS(calculator_error("__import__('os')"), "at position 1");
  EXPECT_CONTAINS(calculator_error("abs(-3)"), "names and functions are not allowed");
  EXPECT_CONTAINS(calculator_error("2**3"), "'**' is not supported");
  EXPECT_CONTAINS(calculator_error("2**3"), "at position 2");
  EXPECT_CONTAINS(calculator_error("7 % 3"), "unexpected '%'");
  EXPECT_CONTAINS(calculator_error("1e3"), "at position 2");
  EXPECT_CONTAINS(calculator_error("1,000"), "unexpected ','");
  EXPECT_CONTAINS(calculator_error(""), "empty");
  EXPECT_CONTAINS(calculator_error("   "), "empty");
  EXPECT_CONTAINS(calculator_error("(1+2"), "expected ')' to close the '(' at position 1");
  EXPECT_CONTAINS(calculator_error("1+2)"), "unexpected ')'");
  EXPECT_CONTAINS(calculator_error("1+"), "unexpected end");
  EXPECT_CONTAINS(calculator_error("3 4"), "expected an operator");
  EXPECT_CONTAINS(calculator_error("2(3)"), "expected an operator");
  EXPECT_CONTAINS(calculator_error("1."), "decimal point");
  EXPECT_CONTAINS(calculator_error(".5"), "expected a number");
  EXPECT_CONTAINS(calculator_error("1..2"), "decimal point");
  EXPECT_CONTAINS(calculator_error("1 + \xc3\xa9"), "unexpected character");
}

TEST(Calculator, LimitsNestingDepth) {
  const int ok = kMaxNestingDepth / 2;
  EXPECT_EQ(evaluate_expression(std::string(ok, '(') + "1" + std::string(ok, ')')), "1");
  const int deep = kMaxNestingDepth + 1;
  EXPECT_CONTAINS(calculator_error(std::string(deep, '(') + "1" + std::string(deep, ')')),
                  "nested");
  EXPECT_CONTAINS(calculator_error(std::string(deep, '-') + "1"), "nested");
  std::string powers = "1";
  for (int i = 0; i < deep; ++i) powers += "^1";
  EXPECT_CONTAINS(calculator_error(powers), "nested");
}

TEST(Calculator, LimitsLength) {
  std::string sum = "1";
  while (sum.size() + 2 <= kMaxExpressionLength) sum += "+1";
  EXPECT_EQ(evaluate_expression(sum), std::to_string((sum.size() + 1) / 2));
  EXPECT_CONTAINS(calculator_error(sum + "+1"), "at most 1000");
}

TEST(Calculator, SchemaHasOneRequiredStringArgument) {
  const nlohmann::ordered_json schema = calculator_tool_schema();
  EXPECT_EQ(schema["function"]["name"], "calculator");
  EXPECT_EQ(schema["function"]["parameters"]["properties"]["expression"]["type"], "string");
  EXPECT_EQ(schema["function"]["parameters"]["required"], nlohmann::ordered_json({"expression"}));
  EXPECT_EQ(find_tool("calculator").schema, schema);
}

// ---- Tool config files -------------------------------------------------------------------------

// A file in a directory of its own, removed at the end of the test.
class ToolConfigFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "baton_tools_test_XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& text) {
    const std::filesystem::path path = dir_ / "tool_config.yaml";
    std::ofstream(path) << text;
    return path;
  }

  // The message load_tool_config throws for a file holding `text`.
  std::string load_error(const std::string& text) {
    const std::filesystem::path path = write(text);
    const std::string message = invalid_argument_message([&] { load_tool_config(path); });
    EXPECT_CONTAINS(message, path.string());
    return message;
  }

  std::filesystem::path dir_;
};

TEST_F(ToolConfigFile, ReadsVerlsFormat) {
  const std::filesystem::path path = write(R"(tools:
  - class_name: "verl.tools.calculator.CalculatorTool"
    config: {type: native, timeout: 5, ratio: 0.5, strict: true, label: "7", none: null}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Edited by the user.
        parameters:
          type: object
          properties:
            expression: {type: string, description: "An expression like 1+2."}
          required: [expression]
  - class_name: my.Echo
    tool_schema:
      type: function
      function: {name: test_echo, description: Echo, parameters: {type: object, properties: {}}}
)");
  const std::vector<ConfiguredTool> tools = load_tool_config(path);
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_EQ(tools[0].name, "calculator");
  EXPECT_EQ(tools[0].class_name, "verl.tools.calculator.CalculatorTool");
  EXPECT_EQ(tools[0].config, nlohmann::json({{"type", "native"},
                                             {"timeout", 5},
                                             {"ratio", 0.5},
                                             {"strict", true},
                                             {"label", "7"},
                                             {"none", nullptr}}));
  EXPECT_TRUE(tools[0].config["timeout"].is_number_integer());
  EXPECT_TRUE(tools[0].config["label"].is_string());  // quoted: a string
  EXPECT_EQ(tools[0].schema["function"]["description"], "Edited by the user.");
  // The file's key order is kept, for a prompt as verl renders it.
  const std::string start = R"({"type":"function","function":{"name":"calculator")";
  EXPECT_EQ(tools[0].schema.dump().substr(0, start.size()), start);
  EXPECT_EQ(tools[1].name, "test_echo");
  EXPECT_EQ(tools[1].config, nlohmann::json::object());

  const nlohmann::ordered_json schemas = tool_schemas_for_template(tools);
  ASSERT_EQ(schemas.size(), 2u);
  EXPECT_EQ(schemas[0], tools[0].schema);
  EXPECT_EQ(schemas[1], tools[1].schema);
  // The registered schema stays what the tool registered.
  EXPECT_EQ(find_tool("calculator").schema, calculator_tool_schema());
}

TEST_F(ToolConfigFile, AnEmptyListHasNoTools) {
  EXPECT_TRUE(load_tool_config(write("tools: []\n")).empty());
  EXPECT_TRUE(tool_schemas_for_template({}).is_array());
}

TEST_F(ToolConfigFile, MissingToolSchemaNamesTheEntryAndKey) {
  const std::string message = load_error(R"(tools:
  - tool_schema: {type: function, function: {name: calculator}}
  - class_name: my.Tool
    config: {}
)");
  EXPECT_CONTAINS(message, "tool_config.yaml:3: tools[1]");
  EXPECT_CONTAINS(message, "missing 'tool_schema'");
}

TEST_F(ToolConfigFile, MissingFunctionNameNamesTheKey) {
  const std::string message =
      load_error("tools:\n  - tool_schema: {type: function, function: {description: x}}\n");
  EXPECT_CONTAINS(message, "tools[0]");
  EXPECT_CONTAINS(message, "'tool_schema.function.name'");
}

TEST_F(ToolConfigFile, UnknownToolListsTheRegisteredOnes) {
  const std::string message = load_error(R"(tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
    tool_schema:
      type: function
      function: {name: calc_gsm8k_reward, description: x}
)");
  EXPECT_CONTAINS(message, "tools[0]");
  EXPECT_CONTAINS(message, "'tool_schema.function.name'");
  EXPECT_CONTAINS(message, "'calc_gsm8k_reward' is not registered");
  EXPECT_CONTAINS(message, "calculator");
  EXPECT_CONTAINS(message, "test_echo");
}

TEST_F(ToolConfigFile, OtherErrorsNameTheKey) {
  EXPECT_CONTAINS(
      load_error("tools:\n  - config: 3\n    tool_schema: {function: {name: calculator}}\n"),
      "'config' must be a mapping");
  EXPECT_CONTAINS(load_error("tools:\n  - tool_schema: [1, 2]\n"),
                  "'tool_schema' must be a mapping");
  EXPECT_CONTAINS(load_error("tools:\n  - just a string\n"), "tools[0]");
  EXPECT_CONTAINS(load_error("tools:\n  - tool_schema: {function: {name: calculator}}\n"
                             "  - tool_schema: {function: {name: calculator}}\n"),
                  "listed twice (also tools[0])");
  EXPECT_CONTAINS(load_error("tool:\n  - tool_schema: {function: {name: calculator}}\n"),
                  "missing 'tools'");
  EXPECT_CONTAINS(load_error("tools: {calculator: 1}\n"), "'tools' must be a list");
  EXPECT_CONTAINS(load_error("- 1\n- 2\n"), "'tools'");
}

TEST_F(ToolConfigFile, BadYamlNamesTheFileAndLine) {
  const std::string message = load_error("tools:\n  - tool_schema: {function: {name: calculator\n");
  EXPECT_CONTAINS(message, "not valid YAML");
  EXPECT_CONTAINS(message, "tool_config.yaml:");
}

TEST_F(ToolConfigFile, MissingFileIsAFileError) {
  EXPECT_THROW(load_tool_config(dir_ / "absent.yaml"), FileError);
}

}  // namespace
}  // namespace baton::tools
