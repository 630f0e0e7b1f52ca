// baton-generate: generate continuations of token prompts with the rollout
// engine (paged KV cache, continuous batching), optionally tensor-parallel
// over local processes, and print the results as JSON.
//
//   baton-generate --model DIR --prompt-tokens "1,2,3;4,5" --max-new-tokens N
//       [--temperature T] [--top-k K] [--top-p P] [--n S] [--seed X] [--tp N]
//       [--stop-tokens 7,9] [--ignore-eos] [--cache-mb MB] [--max-batch B]
//       [--make-vocab-size-divisible-by D]
//
// DIR is an HF directory (config.json + safetensors). Temperature 0 is greedy.
// Any vocabulary size works with any N: the embedding and LM head are padded
// to a multiple of D × N rows (D = 128 by default), never sampled.
// Output (one line), sequences ordered by (request, sample):
//   {"model": DIR, "tp": N, "params": {...}, "sequences": [{"request": 0,
//    "sample": 0, "prompt": [...], "response": [...], "log_probs": [...],
//    "finish_reason": "stop"|"length"}, ...], "stats": {...}}
// log_probs[i] is log_softmax(logits / T) of response[i] (T = 1 when greedy).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/local_world.h"
#include "engine/rollout/generation.h"
#include "tools/cli.h"

using namespace baton::engine;
namespace cli = baton::cli;

namespace {

struct Args {
  std::string model;
  std::vector<std::vector<int64_t>> prompts;
  SamplingParams params;
  int64_t tp = 1;
  int64_t cache_mb = 256;
  int64_t max_batch = 64;
  int64_t vocab_divisible_by = kDefaultVocabDivisibleBy;
  bool max_new_given = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "baton-generate: %s\nusage: baton-generate --model DIR --prompt-tokens \"1,2,3;4,5\" "
      "--max-new-tokens N [--temperature T] [--top-k K] [--top-p P] [--n S] [--seed X] "
      "[--tp N] [--stop-tokens 7,9] [--ignore-eos] [--cache-mb MB] [--max-batch B] "
      "[--make-vocab-size-divisible-by D]\n",
      why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {"--ignore-eos"},
                       [&](const std::string& k, const std::string& v) {
                         if (k == "--ignore-eos") {
                           a.params.ignore_eos = true;
                         } else if (k == "--model") {
                           a.model = v;
                         } else if (k == "--prompt-tokens") {
                           for (const auto& prompt : cli::split(v, ';'))
                             a.prompts.push_back(cli::parse_int_list(prompt, ',', "prompt token"));
                         } else if (k == "--max-new-tokens") {
                           a.params.max_new_tokens = cli::parse_int(v, k);
                           a.max_new_given = true;
                         } else if (k == "--temperature") {
                           a.params.temperature = cli::parse_double(v, k);
                         } else if (k == "--top-k") {
                           a.params.top_k = cli::parse_int(v, k);
                         } else if (k == "--top-p") {
                           a.params.top_p = cli::parse_double(v, k);
                         } else if (k == "--n") {
                           a.params.n = cli::parse_int(v, k);
                         } else if (k == "--seed") {
                           a.params.seed = static_cast<uint64_t>(cli::parse_int(v, k));
                         } else if (k == "--tp") {
                           a.tp = cli::parse_int(v, k);
                         } else if (k == "--stop-tokens") {
                           a.params.stop_token_ids = cli::parse_int_list(v, ',', "stop token");
                         } else if (k == "--cache-mb") {
                           a.cache_mb = cli::parse_int(v, k);
                         } else if (k == "--max-batch") {
                           a.max_batch = cli::parse_int(v, k);
                         } else if (k == "--make-vocab-size-divisible-by") {
                           a.vocab_divisible_by = cli::parse_int(v, k);
                         } else {
                           cli::unknown_option(k);
                         }
                       });
  if (a.model.empty()) usage("--model is required");
  if (a.prompts.empty()) usage("--prompt-tokens is required");
  if (!a.max_new_given) usage("--max-new-tokens is required");
  if (a.tp < 1) usage("--tp must be positive");
  if (a.cache_mb < 1) usage("--cache-mb must be positive");
  if (a.max_batch < 1) usage("--max-batch must be positive");
  if (a.vocab_divisible_by < 1) usage("--make-vocab-size-divisible-by must be positive");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

nlohmann::json params_json(const SamplingParams& p) {
  return {{"temperature", p.temperature},
          {"top_k", p.top_k},
          {"top_p", p.top_p},
          {"n", p.n},
          {"max_new_tokens", p.max_new_tokens},
          {"seed", p.seed},
          {"stop_token_ids", p.stop_token_ids},
          {"ignore_eos", p.ignore_eos}};
}

int run(const Args& a, const std::optional<LocalRank>& me) {
  auto cfg = ModelConfig::load(a.model);
  validate_tensor_parallel(cfg, a.tp);
  ParallelConfig pc;
  pc.tp = a.tp;
  pc.make_vocab_size_divisible_by = a.vocab_divisible_by;
  auto ps = me ? ParallelState::create(me->store, me->rank, pc) : ParallelState::single(pc);
  auto model = std::make_shared<Transformer>(cfg, ps);
  model->load_state_dict(hf_to_shard(read_hf_weights(a.model), cfg, model->shard_spec()));

  GenerationOptions options;
  options.cache.budget_bytes = a.cache_mb << 20;
  options.max_batch = a.max_batch;
  GenerationEngine engine(model, options);
  auto sequences = engine.generate(a.prompts, a.params);
  if (ps->coords().tp != 0) return 0;
  nlohmann::json j;
  j["model"] = a.model;
  j["tp"] = a.tp;
  j["params"] = params_json(a.params);
  j["sequences"] = nlohmann::json::array();
  for (const auto& s : sequences)
    j["sequences"].push_back({{"request", s.request},
                              {"sample", s.sample},
                              {"prompt", s.prompt},
                              {"response", s.response},
                              {"log_probs", s.log_probs},
                              {"finish_reason", s.finish_reason}});
  const auto& st = engine.last_stats();
  j["stats"] = {{"steps", st.steps},
                {"prefill_tokens", st.prefill_tokens},
                {"decode_tokens", st.decode_tokens},
                {"preemptions", st.preemptions},
                {"peak_running", st.peak_running}};
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  auto me = local_world_rank();
  try {
    if (!me && args.tp > 1) {
      // Check the inputs once here so that bad input fails before N processes start.
      auto cfg = ModelConfig::load(args.model);
      validate_tensor_parallel(cfg, args.tp);
      args.params.validate(cfg.vocab_size);
      return launch_local_world(argc, argv, args.tp);
    }
    return run(args, me);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-generate: %s\n", e.what());
    return 1;
  }
}
