// A driver outside baton's tree: a custom worker, a DataProto split over two
// worker processes by DP dispatch, an engine model config read in each worker,
// and the RL layer (a trainer config, the actor worker's class, an estimator).
// Prints "external driver ok" and exits 0 when every check holds.
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "engine/io/model_config.h"
#include "runtime/baton.h"
#include "trainer/config/config.h"
#include "workers/algos/algo_registry.h"
#include "workers/roles/actor_rollout_ref_worker.h"

class Doubler : public baton::Worker {
 public:
  baton::DataProto twice(const baton::DataProto& batch) {
    return baton::DataProto(baton::DataProto::Tensors{{"y", batch.tensor("x") * 2}});
  }
  int64_t hidden_of(const std::string& config_json) {
    return baton::engine::ModelConfig::from_hf_json(nlohmann::json::parse(config_json), "driver")
        .hidden_size;
  }
  static void register_methods(baton::MethodTable<Doubler>& t) {
    t.def("twice", &Doubler::twice,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
    t.def("hidden_of", &Doubler::hidden_of);
  }
};
BATON_WORKER(Doubler);

int main(int argc, char** argv) {
  baton::init(argc, argv);
  baton::ResourcePool pool = baton::ResourcePool::cpu(2);
  baton::WorkerGroup group = baton::WorkerGroup::spawn("Doubler", pool);
  auto x = at::arange(8, at::kLong);
  baton::DataProto in(baton::DataProto::Tensors{{"x", x}});
  auto out = group.call("twice", {in}).get().as<baton::DataProto>();
  if (!at::equal(out.tensor("y"), x * 2)) {
    std::fprintf(stderr, "external driver: wrong result\n");
    return 1;
  }
  const char* cfg =
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
          "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6})";
  baton::List hidden = group.call("hidden_of", {std::string(cfg)}).get().as_list();
  for (const baton::Value& h : hidden) {
    if (h.as_int() != 32) {
      std::fprintf(stderr, "external driver: hidden_size %lld\n",
                   static_cast<long long>(h.as_int()));
      return 1;
    }
  }
  // The RL layer: a config with overrides, the worker role's registration,
  // an advantage estimator by name.
  baton::trainer::Config config = baton::trainer::Config::from_yaml("trainer:\n  steps: 1\n");
  config.apply_override("trainer.steps=3");
  if (config.get<int64_t>("trainer.steps") != 3 ||
      std::string(baton::workers::actor_rollout_ref_worker_class()) != "ActorRolloutRefWorker" ||
      !baton::algos::find_advantage_estimator("grpo")) {
    std::fprintf(stderr, "external driver: the RL layer is not usable\n");
    return 1;
  }
  std::printf("external driver ok\n");
  return 0;
}
