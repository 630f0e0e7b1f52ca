// Dynamic batching (use_dynamic_bsz) against padded micro-batches on a batch
// whose response lengths are skewed: a tenth of the sequences have responses
// 8× longer than the rest, so a padded batch is mostly padding. One process,
// the whole model (engine_bench's default shape), fp32 on the CPU.
//
// Both paths cut the same batch and run the actor's two passes: the log-prob
// forward (compute_log_prob) and a forward + backward of a token-mean loss
// over the response log-probs (update_actor without the optimizer). Padded:
// micro-batches of --micro rows at the batch's full width. Packed: whole
// sequences up to --max-tokens tokens per micro-batch, without padding, the
// budget set to a padded micro-batch's token slots (--micro × width) so that
// both bound activation memory alike.
//
//   build/bench/packing_bench [--threads 2] [--iters 3] [--micro 8] [--device cpu|cuda]
//
// Prints one JSON line: tokens/s (real tokens) of each pass on each path, the
// speed-up, the micro-batch counts, and the largest log-prob difference
// between the paths (the same computation up to attention summation order).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/data_proto.h"
#include "engine/io/model_config.h"
#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"
#include "engine/parallel/pipeline_schedule.h"
#include "workers/roles/role_model.h"

namespace {

using baton::DataProto;
using baton::workers::MicroBatching;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int64_t kRows = 64;          // sequences in the batch
constexpr int64_t kPrompt = 16;        // prompt width (left-padded)
constexpr int64_t kShort = 24;         // most responses
constexpr int64_t kLong = 8 * kShort;  // every tenth response
constexpr int64_t kVocab = 2048;

json model_json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", kVocab},
          {"hidden_size", 256},
          {"intermediate_size", 704},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 4},
          {"max_position_embeddings", kPrompt + kLong},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"},
          {"torch_dtype", "float32"}};
}

// The RL batch layout: prompt (left-padded to kPrompt) then response
// (right-padded to kLong); prompts of 8..16 tokens, responses of kShort
// tokens except every tenth, of kLong.
DataProto skewed_batch() {
  const int64_t width = kPrompt + kLong;
  at::Tensor ids = at::randint(1, kVocab, {kRows, width}, at::kLong);
  at::Tensor mask = at::zeros({kRows, width}, at::kLong);
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t prompt = 8 + r % 9;
    const int64_t response = r % 10 == 3 ? kLong : kShort;
    mask[r].slice(0, kPrompt - prompt, kPrompt + response).fill_(1);
  }
  DataProto d;
  d.set_tensor("input_ids", ids * mask);
  d.set_tensor("attention_mask", mask);
  d.set_tensor("position_ids", (mask.cumsum(1) - 1).clamp_min(0));
  d.set_tensor("response_mask", mask.slice(1, kPrompt).to(at::kFloat));
  return d;
}

struct PassTimes {
  double log_prob_s = 0, update_s = 0;
  int64_t micro_batches = 0;
  at::Tensor log_probs;  // [N, R] of the last log-prob pass
};

PassTimes run(baton::engine::Transformer& model, const DataProto& batch,
              const MicroBatching& batching, int iters) {
  const baton::engine::Group& tp = model.parallel().tp();
  const double tokens = batch.tensor("response_mask").sum().item<double>();
  PassTimes t;
  for (int i = 0; i <= iters; ++i) {  // i = 0 warms up
    auto start = Clock::now();
    auto mbs = baton::workers::make_micro_batches(batch, batching, {"response_mask"},
                                                  model.device());
    auto outs = baton::engine::forward_only(
        model, mbs, [&](const at::Tensor& logits, const baton::engine::MicroBatch& mb) {
          return baton::workers::response_scores(logits, mb, kLong, 1.0, tp).log_probs;
        });
    auto mid = Clock::now();
    mbs = baton::workers::make_micro_batches(batch, batching, {"response_mask"}, model.device());
    baton::engine::forward_backward(
        model, mbs, [&](const at::Tensor& logits, const baton::engine::MicroBatch& mb) {
          auto s = baton::workers::response_scores(logits, mb, kLong, 1.0, tp);
          return -(s.log_probs * mb.extra.at("response_mask")).sum() / tokens;
        });
    auto end = Clock::now();
    if (i == 0) continue;
    t.log_prob_s += std::chrono::duration<double>(mid - start).count() / iters;
    t.update_s += std::chrono::duration<double>(end - mid).count() / iters;
    t.micro_batches = static_cast<int64_t>(mbs.size());
    t.log_probs = at::cat(outs, 0).cpu();
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 3;
  int64_t micro = 8;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") {
      threads = std::stoi(v);
    } else if (k == "--iters") {
      iters = std::stoi(v);
    } else if (k == "--micro") {
      micro = std::stoll(v);
    } else if (k == "--device") {
      device = v;
    } else {
      std::fprintf(stderr,
                   "usage: packing_bench [--threads N] [--iters N] [--micro ROWS] "
                   "[--device cpu|cuda]\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  at::manual_seed(1234);
  auto cfg = baton::engine::ModelConfig::from_hf_json(model_json(), "packing_bench");
  baton::engine::Transformer model(cfg, baton::engine::ParallelState::single());
  model.to(at::Device(device));
  const DataProto batch = skewed_batch();
  const int64_t width = kPrompt + kLong;
  const double real = batch.tensor("attention_mask").sum().item<double>();

  const MicroBatching padded{.rows = micro};
  const MicroBatching packed{.rows = micro, .max_tokens = micro * width};
  const PassTimes p = run(model, batch, padded, iters);
  const PassTimes q = run(model, batch, packed, iters);
  const at::Tensor mask = batch.tensor("response_mask");
  const double diff = ((p.log_probs - q.log_probs) * mask).abs().max().item<double>();

  json out;
  out["bench"] = "packing";
  out["batch"] = {{"rows", kRows},
                  {"width", width},
                  {"real_tokens", real},
                  {"padding_fraction", 1.0 - real / static_cast<double>(kRows * width)},
                  {"responses", {{"short", kShort}, {"long", kLong}, {"long_every", 10}}}};
  out["threads"] = threads;
  out["device"] = device;
  out["iters"] = iters;
  auto path = [&](const PassTimes& t, const MicroBatching& b) {
    return json{{"micro_batches", t.micro_batches},
                {"max_tokens", b.max_tokens},
                {"rows_per_micro_batch", b.max_tokens > 0 ? json(nullptr) : json(b.rows)},
                {"log_prob_s", t.log_prob_s},
                {"update_s", t.update_s},
                {"log_prob_tokens_per_s", real / t.log_prob_s},
                {"update_tokens_per_s", real / t.update_s}};
  };
  out["padded"] = path(p, padded);
  out["packed"] = path(q, packed);
  out["speedup"] = {{"log_prob", p.log_prob_s / q.log_prob_s},
                    {"update", p.update_s / q.update_s}};
  out["max_abs_log_prob_diff"] = diff;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
