// rollout_bench: the generation engine's prefill and decode throughput at
// batch 1, 16 and 64 on a fixed small Llama config (one process, greedy,
// EOS ignored so every sequence generates --new tokens), the KV cache's bytes
// per token, and in the same run the same generation without a cache (each
// step recomputes the full forward over every sequence so far).
//
//   ./build/bench/rollout_bench [--batches 1,16,64] [--prompt 32] [--new 32] [--repeats 3]
//                               [--n 1] [--no-prefix-sharing] [--threads N] [--profile FILE]
//                               [--shape small|qwen0.5b] [--lora-rank R]
//                               [--model DIR] [--device cpu|cuda] [--dtype fp32|bf16]
//                               [--cache-mb MB] [--cached-only] [--warmup-new N]
//
// The last line of stdout is JSON. Per batch size (medians over --repeats):
//   prefill_tokens_per_s  prompt tokens / time in prefill steps
//   decode_tokens_per_s   tokens decoded one step at a time / time in decode steps
//   cached_tokens_per_s   generated tokens / wall time of the whole generate()
//                         (the engine's default steps: packed CPU kernels)
//   padded_tokens_per_s   the same with GenerationOptions::packed_cpu_steps off
//                         (padded steps of LibTorch operations)
//   uncached_tokens_per_s generated tokens / wall time without a cache
//   speedup               cached / uncached
//   same_tokens           all three produced the same sequences (greedy, fp32)
//   prefill_computed      prompt tokens the packed engine prefilled, and
//   prefill_shared        those its samples took from another's prefill
// --n N: N samples of each of B prompts (B · N sequences; greedy, so they
// are equal: this measures prefix sharing's effect, not diversity);
// --no-prefix-sharing: every sample prefills its prompt (both engines).
// Intra-op threads: all cores (one process) unless --threads. --profile FILE:
// after timing, one more cached generation at the first batch size under
// LibTorch's autograd profiler, written as a Chrome trace.
// --shape qwen0.5b: Qwen2.5-0.5B's dimensions (hidden 896, 24 layers, 14
// heads, 2 kv heads, intermediate 4864, vocab 151936, tied embeddings; random
// weights) instead of the small Llama; the output then names "shape".
//
// A real checkpoint on a GPU (scripts/gpu_bench.sh):
//   --model DIR     an HF directory (config.json + safetensors) instead of
//                   --shape's random model; the output then names "model_dir"
//   --device D      cpu (default) or cuda (the current CUDA device)
//   --dtype T       fp32 (default) or bf16: the parameters' and KV cache's
//   --cache-mb MB   KV cache budget (default 256); 0: room for every sequence
//                   of the largest batch at once (no preemption)
//   --cached-only   time only the engine's default generate(): no padded and
//                   no uncached run (their columns and same_tokens are absent)
//   --warmup-new N  new tokens of each batch's warm-up generation (default --new)
//   --device-decode-steps K  decode steps per host check in the device loop
//                   (GenerationOptions::device_decode_steps, default 8; 0: the
//                   host loop); it runs for padded steps (cuda, bf16)
//   --no-cuda-graphs  the device loop's steps uncaptured
// The output also has "device", "dtype", "param_bytes" (the parameters, tied
// embeddings once), "kv_cache_budget_bytes", "device_decode" and
// "cuda_graphs" (whether the engine ran them); each row "preemptions",
// "device_runs" (token copies to the host) and "graph_replays".
//
// --lora-rank R (0: off): a second model of the same config with random
// non-zero LoRA adapters of rank R (alpha 2R) on every linear layer, and the
// two ways a rollout can use it (issue 39), timed in the same run. Each row
// then also has, over the same prompts and --repeats (medians):
//   lora_adapter_tokens_per_s  generated tokens / wall time of generate() on
//                              the LoRA model itself (adapters applied in
//                              every step; the path it takes is
//                              lora.adapter_packed_steps: false = padded steps)
//   lora_merge_s               merged_params() (W + (alpha/R)·B·A) plus
//                              load_state_dict into a plain model of the
//                              same config (merge on entering the rollout)
//   lora_merged_tokens_per_s   generated tokens / wall time of generate() on
//                              that plain model (the engine's default steps)
//   lora_adapter_rollout_s     one rollout of B × n × --new tokens, adapters
//   lora_merged_rollout_s      the same, merge_s + generation on the merge
//   lora_faster                "merge" or "adapter" (the smaller rollout_s)
//   lora_same_tokens           fraction of sequences whose greedy responses
//                              are identical (fp32; W + ΔW and x Wᵀ + x ΔWᵀ
//                              round differently, so a near-tie in the
//                              logits of random weights can flip a token)
//   lora_same_token_fraction   fraction of response tokens equal position by
//                              position (a flip changes the rest of its sequence)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/io/hf_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/rollout/generation.h"
#include "tools/cli.h"

