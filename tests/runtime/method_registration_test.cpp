// What registration promises a driver author: any type a method takes is a
// call argument as it is, and a dispatch mode that is not registered fails at
// spawn, naming the method, before any worker starts.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "runtime/baton.h"
#include "runtime/dispatch_registry.h"

namespace baton {
namespace {

// Typed echoes: the worker converts each argument to its C++ type and back.
class Containers : public Worker {
 public:
  std::vector<double> doubles(const std::vector<double>& xs) { return xs; }
  std::vector<int64_t> ints(std::vector<int64_t> xs) { return xs; }
  std::map<std::string, double> scores(const std::map<std::string, double>& m) { return m; }
  std::vector<std::string> words(const std::vector<std::string>& ws) { return ws; }
  std::map<std::string, std::vector<int64_t>> nested(std::map<std::string, std::vector<int64_t>> m) {
    return m;
  }

  static void register_methods(MethodTable<Containers>& t) {
    t.def("doubles", &Containers::doubles);
    t.def("ints", &Containers::ints);
    t.def("scores", &Containers::scores);
    t.def("words", &Containers::words);
    t.def("nested", &Containers::nested);
  }
};
BATON_WORKER(Containers);

class MisspeltMode : public Worker {
 public:
  int64_t twice(int64_t x) { return 2 * x; }
  static void register_methods(MethodTable<MisspeltMode>& t) {
    t.def("twice", &MisspeltMode::twice);
    t.def("shard", &MisspeltMode::twice, MethodOptions().set_dispatch_mode("ALL_TO_AL"));
  }
};
BATON_WORKER(MisspeltMode);

// Uses a mode that only the driver registers, and only after init().
class LateMode : public Worker {
 public:
  int64_t twice(int64_t x) { return 2 * x; }
  static void register_methods(MethodTable<LateMode>& t) {
    t.def("twice", &LateMode::twice, MethodOptions().set_dispatch_mode("TEST_LATE_MODE"));
  }
};
BATON_WORKER(LateMode);

TEST(MethodRegistration, ContainerArgumentsRoundTripThroughAWorkerAsTheyAre) {
  ResourcePool pool = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("Containers", pool);
  // Exact: numbers travel as int64 and float64 bits.
  const std::vector<double> doubles{1.5, -2.25, 1e300, 5e-324, -0.0};
  EXPECT_EQ(g.call_rank(0, "doubles", {doubles}).get().as<std::vector<double>>(), doubles);
  const std::vector<int64_t> ints{std::numeric_limits<int64_t>::min(), -1, 0,
                                  std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(g.call_rank(0, "ints", {ints}).get().as<std::vector<int64_t>>(), ints);
  using Scores = std::map<std::string, double>;
  const Scores scores{{"accuracy", 0.75}, {"loss", -3.0}, {"", 1e-9}};
  EXPECT_EQ(g.call_rank(0, "scores", {scores}).get().as<Scores>(), scores);
  const std::vector<std::string> words{"", "two words", "\xc3\xbc"};
  EXPECT_EQ(g.call_rank(0, "words", {words}).get().as<std::vector<std::string>>(), words);
  using Nested = std::map<std::string, std::vector<int64_t>>;
  const Nested nested{{"a", {1, 2}}, {"b", {}}};
  EXPECT_EQ(g.call_rank(0, "nested", {nested}).get().as<Nested>(), nested);
  // Temporaries in braces, several at once, with call().
  List both = g.call("doubles", {std::vector<double>{0.5, 4.0}}).get().as_list();
  ASSERT_EQ(both.size(), 1u);
  EXPECT_EQ(both[0].as<std::vector<double>>(), (std::vector<double>{0.5, 4.0}));
  EXPECT_THROW(g.call("ints", {std::vector<double>{0.5}}), CallError);  // float is no int
}

TEST(MethodRegistration, MisspeltDispatchModeFailsAtSpawnNamingMethodAndKnownModes) {
  ResourcePool pool = ResourcePool::cpu(1);
  try {
    WorkerGroup::spawn("MisspeltMode", pool);
    ADD_FAILURE() << "spawned a class whose method names an unregistered dispatch mode";
  } catch (const CallError& e) {
    std::string err = e.what();
    EXPECT_NE(err.find("worker class MisspeltMode, method 'shard': dispatch mode 'ALL_TO_AL' "
                       "is not registered; did you mean 'ALL_TO_ALL'? known: ALL_TO_ALL, "
                       "ONE_TO_ALL"),
              std::string::npos)
        << err;
  }
  // It failed before claiming the pool, so before starting any worker.
  WorkerGroup g = WorkerGroup::spawn("Containers", pool);
  EXPECT_EQ(g.world_size(), 1);
}

TEST(MethodRegistration, ModeRegisteredInTheDriverBeforeSpawnIsFoundThereOnly) {
  ResourcePool pool = ResourcePool::cpu(2);
  EXPECT_THROW(WorkerGroup::spawn("LateMode", pool), CallError);
  register_dispatch_mode(
      "TEST_LATE_MODE",
      [](const WorkerGroup& g, const List& args) {
        DispatchPlan p;
        p.chunks = {args};
        p.chunk_of_rank = {-1, 0};  // rank 1 only
        return p;
      },
      [](const CollectInput& in) { return in.outputs.at(0); });
  // The workers never registered the mode (they stop at init()): only the
  // driver, which dispatches, checks it.
  WorkerGroup g = WorkerGroup::spawn("LateMode", pool);
  EXPECT_EQ(g.call("twice", {21}).get(), Value(42));
}

}  // namespace
}  // namespace baton
