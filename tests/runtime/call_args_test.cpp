// CallArgs: every type a method can take is a call argument as it is.
#include "runtime/call_args.h"

#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/future.h"

namespace baton {
namespace {

static_assert(is_value_type_v<std::vector<double>>);
static_assert(is_value_type_v<std::map<std::string, std::vector<int64_t>>>);
static_assert(!is_value_type_v<std::vector<std::vector<const void*>>>);
static_assert(!is_value_type_v<std::map<int, double>>);  // keys are strings

TEST(CallArgs, ContainersAMethodTakesBecomeTheValuesItsParameterExpects) {
  const std::vector<std::string> words{"a", "b"};
  CallArgs args{std::vector<double>{1.5, -2.0}, std::vector<int64_t>{3, 4},
                std::map<std::string, double>{{"x", 0.25}}, words, 7, "text", at::ones({2})};
  ASSERT_EQ(args.size(), 7u);
  EXPECT_EQ(args[0].value(), Value(List{1.5, -2.0}));
  EXPECT_EQ(args[1].value(), Value(List{3, 4}));
  EXPECT_EQ(args[2].value(), Value(Dict{{"x", 0.25}}));
  EXPECT_EQ(args[3].value(), Value(List{"a", "b"}));
  EXPECT_EQ(args[4].value(), Value(7));
  EXPECT_EQ(args[5].value(), Value("text"));
  EXPECT_EQ(args[6].value(), Value(at::ones({2})));
  EXPECT_FALSE(args.has_futures());
  // And back: what a worker's typed parameter makes of them.
  EXPECT_EQ(args[0].value().as<std::vector<double>>(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(args[3].value().as<std::vector<std::string>>(), words);
  EXPECT_TRUE(TypeSpec::list_of(TypeSpec::of(ValueKind::kFloat)).mismatch(args[0].value()) ==
              std::nullopt);
}

TEST(CallArgs, FuturesStayFutures) {
  Promise<Value> p;
  Future<Value> f = p.future();
  CallArgs args{f, std::vector<double>{1.0}};
  EXPECT_TRUE(args[0].is_future());
  EXPECT_FALSE(args[1].is_future());
  EXPECT_TRUE(args.has_futures());
}

}  // namespace
}  // namespace baton