using namespace baton::engine;
namespace cli = baton::cli;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<int64_t> batches{1, 16, 64};
  int64_t prompt = 32;
  int64_t new_tokens = 32;
  int64_t repeats = 3;
  int64_t n = 1;  // samples per prompt
  bool share = true;
  int64_t threads = 0;  // 0: all cores
  std::string profile;
  std::string shape = "small";  // or "qwen0.5b"
  int64_t lora_rank = 0;        // 0: no LoRA comparison
  std::string model_dir;        // empty: --shape's random model
  std::string device = "cpu";   // or "cuda"
  std::string dtype = "fp32";   // or "bf16"
  int64_t cache_mb = 256;       // 0: room for the largest batch
  bool cached_only = false;
  int64_t warmup_new = 0;  // 0: --new
  int64_t device_decode_steps = 8;
  bool cuda_graphs = true;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "rollout_bench: %s\nusage: rollout_bench [--batches 1,16,64] [--prompt N] "
               "[--new N] [--repeats N] [--n N] [--no-prefix-sharing] [--threads N] "
               "[--profile FILE] [--shape small|qwen0.5b] [--lora-rank R] [--model DIR] "
               "[--device cpu|cuda] [--dtype fp32|bf16] [--cache-mb MB] [--cached-only] "
               "[--warmup-new N] [--device-decode-steps K] [--no-cuda-graphs]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {"--no-prefix-sharing", "--cached-only", "--no-cuda-graphs"},
                       [&](const std::string& k, const std::string& v) {
                         if (k == "--no-prefix-sharing") {
                           a.share = false;
                         } else if (k == "--cached-only") {
                           a.cached_only = true;
                         } else if (k == "--no-cuda-graphs") {
                           a.cuda_graphs = false;
                         } else if (k == "--device-decode-steps") {
                           a.device_decode_steps = cli::parse_int(v, k);
                         } else if (k == "--batches") {
                           a.batches = cli::parse_int_list(v, ',', "batch size");
                         } else if (k == "--prompt") {
                           a.prompt = cli::parse_int(v, k);
                         } else if (k == "--new") {
                           a.new_tokens = cli::parse_int(v, k);
                         } else if (k == "--repeats") {
                           a.repeats = cli::parse_int(v, k);
                         } else if (k == "--n") {
                           a.n = cli::parse_int(v, k);
                         } else if (k == "--threads") {
                           a.threads = cli::parse_int(v, k);
                         } else if (k == "--profile") {
                           a.profile = v;
                         } else if (k == "--shape") {
                           a.shape = v;
                         } else if (k == "--lora-rank") {
                           a.lora_rank = cli::parse_int(v, k);
                         } else if (k == "--model") {
                           a.model_dir = v;
                         } else if (k == "--device") {
                           a.device = v;
                         } else if (k == "--dtype") {
                           a.dtype = v;
                         } else if (k == "--cache-mb") {
                           a.cache_mb = cli::parse_int(v, k);
                         } else if (k == "--warmup-new") {
                           a.warmup_new = cli::parse_int(v, k);
                         } else {
                           cli::unknown_option(k);
                         }
                       });
  for (int64_t b : a.batches)
    if (b < 1) usage("batch sizes must be positive");
  if (a.prompt < 1 || a.new_tokens < 1 || a.repeats < 1 || a.n < 1 || a.threads < 0)
    usage("--prompt, --new, --repeats and --n must be positive, --threads >= 0");
  if (a.shape != "small" && a.shape != "qwen0.5b") usage("--shape must be small or qwen0.5b");
  if (a.lora_rank < 0) usage("--lora-rank must be >= 0");
  if (a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  if (a.dtype != "fp32" && a.dtype != "bf16") usage("--dtype must be fp32 or bf16");
  if (a.cache_mb < 0 || a.warmup_new < 0 || a.device_decode_steps < 0)
    usage("--cache-mb, --warmup-new and --device-decode-steps must be >= 0");
  if (a.lora_rank > 0 && (a.device != "cpu" || a.dtype != "fp32"))
    usage("--lora-rank runs on the CPU in fp32 only");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

// Qwen2.5-0.5B's dimensions (494M parameters), random weights.
ModelConfig qwen_05b_config(int64_t max_positions) {
  json j = {{"architectures", {"Qwen2ForCausalLM"}},
            {"model_type", "qwen2"},
            {"vocab_size", 151936},
            {"hidden_size", 896},
            {"intermediate_size", 4864},
            {"num_hidden_layers", 24},
            {"num_attention_heads", 14},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", max_positions},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"tie_word_embeddings", true},
            {"eos_token_id", 2}};
  return ModelConfig::from_hf_json(j, "rollout_bench");
}

// The fixed model: engine_bench's small Llama (4M parameters).
ModelConfig bench_config(int64_t max_positions, const std::string& shape) {
  if (shape == "qwen0.5b") return qwen_05b_config(max_positions);
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", 2048},
            {"hidden_size", 256},
            {"intermediate_size", 704},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 4},
            {"max_position_embeddings", max_positions},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", false},
            {"eos_token_id", 2}};
  return ModelConfig::from_hf_json(j, "rollout_bench");
}

