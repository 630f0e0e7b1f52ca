// reshard_bench: reshard_weights from a training layout into a rollout layout
// on two local processes, against a plain Gloo all-gather of the same bytes.
//
//   ./build/bench/reshard_bench [--bucket-mb 64] [--repeats 3] [--warmup 1]
//                               [--cases tp2-tp1,tp2-tp2,pp2-tp1,pp2-tp2,sync-tp2-tp1,sync-pp2-tp1]
//
// The model: Llama, vocab 32000, hidden 768, 12 layers, 12 heads / 4 kv heads,
// intermediate 2048, untied LM head (124.7M parameters, 499 MB fp32), random
// init (the engine's own). Cases "<training>-<rollout>": training TP2 or PP2,
// rollout TP1 or TP2 (rollout DP = 2 / TP).
//
// Per case (the world's time: each rank's, max over ranks, after a barrier;
// median of --repeats after --warmup):
//   seconds, model_bytes_per_s     one reshard_weights; bytes = the full model once
//   allgather_s, allgather_bytes_per_s   c10d Gloo all-gather over the world,
//                                  each rank contributing model_bytes / world
//   rate_ratio                     reshard rate / all-gather rate (target >= 0.67)
//   peak_buffer_bytes              ReshardStats: bucket buffers held at once (max over ranks)
//   rss_growth_bytes               VmHWM after the reshard minus VmRSS before it
//                                  (high-water mark reset through /proc/self/clear_refs),
//                                  max over ranks and repeats
//   rollout_bytes_per_rank         the rollout model's weights on one rank (max over ranks)
//   peak_extra_target_ok           rollout weights + rss growth <= rollout weights + two
//                                  buckets, a bucket being max(--bucket-mb, largest
//                                  tensor) since a bigger tensor travels alone
//
// Cases "sync-<training>-tp1" measure weight sync to a separate rollout
// worker (weight_sync.h) instead: a world of 3 processes, the training layout
// on ranks 0-1 and a TP1 rollout worker on rank 2. Per case: seconds and
// model_bytes_per_s of one send/receive (max over the 3 ranks), against a
// plain Gloo broadcast of the same bytes from training rank 0 to the worker
// over the same sync group (rate_ratio = sync rate / broadcast rate: how well
// assembling the next bucket hides behind sending this one), with
// peak_buffer_bytes (max over ranks) and rss_growth_bytes as above;
// peak_extra_target_ok there is rss growth <= two of the largest bucket
// buffer (largest_bucket_bytes: a bucket or one larger tensor, plus 8-byte
// alignment per tensor). The rollout worker's weights are allocated before.
// The last line of stdout is one JSON object with every case.
#include <ATen/ATen.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "engine/model/transformer.h"
#include "engine/parallel/local_world.h"
#include "engine/rollout/reshard.h"
#include "engine/rollout/weight_sync.h"
#include "tools/cli.h"

using namespace baton::engine;
using json = nlohmann::json;
namespace cli = baton::cli;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kWorld = 2;

json model_json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 32000},
          {"hidden_size", 768},
          {"intermediate_size", 2048},
          {"num_hidden_layers", 12},
          {"num_attention_heads", 12},
          {"num_key_value_heads", 4},
          {"max_position_embeddings", 2048},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"torch_dtype", "float32"}};
}

struct Case {
  std::string name;  // "tp2-tp1"
  int64_t train_tp = 1, train_pp = 1, rollout_tp = 1;
  bool sync = false;  // to a separate rollout worker (world of 3)
  int64_t world() const { return sync ? kWorld + 1 : kWorld; }
};

const std::vector<Case> kCases = {{"tp2-tp1", 2, 1, 1},
                                  {"tp2-tp2", 2, 1, 2},
                                  {"pp2-tp1", 1, 2, 1},
                                  {"pp2-tp2", 1, 2, 2},
                                  {"sync-tp2-tp1", 2, 1, 1, true},
                                  {"sync-pp2-tp1", 1, 2, 1, true}};

struct Args {
  int64_t bucket_mb = 64;
  int repeats = 3;
  int warmup = 1;
  std::vector<std::string> cases{"tp2-tp1", "tp2-tp2",      "pp2-tp1",
                                 "pp2-tp2", "sync-tp2-tp1", "sync-pp2-tp1"};
  std::string result;  // in the child world: where rank 0 writes its JSON
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "reshard_bench: %s\nusage: reshard_bench [--bucket-mb N] [--repeats N] "
               "[--warmup N] [--cases tp2-tp1,tp2-tp2,pp2-tp1,pp2-tp2,sync-tp2-tp1,sync-pp2-tp1]\n",
               why.c_str());
  std::exit(2);
}

