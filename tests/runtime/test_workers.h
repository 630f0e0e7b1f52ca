// Worker classes the runtime tests spawn. Registered in test_workers.cpp,
// which is linked into every test binary that starts workers.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "runtime/baton.h"

namespace baton::testing {

// Runs a small driver for the driver-death tests (see failure_test.cpp) when
// BATON_TEST_DRIVER is set; returns false otherwise.
bool maybe_run_test_driver();

}  // namespace baton::testing