// The model to generate with: the checkpoint of --model, else --shape's
// seeded random weights; then on --device in --dtype.
std::shared_ptr<Transformer> make_model(const Args& args) {
  std::shared_ptr<Transformer> model;
  if (args.model_dir.empty()) {
    at::manual_seed(1234);
    model = std::make_shared<Transformer>(bench_config(args.prompt + args.new_tokens, args.shape),
                                          ParallelState::single());
  } else {
    HfModel hf = load_hf_model(args.model_dir);
    model = std::make_shared<Transformer>(hf.config, ParallelState::single());
    model->load_state_dict(hf_to_shard(hf.weights, hf.config, model->shard_spec()));
  }
  const at::ScalarType dtype = args.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (args.device != "cpu" || dtype != at::kFloat)
    model->to(at::Device(args.device == "cuda" ? at::kCUDA : at::kCPU), dtype);
  return model;
}

// A KV cache budget with room for `sequences` of `tokens` positions each at
// once (whole blocks, plus the scratch block).
int64_t cache_bytes_for(const Transformer& model, int64_t sequences, int64_t tokens,
                        int64_t block_size) {
  const ModelConfig& cfg = model.config();
  const int64_t element = model.named_params().front().second.element_size();
  const int64_t per_token = 2 * cfg.num_layers * cfg.kv_size() * element;
  const int64_t blocks = sequences * ((tokens + block_size - 1) / block_size) + 1;
  return blocks * block_size * per_token;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Merge on entering the rollout: what HybridEngine does before it reshards,
// in one process (the plain model stands for the rollout's copy).
void load_merged(const Transformer& lora_model, Transformer& rollout_model) {
  const auto merged = lora_model.merged_params();
  rollout_model.load_state_dict({merged.begin(), merged.end()});
}

// The LoRA model and the engines that compare the two ways to roll out with it.
struct LoraBench {
  std::shared_ptr<Transformer> model;   // base + adapters
  std::shared_ptr<Transformer> merged;  // plain, loaded with merged_params()
  std::unique_ptr<GenerationEngine> adapter_engine;
  std::unique_ptr<GenerationEngine> merged_engine;
  int64_t adapter_params = 0;
};

LoraBench make_lora_bench(const ModelConfig& cfg, int64_t rank, const GenerationOptions& options) {
  LoraBench lb;
  TransformerOptions o;
  o.lora = LoraOptions{.rank = rank, .alpha = 2.0 * rank, .targets = {"all-linear"}};
  lb.model = std::make_shared<Transformer>(cfg, ParallelState::single(), o);
  // B starts at zero (a fresh adapter changes nothing); a trained one does not.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : lb.model->lora_params()) {
    if (name.ends_with(".B")) t.normal_(0.0, 0.02, gen);
    lb.adapter_params += t.numel();
  }
  lb.merged = std::make_shared<Transformer>(cfg, ParallelState::single());
  lb.adapter_engine = std::make_unique<GenerationEngine>(lb.model, options);
  lb.merged_engine = std::make_unique<GenerationEngine>(lb.merged, options);
  return lb;
}

