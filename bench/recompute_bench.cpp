// recompute_bench: what full activation recomputation
// (TransformerOptions::recompute_activations) saves in memory and costs in
// time, and what LoRA (TransformerOptions::lora) saves against full
// fine-tuning, on a model of Qwen2.5-0.5B's shape (fp32, random
// initialisation, CPU, one process). bench/recompute_bench_hf.py measures the
// same with HF transformers' gradient checkpointing and PEFT.
//
//   ./build/bench/recompute_bench [--batch 4] [--seq 512] [--micro B] [--steps 3]
//                                 [--threads 2] [--layers 24] [--rounds 2]
//                                 [--lora-rank 0] [--optimizer 0|1]
//   ./build/bench/recompute_bench --compare lora [--lora-rank 16] [same options]
//   ./build/bench/recompute_bench --recompute 0|1 [same options] [--result FILE]
//
// Without --recompute (the parent) it runs each of two configurations in a
// process of its own (this program again, with --recompute), in alternating
// order --rounds times (A, B, B, A for 2), so that each process's peak RSS
// belongs to one configuration, and prints one JSON object as the last line
// of stdout: every run, each configuration's means over its runs, and the
// ratios B / A. The two configurations:
//   --compare recompute (the default): no recompute (A) and recompute (B),
//     both with --lora-rank and --optimizer as given; ratios in
//     "recompute_over_no_recompute".
//   --compare lora: full fine-tuning (A) and LoRA of rank --lora-rank
//     (default 16; alpha 2·rank, every linear layer of every block) (B), both
//     with the optimizer step and without recompute; ratios in
//     "lora_over_full".
// With --recompute it runs that configuration here and prints (or writes to
// FILE) that run's JSON.
//
// A run: build the model (Qwen2's shape; --layers shrinks it for a smoke
// run; --lora-rank R > 0 adds adapters to q/k/v/o/gate/up/down_proj and
// freezes the base), then --steps steps of forward_backward over the batch's
// micro-batches (1F1B with pp = 1: gradient accumulation; loss = token mean
// of -log p over all B·(S-1) next-token positions), and with --optimizer 1 an
// AdamW step (engine::Optimizer, plain, its defaults: lr 1e-5, weight decay
// 0.01 on matrices, global-norm clip 1.0) over the trainable parameters
// after each. The timed step is forward + backward (+ the optimizer step);
// gradients are zeroed in place between steps, outside the timing. The first
// step is a warm-up (it also allocates the gradients); step_s_mean is the
// mean of the others, optimizer_s_mean the optimizer step's share of it.
//
// Memory, in bytes, from /proc/self/status and getrusage:
//   rss_after_build        VmRSS after the model is built (parameters only)
//   rss_after_optimizer    VmRSS after the optimizer is built (its AdamW
//                          moments: optimizer_state_bytes); = after build
//                          without --optimizer
//   rss_after_first_step   VmRSS after the warm-up step (parameters +
//                          optimizer state + gradients: grad_bytes)
//   steps[i].rss_before    VmRSS just before step i
//   steps[i].peak_rss      VmHWM during step i (the high-water mark is reset
//                          before each step by writing 5 to
//                          /proc/self/clear_refs; peak_reset says whether that
//                          worked, else it is the process's mark so far)
//   activation             max over the measured steps of peak_rss - rss_before
//   peak_rss, ru_maxrss    the process's peak: the largest VmHWM / ru_maxrss
//                          read at the end of the build and of each step
// Every VmRSS is read after malloc_trim(0), so that memory glibc keeps cached
// after free() is not counted as live (the Python script does the same).
// trainable_params / trainable_bytes count what the optimizer updates (every
// parameter, the tied embedding once; with LoRA the adapters alone).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/errors.h"
#include "engine/io/model_config.h"
#include "engine/model/lora.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/parallel_state.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tools/cli.h"

using namespace baton::engine;
using json = nlohmann::json;
namespace cli = baton::cli;

