// What the static registration macros share (BATON_POLICY_LOSS and
// BATON_ADVANTAGE_ESTIMATOR in workers/algos/algo_registry.h, BATON_REWARD_FUNCTION
// in workers/rewards/reward_registry.h). Each expands, at namespace scope, to a
// static bool initialised by register_at_startup, so the registration runs
// before main() in every process of the executable. A failed registration (a
// taken name) prints the macro, the name and why, and aborts: an exception
// thrown before main() could not be caught.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace baton::detail {

template <typename Register>
bool register_at_startup(const char* macro, const char* name, Register&& add) {
  try {
    add();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s(\"%s\"): %s\n", macro, name, e.what());
    std::abort();
  }
  return true;
}

}  // namespace baton::detail

// A name of its own for each registration in a file.
#define BATON_REGISTRATION_CONCAT_(a, b) a##b
#define BATON_REGISTRATION_CONCAT(a, b) BATON_REGISTRATION_CONCAT_(a, b)
#define BATON_REGISTRATION_NAME(prefix) BATON_REGISTRATION_CONCAT(prefix, __COUNTER__)
