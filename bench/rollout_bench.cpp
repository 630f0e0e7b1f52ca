// rollout_bench: the generation engine's prefill and decode throughput at
// batch 1, 16 and 64 on a fixed small Llama config (one process, greedy,
// EOS ignored so every sequence generates --new tokens), the KV cache's bytes
// per token, and in the same run the same generation without a cache (each
// step recomputes the full forward over every sequence so far).
//
//   ./build/bench/rollout_bench [--batches 1,16,64] [--prompt 32] [--new 32] [--repeats 3]
//                               [--n 1] [--no-prefix-sharing] [--threads N] [--profile FILE]
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
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

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
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "rollout_bench: %s\nusage: rollout_bench [--batches 1,16,64] [--prompt N] "
               "[--new N] [--repeats N] [--n N] [--no-prefix-sharing] [--threads N] "
               "[--profile FILE]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {"--no-prefix-sharing"},
                       [&](const std::string& k, const std::string& v) {
                         if (k == "--no-prefix-sharing") {
                           a.share = false;
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
                         } else {
                           cli::unknown_option(k);
                         }
                       });
  for (int64_t b : a.batches)
    if (b < 1) usage("batch sizes must be positive");
  if (a.prompt < 1 || a.new_tokens < 1 || a.repeats < 1 || a.n < 1 || a.threads < 0)
    usage("--prompt, --new, --repeats and --n must be positive, --threads >= 0");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

// The fixed model: engine_bench's small Llama (4M parameters).
ModelConfig bench_config(int64_t max_positions) {
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  int threads = args.threads > 0
                    ? static_cast<int>(args.threads)
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  auto cfg = bench_config(args.prompt + args.new_tokens);
  at::manual_seed(1234);
  auto model = std::make_shared<Transformer>(cfg, ParallelState::single());
  int64_t params = 0;
  for (const auto& [name, t] : model->named_params()) params += t.numel();

  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = args.new_tokens;
  greedy.ignore_eos = true;
  greedy.n = args.n;
  GenerationOptions options;
  options.max_batch = *std::max_element(args.batches.begin(), args.batches.end()) * args.n;
  options.cache.budget_bytes = 256 << 20;
  options.share_prompt_prefill = args.share;
  GenerationEngine engine(model, options);
  GenerationEngine padded_engine(model, GenerationOptions(options).set_packed_cpu_steps(false));

  json results = json::array();
  for (int64_t b : args.batches) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + b);
    auto ids = at::randint(3, cfg.vocab_size, {b, args.prompt}, gen, at::kLong);
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < b; ++i)
      prompts.emplace_back(ids[i].data_ptr<int64_t>(), ids[i].data_ptr<int64_t>() + args.prompt);
    engine.generate(prompts, greedy);  // warm-up
    padded_engine.generate(prompts, greedy);
    std::vector<double> prefill, decode, cached, padded, uncached;
    std::vector<GeneratedSequence> with_cache, with_padding, without_cache;
    for (int64_t r = 0; r < args.repeats; ++r) {
      auto t = Clock::now();
      with_cache = engine.generate(prompts, greedy);
      cached.push_back(b * args.n * args.new_tokens / seconds_since(t));
      const auto& st = engine.last_stats();
      prefill.push_back(st.prefill_tokens / st.prefill_seconds);
      decode.push_back(st.decode_tokens > 0 ? st.decode_tokens / st.decode_seconds : 0.0);
      t = Clock::now();
      with_padding = padded_engine.generate(prompts, greedy);
      padded.push_back(b * args.n * args.new_tokens / seconds_since(t));
      t = Clock::now();
      without_cache = generate_without_cache(*model, prompts, greedy);
      uncached.push_back(b * args.n * args.new_tokens / seconds_since(t));
    }
    bool same = true;
    for (size_t i = 0; i < with_cache.size(); ++i)
      same = same && with_cache[i].response == without_cache[i].response &&
             with_cache[i].response == with_padding[i].response;
    json row = {{"batch", b},
                {"prefill_tokens_per_s", median(prefill)},
                {"decode_tokens_per_s", median(decode)},
                {"cached_tokens_per_s", median(cached)},
                {"padded_tokens_per_s", median(padded)},
                {"uncached_tokens_per_s", median(uncached)},
                {"speedup", median(cached) / median(uncached)},
                {"same_tokens", same},
                {"prefill_computed", engine.last_stats().prefill_tokens},
                {"prefill_shared", engine.last_stats().shared_prefill_tokens}};
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
              {"results", results}};
  std::cout << out.dump() << std::endl;
  return 0;
}
