// engine_bench: training and log-prob throughput of the engine's transformer
// on a fixed small Llama config, at TP1 (this process) and at TP2, PP2 and DP2
// (two local processes each, one child world per layout), with each rank's
// parameter bytes.
//
//   ./build/bench/engine_bench [--layouts tp1,tp2,pp2,dp2,dp2-overlap,dp2-zero,dp2-zero-gloo]
//                              [--warmup 1] [--iters 3] [--torch-json FILE] [--profile DIR]
//                              [--shape default|add3]
//
// --shape add3: the model and batch of the GRPO add3 task's update
// (configs/grpo_add3.yaml: 128 sequences of 18 tokens, hidden 128, 6 layers,
// 4 heads, vocabulary 19, one micro-batch of 64 per DP rank); default: a
// 4-layer, hidden-256 Llama on 8 x 48 tokens.
//
// The last line of stdout is JSON. FILE holds the JSON line printed by
// bench/engine_bench_torch.py (the same model as HF LlamaForCausalLM in
// PyTorch eager); it is copied under "torch_eager" next to TP1's ratios.
//
// What is timed (the world's time: each rank's time, max over ranks, after a
// barrier; median of --iters after --warmup):
//   fwd_bwd     forward_backward over the batch's micro-batches (1F1B; loss =
//               token mean of -log p over all B·(S-1) next-token positions).
//               The optimizer step and the DP gradient all-reduce are not in
//               it; train_step is.
//   train_step  fwd_bwd + Optimizer::step() (gradient reduction over DP,
//               global-norm clipping, AdamW). dp2-overlap: the plain
//               optimizer with each 4 MB bucket's all-reduce started during
//               the last micro-batch's backward (so part of the reduction
//               is inside its fwd_bwd). dp2-zero: the distributed
//               optimizer (ZeRO-1) with its shared-memory collectives;
//               dp2-zero-gloo: the same over Gloo's reduce-scatter and
//               all-gather. optimizer_state_bytes_per_rank: what each rank's
//               optimizer holds (Optimizer::state_bytes).
//   logprob     forward_only + next_token_log_probs over the micro-batches.
// tokens/s = B·S tokens of the whole batch / that time, for the whole world.
//
// --profile DIR: after timing, one more TP1 log-prob pass and forward+backward
// under LibTorch's autograd profiler, written as Chrome traces
// DIR/baton_logprob.trace and DIR/baton_fwd_bwd.trace (engine_bench_torch.py
// --profile DIR writes torch_*.trace beside them).
//
// Weights and tokens come from seeded CPU generators in the HF layout and are
// sliced per rank with hf_to_shard, so every layout (and the PyTorch script,
// which draws them in the same order) runs the same model on the same batch.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/errors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/local_world.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tools/cli.h"

using namespace baton::engine;
using json = nlohmann::json;
namespace cli = baton::cli;

namespace {

using Clock = std::chrono::steady_clock;

// The fixed benchmark: model and batch. bench/engine_bench_torch.py mirrors it.
struct BenchConfig {
  int64_t vocab = 2048;
  int64_t hidden = 256;
  int64_t intermediate = 704;
  int64_t layers = 4;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t batch = 8;       // sequences per step, whole world
  int64_t seq = 48;        // tokens per sequence
  int64_t micro = 2;       // sequences per micro-batch
  uint64_t seed = 1234;    // weights; tokens use seed + 1
  double init_std = 0.02;  // HF's initializer_range

  // The add3 task's update (see the top of this file).
  static BenchConfig add3() {
    BenchConfig b;
    b.vocab = 19;
    b.hidden = 128;
    b.intermediate = 256;
    b.layers = 6;
    b.heads = 4;
    b.kv_heads = 4;
    b.batch = 128;
    b.seq = 18;
    b.micro = 64;
    return b;
  }

  json model_json() const {
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", vocab},
            {"hidden_size", hidden},
            {"intermediate_size", intermediate},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv_heads},
            {"max_position_embeddings", seq},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"tie_word_embeddings", false},
            {"hidden_act", "silu"},
            {"torch_dtype", "float32"}};
  }
  json to_json() const {
    json j = model_json();
    j["batch"] = batch;
    j["seq"] = seq;
    j["micro_batch"] = micro;
    j["seed"] = seed;
    j["init_std"] = init_std;
    return j;
  }
};

