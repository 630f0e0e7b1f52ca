// The DAPO math reward against hand-written responses. Expected predictions
// and scores are worked out by hand from verl's math_dapo.py (its regexes and
// replacement lists); noted where verl's behaviour is surprising.
#include <gtest/gtest.h>

#include <string>

#include "workers/rewards/math_dapo_reward.h"
#include "workers/rewards/reward_registry.h"

namespace baton::rewards {
namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(MathDapoReward, ScoresOneForTheRightAnswerAndMinusOneOtherwise) {
  EXPECT_EQ(math_dapo_score("6 * 7 = 42\nAnswer: 42", "42"), 1.0);
  EXPECT_EQ(math_dapo_score("6 * 7 = 41\nAnswer: 41", "42"), -1.0);
  // No "Answer:" at all: the prediction is "[INVALID]".
  EXPECT_EQ(math_dapo_prediction("6 * 7 = 42"), "[INVALID]");
  EXPECT_EQ(math_dapo_score("6 * 7 = 42", "42"), -1.0);
}

TEST(MathDapoReward, ReadsTheLastAnswerLine) {
  EXPECT_EQ(math_dapo_prediction("Answer: 3\nthen I checked.\nAnswer: 4"), "4");
  EXPECT_EQ(math_dapo_prediction("answer : 9"), "9");  // case-insensitive, space before ':'
  // \s* after ':' crosses newlines, and gives back what [^\n]+ needs.
  EXPECT_EQ(math_dapo_prediction("Answer:\n7"), "7");
  EXPECT_EQ(math_dapo_prediction("Answer:  \n5"), "5");
  // The first match takes the rest of its line: no second match inside it.
  EXPECT_EQ(math_dapo_prediction("Answer: Answer: 5"), "Answer:5");
  EXPECT_EQ(math_dapo_score("Answer: Answer: 5", "5"), -1.0);
}

TEST(MathDapoReward, PythonUnicodeRulesForWhitespaceAndCase) {
  // U+3000 (ideographic space) is \s in Python; U+017F (long s) matches 's'
  // under re.IGNORECASE.
  EXPECT_EQ(math_dapo_prediction("Answer:\xE3\x80\x80 5"), "5");
  EXPECT_EQ(math_dapo_prediction("An\xC5\xBFwer: 5"), "5");
}

TEST(MathDapoReward, ReadsOnlyTheLast300CodePoints) {
  // "Answer: 5\n" is 10 code points; é is one code point of two bytes.
  EXPECT_EQ(math_dapo_score("Answer: 5\n" + repeat("\xC3\xA9", 290), "5"), 1.0);
  EXPECT_EQ(math_dapo_score("Answer: 5\n" + repeat("\xC3\xA9", 291), "5"), -1.0);
}

TEST(MathDapoReward, NormalisesLikeMinerva) {
  EXPECT_EQ(normalize_final_answer("x = 10"), "10");             // after the last '='
  EXPECT_EQ(normalize_final_answer("1,000"), "1000");            // digits and commas
  EXPECT_EQ(normalize_final_answer("1,000.5"), "1,000.5");       // not only digits: kept
  EXPECT_EQ(normalize_final_answer("5 dollars"), "5");           // units removed
  EXPECT_EQ(normalize_final_answer("10\\text{ m}"), "10");       // \text{m} -> \text{} -> ""
  EXPECT_EQ(normalize_final_answer("90^\\circ"), "90");
  EXPECT_EQ(normalize_final_answer("\\$5"), "5");
  EXPECT_EQ(normalize_final_answer("\\text{(B)}"), "(B)");
  EXPECT_EQ(normalize_final_answer("\\textbf{yes}"), "yes");
  EXPECT_EQ(normalize_final_answer("\\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");  // greedy to the last }
  EXPECT_EQ(normalize_final_answer("\\frac12"), "\\frac{1}{2}");
  EXPECT_EQ(normalize_final_answer("2\\sqrt3"), "2\\sqrt{3}");
  EXPECT_EQ(normalize_final_answer("the value is $42$ exactly"), "42");  // between the first two $
  // Surprising, as in verl: "cm" is removed wherever it occurs.
  EXPECT_EQ(normalize_final_answer("5 cm^2"), "5^2");
}

TEST(MathDapoReward, ComparesNormalisedAnswerAndGroundTruth) {
  EXPECT_EQ(math_dapo_score("so\nAnswer: $\\frac{1}{2}$", "\\frac12"), 1.0);
  EXPECT_EQ(math_dapo_score("Answer: 1000", "1,000"), 1.0);
  EXPECT_EQ(math_dapo_score("Answer: 0.5", "\\frac{1}{2}"), -1.0);  // no numeric equivalence
}

TEST(MathDapoReward, StrictBoxVerifyComparesTheLastBoxUnnormalised) {
  const MathDapoOptions strict{.strict_box_verify = true};
  EXPECT_EQ(math_dapo_score("so \\boxed{12}", "12", strict), 1.0);
  EXPECT_EQ(math_dapo_score("so \\boxed{ 12}", "12", strict), -1.0);
  EXPECT_EQ(math_dapo_score("\\boxed{1} or \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", strict), 1.0);
  EXPECT_EQ(math_dapo_prediction("Answer: 12", strict), "[INVALID]");
  // Only the last 100 code points are searched.
  EXPECT_EQ(math_dapo_score("\\boxed{12}" + repeat("x", 91), "12", strict), -1.0);
  EXPECT_EQ(math_dapo_score("\\boxed{12}" + repeat("x", 90), "12", strict), 1.0);
}

TEST(MathDapoReward, RegisteredForMathDapoAndAimeSources) {
  EXPECT_EQ(compute_score({.data_source = "math_dapo", .response = "Answer: 4", .ground_truth = "4"}),
            1.0);
  EXPECT_EQ(compute_score({.data_source = "aime2024", .response = "Answer: 4", .ground_truth = "4"}),
            1.0);
  EXPECT_EQ(compute_score({.data_source = "aime25", .response = "Answer: 5", .ground_truth = "4"}),
            -1.0);
  EXPECT_EQ(find_reward_function("math_dapo")({.response = "Answer: 4", .ground_truth = "4"}), 1.0);
}

}  // namespace
}  // namespace baton::rewards