// The LoRA columns of one batch size's row (see the header).
json lora_row(LoraBench& lb, const std::vector<std::vector<int64_t>>& prompts,
              const SamplingParams& greedy, int64_t repeats, double tokens) {
  load_merged(*lb.model, *lb.merged);
  lb.adapter_engine->generate(prompts, greedy);  // warm-up
  lb.merged_engine->generate(prompts, greedy);
  std::vector<double> adapter_s, merge_s, merged_gen_s;
  std::vector<GeneratedSequence> with_adapters, with_merge;
  for (int64_t r = 0; r < repeats; ++r) {
    auto t = Clock::now();
    with_adapters = lb.adapter_engine->generate(prompts, greedy);
    adapter_s.push_back(seconds_since(t));
    t = Clock::now();
    load_merged(*lb.model, *lb.merged);
    merge_s.push_back(seconds_since(t));
    t = Clock::now();
    with_merge = lb.merged_engine->generate(prompts, greedy);
    merged_gen_s.push_back(seconds_since(t));
  }
  int64_t same_seqs = 0, same_toks = 0, toks = 0;
  for (size_t i = 0; i < with_adapters.size(); ++i) {
    const auto& a = with_adapters[i].response;
    const auto& m = with_merge[i].response;
    same_seqs += a == m;
    for (size_t j = 0; j < std::max(a.size(), m.size()); ++j, ++toks)
      same_toks += j < a.size() && j < m.size() && a[j] == m[j];
  }
  const double adapter_rollout = median(adapter_s);
  const double merged_rollout = median(merge_s) + median(merged_gen_s);
  return {{"lora_adapter_tokens_per_s", tokens / adapter_rollout},
          {"lora_merge_s", median(merge_s)},
          {"lora_merged_tokens_per_s", tokens / median(merged_gen_s)},
          {"lora_adapter_rollout_s", adapter_rollout},
          {"lora_merged_rollout_s", merged_rollout},
          {"lora_faster", merged_rollout < adapter_rollout ? "merge" : "adapter"},
          {"lora_same_tokens", static_cast<double>(same_seqs) / with_adapters.size()},
          {"lora_same_token_fraction", toks > 0 ? static_cast<double>(same_toks) / toks : 1.0}};
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  int threads = args.threads > 0
                    ? static_cast<int>(args.threads)
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  auto model = make_model(args);
  const ModelConfig cfg = model->config();
  int64_t params = 0;
  for (const auto& [name, t] : model->named_params()) params += t.numel();

  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = args.new_tokens;
  greedy.ignore_eos = true;
  greedy.n = args.n;
  SamplingParams warmup = greedy;
  if (args.warmup_new > 0) warmup.max_new_tokens = args.warmup_new;
  GenerationOptions options;
  options.max_batch = *std::max_element(args.batches.begin(), args.batches.end()) * args.n;
  options.cache.budget_bytes =
      args.cache_mb > 0 ? args.cache_mb << 20
                        : cache_bytes_for(*model, options.max_batch, args.prompt + args.new_tokens,
                                          options.cache.block_size);
  options.share_prompt_prefill = args.share;
  options.device_decode_steps = args.device_decode_steps;
  options.cuda_graphs = args.cuda_graphs;
  GenerationEngine engine(model, options);
  std::optional<GenerationEngine> padded_engine;
  if (!args.cached_only)
    padded_engine.emplace(model, GenerationOptions(options).set_packed_cpu_steps(false));
  std::optional<LoraBench> lora;
  if (args.lora_rank > 0) lora = make_lora_bench(cfg, args.lora_rank, options);

  json results = json::array();
  for (int64_t b : args.batches) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + b);
    auto ids = at::randint(3, cfg.vocab_size, {b, args.prompt}, gen, at::kLong);
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < b; ++i)
      prompts.emplace_back(ids[i].data_ptr<int64_t>(), ids[i].data_ptr<int64_t>() + args.prompt);
    engine.generate(prompts, warmup);
    if (padded_engine) padded_engine->generate(prompts, warmup);
    std::vector<double> prefill, decode, cached, padded, uncached;
    std::vector<GeneratedSequence> with_cache, with_padding, without_cache;
    for (int64_t r = 0; r < args.repeats; ++r) {
      auto t = Clock::now();
      with_cache = engine.generate(prompts, greedy);
      cached.push_back(b * args.n * args.new_tokens / seconds_since(t));
      const auto& st = engine.last_stats();
      prefill.push_back(st.prefill_tokens / st.prefill_seconds);
      decode.push_back(st.decode_tokens > 0 ? st.decode_tokens / st.decode_seconds : 0.0);
      if (!padded_engine) continue;
      t = Clock::now();
      with_padding = padded_engine->generate(prompts, greedy);
      padded.push_back(b * args.n * args.new_tokens / seconds_since(t));
      t = Clock::now();
      without_cache = generate_without_cache(*model, prompts, greedy);
      uncached.push_back(b * args.n * args.new_tokens / seconds_since(t));
    }
    json row = {{"batch", b},
                {"prefill_tokens_per_s", median(prefill)},
                {"decode_tokens_per_s", median(decode)},
                {"cached_tokens_per_s", median(cached)},
                {"prefill_computed", engine.last_stats().prefill_tokens},
                {"prefill_shared", engine.last_stats().shared_prefill_tokens},
                {"preemptions", engine.last_stats().preemptions},
                {"device_runs", engine.last_stats().device_runs},
                {"graph_replays", engine.last_stats().graph_replays}};
    if (padded_engine) {
      bool same = true;
      for (size_t i = 0; i < with_cache.size(); ++i)
        same = same && with_cache[i].response == without_cache[i].response &&
               with_cache[i].response == with_padding[i].response;
      row["padded_tokens_per_s"] = median(padded);
      row["uncached_tokens_per_s"] = median(uncached);
      row["speedup"] = median(cached) / median(uncached);
      row["same_tokens"] = same;
    }
    if (lora)
      row.update(lora_row(*lora, prompts, greedy, args.repeats, b * args.n * args.new_tokens));
    std::fprintf(stderr, "%s\n", row.dump().c_str());
    results.push_back(row);
  }
  if (!args.profile.empty()) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    auto ids = at::randint(3, cfg.vocab_size, {args.batches[0], args.prompt}, gen, at::kLong);
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < ids.size(0); ++i)
      prompts.emplace_back(ids[i].data_ptr<int64_t>(), ids[i].data_ptr<int64_t>() + args.prompt);
    torch::autograd::profiler::RecordProfile trace(args.profile);
    engine.generate(prompts, greedy);
  }
  json out = {{"bench", "rollout"},
              {"model",
               {{"params", params},
                {"vocab", cfg.vocab_size},
                {"hidden", cfg.hidden_size},
                {"layers", cfg.num_layers},
                {"heads", cfg.num_heads},
                {"kv_heads", cfg.num_kv_heads}}},
              {"prompt_tokens", args.prompt},
              {"new_tokens", args.new_tokens},
              {"samples_per_prompt", args.n},
              {"prefix_sharing", args.share},
              {"repeats", args.repeats},
              {"threads", threads},
              {"packed_steps", engine.packed_steps()},
              {"kv_cache_bytes_per_token", engine.cache().bytes_per_token()},
              {"kv_cache_block_size", engine.cache().block_size()},
              {"kv_cache_budget_bytes", options.cache.budget_bytes},
              {"device_decode", engine.device_decode()},
              {"cuda_graphs", engine.cuda_graphs()},
              {"device", args.device},
              {"dtype", args.dtype},
              {"param_bytes", model->param_bytes()},
              {"results", results}};
  if (!args.model_dir.empty())
    out["model_dir"] = args.model_dir;
  else if (args.shape != "small")
    out["shape"] = args.shape;
  if (lora)
    out["lora"] = {{"rank", args.lora_rank},
                   {"alpha", 2.0 * args.lora_rank},
                   {"targets", "all-linear"},
                   {"adapter_params", lora->adapter_params},
                   {"adapter_packed_steps", lora->adapter_engine->packed_steps()},
                   {"merged_packed_steps", lora->merged_engine->packed_steps()}};
  std::cout << out.dump() << std::endl;
  return 0;
}
