// main() of dispatch_process_tests: baton::init first (in a worker process it
// runs the worker and never returns), then GoogleTest.
#include <gtest/gtest.h>

#include "runtime/runtime.h"

int main(int argc, char** argv) {
  baton::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