namespace {

using Clock = std::chrono::steady_clock;

// What the parent compares (the header).
enum class Compare { kRecompute, kLora };

constexpr int64_t kCompareLoraRank = 16;  // --compare lora without --lora-rank

struct Args {
  std::optional<bool> recompute;     // set: run this configuration here
  std::string result;                // with --recompute: write the JSON here
  std::optional<Compare> compare;    // the parent's; kRecompute when not given
  std::optional<int64_t> lora_rank;  // 0: full fine-tuning
  bool optimizer = false;            // an AdamW step after each backward
  int64_t batch = 4;
  int64_t seq = 512;
  int64_t micro = 0;  // sequences per micro-batch; 0: the whole batch
  int64_t steps = 3;  // the first one is a warm-up
  int64_t threads = 2;
  int64_t layers = 24;
  int64_t rounds = 2;
  uint64_t seed = 1234;  // parameters and tokens
};

// One configuration: what a child process runs.
struct Variant {
  std::string name;   // its key in the parent's JSON
  std::string label;  // its name in the printed lines
  bool recompute = false;
  int64_t lora_rank = 0;
  bool optimizer = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "recompute_bench: %s\nusage: recompute_bench [--compare recompute|lora | "
               "--recompute 0|1 [--result FILE]] [--lora-rank R] [--optimizer 0|1] "
               "[--batch 4] [--seq 512] [--micro B] [--steps 3] [--threads 2] [--layers 24] "
               "[--rounds 2]\n",
               why.c_str());
  std::exit(2);
}

bool parse_bool(const std::string& v, const std::string& k) {
  if (v != "0" && v != "1") usage(k + " is 0 or 1, not " + v);
  return v == "1";
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {}, [&](const std::string& k, const std::string& v) {
    if (k == "--recompute") {
      a.recompute = parse_bool(v, k);
    } else if (k == "--result") {
      a.result = v;
    } else if (k == "--compare") {
      if (v != "recompute" && v != "lora") usage("--compare is recompute or lora, not " + v);
      a.compare = v == "lora" ? Compare::kLora : Compare::kRecompute;
    } else if (k == "--lora-rank") {
      a.lora_rank = cli::parse_int(v, k);
    } else if (k == "--optimizer") {
      a.optimizer = parse_bool(v, k);
    } else if (k == "--batch") {
      a.batch = cli::parse_int(v, k);
    } else if (k == "--seq") {
      a.seq = cli::parse_int(v, k);
    } else if (k == "--micro") {
      a.micro = cli::parse_int(v, k);
    } else if (k == "--steps") {
      a.steps = cli::parse_int(v, k);
    } else if (k == "--threads") {
      a.threads = cli::parse_int(v, k);
    } else if (k == "--layers") {
      a.layers = cli::parse_int(v, k);
    } else if (k == "--rounds") {
      a.rounds = cli::parse_int(v, k);
    } else {
      cli::unknown_option(k);
    }
  });
  if (a.micro == 0) a.micro = a.batch;
  if (a.batch < 1 || a.seq < 2 || a.micro < 1 || a.batch % a.micro != 0)
    usage("--batch >= 1, --seq >= 2, and --micro must divide --batch");
  if (a.steps < 2) usage("--steps must be >= 2 (the first is a warm-up)");
  if (a.threads < 1 || a.layers < 1 || a.rounds < 1)
    usage("--threads, --layers and --rounds must be >= 1");
  if (a.recompute && a.compare) usage("--compare is the parent's; a --recompute run is one");
  if (a.lora_rank && *a.lora_rank < 0) usage("--lora-rank must be >= 0");
  if (a.compare == Compare::kLora && a.lora_rank == 0)
    usage("--compare lora needs --lora-rank > 0");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

// Qwen2.5-0.5B's config.json, less what only generation reads, with
// `layers` layers.
json qwen2_5_0_5b(int64_t layers) {
  return {{"architectures", {"Qwen2ForCausalLM"}},
          {"model_type", "qwen2"},
          {"vocab_size", 151936},
          {"hidden_size", 896},
          {"intermediate_size", 4864},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 14},
          {"num_key_value_heads", 2},
          {"head_dim", 64},
          {"max_position_embeddings", 32768},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"tie_word_embeddings", true},
          {"use_sliding_window", false},
          {"hidden_act", "silu"},
          {"torch_dtype", "float32"}};
}

// PEFT's LoraConfig(r=rank, lora_alpha=2·rank, target_modules="all-linear").
LoraOptions lora_options(int64_t rank) {
  LoraOptions o;
  o.rank = rank;
  o.alpha = 2.0 * static_cast<double>(rank);
  o.targets = {"all-linear"};
  return o;
}

// A field of /proc/self/status ("VmRSS", "VmHWM") in bytes.
int64_t proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  throw EngineError("recompute_bench: no " + key + " in /proc/self/status");
}

