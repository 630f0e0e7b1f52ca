// baton-logprobs: per-token log-probabilities of one token sequence under a
// model, teacher-forced, printed as JSON; optionally sharded over tp × pp
// local processes (the same numbers, computed the distributed way).
//
//   baton-logprobs --model DIR --tokens 1,2,3,4 [--tp N] [--pp M]
//                  [--make-vocab-size-divisible-by D]
//
// DIR is an HF directory (config.json + safetensors). Any vocabulary size
// works with any N: the embedding and LM head are padded to a multiple of
// D × N rows (D = 128 by default, Megatron's make_vocab_size_divisible_by),
// and the padding never changes the log-probs. Output (one line):
//   {"model": DIR, "tokens": [...], "log_probs": [...], "tp": N, "pp": M}
// where log_probs[i] = log p(tokens[i+1] | tokens[..i]).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/parallel/local_world.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tools/cli.h"

using namespace baton::engine;
namespace cli = baton::cli;

namespace {

struct Args {
  std::string model;
  std::vector<int64_t> tokens;
  int64_t tp = 1, pp = 1;
  int64_t vocab_divisible_by = kDefaultVocabDivisibleBy;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "baton-logprobs: %s\nusage: baton-logprobs --model DIR --tokens 1,2,3 [--tp N] "
               "[--pp M] [--make-vocab-size-divisible-by D]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) try {
  Args a;
  cli::for_each_option(argc, argv, {}, [&](const std::string& k, const std::string& v) {
    if (k == "--model") {
      a.model = v;
    } else if (k == "--tokens") {
      a.tokens = cli::parse_int_list(v, ',', "token");
    } else if (k == "--tp") {
      a.tp = cli::parse_int(v, "--tp");
    } else if (k == "--pp") {
      a.pp = cli::parse_int(v, "--pp");
    } else if (k == "--make-vocab-size-divisible-by") {
      a.vocab_divisible_by = cli::parse_int(v, k);
    } else {
      cli::unknown_option(k);
    }
  });
  if (a.model.empty()) usage("--model is required");
  if (a.tokens.size() < 2) usage("--tokens needs at least two tokens");
  if (a.tp < 1 || a.pp < 1) usage("--tp and --pp must be positive");
  if (a.vocab_divisible_by < 1) usage("--make-vocab-size-divisible-by must be positive");
  return a;
} catch (const cli::UsageError& e) {
  usage(e.what());
}

int run(const Args& a, const std::optional<LocalRank>& me) {
  auto cfg = ModelConfig::load(a.model);
  for (auto t : a.tokens)
    if (t < 0 || t >= cfg.vocab_size)
      throw EngineError("token " + std::to_string(t) + " is outside the vocabulary [0, " +
                        std::to_string(cfg.vocab_size) + ")");
  validate_tensor_parallel(cfg, a.tp);
  ParallelConfig pc;
  pc.tp = a.tp;
  pc.pp = a.pp;
  pc.make_vocab_size_divisible_by = a.vocab_divisible_by;
  auto ps = me ? ParallelState::create(me->store, me->rank, pc) : ParallelState::single(pc);
  auto model = std::make_shared<Transformer>(cfg, ps);
  model->load_state_dict(hf_to_shard(read_hf_weights(a.model), cfg, model->shard_spec()));

  int64_t n = static_cast<int64_t>(a.tokens.size());
  MicroBatch mb;
  mb.input_ids = at::tensor(a.tokens, at::kLong).unsqueeze(0);
  mb.position_ids = at::arange(n, at::kLong).unsqueeze(0);
  mb.attention_mask = at::ones({1, n}, at::kLong);
  const Group& tp = ps->tp();
  auto out = forward_only(*model, {mb}, [&](const at::Tensor& logits, const MicroBatch& m) {
    return next_token_log_probs(logits, m.input_ids, tp);
  });
  if (ps->is_last_stage() && ps->coords().tp == 0) {
    auto lp = out.at(0).squeeze(0).contiguous();
    nlohmann::json j;
    j["model"] = a.model;
    j["tokens"] = a.tokens;
    j["log_probs"] = std::vector<double>(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel());
    j["tp"] = a.tp;
    j["pp"] = a.pp;
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  auto me = local_world_rank();
  try {
    if (!me && args.tp * args.pp > 1) {
      // Check the inputs once here so that a bad file fails before N processes start.
      auto cfg = ModelConfig::load(args.model);
      validate_tensor_parallel(cfg, args.tp);
      if (args.pp > cfg.num_layers)
        throw EngineError("--pp " + std::to_string(args.pp) + " exceeds the model's " +
                          std::to_string(cfg.num_layers) + " layers");
      return launch_local_world(argc, argv, args.tp * args.pp);
    }
    return run(args, me);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-logprobs: %s\n", e.what());
    return 1;
  }
}
