// Not a test binary: compiled (syntax only) by the compile checks in
// CMakeLists.txt. As it is, it must compile and include neither
// <torch/torch.h> nor <ATen/ATen.h> nor anything of Boost, Cap'n Proto or
// c10d: these are the headers a driver includes. With
// BATON_CHECK_UNSUPPORTED_PARAMETER or BATON_CHECK_UNSUPPORTED_CALL_ARGUMENT it
// must fail, with a static_assert that says what is supported.
#include <map>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"

namespace {

struct NotAValue {
  int x = 0;
};

class Scorer : public baton::Worker {
 public:
  double mean(const std::vector<double>& xs) { return xs.empty() ? 0.0 : xs[0]; }
  baton::DataProto score(const baton::DataProto& batch) { return batch; }
  int64_t unsupported(const NotAValue& v) { return v.x; }

  static void register_methods(baton::MethodTable<Scorer>& t) {
    t.def("mean", &Scorer::mean);
    t.def("score", &Scorer::score,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
#if defined(BATON_CHECK_UNSUPPORTED_PARAMETER)
    t.def("unsupported", &Scorer::unsupported);
#endif
  }
};
BATON_WORKER(Scorer);

}  // namespace

void drive(baton::WorkerGroup& g, const baton::DataProto& batch) {
  g.call("mean", {std::vector<double>{1.0, 2.0}});
  g.call("score", {batch});
  std::map<std::string, double> m{{"a", 1.0}};
  g.call_rank(0, "mean", {m});
#if defined(BATON_CHECK_UNSUPPORTED_CALL_ARGUMENT)
  g.call("mean", {NotAValue{}});
#endif
}