struct Layout {
  std::string name;
  int64_t tp = 1, pp = 1, dp = 1;
  bool distributed = false;    // the distributed optimizer (ZeRO-1)
  bool shared_memory = true;   // its collectives through shared memory
  bool overlap = false;        // plain optimizer: all-reduce overlapped with backward
  int64_t world() const { return tp * pp * dp; }
};

const std::vector<Layout> kLayouts = {{"tp1", 1, 1, 1},
                                      {"tp2", 2, 1, 1},
                                      {"pp2", 1, 2, 1},
                                      {"dp2", 1, 1, 2},
                                      {"dp2-overlap", 1, 1, 2, false, true, true},
                                      {"dp2-zero", 1, 1, 2, true, true},
                                      {"dp2-zero-gloo", 1, 1, 2, true, false}};

struct Args {
  std::vector<std::string> layouts{"tp1",         "tp2",      "pp2",          "dp2",
                                   "dp2-overlap", "dp2-zero", "dp2-zero-gloo"};
  int warmup = 1;
  int iters = 3;
  std::string torch_json;
  std::string profile;  // TP1 traces go here
  std::string layout;   // in a child world: the layout it runs
  std::string result;   // in a child world: where rank 0 writes its JSON
  std::string shape = "default";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "engine_bench: %s\nusage: engine_bench [--layouts "
               "tp1,tp2,pp2,dp2,dp2-overlap,dp2-zero,dp2-zero-gloo] [--warmup N] "
               "[--iters N] [--torch-json FILE] [--profile DIR] [--shape default|add3]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {}, [&](const std::string& k, const std::string& v) {
    if (k == "--layouts") {
      a.layouts = cli::split(v, ',');
    } else if (k == "--warmup") {
      a.warmup = static_cast<int>(cli::parse_int(v, k));
    } else if (k == "--iters") {
      a.iters = static_cast<int>(cli::parse_int(v, k));
    } else if (k == "--torch-json") {
      a.torch_json = v;
    } else if (k == "--profile") {
      a.profile = v;
    } else if (k == "--layout") {
      a.layout = v;
    } else if (k == "--result") {
      a.result = v;
    } else if (k == "--shape") {
      if (v != "default" && v != "add3") usage("--shape is default or add3, not " + v);
      a.shape = v;
    } else {
      cli::unknown_option(k);
    }
  });
  if (a.warmup < 0 || a.iters < 1) usage("--warmup must be >= 0 and --iters >= 1");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

const Layout& find_layout(const std::string& name) {
  for (const auto& l : kLayouts)
    if (l.name == name) return l;
  usage("unknown layout \"" + name +
        "\" (known: tp1, tp2, pp2, dp2, dp2-overlap, dp2-zero, dp2-zero-gloo)");
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// The whole model in HF names, drawn in a fixed order from one generator
// (the PyTorch script draws the same tensors in the same order). Norm
// weights are ones, as HF initialises them.
TensorMap hf_weights(const BenchConfig& b, const ModelConfig& cfg) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(b.seed);
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, b.init_std, shape, gen); };
  int64_t h = cfg.hidden_size, f = cfg.intermediate_size;
  TensorMap w;
  w["model.embed_tokens.weight"] = normal({cfg.vocab_size, h});
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "self_attn.q_proj.weight"] = normal({cfg.q_size(), h});
    w[p + "self_attn.k_proj.weight"] = normal({cfg.kv_size(), h});
    w[p + "self_attn.v_proj.weight"] = normal({cfg.kv_size(), h});
    w[p + "self_attn.o_proj.weight"] = normal({h, cfg.q_size()});
    w[p + "mlp.gate_proj.weight"] = normal({f, h});
    w[p + "mlp.up_proj.weight"] = normal({f, h});
    w[p + "mlp.down_proj.weight"] = normal({h, f});
    w[p + "input_layernorm.weight"] = at::ones({h});
    w[p + "post_attention_layernorm.weight"] = at::ones({h});
  }
  w["model.norm.weight"] = at::ones({h});
  w["lm_head.weight"] = normal({cfg.vocab_size, h});
  return w;
}