int64_t ru_maxrss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// VmRSS of live memory: free()d pages glibc still holds go back first.
int64_t live_rss_bytes() {
  malloc_trim(0);
  return proc_status_bytes("VmRSS");
}

// Resets VmHWM (and ru_maxrss) to the current RSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double mean(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return s / static_cast<double>(xs.size());
}

// One configuration in this process.
json run_configuration(const Args& a) {
  const bool recompute = *a.recompute;
  const int64_t lora_rank = a.lora_rank.value_or(0);
  at::set_num_threads(static_cast<int>(a.threads));
  json j;
  j["recompute"] = recompute;
  j["lora_rank"] = lora_rank;
  j["optimizer"] = a.optimizer;
  j["threads"] = at::get_num_threads();
  j["rss_start_bytes"] = live_rss_bytes();

  auto cfg = ModelConfig::from_hf_json(qwen2_5_0_5b(a.layers), "recompute_bench");
  TransformerOptions options = TransformerOptions().set_recompute_activations(recompute);
  if (lora_rank > 0) options.lora = lora_options(lora_rank);
  at::manual_seed(a.seed);  // the parameters' initialisation
  auto t0 = Clock::now();
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single(), options);
  j["build_s"] = since(t0);
  j["param_bytes"] = model->param_bytes();
  int64_t trainable = 0, trainable_bytes = 0;
  for (const auto& [name, p] : model->trainable_params()) {
    trainable += p.numel();
    trainable_bytes += static_cast<int64_t>(p.nbytes());
  }
  j["trainable_params"] = trainable;
  j["trainable_bytes"] = trainable_bytes;
  j["rss_after_build_bytes"] = live_rss_bytes();

  std::unique_ptr<Optimizer> opt;
  if (a.optimizer) {
    OptimizerOptions oo;
    oo.distributed = false;
    opt = std::make_unique<Optimizer>(model, oo);
  }
  j["optimizer_state_bytes"] = opt ? opt->state_bytes() : 0;
  j["rss_after_optimizer_bytes"] = live_rss_bytes();

  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed);
  auto ids = at::randint(0, cfg.vocab_size, {a.batch, a.seq}, gen, at::kLong);
  auto pos = at::arange(a.seq, at::kLong).unsqueeze(0).expand({a.batch, a.seq}).contiguous();
  auto mask = at::ones({a.batch, a.seq}, at::kLong);
  std::vector<MicroBatch> mbs;
  for (int64_t r = 0; r < a.batch; r += a.micro) {
    MicroBatch mb;
    mb.input_ids = ids.narrow(0, r, a.micro);
    mb.position_ids = pos.narrow(0, r, a.micro);
    mb.attention_mask = mask.narrow(0, r, a.micro);
    mbs.push_back(mb);
  }
  const Group& tp = model->parallel().tp();
  const double positions = static_cast<double>(a.batch * (a.seq - 1));
  auto loss = [&](const at::Tensor& logits, const MicroBatch& mb) {
    return -next_token_log_probs(logits, mb.input_ids, tp).sum() / positions;
  };

  int64_t peak = proc_status_bytes("VmHWM"), ru_peak = ru_maxrss_bytes();
  bool peak_reset = true;
  json steps = json::array();
  std::vector<double> step_s, optimizer_s;
  int64_t activation = 0;
  for (int64_t i = 0; i < a.steps; ++i) {
    if (opt) {
      opt->zero_grad();
    } else {
      for (auto& [name, p] : model->trainable_params())
        if (p.grad().defined()) p.mutable_grad().zero_();
    }
    const int64_t before = live_rss_bytes();
    peak_reset = reset_peak_rss() && peak_reset;
    t0 = Clock::now();
    auto losses = forward_backward(*model, mbs, loss);
    const auto t_opt = Clock::now();
    if (opt) opt->step();
    const double dt = since(t0), opt_dt = since(t_opt);
    const int64_t step_peak = proc_status_bytes("VmHWM");
    peak = std::max(peak, step_peak);
    ru_peak = std::max(ru_peak, ru_maxrss_bytes());
    json s = {{"warmup", i == 0},
              {"step_s", dt},
              {"optimizer_s", opt ? opt_dt : 0.0},
              {"rss_before_bytes", before},
              {"peak_rss_bytes", step_peak},
              {"activation_bytes", step_peak - before}};
    steps.push_back(s);
    if (i == 0) {
      double l = 0;
      for (auto& x : losses) l += x.item<double>();
      j["first_loss"] = l;
      int64_t grad_bytes = 0;
      for (const auto& [name, p] : model->trainable_params())
        if (p.grad().defined()) grad_bytes += static_cast<int64_t>(p.grad().nbytes());
      j["grad_bytes"] = grad_bytes;
      j["rss_after_first_step_bytes"] = live_rss_bytes();
    } else {
      step_s.push_back(dt);
      optimizer_s.push_back(opt ? opt_dt : 0.0);
      activation = std::max(activation, step_peak - before);
    }
  }
  j["steps"] = steps;
  j["peak_reset"] = peak_reset;
  j["peak_rss_bytes"] = peak;
  j["ru_maxrss_bytes"] = ru_peak;
  j["activation_bytes"] = activation;
  j["step_s_mean"] = mean(step_s);
  j["optimizer_s_mean"] = mean(optimizer_s);
  j["tokens_per_s"] = static_cast<double>(a.batch * a.seq) / mean(step_s);
  return j;
}