const Case& find_case(const std::string& name) {
  for (const auto& c : kCases)
    if (c.name == name) return c;
  usage("unknown case \"" + name +
        "\" (known: tp2-tp1, tp2-tp2, pp2-tp1, pp2-tp2, sync-tp2-tp1, sync-pp2-tp1)");
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {}, [&](const std::string& k, const std::string& v) {
    if (k == "--bucket-mb") {
      a.bucket_mb = cli::parse_int(v, k);
    } else if (k == "--repeats") {
      a.repeats = static_cast<int>(cli::parse_int(v, k));
    } else if (k == "--warmup") {
      a.warmup = static_cast<int>(cli::parse_int(v, k));
    } else if (k == "--cases") {
      a.cases.clear();
      for (const auto& c : cli::split(v, ',')) a.cases.push_back(find_case(c).name);
    } else if (k == "--result") {
      a.result = v;
    } else {
      cli::unknown_option(k);
    }
  });
  if (a.bucket_mb < 1 || a.repeats < 1 || a.warmup < 0)
    usage("--bucket-mb and --repeats must be >= 1, --warmup >= 0");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// The max over the world of each value (after every rank has its values).
std::vector<double> world_max(const Group& world, std::vector<double> xs) {
  auto t = at::tensor(xs, at::kDouble);
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  world.pg->allreduce(ts, opts)->wait();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

// An all-reduce as the timing fence (every rank's queued work is done when
// it returns, where a Gloo barrier only waits for arrival).
void fence(const Group& world) {
  std::vector<at::Tensor> ts{at::zeros({1})};
  world.pg->allreduce(ts)->wait();
}

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  throw EngineError("no " + field + " in /proc/self/status");
}

// Resets the peak-RSS mark (VmHWM) to the current RSS.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

json run_case(const Case& c, const Args& args, const LocalRank& me, const ModelConfig& cfg) {
  ParallelConfig pc;
  pc.tp = c.train_tp;
  pc.pp = c.train_pp;
  // Each case's training state gets store keys of its own.
  auto store = c10::make_intrusive<c10d::PrefixStore>("reshard_bench/" + c.name, me.store);
  auto ps = ParallelState::create(store, me.rank, pc);
  const Group& world = ps->world();
  Transformer train(cfg, ps);
  Transformer rollout(cfg, make_rollout_state(store, me.rank, pc, c.rollout_tp));
  int64_t rollout_bytes = 0, largest = 0;
  for (const auto& [name, p] : rollout.named_params()) {
    rollout_bytes += static_cast<int64_t>(p.nbytes());
    largest = std::max<int64_t>(largest,
                                p.nbytes() * (Transformer::tp_replicated(name) ? 1 : c.rollout_tp));
  }

  ReshardOptions ro;
  ro.bucket_bytes = args.bucket_mb << 20;
  std::vector<double> reshard_s;
  double rss_growth = 0, peak_buffer = 0;
  ReshardStats stats;
  for (int i = 0; i < args.warmup + args.repeats; ++i) {
    fence(world);
    reset_peak_rss();
    const double rss_before = static_cast<double>(proc_status_bytes("VmRSS"));
    auto t0 = Clock::now();
    stats = reshard_weights(train, rollout, ro);
    double s = since(t0);
    const double growth = static_cast<double>(proc_status_bytes("VmHWM")) - rss_before;
    auto m = world_max(world, {s, growth, static_cast<double>(stats.peak_buffer_bytes)});
    if (i < args.warmup) continue;
    reshard_s.push_back(m[0]);
    rss_growth = std::max(rss_growth, m[1]);
    peak_buffer = std::max(peak_buffer, m[2]);
  }

  // The baseline: the same bytes through one Gloo all-gather of the world.
  const int64_t chunk = stats.model_bytes / kWorld;
  std::vector<double> gather_s;
  {
    auto in = at::ones({chunk}, at::kByte);
    std::vector<std::vector<at::Tensor>> out(1);
    for (int64_t r = 0; r < kWorld; ++r) out[0].push_back(at::empty({chunk}, at::kByte));
    for (int i = 0; i < args.warmup + args.repeats; ++i) {
      fence(world);
      std::vector<at::Tensor> ins{in};
      auto t0 = Clock::now();
      world.pg->allgather(out, ins)->wait();
      double s = world_max(world, {since(t0)})[0];
      if (i >= args.warmup) gather_s.push_back(s);
    }
  }
  auto max_rollout = world_max(world, {static_cast<double>(rollout_bytes)})[0];

  const double model_bytes = static_cast<double>(stats.model_bytes);
  const double rate = model_bytes / median(reshard_s);
  const double gather_rate = model_bytes / median(gather_s);
  const double bucket = static_cast<double>(std::max<int64_t>(ro.bucket_bytes, largest));
  json j;
  j["training"] = pc.to_string();
  j["rollout_tp"] = c.rollout_tp;
  j["seconds"] = median(reshard_s);
  j["seconds_all"] = reshard_s;
  j["model_bytes"] = stats.model_bytes;
  j["model_bytes_per_s"] = rate;
  j["buckets"] = stats.buckets;
  j["allgather_s"] = median(gather_s);
  j["allgather_bytes_per_s"] = gather_rate;
  j["rate_ratio"] = rate / gather_rate;
  j["peak_buffer_bytes"] = static_cast<int64_t>(peak_buffer);
  j["rss_growth_bytes"] = static_cast<int64_t>(rss_growth);
  j["rollout_bytes_per_rank"] = static_cast<int64_t>(max_rollout);
  j["largest_tensor_bytes"] = largest;
  j["target_rate_ratio_ge_0_67"] = rate / gather_rate >= 0.67;
  j["peak_extra_target_ok"] = max_rollout + rss_growth <= max_rollout + 2 * bucket;
  return j;
}