// Barrier, run, and the slowest rank's seconds for each of the body's laps.
// `body` returns its laps' seconds (cumulative from its start).
template <typename F>
std::vector<double> world_time(const Group& world, F&& body) {
  auto sync = at::zeros({1});
  if (world.size > 1) {
    std::vector<at::Tensor> ts{sync};
    world.pg->allreduce(ts)->wait();
  }
  std::vector<double> laps = body();
  if (world.size > 1) {
    auto t = at::tensor(laps, at::kDouble);
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    world.pg->allreduce(ts, opts)->wait();
    laps.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  return laps;
}

// The BLAS library this process loaded (its GEMMs are most of a step's time,
// and Debian's libblas.so.3 may be the unoptimised reference BLAS).
std::string blas_library() {
  // PyPI's LibTorch links MKL into libtorch_cpu: there is no library to name.
  if (at::hasMKL()) return "MKL (linked into libtorch_cpu)";
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash != std::string::npos && line.find("blas", slash) != std::string::npos &&
        line.find("cublas", slash) == std::string::npos) {
      std::error_code ec;
      auto path = std::filesystem::canonical(line.substr(slash), ec);
      return ec ? line.substr(slash) : path.string();
    }
  }
  return "unknown";
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs one layout on this rank (every rank of the world calls it). Returns
// the layout's JSON (meaningful on global rank 0).
json run_layout(const BenchConfig& b, const Layout& l, const Args& args,
                const std::optional<LocalRank>& me) {
  auto cfg = ModelConfig::from_hf_json(b.model_json(), "engine_bench");
  ParallelConfig pc;
  pc.tp = l.tp;
  pc.pp = l.pp;
  pc.dp = l.dp;
  auto ps = me ? ParallelState::create(me->store, me->rank, pc) : ParallelState::single();
  auto split = even_layer_split(cfg.num_layers, l.pp);
  auto model = std::make_shared<Transformer>(cfg, ps);
  auto spec = ShardSpec::for_rank(cfg, ps->coords().tp, l.tp, ps->coords().pp, split);
  model->load_state_dict(hf_to_shard(hf_weights(b, cfg), cfg, spec));
  OptimizerOptions oo = OptimizerOptions().set_lr(1e-5);
  oo.distributed = l.distributed;
  oo.shared_memory = l.shared_memory;
  oo.overlap_grad_reduce = l.overlap;
  oo.bucket_bytes = l.overlap ? 4 << 20 : oo.bucket_bytes;
  Optimizer opt(model, oo);

  // This DP rank's rows, in micro-batches.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(b.seed + 1);
  auto ids = at::randint(0, cfg.vocab_size, {b.batch, b.seq}, gen, at::kLong);
  auto pos = at::arange(b.seq, at::kLong).unsqueeze(0).expand({b.batch, b.seq}).contiguous();
  auto mask = at::ones({b.batch, b.seq}, at::kLong);
  int64_t rows = b.batch / l.dp, row0 = ps->coords().dp * rows;
  std::vector<MicroBatch> mbs;
  for (int64_t r = row0; r < row0 + rows; r += b.micro) {
    MicroBatch mb;
    mb.input_ids = ids.narrow(0, r, b.micro);
    mb.position_ids = pos.narrow(0, r, b.micro);
    mb.attention_mask = mask.narrow(0, r, b.micro);
    mbs.push_back(mb);
  }
  const Group& tp = ps->tp();
  const Group& world = ps->world();
  double positions = static_cast<double>(b.batch * (b.seq - 1));
  auto loss = [&](const at::Tensor& logits, const MicroBatch& mb) {
    return -next_token_log_probs(logits, mb.input_ids, tp).sum() / positions;
  };
  auto log_probs = [&](const at::Tensor& logits, const MicroBatch& mb) {
    return next_token_log_probs(logits, mb.input_ids, tp);
  };

  // Inference first (the weights are still the initial ones: the mean
  // log-prob is comparable with the PyTorch script's).
  std::vector<double> logprob_s;
  double lp_sum = 0;
  for (int i = 0; i < args.warmup + args.iters; ++i) {
    std::vector<at::Tensor> outs;
    auto laps = world_time(world, [&] {
      auto t0 = Clock::now();
      outs = forward_only(*model, mbs, log_probs);
      return std::vector<double>{since(t0)};
    });
    if (i >= args.warmup) logprob_s.push_back(laps[0]);
    if (i == 0)
      for (auto& o : outs) lp_sum += o.sum().item<double>();
  }
  std::vector<double> fwd_bwd_s, step_s;
  double first_loss = 0;
  for (int i = 0; i < args.warmup + args.iters; ++i) {
    opt.zero_grad();
    std::vector<at::Tensor> losses;
    auto laps = world_time(world, [&] {
      auto t0 = Clock::now();
      losses = forward_backward(*model, mbs, loss);
      double fb = since(t0);
      opt.step();
      return std::vector<double>{fb, since(t0)};
    });
    if (i >= args.warmup) {
      fwd_bwd_s.push_back(laps[0]);
      step_s.push_back(laps[1]);
    }
    if (i == 0)
      for (auto& x : losses) first_loss += x.item<double>();
  }

  if (!args.profile.empty() && ps->world().size == 1) {
    std::filesystem::create_directories(args.profile);
    {
      torch::autograd::profiler::RecordProfile trace(args.profile + "/baton_logprob.trace");
      forward_only(*model, mbs, log_probs);
    }
    opt.zero_grad();
    {
      torch::autograd::profiler::RecordProfile trace(args.profile + "/baton_fwd_bwd.trace");
      forward_backward(*model, mbs, loss);
    }
  }

  // Per-rank parameter bytes, and the sums of loss and log-probs over the
  // last stages' DP ranks (tp rank 0 only: the values are replicated).
  int64_t n = ps->world().size;
  auto gathered = at::zeros({2 * n + 2}, at::kDouble);
  gathered[ps->rank()] = static_cast<double>(model->param_bytes());
  gathered[n + 2 + ps->rank()] = static_cast<double>(opt.state_bytes());
  if (ps->is_last_stage() && ps->coords().tp == 0) {
    gathered[n] = first_loss;
    gathered[n + 1] = lp_sum;
  }
  if (n > 1) {
    std::vector<at::Tensor> ts{gathered};
    world.pg->allreduce(ts)->wait();
  }
  std::vector<int64_t> per_rank, optim_per_rank;
  for (int64_t r = 0; r < n; ++r) {
    per_rank.push_back(gathered[r].item<int64_t>());
    optim_per_rank.push_back(gathered[n + 2 + r].item<int64_t>());
  }

  double tokens = static_cast<double>(b.batch * b.seq);
  json j;
  j["world"] = n;
  j["threads_per_process"] = at::get_num_threads();
  j["micro_batches_per_rank"] = mbs.size();
  j["fwd_bwd_tokens_per_s"] = tokens / median(fwd_bwd_s);
  j["train_step_tokens_per_s"] = tokens / median(step_s);
  j["logprob_tokens_per_s"] = tokens / median(logprob_s);
  j["fwd_bwd_s"] = fwd_bwd_s;
  j["train_step_s"] = step_s;
  j["logprob_s"] = logprob_s;
  j["param_bytes_per_rank"] = per_rank;
  j["param_bytes_max"] = *std::max_element(per_rank.begin(), per_rank.end());
  j["optimizer_state_bytes_per_rank"] = optim_per_rank;
  j["optimizer_state_bytes_max"] = *std::max_element(optim_per_rank.begin(), optim_per_rank.end());
  j["distributed_optimizer"] = l.distributed;
  j["shared_memory_collectives"] = opt.shared_memory_collectives();
  j["overlap_grad_reduce"] = l.overlap;
  j["grad_buckets"] = opt.grad_buckets();
  j["buckets_started_in_backward"] = opt.buckets_started_in_backward();
  j["train_step_over_fwd_bwd"] = median(fwd_bwd_s) / median(step_s);
  j["first_loss"] = gathered[n].item<double>();
  j["mean_log_prob"] = gathered[n + 1].item<double>() / positions;
  return j;
}

