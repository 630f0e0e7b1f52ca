// baton::Registry<T> (base/registry.h): the one name → value table behind the
// registries of policy losses, advantage estimators, reward functions,
// dispatch modes, worker functions, built-in methods and worker classes.
#include "base/registry.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"

namespace baton {
namespace {

template <typename E = Error>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Registry, AddRefusesAnEmptyOrTakenName) {
  Registry<int> r("widget");
  r.add("gear", 1);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.add("gear", 2); }),
            "widget 'gear' is already registered; choose another name");
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.add("", 3); }), "widget: the name is empty");
  EXPECT_EQ(r.get("gear"), 1);  // the first value stays
}

TEST(Registry, FindReturnsTheValueOrNull) {
  Registry<std::string> r("widget");
  r.add("gear", "a gear");
  ASSERT_NE(r.find("gear"), nullptr);
  EXPECT_EQ(*r.find("gear"), "a gear");
  EXPECT_EQ(r.find("Gear"), nullptr);  // names are case-sensitive
  EXPECT_EQ(r.find("cog"), nullptr);
}

TEST(Registry, UnknownNameSuggestsTheClosestAndListsTheKnownOnes) {
  Registry<int> r("widget", "register your own with add_widget");
  r.add("sprocket", 1);
  r.add("gear", 2);
  r.add("lever", 3);
  EXPECT_EQ(error_of<InvalidArgument>([&] { r.get("sprockit"); }),
            "widget 'sprockit' is not registered; did you mean 'sprocket'? known: gear, lever, "
            "sprocket (register your own with add_widget)");
  // Case is ignored for the suggestion only.
  EXPECT_NE(error_of([&] { r.get("GEAR"); }).find("did you mean 'gear'?"), std::string::npos);
  // A name far from every known one gets no suggestion.
  EXPECT_EQ(error_of([&] { r.get("zzzzzzzzzzzz"); }),
            "widget 'zzzzzzzzzzzz' is not registered; known: gear, lever, sprocket (register "
            "your own with add_widget)");
  EXPECT_EQ(error_of([] { Registry<int>("widget").get("gear"); }),
            "widget 'gear' is not registered; known: none");
}

TEST(Registry, UnknownNameThrowsTheErrorTypeTheRegistryNames) {
  Registry<int, CallError> r("dispatch mode");
  r.add("ONE_TO_ALL", 1);
  EXPECT_THROW(r.get("ONE_TO_AL"), CallError);
  EXPECT_NE(error_of<CallError>([&] { r.get("ONE_TO_AL"); }).find("did you mean 'ONE_TO_ALL'?"),
            std::string::npos);
  // Registration errors are the caller's bad arguments whatever the registry.
  EXPECT_THROW(r.add("ONE_TO_ALL", 2), InvalidArgument);
}

TEST(Registry, NamesAreSorted) {
  Registry<int> r("widget");
  for (const char* name : {"lever", "gear", "sprocket", "axle"}) r.add(name, 0);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"axle", "gear", "lever", "sprocket"}));
  EXPECT_TRUE(Registry<int>("widget").names().empty());
}

TEST(Registry, ReplaceOverwritesATakenNameAndAddsANewOne) {
  Registry<int> r("widget");
  r.add("gear", 1);
  const int* gear = r.find("gear");
  r.replace("gear", 2);
  r.replace("lever", 3);
  EXPECT_EQ(r.find("gear"), gear);  // the entry stays where it was
  EXPECT_EQ(*gear, 2);
  EXPECT_EQ(r.get("lever"), 3);
  EXPECT_THROW(r.replace("", 4), InvalidArgument);
}

TEST(Registry, AddsAndLookupsFromManyThreads) {
  Registry<int> r("widget");
  r.add("first", 0);
  const int* first = r.find("first");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 200; ++i) {
        r.add("w" + std::to_string(t) + "_" + std::to_string(i), i);
        EXPECT_EQ(r.get("first"), 0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(r.names().size(), 801u);
  EXPECT_EQ(r.find("first"), first);  // entries never move
  EXPECT_EQ(r.get("w3_199"), 199);
}

}  // namespace
}  // namespace baton
