// Rule-based rewards against hand-written responses. Expected scores are
// those verl's Python functions give for the same strings (worked out by hand
// from their code; noted where verl's behaviour is surprising).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "workers/rewards/exact_match_reward.h"
#include "workers/rewards/gsm8k_reward.h"
#include "workers/rewards/math_reward.h"
#include "workers/rewards/reward_registry.h"
#include "workers/rewards/reward_text.h"

namespace baton::rewards {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

constexpr Gsm8kOptions kFlexible{.method = Gsm8kMethod::kFlexible};

// ---- GSM8K -------------------------------------------------------------------

TEST(Gsm8kReward, StrictScoresTheAnswerAfterTheMarker) {
  EXPECT_EQ(gsm8k_score("She has 3 + 4 = 7 apples.\n#### 7", "7"), 1.0);
  EXPECT_EQ(gsm8k_score("She has 3 + 4 = 8 apples.\n#### 8", "7"), 0.0);
  EXPECT_EQ(gsm8k_score("#### -12", "-12"), 1.0);
  // Commas (thousands) are removed from the strict answer.
  EXPECT_EQ(gsm8k_score("#### 1,234", "1234"), 1.0);
  EXPECT_EQ(*extract_gsm8k_answer("#### 1,234,567.5"), "1234567.5");
}

TEST(Gsm8kReward, StrictNeedsTheMarkerWithOneSpace) {
  EXPECT_EQ(extract_gsm8k_answer("The answer is 7."), std::nullopt);
  EXPECT_EQ(extract_gsm8k_answer("####7"), std::nullopt);
  EXPECT_EQ(extract_gsm8k_answer("#### seven"), std::nullopt);
  EXPECT_EQ(extract_gsm8k_answer("#### -"), std::nullopt);
  EXPECT_EQ(gsm8k_score("The answer is 7.", "7"), 0.0);
  // A trailing period is part of the number: "7." is not "7" (as in verl).
  EXPECT_EQ(*extract_gsm8k_answer("#### 7."), "7.");
  EXPECT_EQ(gsm8k_score("#### 7.", "7"), 0.0);
}

TEST(Gsm8kReward, TheLastOfSeveralAnswersCounts) {
  const std::string response = "First try: #### 5\nNo, recount. #### 7";
  EXPECT_EQ(*extract_gsm8k_answer(response), "7");
  EXPECT_EQ(gsm8k_score(response, "7"), 1.0);
  EXPECT_EQ(gsm8k_score(response, "5"), 0.0);
  EXPECT_EQ(*extract_gsm8k_answer(response, Gsm8kMethod::kFlexible), "7");
}

TEST(Gsm8kReward, FlexibleTakesTheLastNumber) {
  EXPECT_EQ(gsm8k_score("3 + 4 makes 7", "7", kFlexible), 1.0);
  EXPECT_EQ(gsm8k_score("3 + 4 makes 7", "7"), 0.0);  // strict: no marker
  EXPECT_EQ(gsm8k_score("no digits here", "7", kFlexible), 0.0);
  // A lone "." is skipped, commas are kept, a final period stays attached.
  EXPECT_EQ(*extract_gsm8k_answer("it is 7 .", Gsm8kMethod::kFlexible), "7");
  EXPECT_EQ(*extract_gsm8k_answer("it is 1,234", Gsm8kMethod::kFlexible), "1,234");
  EXPECT_EQ(gsm8k_score("it is 1,234", "1234", kFlexible), 0.0);
  EXPECT_EQ(*extract_gsm8k_answer("it is 7.", Gsm8kMethod::kFlexible), "7.");
  EXPECT_EQ(*extract_gsm8k_answer("from 3 to -5", Gsm8kMethod::kFlexible), "-5");
  // Only "." tokens: Python's loop ends on the first one.
  EXPECT_EQ(*extract_gsm8k_answer("a . b .", Gsm8kMethod::kFlexible), ".");
}

TEST(Gsm8kReward, OnlyTheLast300CharactersAreRead) {
  // 6 + 294 characters: the marker is inside the last 300.
  const std::string filler_294(294, 'x');
  EXPECT_EQ(gsm8k_score("#### 7" + filler_294, "7"), 1.0);
  // One more character pushes the first '#' out.
  EXPECT_EQ(gsm8k_score("#### 7" + filler_294 + "x", "7"), 0.0);
  // Characters, not bytes: 294 two-byte 'é' keep the marker in.
  std::string accents;
  for (int i = 0; i < 294; ++i) accents += "\xC3\xA9";
  EXPECT_EQ(gsm8k_score("#### 7" + accents, "7"), 1.0);
  EXPECT_EQ(gsm8k_score("#### 7" + accents + "\xC3\xA9", "7"), 0.0);
}

TEST(Gsm8kReward, ScoresAreConfigurable) {
  const Gsm8kOptions options{.format_score = 0.1, .score = 2.0};
  EXPECT_EQ(gsm8k_score("#### 7", "7", options), 2.0);
  EXPECT_EQ(gsm8k_score("#### 8", "7", options), 0.1);
  EXPECT_EQ(gsm8k_score("no answer", "7", options), 0.0);
}

// ---- MATH --------------------------------------------------------------------

TEST(MathReward, ExtractsTheLastBoxedAnswerWithNestedBraces) {
  EXPECT_EQ(*last_boxed_only_string("so $\\boxed{\\frac{\\sqrt{3}}{2}}$."),
            "\\boxed{\\frac{\\sqrt{3}}{2}}");
  EXPECT_EQ(*remove_boxed("\\boxed{\\frac{\\sqrt{3}}{2}}"), "\\frac{\\sqrt{3}}{2}");
  EXPECT_EQ(*last_boxed_only_string("\\boxed{1} then \\boxed{2}"), "\\boxed{2}");
  EXPECT_EQ(math_score("\\boxed{1} then \\boxed{2}", "2"), 1.0);
  EXPECT_EQ(math_score("\\boxed{1} then \\boxed{2}", "1"), 0.0);
  // `\boxed 5` (space, no braces) runs to the next '$'.
  EXPECT_EQ(*last_boxed_only_string("thus $\\boxed 5$ done"), "\\boxed 5");
  EXPECT_EQ(math_score("thus $\\boxed 5$ done", "5"), 1.0);
}

TEST(MathReward, MalformedOrMissingBoxesScoreZero) {
  EXPECT_EQ(last_boxed_only_string("the answer is 5"), std::nullopt);
  EXPECT_EQ(math_score("the answer is 5", "5"), 0.0);
  EXPECT_EQ(last_boxed_only_string("\\boxed{5"), std::nullopt);
  EXPECT_EQ(math_score("\\boxed{5", "5"), 0.0);
  // verl finds \fbox{...} but its remove_boxed rejects it: 0.
  EXPECT_EQ(*last_boxed_only_string("\\fbox{5}"), "\\fbox{5}");
  EXPECT_EQ(remove_boxed("\\fbox{5}"), std::nullopt);
  EXPECT_EQ(math_score("\\fbox{5}", "5"), 0.0);
}

TEST(MathReward, NormalisesAnswersAsVerl) {
  const auto norm = [](const char* s) { return normalize_math_answer(s).value_or("<raises>"); };
  EXPECT_EQ(norm("\\dfrac{3}{4}"), "\\frac{3}{4}");
  EXPECT_EQ(norm("\\tfrac12"), "\\frac{1}{2}");
  EXPECT_EQ(norm("\\frac1{72}"), "\\frac{1}{72}");
  EXPECT_EQ(norm("3/4"), "\\frac{3}{4}");
  EXPECT_EQ(norm("-3/4"), "\\frac{-3}{4}");
  EXPECT_EQ(norm("03/4"), "03/4");  // not how Python prints int("03")
  EXPECT_EQ(norm("0.5"), "\\frac{1}{2}");
  EXPECT_EQ(norm(".5"), "\\frac{1}{2}");
  EXPECT_EQ(norm("\\left( 1, 2 \\right)"), "(1,2)");
  EXPECT_EQ(norm("10\\text{ inches}"), "10");
  EXPECT_EQ(norm("90^\\circ"), "90");
  EXPECT_EQ(norm("90^{\\circ}"), "90");
  EXPECT_EQ(norm("50\\%"), "50");
  EXPECT_EQ(norm("\\$5"), "5");
  EXPECT_EQ(norm("k = 3"), "3");
  EXPECT_EQ(norm("x+y = 3"), "x+y=3");  // more than 2 characters before '='
  EXPECT_EQ(norm("\\sqrt2"), "\\sqrt{2}");
  EXPECT_EQ(norm("2\\!3\n"), "23");
  EXPECT_EQ(norm("\\frac{1}{ .5}"), "\\frac{1}{0.5}");
  // Not normalised by verl's math reward: trailing ".0" and thousands commas.
  EXPECT_EQ(norm("5.0"), "5.0");
  EXPECT_EQ(norm("1,000"), "1,000");
  // Where verl's strip_string raises.
  EXPECT_EQ(normalize_math_answer("1\\text{ m}+2\\text{ m}"), std::nullopt);
  EXPECT_EQ(normalize_math_answer("2\\sqrt"), std::nullopt);
  EXPECT_EQ(normalize_math_answer("\\frac"), std::nullopt);
  // A \frac followed by one character is left as it was.
  EXPECT_EQ(norm("\\frac1"), "\\frac1");
}

TEST(MathReward, ComparesNormalisedAnswers) {
  EXPECT_EQ(math_score("We get $\\boxed{\\dfrac{1}{2}}$.", "0.5"), 1.0);
  EXPECT_EQ(math_score("\\boxed{\\frac12}", "\\frac{1}{2}"), 1.0);
  EXPECT_EQ(math_score("\\boxed{3/4}", "\\frac{3}{4}"), 1.0);
  EXPECT_EQ(math_score("\\boxed{10\\text{ inches}}", "10"), 1.0);
  EXPECT_EQ(math_score("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}"), 0.0);
  EXPECT_EQ(math_score("\\boxed{5.0}", "5"), 0.0);  // as verl
  // When normalisation fails, the raw strings are compared.
  EXPECT_TRUE(math_answers_equivalent("2\\sqrt", "2\\sqrt"));
  EXPECT_FALSE(math_answers_equivalent("2\\sqrt", "2 \\sqrt"));
}

// ---- exact match -------------------------------------------------------------

TEST(ExactMatchReward, NormalisesCaseArticlesPunctuationAndSpaces) {
  EXPECT_EQ(normalize_answer("  The Eiffel   Tower! "), "eiffel tower");
  EXPECT_EQ(normalize_answer("an apple, a pear"), "apple pear");
  EXPECT_EQ(normalize_answer("Theatre"), "theatre");  // articles are whole words only
  EXPECT_EQ(exact_match_score("<answer>The Eiffel Tower.</answer>", {"eiffel tower"}), 1.0);
  EXPECT_EQ(exact_match_score("<answer>Big Ben</answer>", {"eiffel tower"}), 0.0);
}

TEST(ExactMatchReward, TakesTheLastTaggedAnswer) {
  const std::string response = "<answer>London</answer> wait <answer>\n Paris\n</answer>";
  EXPECT_EQ(*extract_tagged_answer(response), "Paris");
  EXPECT_EQ(exact_match_score(response, {"paris"}), 1.0);
  EXPECT_EQ(exact_match_score(response, {"london"}), 0.0);
  EXPECT_EQ(extract_tagged_answer("Paris"), std::nullopt);
  EXPECT_EQ(extract_tagged_answer("<answer>Paris"), std::nullopt);
  EXPECT_EQ(exact_match_score("<answer>Paris", {"paris"}), 0.0);
}

TEST(ExactMatchReward, AnyOfSeveralGroundTruthsMatches) {
  EXPECT_EQ(parse_ground_truths("[\"Paris\", \"City of Light\"]"),
            (std::vector<std::string>{"Paris", "City of Light"}));
  EXPECT_EQ(parse_ground_truths("{\"target\": [\"Paris\"]}"), std::vector<std::string>{"Paris"});
  EXPECT_EQ(parse_ground_truths("Paris"), std::vector<std::string>{"Paris"});
  EXPECT_EQ(parse_ground_truths("[not json"), std::vector<std::string>{"[not json"});
  EXPECT_EQ(exact_match_score("<answer>the city of light</answer>",
                              parse_ground_truths("[\"Paris\", \"City of Light\"]")),
            1.0);
}

TEST(ExactMatchReward, TagSpamScoresAQuarter) {
  std::string response;
  for (int i = 0; i < 11; ++i) response += "<answer>x</answer>";
  response += "<answer>Paris</answer>";
  EXPECT_EQ(exact_match_score(response, {"paris"}), 0.25);
}

// ---- registry ----------------------------------------------------------------

TEST(RewardRegistry, DispatchesVerlDataSources) {
  EXPECT_EQ(
      compute_score({.data_source = "openai/gsm8k", .response = "#### 4", .ground_truth = "4"}),
      1.0);
  for (const char* source :
       {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
    EXPECT_EQ(compute_score({.data_source = source,
                             .response = "\\boxed{\\dfrac{1}{2}}",
                             .ground_truth = "\\frac12"}),
              1.0)
        << source;
  EXPECT_EQ(compute_score({.data_source = "searchR1_nq",
                           .response = "<answer>Paris</answer>",
                           .ground_truth = "{\"target\": [\"paris\"]}"}),
            1.0);
  // GSM8K's strict method is the default; gsm8k_flexible is selectable by name.
  EXPECT_EQ(compute_score({.data_source = "openai/gsm8k", .response = "so 4", .ground_truth = "4"}),
            0.0);
  EXPECT_EQ(find_reward_function("gsm8k_flexible")({.response = "so 4", .ground_truth = "4"}), 1.0);
}

TEST(RewardRegistry, UnknownDataSourceNamesItAndTheKnownOnes) {
  try {
    compute_score({.data_source = "my/dataset", .response = "x", .ground_truth = "x"});
    FAIL() << "no error";
  } catch (const baton::InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_CONTAINS(message, "no reward function for data_source 'my/dataset'");
    EXPECT_CONTAINS(message, "openai/gsm8k");
    EXPECT_CONTAINS(message, "lighteval/MATH");
    EXPECT_CONTAINS(message, "register_reward_data_source");
  }
  try {
    find_reward_function("gsm9k");
    FAIL() << "no error";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(),
                    "reward function 'gsm9k' is not registered; did you mean 'gsm8k'? known: "
                    "exact_match, gsm8k");
  }
}

TEST(RewardRegistry, UserFunctionsAreRegisteredAndSelectedByName) {
  register_reward_function(
      "test_length", [](const RewardInput& in) { return static_cast<double>(in.response.size()); });
  EXPECT_THROW(register_reward_function("test_length", [](const RewardInput&) { return 0.0; }),
               baton::InvalidArgument);
  EXPECT_THROW(register_reward_function("gsm8k", [](const RewardInput&) { return 0.0; }),
               baton::InvalidArgument);
  EXPECT_THROW(register_reward_function("test_empty", nullptr), baton::InvalidArgument);

  // custom_reward_function.name selects it for every sample...
  const RewardFunction selected = select_reward_function("test_length");
  EXPECT_EQ(selected({.data_source = "openai/gsm8k", .response = "abc"}), 3.0);
  // ...and null selects by data source.
  const RewardFunction by_source = select_reward_function(std::nullopt);
  EXPECT_EQ(by_source({.data_source = "openai/gsm8k", .response = "#### 4", .ground_truth = "4"}),
            1.0);

  // Data sources: exact names, prefixes (the longest wins), remapping.
  register_reward_data_source("test_toy", "test_length");
  register_reward_data_source("test_arith_*", "gsm8k");
  register_reward_data_source("test_arith_long_*", "test_length");
  EXPECT_EQ(compute_score({.data_source = "test_toy", .response = "abcd"}), 4.0);
  EXPECT_EQ(
      compute_score({.data_source = "test_arith_add", .response = "#### 2", .ground_truth = "2"}),
      1.0);
  EXPECT_EQ(compute_score({.data_source = "test_arith_long_add", .response = "#### 2"}), 6.0);
  register_reward_data_source("test_toy", "gsm8k");
  EXPECT_EQ(compute_score({.data_source = "test_toy", .response = "abcd", .ground_truth = "4"}),
            0.0);
  EXPECT_THROW(register_reward_data_source("test_other", "no_such_function"),
               baton::InvalidArgument);
  const auto sources = reward_data_sources();
  EXPECT_NE(std::find(sources.begin(), sources.end(), "test_arith_*"), sources.end());
}

TEST(RewardText, PythonStringSemantics) {
  EXPECT_EQ(text::replace_all("\\\\\\", "\\\\", "\\"), "\\\\");  // non-overlapping
  EXPECT_EQ(text::split("a=b=", "="), (std::vector<std::string>{"a", "b", ""}));
  EXPECT_EQ(text::code_point_count("a\xC3\xA9\xE2\x82\xAC"), 3u);
  EXPECT_EQ(text::last_code_points("a\xC3\xA9"
                                   "b",
                                   2),
            "\xC3\xA9"
            "b");
  EXPECT_EQ(text::count("<a><a>", "<a>"), 2u);
}

}  // namespace
}  // namespace baton::rewards