// Runs `layout` as a child world of its own and returns rank 0's JSON.
json run_child_world(const Layout& l, const Args& args, const char* self) {
  auto file = std::filesystem::temp_directory_path() /
              ("engine-bench-" + std::to_string(::getpid()) + "-" + l.name + ".json");
  std::vector<std::string> words = {self, "--layout", l.name, "--result", file.string()};
  words.insert(words.end(), {"--warmup", std::to_string(args.warmup), "--iters",
                             std::to_string(args.iters), "--shape", args.shape});
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  if (launch_local_world(static_cast<int>(words.size()), argv.data(), l.world()) != 0)
    throw EngineError("layout " + l.name + ": a rank failed (see above)");
  std::ifstream in(file);
  json j = json::parse(in);
  std::filesystem::remove(file);
  return j;
}

void print_layout(const std::string& name, const json& j) {
  std::printf(
      "%-13s world %lld x %d threads: fwd+bwd %8.0f tok/s  train step %8.0f tok/s (%.2fx)  "
      "log-probs %8.0f tok/s  params/rank max %.2f MB  optimizer/rank max %.2f MB  "
      "(first loss %.6f, mean log-prob %.6f)\n",
      name.c_str(), static_cast<long long>(j["world"].get<int64_t>()),
      j["threads_per_process"].get<int>(), j["fwd_bwd_tokens_per_s"].get<double>(),
      j["train_step_tokens_per_s"].get<double>(), j["train_step_over_fwd_bwd"].get<double>(),
      j["logprob_tokens_per_s"].get<double>(), j["param_bytes_max"].get<double>() / 1e6,
      j["optimizer_state_bytes_max"].get<double>() / 1e6, j["first_loss"].get<double>(),
      j["mean_log_prob"].get<double>());
  std::fflush(stdout);
}

