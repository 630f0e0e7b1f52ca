// main() of the runtime test binaries: baton::init first (in a worker process
// it runs the worker and never returns), then GoogleTest.
#include <gtest/gtest.h>

#include "runtime/runtime.h"
#include "tests/runtime/test_workers.h"

int main(int argc, char** argv) {
  baton::init(argc, argv);
  if (baton::testing::maybe_run_test_driver()) return 0;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
