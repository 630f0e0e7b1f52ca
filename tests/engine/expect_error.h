// expect_error: the call throws EngineError (or the error type given,
// expect_error<baton::Error>(...)) and its message names every one of
// `needles` (a file, a tensor, a size). For tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/errors.h"

namespace baton::engine::testing {

template <typename ErrorType = EngineError, typename F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an error naming " << (needles.empty() ? "" : needles.front());
  } catch (const ErrorType& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "\"" << n << "\" not in: " << e.what();
  }
}

}  // namespace baton::engine::testing