// The last JSON line of a file (the PyTorch script's output).
json read_last_json_line(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw EngineError("--torch-json: cannot read " + path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') last = line;
  if (last.empty()) throw EngineError("--torch-json: no JSON line in " + path);
  return json::parse(last);
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  for (const auto& name : args.layouts) find_layout(name);  // exits on an unknown one
  const BenchConfig bench = args.shape == "add3" ? BenchConfig::add3() : BenchConfig();
  try {
    auto me = local_world_rank();
    if (me) {  // a rank of a child world
      json j = run_layout(bench, find_layout(args.layout), args, me);
      if (me->rank == 0) {
        std::ofstream out(args.result);
        out << j.dump() << "\n";
      }
      return 0;
    }
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    std::printf(
        "engine_bench: Llama vocab %lld hidden %lld intermediate %lld layers %lld heads %lld/%lld "
        "kv; batch %lld x %lld tokens, micro-batch %lld; fp32 CPU\n",
        static_cast<long long>(bench.vocab), static_cast<long long>(bench.hidden),
        static_cast<long long>(bench.intermediate), static_cast<long long>(bench.layers),
        static_cast<long long>(bench.heads), static_cast<long long>(bench.kv_heads),
        static_cast<long long>(bench.batch), static_cast<long long>(bench.seq),
        static_cast<long long>(bench.micro));
    std::printf(
        "threads: %u cores; tp1 runs in this process with %u intra-op threads, the 2-process "
        "layouts with %u per process (cores / world)\n",
        cores, cores, std::max(1u, cores / 2));
    std::string blas = blas_library();
    std::printf("BLAS: %s\n", blas.c_str());
    json out;
    out["config"] = bench.to_json();
    out["cores"] = cores;
    out["threads"] = {{"single_process", cores},
                      {"per_process_in_world_of_2", std::max(1u, cores / 2)}};
    out["blas"] = blas;
    out["warmup"] = args.warmup;
    out["iters"] = args.iters;
    json layouts = json::object();
    for (const auto& name : args.layouts) {
      const Layout& l = find_layout(name);
      json j;
      if (l.world() == 1) {
        at::set_num_threads(static_cast<int>(cores));
        j = run_layout(bench, l, args, std::nullopt);
      } else {
        j = run_child_world(l, args, argv[0]);
      }
      print_layout(name, j);
      layouts[name] = j;
    }
    out["layouts"] = layouts;
    if (!args.torch_json.empty()) {
      json t = read_last_json_line(args.torch_json);
      out["torch_eager"] = t;
      if (layouts.contains("tp1")) {
        const json& b = layouts["tp1"];
        json ratio;
        for (const char* k :
             {"fwd_bwd_tokens_per_s", "train_step_tokens_per_s", "logprob_tokens_per_s"})
          if (t.contains(k)) ratio[k] = b[k].get<double>() / t[k].get<double>();
        out["tp1_over_torch_eager"] = ratio;
        std::printf("tp1 / torch eager: fwd+bwd %.2fx, log-probs %.2fx (torch %d threads)\n",
                    ratio.value("fwd_bwd_tokens_per_s", 0.0),
                    ratio.value("logprob_tokens_per_s", 0.0), t.value("threads", 0));
      }
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
}