// Weight sync from the training layout on ranks 0-1 to a TP1 rollout worker
// on rank 2, against a plain broadcast of the same bytes over the sync group.
json run_sync_case(const Case& c, const Args& args, const LocalRank& me, const ModelConfig& cfg) {
  auto store = c10::make_intrusive<c10d::PrefixStore>("reshard_bench/" + c.name, me.store);
  Group all;
  all.pg = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("all", store), me.rank,
                           kWorld + 1, std::chrono::minutes(5));
  all.size = kWorld + 1;
  all.rank = me.rank;
  ParallelConfig pc;
  pc.tp = c.train_tp;
  pc.pp = c.train_pp;
  WeightSyncOptions so;
  so.bucket_bytes = args.bucket_mb << 20;
  const bool trainer = me.rank < kWorld;
  // The sync group: both training ranks (the first replica) and the worker.
  // The baseline's group: training rank 0 and the worker.
  const int64_t sync_size = sync_group_size(pc, 1);
  c10::intrusive_ptr<c10d::ProcessGroup> sync, plain;
  if (me.rank == 0 || !trainer)
    plain = make_sync_group(store, c.name + "-broadcast", trainer ? 0 : 1, 2);
  std::unique_ptr<WeightSender> sender;
  std::unique_ptr<WeightReceiver> receiver;
  int64_t largest = 0;
  if (trainer) {
    auto ps =
        ParallelState::create(c10::make_intrusive<c10d::PrefixStore>("train", store), me.rank, pc);
    sync = make_sync_group(store, c.name, trainer_sync_rank(*ps), sync_size);
    sender = std::make_unique<WeightSender>(std::make_shared<Transformer>(cfg, ps), sync, so);
  } else {
    sync = make_sync_group(store, c.name, receiver_sync_rank(pc, 0), sync_size);
    auto rollout = std::make_shared<Transformer>(cfg, ParallelState::single());
    for (const auto& [name, p] : rollout->named_params())
      largest = std::max<int64_t>(largest, p.nbytes());
    receiver = std::make_unique<WeightReceiver>(rollout, pc, sync, so);
  }
  std::vector<double> sync_s;
  double rss_growth = 0, peak_buffer = 0;
  WeightSyncStats stats;
  for (int i = 0; i < args.warmup + args.repeats; ++i) {
    fence(all);
    reset_peak_rss();
    const double rss_before = static_cast<double>(proc_status_bytes("VmRSS"));
    auto t0 = Clock::now();
    stats = trainer ? sender->send(i) : receiver->receive();
    double s = since(t0);
    const double growth = static_cast<double>(proc_status_bytes("VmHWM")) - rss_before;
    auto m = world_max(all, {s, growth, static_cast<double>(stats.peak_buffer_bytes),
                             static_cast<double>(stats.model_bytes), static_cast<double>(largest),
                             static_cast<double>(stats.largest_bucket_bytes)});
    if (i < args.warmup) continue;
    sync_s.push_back(m[0]);
    rss_growth = std::max(rss_growth, m[1]);
    peak_buffer = std::max(peak_buffer, m[2]);
    stats.model_bytes = static_cast<int64_t>(m[3]);
    largest = static_cast<int64_t>(m[4]);
    stats.largest_bucket_bytes = static_cast<int64_t>(m[5]);
  }
  std::vector<double> bcast_s;
  {
    auto buf = at::ones({stats.model_bytes}, at::kByte);
    for (int i = 0; i < args.warmup + args.repeats; ++i) {
      fence(all);
      auto t0 = Clock::now();
      if (plain) {
        std::vector<at::Tensor> ts{buf};
        c10d::BroadcastOptions opts;
        opts.rootRank = 0;
        plain->broadcast(ts, opts)->wait();
      }
      double s = world_max(all, {since(t0)})[0];
      if (i >= args.warmup) bcast_s.push_back(s);
    }
  }
  const double model_bytes = static_cast<double>(stats.model_bytes);
  const double rate = model_bytes / median(sync_s);
  const double bcast_rate = model_bytes / median(bcast_s);
  const double bucket = static_cast<double>(stats.largest_bucket_bytes);
  json j;
  j["training"] = pc.to_string();
  j["rollout_tp"] = 1;
  j["separate_rollout_worker"] = true;
  j["seconds"] = median(sync_s);
  j["seconds_all"] = sync_s;
  j["model_bytes"] = stats.model_bytes;
  j["model_bytes_per_s"] = rate;
  j["buckets"] = stats.buckets;
  j["broadcast_s"] = median(bcast_s);
  j["broadcast_bytes_per_s"] = bcast_rate;
  j["rate_ratio"] = rate / bcast_rate;
  j["peak_buffer_bytes"] = static_cast<int64_t>(peak_buffer);
  j["rss_growth_bytes"] = static_cast<int64_t>(rss_growth);
  j["largest_tensor_bytes"] = largest;
  j["largest_bucket_bytes"] = stats.largest_bucket_bytes;
  j["peak_extra_target_ok"] = rss_growth <= 2 * bucket;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    auto cfg = ModelConfig::from_hf_json(model_json(), "reshard_bench");
    auto me = local_world_rank();
    if (me) {  // a rank of the child world: run every case
      json cases = json::object();
      for (const auto& name : args.cases) {
        const Case& c = find_case(name);
        if (c.world() != me->world_size) continue;
        cases[name] = c.sync ? run_sync_case(c, args, *me, cfg) : run_case(c, args, *me, cfg);
      }
      if (me->rank == 0) std::ofstream(args.result) << cases.dump() << "\n";
      return 0;
    }

    // One child world per world size the chosen cases need.
    json cases = json::object();
    for (int64_t world : {kWorld, kWorld + 1}) {
      bool needed = false;
      for (const auto& name : args.cases) needed = needed || find_case(name).world() == world;
      if (!needed) continue;
      auto file = std::filesystem::temp_directory_path() /
                  ("reshard-bench-" + std::to_string(::getpid()) + ".json");
      std::vector<std::string> words(argv, argv + argc);
      words.insert(words.end(), {"--result", file.string()});
      std::vector<char*> child_argv;
      for (auto& w : words) child_argv.push_back(w.data());
      child_argv.push_back(nullptr);
      std::fflush(stdout);
      if (launch_local_world(static_cast<int>(words.size()), child_argv.data(), world) != 0)
        throw EngineError("a rank failed (see above)");
      std::ifstream in(file);
      cases.update(json::parse(in));
      in.close();
      std::filesystem::remove(file);
    }

    int64_t params = 0;
    {
      Transformer whole(cfg, ParallelState::single());
      for (const auto& [name, p] : whole.named_params()) params += p.numel();
    }
    std::printf(
        "reshard_bench: Llama vocab 32000 hidden 768 layers 12 heads 12/4 kv intermediate 2048, "
        "%.1fM params fp32; world of %lld processes; bucket %lld MB\n",
        params / 1e6, static_cast<long long>(kWorld), static_cast<long long>(args.bucket_mb));
    for (const auto& name : args.cases) {
      const json& j = cases[name];
      const bool sync = j.contains("separate_rollout_worker");
      std::printf(
          "%s: %.3f s  %.0f MB/s  (%s %.0f MB/s, ratio %.2f)  buckets %lld  peak buffers "
          "%.0f MB  RSS growth %.0f MB\n",
          name.c_str(), j["seconds"].get<double>(), j["model_bytes_per_s"].get<double>() / 1e6,
          sync ? "broadcast" : "all-gather",
          j[sync ? "broadcast_bytes_per_s" : "allgather_bytes_per_s"].get<double>() / 1e6,
          j["rate_ratio"].get<double>(), static_cast<long long>(j["buckets"].get<int64_t>()),
          j["peak_buffer_bytes"].get<double>() / 1e6, j["rss_growth_bytes"].get<double>() / 1e6);
    }
    json out;
    out["model"] = model_json();
    out["params"] = params;
    out["world"] = kWorld;
    out["bucket_bytes"] = args.bucket_mb << 20;
    out["repeats"] = args.repeats;
    out["warmup"] = args.warmup;
    out["cases"] = cases;
    bool rate_ok = true, memory_ok = true;
    for (const auto& [name, j] : cases.items()) {
      if (j.contains("target_rate_ratio_ge_0_67"))
        rate_ok = rate_ok && j["target_rate_ratio_ge_0_67"].get<bool>();
      memory_ok = memory_ok && j["peak_extra_target_ok"].get<bool>();
    }
    out["all_rate_targets_met"] = rate_ok;
    out["all_memory_targets_met"] = memory_ok;
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reshard_bench: %s\n", e.what());
    return 1;
  }
}
