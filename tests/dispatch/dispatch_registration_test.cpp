// The DataProto dispatch modes are there in a program that only includes
// dispatch/dispatch_modes.h: nothing here references DataProto, so the
// linker would drop an object file whose static initialiser registered them.
#include <gtest/gtest.h>

#include "dispatch/dispatch_modes.h"
#include "runtime/dispatch_registry.h"
#include "runtime/method_table.h"

namespace baton {
namespace {

namespace mode = dispatch_mode;

TEST(DispatchModeRegistration, IncludingTheHeaderRegistersEveryModeBeforeMain) {
  for (const char* m : {mode::kDpCompute, mode::kDpComputeProto, mode::kDpComputeProtoWithFunc,
                        mode::kDpComputeMetric, mode::kMegatronCompute, mode::kMegatronComputeProto,
                        mode::kMegatronPpAsDp, mode::kMegatronPpAsDpProto, mode::kMegatronPpOnly}) {
    EXPECT_NO_THROW(find_dispatch_mode(m)) << m;
  }
  EXPECT_NE(find_builtin_method("execute_with_func"), nullptr);
}

TEST(DispatchModeRegistration, RegisteringAgainKeepsAReplacedMode) {
  replace_dispatch_mode(
      mode::kDpCompute, [](const WorkerGroup&, const List&) { return DispatchPlan(); },
      [](const CollectInput&) { return Value("replaced"); });
  register_dispatch_modes();
  EXPECT_EQ(find_dispatch_mode(mode::kDpCompute).collect(CollectInput()), Value("replaced"));
}

}  // namespace
}  // namespace baton
