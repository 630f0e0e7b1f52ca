// Partial rollout (async_training.partial_rollout): how long a weight sync
// issued while the rollout generates a batch waits, with one generate call
// per batch against calls of --chunk tokens, and what the chunks cost (each
// continuation prefills its prefix again).
//
// One actor process and one RolloutWorker process (as the fully-async
// trainer spawns them) on an HF model (default toy/model, made by the quick
// start); --prompts prompts × --n samples of --response tokens each, EOS
// ignored so that every sample runs the whole length. Per mode and rep: the
// batch is generated on a thread (trainer/async/chunked_rollout.h) and, after
// --sync-at × the one-call batch's time, the driver syncs the actor's
// weights to the rollout (send_weights ∥ receive_weights) and times it.
//
//   build/bench/partial_rollout_bench [--model toy/model] [--response 96] [--chunk 16]
//                                     [--prompts 8] [--n 4] [--reps 5] [--sync-at 0.3]
//
// Prints one JSON line: per mode the median batch time without a sync, the
// median sync wait, the median batch time with the sync, and the samples the
// sync interrupted (resumed with the new weights).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "runtime/baton.h"
#include "runtime/resource_pool.h"
#include "runtime/worker_group.h"
#include "trainer/async/chunked_rollout.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/role_options.h"
#include "workers/roles/rollout_worker.h"

namespace {

using baton::DataProto;
using baton::Value;
using baton::WorkerGroup;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0.0 : xs[xs.size() / 2];
}

struct Args {
  std::string model = "toy/model";
  int64_t response = 96, chunk = 16, prompts = 8, n = 4, reps = 5;
  double sync_at = 0.3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--response") a.response = std::stoll(v);
    else if (k == "--chunk") a.chunk = std::stoll(v);
    else if (k == "--prompts") a.prompts = std::stoll(v);
    else if (k == "--n") a.n = std::stoll(v);
    else if (k == "--reps") a.reps = std::stoll(v);
    else if (k == "--sync-at") a.sync_at = std::stod(v);
    else {
      std::fprintf(stderr, "partial_rollout_bench: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

DataProto prompt_batch(const Args& a) {
  // Prompts of 6 tokens from the model's vocabulary (past its first 3 ids).
  std::ifstream f(a.model + "/config.json");
  const int64_t vocab = json::parse(f).at("vocab_size").get<int64_t>();
  at::Tensor ids =
      at::arange(a.prompts * 6, at::kLong).remainder(vocab - 3).add(3).view({a.prompts, 6});
  DataProto p;
  p.set_tensor("input_ids", ids);
  p.set_tensor("attention_mask", at::ones_like(ids));
  p.set_tensor("request_seed", at::arange(1, a.prompts + 1, at::kLong));
  p.set_meta("n", Value(a.n));
  p.set_meta("temperature", Value(1.0));
  p.set_meta("ignore_eos", Value(true));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);  // a worker process runs its worker here
  const Args a = parse(argc, argv);
  baton::workers::ActorRolloutRefOptions o;
  o.model.path = a.model;
  o.rollout.response_length = a.response;
  baton::ResourcePool actor_pool = baton::ResourcePool::cpu(1);
  baton::ResourcePool rollout_pool = baton::ResourcePool::cpu(1);
  WorkerGroup actor = WorkerGroup::spawn(baton::workers::actor_rollout_ref_worker_class(),
                                         actor_pool, {o.to_json()});
  WorkerGroup rollout = WorkerGroup::spawn(baton::workers::rollout_worker_class(), rollout_pool,
                                           {o.to_json(), int64_t{1}});
  actor.call("init_model", {}).get();
  rollout.call("init_model", {}).get();
  const std::string endpoint =
      rollout.call("weight_sync_endpoint", {}).get().as_list().at(0).as_string();
  auto sender = actor.call("init_weight_sync", {endpoint, std::string("bench"), int64_t{1}});
  rollout.call("init_weight_sync", {endpoint, std::string("bench")}).get();
  sender.get();

  const DataProto prompts = prompt_batch(a);
  int64_t version = 0;
  auto sync = [&] {
    const auto t0 = Clock::now();
    auto sent = actor.call("send_weights", {++version});
    rollout.call("receive_weights", {}).get();
    sent.get();
    return seconds_since(t0);
  };
  auto generate = [&](int64_t chunk) {
    baton::trainer::ChunkedRollout g(prompts, a.response, chunk, 1);
    while (!g.done()) g.step(rollout);
    return g;
  };
  generate(a.response);  // warm-up
  sync();

  json out = {{"model", a.model}, {"response", a.response}, {"chunk", a.chunk},
              {"prompts", a.prompts}, {"n", a.n}, {"reps", a.reps}, {"sync_at", a.sync_at}};
  double one_call_s = 0;
  for (const auto& [name, chunk] : {std::pair<const char*, int64_t>{"one_call", a.response},
                                    std::pair<const char*, int64_t>{"partial", a.chunk}}) {
    std::vector<double> alone, waits, with_sync, resumed, calls;
    for (int64_t r = 0; r < a.reps; ++r) {
      auto t0 = Clock::now();
      calls.push_back(static_cast<double>(generate(chunk).calls()));
      alone.push_back(seconds_since(t0));
    }
    if (one_call_s == 0) one_call_s = median(alone);
    for (int64_t r = 0; r < a.reps; ++r) {
      int64_t interrupted = 0;
      const auto t0 = Clock::now();
      std::thread gen([&] { interrupted = generate(chunk).resumed_samples(); });
      std::this_thread::sleep_for(std::chrono::duration<double>(a.sync_at * one_call_s));
      waits.push_back(sync());
      gen.join();
      with_sync.push_back(seconds_since(t0));
      resumed.push_back(static_cast<double>(interrupted));
    }
    out[name] = {{"calls_per_batch", median(calls)},
                 {"batch_s", median(alone)},
                 {"sync_wait_s", median(waits)},
                 {"batch_with_sync_s", median(with_sync)},
                 {"resumed_samples", median(resumed)}};
  }
  out["sync_wait_ratio"] = out["one_call"]["sync_wait_s"].get<double>() /
                           out["partial"]["sync_wait_s"].get<double>();
  out["chunk_overhead"] =
      out["partial"]["batch_s"].get<double>() / out["one_call"]["batch_s"].get<double>();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