// Runs one configuration as a child process (this program with --recompute)
// and returns its JSON.
json run_child(const Args& a, const Variant& v, int run) {
  auto file =
      std::filesystem::temp_directory_path() /
      ("recompute-bench-" + std::to_string(::getpid()) + "-" + std::to_string(run) + ".json");
  std::vector<std::string> words = {"recompute_bench",
                                    "--recompute",
                                    v.recompute ? "1" : "0",
                                    "--lora-rank",
                                    std::to_string(v.lora_rank),
                                    "--optimizer",
                                    v.optimizer ? "1" : "0",
                                    "--result",
                                    file.string(),
                                    "--batch",
                                    std::to_string(a.batch),
                                    "--seq",
                                    std::to_string(a.seq),
                                    "--micro",
                                    std::to_string(a.micro),
                                    "--steps",
                                    std::to_string(a.steps),
                                    "--threads",
                                    std::to_string(a.threads),
                                    "--layers",
                                    std::to_string(a.layers)};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) throw EngineError("recompute_bench: fork failed");
  if (pid == 0) {
    ::execv("/proc/self/exe", argv.data());
    std::perror("recompute_bench: execv /proc/self/exe");
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw EngineError("recompute_bench: the " + v.name + " run failed (see above)");
  std::ifstream in(file);
  json j = json::parse(in);
  std::filesystem::remove(file);
  return j;
}

// The means over one configuration's runs.
json summarize(const std::vector<json>& runs) {
  json s;
  for (const char* k :
       {"rss_start_bytes", "rss_after_build_bytes", "rss_after_optimizer_bytes",
        "rss_after_first_step_bytes", "peak_rss_bytes", "ru_maxrss_bytes", "activation_bytes",
        "step_s_mean", "optimizer_s_mean", "tokens_per_s", "trainable_params", "trainable_bytes",
        "optimizer_state_bytes", "grad_bytes"}) {
    std::vector<double> xs;
    for (const auto& r : runs) xs.push_back(r[k].get<double>());
    s[k] = mean(xs);
  }
  s["runs"] = runs.size();
  return s;
}

void print_run(const Variant& v, const json& r) {
  std::printf(
      "%s: step %.2f s  peak RSS %.2f GB  activations %.2f GB  after build %.2f GB  "
      "after first step %.2f GB  trainable %lld params  (first loss %.4f)\n",
      v.label.c_str(), r["step_s_mean"].get<double>(), r["peak_rss_bytes"].get<double>() / 1e9,
      r["activation_bytes"].get<double>() / 1e9, r["rss_after_build_bytes"].get<double>() / 1e9,
      r["rss_after_first_step_bytes"].get<double>() / 1e9,
      static_cast<long long>(r["trainable_params"].get<int64_t>()), r["first_loss"].get<double>());
  std::fflush(stdout);
}

// The parent's two configurations and the key of their ratios.
struct Comparison {
  Variant a, b;
  std::string ratio_key;  // "<b>_over_<a>"
  std::vector<const char*> ratios;
};

Comparison comparison(const Args& args) {
  if (args.compare == Compare::kLora) {
    const int64_t rank = args.lora_rank.value_or(kCompareLoraRank);
    return {{"full", "full", false, 0, true},
            {"lora", "lora rank " + std::to_string(rank), false, rank, true},
            "lora_over_full",
            {"peak_rss_bytes", "rss_after_first_step_bytes", "activation_bytes", "step_s_mean",
             "trainable_params", "trainable_bytes"}};
  }
  const int64_t rank = args.lora_rank.value_or(0);
  return {{"no_recompute", "recompute 0", false, rank, args.optimizer},
          {"recompute", "recompute 1", true, rank, args.optimizer},
          "recompute_over_no_recompute",
          {"peak_rss_bytes", "activation_bytes", "step_s_mean"}};
}

json run_parent(const Args& a, const Comparison& c) {
  json out;
  out["bench"] = "recompute_bench";
  out["impl"] = c.ratio_key == "lora_over_full"
                    ? "baton engine (LibTorch C++), TransformerOptions::lora (all-linear, alpha "
                      "2 rank) against full fine-tuning, engine::Optimizer AdamW"
                    : "baton engine (LibTorch C++), TransformerOptions::recompute_activations";
  json config = qwen2_5_0_5b(a.layers);
  config["batch"] = a.batch;
  config["seq"] = a.seq;
  config["micro_batch"] = a.micro;
  config["steps"] = a.steps;
  config["lora_rank"] = c.b.lora_rank;
  config["optimizer"] = c.b.optimizer;
  out["config"] = config;
  out["cpu"] = cpu_model();
  out["cores"] = std::max(1u, std::thread::hardware_concurrency());
  out["threads"] = a.threads;
  out["timed"] = c.b.optimizer
                     ? "forward+backward of every micro-batch, then one AdamW step; mean over the "
                       "steps after the first (warm-up)"
                     : "forward+backward of every micro-batch, no optimizer step; mean over the "
                       "steps after the first (warm-up)";
  out["activation"] = "peak RSS during a step minus RSS just before it (max over measured steps)";
  std::vector<json> runs, of_a, of_b;
  json order = json::array();
  for (int64_t round = 0; round < a.rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool second = (k == 1) != (round % 2 == 1);
      const Variant& v = second ? c.b : c.a;
      json r = run_child(a, v, static_cast<int>(runs.size()));
      print_run(v, r);
      order.push_back(v.name);
      runs.push_back(r);
      (second ? of_b : of_a).push_back(r);
    }
  }
  out["order"] = order;
  out["runs"] = runs;
  json s_a = summarize(of_a), s_b = summarize(of_b);
  out[c.a.name] = s_a;
  out[c.b.name] = s_b;
  json ratio;
  for (const char* k : c.ratios) ratio[k] = s_b[k].get<double>() / s_a[k].get<double>();
  out[c.ratio_key] = ratio;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    if (!args.recompute) {
      const Comparison c = comparison(args);
      std::printf(
          "recompute_bench: Qwen2.5-0.5B shape (%lld layers), batch %lld x %lld, micro-batch "
          "%lld, %lld steps (1 warm-up), %lld threads, fp32 CPU; %s vs %s (LoRA rank %lld), "
          "%s\n",
          static_cast<long long>(args.layers), static_cast<long long>(args.batch),
          static_cast<long long>(args.seq), static_cast<long long>(args.micro),
          static_cast<long long>(args.steps), static_cast<long long>(args.threads),
          c.a.name.c_str(), c.b.name.c_str(), static_cast<long long>(c.b.lora_rank),
          c.b.optimizer ? "forward+backward+AdamW" : "forward+backward only");
      json out = run_parent(args, c);
      const json& r = out[c.ratio_key];
      std::printf("%s / %s: peak RSS %.2fx, activations %.2fx, step time %.2fx", c.b.name.c_str(),
                  c.a.name.c_str(), r["peak_rss_bytes"].get<double>(),
                  r["activation_bytes"].get<double>(), r["step_s_mean"].get<double>());
      if (r.contains("trainable_params"))
        std::printf(", after the first step %.2fx, trainable parameters %.4fx",
                    r["rss_after_first_step_bytes"].get<double>(),
                    r["trainable_params"].get<double>());
      std::printf("\n%s\n", out.dump().c_str());
      return 0;
    }
    json j = run_configuration(args);
    if (args.result.empty()) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::ofstream out(args.result);
      out << j.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recompute_bench: %s\n", e.what());
    return 1;
  }
}
