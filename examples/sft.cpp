// sft: supervised fine-tuning with the baton runtime — the base model of the RL
// toy task (examples/toy_task.cpp), or any prompt/response JSONL on a small
// HF model.
//
//   build/examples/toy_task --out toy
//   build/examples/sft --config configs/sft_toy.yaml [key=value ...]
//
// The driver reads data.train_files (JSONL rows with data.prompt_key and
// data.response_key), tokenizes them with the model's tokenizer (the response
// followed by the eos token) and spawns trainer.n_gpus_per_node SftWorker
// processes, all data parallel, on CPU slots or (trainer.device=cuda) one GPU
// each. Each step the driver cuts
// data.train_batch_size rows out of a seeded shuffle and sends them with
// DP_COMPUTE_METRIC: every rank runs its share in micro-batches of
// data.micro_batch_size_per_gpu and the loss is the token-mean negative
// log-likelihood of the response tokens over the whole step's response tokens
// (the optimizer sums gradients over ranks, engine/optim/optimizer.h), so the update
// does not depend on how the batch is split. At the end rank 0 writes an HF
// checkpoint to <trainer.default_local_dir>/model (config.json,
// model.safetensors, the tokenizer files), then every rank generates greedily
// for its share of data.val_files and the driver scores the answers with the
// reward registry (the rows' data_source; GSM8K's strict "#### n" for the toy
// task). It prints "base accuracy: X %" and writes <dir>/eval.json.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prompt_dataset.h"
#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/rollout/generation.h"
#include "runtime/baton.h"
#include "text/tokenizer/tokenizer.h"
#include "trainer/config/config.h"
#include "workers/rewards/reward_registry.h"
#include "workers/roles/prompt_batch.h"
#include "workers/roles/role_model.h"

namespace fs = std::filesystem;

// One data-parallel rank of the SFT model: a workers::RoleModel (the model,
// its ParallelState over the group, the optimizer) like the RL roles', so SFT
// runs on GPUs (trainer.device=cuda) and exports with the same code.
class SftWorker : public baton::Worker {
 public:
  // Collective: builds the role model (pure DP) from `model_path` with its
  // optimizer. `optim`: lr, weight_decay, clip_grad, warmup_steps,
  // total_steps, min_lr_ratio, seed; `scheduler`: "constant" or "cosine" (to
  // lr × min_lr_ratio at total_steps). Returns the parameter count (padded
  // vocabulary rows included).
  int64_t init_model(const std::string& model_path, const std::map<std::string, double>& optim,
                     const std::string& scheduler) {
    baton::workers::ModelOptions m;
    m.path = model_path;
    m.seed = static_cast<uint64_t>(optim.at("seed"));
    baton::workers::OptimOptions o;
    o.lr = optim.at("lr");
    o.weight_decay = optim.at("weight_decay");
    o.grad_clip = optim.at("clip_grad");
    o.warmup_steps = static_cast<int64_t>(optim.at("warmup_steps"));
    o.total_steps = static_cast<int64_t>(optim.at("total_steps"));
    o.scheduler = scheduler;
    o.min_lr_ratio = optim.at("min_lr_ratio");
    o.distributed = false;
    at::manual_seed(m.seed);
    role_ = std::make_unique<baton::workers::RoleModel>(info(), m, "sft", &o);
    int64_t params = 0;
    for (const auto& [name, p] : role_->model().named_params()) params += p.numel();
    return params;
  }

  // One optimizer step on this rank's rows: `input_ids`, `attention_mask`,
  // `position_ids` and `loss_mask` ([b, S]; 1 where the token is a target, i.e.
  // a response token), meta `micro_batch_size` and `global_tokens` (the step's
  // response tokens over every rank). Returns this rank's share of the loss
  // (the ranks' shares sum to the step's token-mean NLL), the grad norm and lr.
  std::map<std::string, double> train_step(const baton::DataProto& batch) {
    const int64_t micro = batch.meta_value("micro_batch_size")->as_int();
    const double global_tokens = batch.meta_value("global_tokens")->as_float();
    baton::engine::Transformer& model = role_->model();
    const auto mbs =
        baton::workers::make_micro_batches(batch, {.rows = micro}, {"loss_mask"}, model.device());
    const auto& tp = role_->state().tp();
    // The role's optimizer averages gradients over DP (as verl's losses
    // expect); this loss is a share of the global token mean, so it is scaled
    // by the DP size to make that average the sum.
    const double dp = static_cast<double>(role_->state().config().dp);
    baton::engine::Optimizer& optimizer = role_->optimizer();
    optimizer.zero_grad();
    double loss = 0;
    baton::engine::forward_backward(
        model, mbs, [&](const at::Tensor& logits, const baton::engine::MicroBatch& mb) {
          // Position t scores token t + 1; the mask's column t + 1 says whether it is a target.
          const at::Tensor lp = baton::engine::next_token_log_probs(logits, mb.input_ids, tp);
          const at::Tensor mask = mb.extra.at("loss_mask").slice(1, 1).to(lp.scalar_type());
          const at::Tensor share = -(lp * mask).sum() / global_tokens;
          loss += share.item<double>();
          return share * dp;
        });
    const auto stats = optimizer.step();
    return {{"loss", loss}, {"grad_norm", stats.grad_norm}, {"lr", stats.lr}};
  }

  // Greedy (or sampled) answers for this rank's prompts: `input_ids` and
  // `attention_mask` [b, P], left-padded. Returns `responses` [b,
  // max_new_tokens] right-padded with `pad_id` (meta: pad_id, max_new_tokens,
  // temperature).
  baton::DataProto generate(const baton::DataProto& prompts) {
    const int64_t pad = prompts.meta_value("pad_id")->as_int();
    baton::engine::SamplingParams params;
    params.max_new_tokens = prompts.meta_value("max_new_tokens")->as_int();
    params.temperature = prompts.meta_value("temperature")->as_float();
    params.log_probs = false;
    const at::Tensor ids = prompts.tensor("input_ids");
    const auto rows = baton::workers::unpadded_prompts(ids, prompts.tensor("attention_mask"),
                                                       "SftWorker.generate");
    baton::engine::GenerationEngine engine(
        role_->model_ptr(), baton::engine::GenerationOptions().set_cache_bytes(16 << 20));
    const auto seqs = engine.generate(rows, params);
    // max_new_tokens columns on every rank, so that the ranks' results concatenate.
    at::Tensor responses = at::full({ids.size(0), params.max_new_tokens}, pad, at::kLong);
    auto out = responses.accessor<int64_t, 2>();
    for (const auto& seq : seqs) {
      for (std::size_t t = 0; t < seq.response.size(); ++t) {
        out[seq.request][static_cast<int64_t>(t)] = seq.response[t];
      }
    }
    return baton::DataProto({{"responses", responses}});
  }

  // Collective: writes the model as an HF checkpoint to `dir` with the source
  // model's other files (the tokenizer's), as the RL roles export.
  std::string save_hf(const std::string& dir) {
    baton::workers::export_hf_model(*role_, dir);
    return dir;
  }

  static void register_methods(baton::MethodTable<SftWorker>& t) {
    t.def("init_model", &SftWorker::init_model);
    t.def("train_step", &SftWorker::train_step,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeMetric));
    t.def("generate", &SftWorker::generate,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
    t.def("save_hf", &SftWorker::save_hf);
  }

 private:
  std::unique_ptr<baton::workers::RoleModel> role_;
};
BATON_WORKER(SftWorker);

namespace {

// One tokenized SFT row: prompt ids then response ids (eos appended).
struct Example {
  std::vector<int64_t> ids;
  int64_t prompt_len = 0;
};

std::vector<Example> read_examples(const std::vector<std::string>& files,
                                   const baton::data::Tokenizer& tok, const std::string& prompt_key,
                                   const std::string& response_key, int64_t max_length) {
  const auto eos = tok.eos_id();
  if (!eos) throw std::runtime_error("the model's tokenizer has no eos_token");
  std::vector<Example> out;
  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) throw std::runtime_error(file + ": cannot open");
    int64_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.empty()) continue;
      const std::string where = file + ":" + std::to_string(line_no);
      nlohmann::json row;
      try {
        row = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(where + ": " + e.what());
      }
      if (!row.contains(prompt_key) || !row[prompt_key].is_string() ||
          !row.contains(response_key) || !row[response_key].is_string()) {
        throw std::runtime_error(where + ": needs string fields '" + prompt_key + "' and '" +
                                 response_key + "'");
      }
      Example ex;
      for (int32_t id : tok.encode(row[prompt_key].get<std::string>(), false)) ex.ids.push_back(id);
      ex.prompt_len = static_cast<int64_t>(ex.ids.size());
      for (int32_t id : tok.encode(row[response_key].get<std::string>(), false))
        ex.ids.push_back(id);
      ex.ids.push_back(*eos);
      if (static_cast<int64_t>(ex.ids.size()) > max_length) {
        throw std::runtime_error(where + ": " + std::to_string(ex.ids.size()) +
                                 " tokens, more than data.max_length (" +
                                 std::to_string(max_length) + ")");
      }
      out.push_back(std::move(ex));
    }
  }
  if (out.empty()) throw std::runtime_error("data.train_files hold no rows");
  return out;
}

// The rows `order[begin, end)` right-padded to their longest row.
baton::DataProto make_batch(const std::vector<Example>& examples,
                            const std::vector<std::size_t>& order, std::size_t begin,
                            std::size_t end, int64_t pad_id, int64_t* response_tokens) {
  const auto n = static_cast<int64_t>(end - begin);
  int64_t len = 0;
  for (std::size_t i = begin; i < end; ++i)
    len = std::max<int64_t>(len, static_cast<int64_t>(examples[order[i]].ids.size()));
  at::Tensor ids = at::full({n, len}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({n, len}, at::kLong);
  at::Tensor loss_mask = at::zeros({n, len}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  auto loss_a = loss_mask.accessor<int64_t, 2>();
  *response_tokens = 0;
  for (int64_t r = 0; r < n; ++r) {
    const Example& ex = examples[order[begin + r]];
    for (std::size_t t = 0; t < ex.ids.size(); ++t) {
      ids_a[r][t] = ex.ids[t];
      mask_a[r][t] = 1;
      if (static_cast<int64_t>(t) >= ex.prompt_len) {
        loss_a[r][t] = 1;
        ++*response_tokens;
      }
    }
  }
  const at::Tensor positions = at::arange(len, at::kLong).unsqueeze(0).expand({n, len}).clone();
  return baton::DataProto({{"input_ids", ids},
                           {"attention_mask", mask},
                           {"position_ids", positions},
                           {"loss_mask", loss_mask}});
}

struct EvalResult {
  int64_t correct = 0;
  int64_t total = 0;
  std::vector<std::pair<std::string, std::string>> samples;  // prompt, response
};

EvalResult evaluate(baton::WorkerGroup& group, const baton::trainer::Config& config,
                    const baton::data::Tokenizer& tok) {
  const auto ds = baton::data::PromptDataset::load(
      config.get<std::vector<std::string>>("data.val_files"), tok,
      baton::data::PromptDatasetOptions()
          .set_max_prompt_length(config.get<int64_t>("data.max_prompt_length"))
          .set_prompt_key(config.get<std::string>("data.prompt_key")));
  std::vector<std::size_t> all(ds.size());
  std::iota(all.begin(), all.end(), 0);
  const auto batch = ds.batch(all);
  baton::DataProto prompts =
      baton::workers::prompt_batch_proto(batch).select({"input_ids", "attention_mask"});
  prompts.set_meta("pad_id", baton::Value(static_cast<int64_t>(ds.pad_id())));
  prompts.set_meta("max_new_tokens", baton::Value(config.get<int64_t>("eval.max_new_tokens")));
  prompts.set_meta("temperature", baton::Value(0.0));
  const auto out = baton::DataProto::from_value(group.call("generate", {prompts}).get());
  const at::Tensor responses = out.tensor("responses");
  EvalResult result;
  result.total = batch.size;
  for (int64_t i = 0; i < batch.size; ++i) {
    const at::Tensor row = responses[i].contiguous();
    const std::vector<int32_t> ids(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
    const std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
    const auto& prow = ds.row(i);
    const double score = baton::rewards::compute_score({.data_source = prow.data_source,
                                                        .response = text,
                                                        .ground_truth = prow.ground_truth,
                                                        .extra_info = prow.extra_info});
    if (score >= 1.0) ++result.correct;
    if (result.samples.size() < 4) result.samples.emplace_back(prow.prompt_text, text);
  }
  return result;
}

int run(int argc, char** argv) {
  auto cl = baton::trainer::config_from_command_line(argc, argv, "configs/sft_toy.yaml");
  if (!cl.other_args.empty()) {
    throw baton::trainer::ConfigError("sft: unexpected argument '" + cl.other_args.front() +
                                      "' (give --config FILE and key=value overrides)");
  }
  const baton::trainer::Config config = cl.config.resolved();
  const auto model_path = config.get<std::string>("model.path");
  const fs::path out_dir = config.get<std::string>("trainer.default_local_dir");
  const int64_t workers = config.get<int64_t>("trainer.n_gpus_per_node");
  const int64_t batch_size = config.get<int64_t>("data.train_batch_size");
  const int64_t micro = config.get<int64_t>("data.micro_batch_size_per_gpu");
  const int64_t log_every = std::max<int64_t>(1, config.get<int64_t>("trainer.log_every"));
  const auto seed = static_cast<uint64_t>(config.get<int64_t>("trainer.seed"));
  const auto device = config.get<std::string>("trainer.device");
  if (device != "cpu" && device != "cuda")
    throw baton::trainer::ConfigError("trainer.device: '" + device + "' (expected cpu or cuda)");
  if (workers < 1) throw baton::trainer::ConfigError("trainer.n_gpus_per_node must be positive");
  if (batch_size < 1 || batch_size % workers != 0) {
    throw baton::trainer::ConfigError("data.train_batch_size (" + std::to_string(batch_size) +
                                      ") must be a positive multiple of trainer.n_gpus_per_node (" +
                                      std::to_string(workers) + ")");
  }
  if (micro < 1)
    throw baton::trainer::ConfigError("data.micro_batch_size_per_gpu must be positive");

  const auto tok = baton::data::Tokenizer::load(model_path);
  const auto pad = tok.pad_id().value_or(tok.eos_id().value_or(0));
  const auto examples = read_examples(config.get<std::vector<std::string>>("data.train_files"), tok,
                                      config.get<std::string>("data.prompt_key"),
                                      config.get<std::string>("data.response_key"),
                                      config.get<int64_t>("data.max_length"));
  const int64_t steps_per_epoch = static_cast<int64_t>(examples.size()) / batch_size;
  if (steps_per_epoch < 1) {
    throw baton::trainer::ConfigError("data.train_batch_size (" + std::to_string(batch_size) +
                                      ") is larger than the training set (" +
                                      std::to_string(examples.size()) + " rows)");
  }
  const int64_t total_steps =
      config.get_optional<int64_t>("trainer.total_training_steps")
          .value_or(steps_per_epoch * config.get<int64_t>("trainer.total_epochs"));
  std::printf("sft: %zu examples, %lld steps of %lld rows on %lld workers (%lld steps/epoch)\n",
              examples.size(), static_cast<long long>(total_steps),
              static_cast<long long>(batch_size), static_cast<long long>(workers),
              static_cast<long long>(steps_per_epoch));

  const std::string scheduler = config.get<std::string>("optim.lr_scheduler");
  if (scheduler != "cosine" && scheduler != "constant") {
    throw baton::trainer::ConfigError("optim.lr_scheduler: '" + scheduler +
                                      "' (expected constant or cosine)");
  }

  const auto t0 = std::chrono::steady_clock::now();
  baton::ResourcePool pool(baton::ResourcePoolOptions()
                               .set_processes_on_nodes({static_cast<int>(workers)})
                               .set_use_gpu(device == "cuda"));
  baton::WorkerGroup group = baton::WorkerGroup::spawn("SftWorker", pool);
  const std::map<std::string, double> optim = {
      {"lr", config.get<double>("optim.lr")},
      {"weight_decay", config.get<double>("optim.weight_decay")},
      {"clip_grad", config.get<double>("optim.clip_grad")},
      {"warmup_steps", static_cast<double>(config.get<int64_t>("optim.warmup_steps"))},
      {"total_steps", static_cast<double>(total_steps)},
      {"min_lr_ratio", config.get<double>("optim.min_lr_ratio")},
      {"seed", static_cast<double>(seed)}};
  const auto params =
      group.call("init_model", {model_path, optim, scheduler}).get().as_list().at(0).as_int();
  std::printf("sft: model %s, %lld parameters (padded vocabulary rows included)\n",
              model_path.c_str(), static_cast<long long>(params));

  std::vector<std::size_t> order(examples.size());
  std::mt19937_64 rng(seed);
  double last_loss = 0;
  double window_loss = 0;
  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t in_epoch = step % steps_per_epoch;
    if (in_epoch == 0) {
      std::iota(order.begin(), order.end(), 0);
      for (std::size_t i = order.size() - 1; i > 0; --i)
        std::swap(order[i], order[rng() % (i + 1)]);
    }
    int64_t tokens = 0;
    baton::DataProto batch =
        make_batch(examples, order, static_cast<std::size_t>(in_epoch * batch_size),
                   static_cast<std::size_t>((in_epoch + 1) * batch_size), pad, &tokens);
    batch.set_meta("micro_batch_size", baton::Value(micro));
    batch.set_meta("global_tokens", baton::Value(static_cast<double>(tokens)));
    const baton::Value metrics = group.call("train_step", {batch}).get();
    double loss = 0;
    double grad_norm = 0;
    double lr = 0;
    for (const baton::Value& m : metrics.as_list()) {
      for (const auto& [key, value] : m.as_dict()) {
        if (key == "loss") loss += value.as_float();
        if (key == "grad_norm") grad_norm = value.as_float();
        if (key == "lr") lr = value.as_float();
      }
    }
    last_loss = loss;
    window_loss += loss;
    if ((step + 1) % log_every == 0 || step + 1 == total_steps) {
      const int64_t n = (step + 1) % log_every == 0 ? log_every : (step + 1) % log_every;
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf(
          "step %lld/%lld  epoch %lld  loss %.6f (mean of last %lld %.4f)  grad_norm %.6f"
          "  lr %.2e  %.1f s\n",
          static_cast<long long>(step + 1), static_cast<long long>(total_steps),
          static_cast<long long>(step / steps_per_epoch), loss, static_cast<long long>(n),
          window_loss / static_cast<double>(n), grad_norm, lr, secs);
      std::fflush(stdout);
      window_loss = 0;
    }
  }
  const double train_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const fs::path model_dir = out_dir / "model";
  fs::create_directories(out_dir);
  group.call("save_hf", {fs::absolute(model_dir).string()}).get();
  std::printf("sft: wrote %s\n", model_dir.string().c_str());

  const EvalResult eval = evaluate(group, config, tok);
  const double accuracy =
      eval.total > 0 ? 100.0 * static_cast<double>(eval.correct) / static_cast<double>(eval.total)
                     : 0.0;
  for (const auto& [prompt, response] : eval.samples)
    std::printf("  %s -> %s\n", prompt.c_str(), response.c_str());
  std::printf("base accuracy: %.1f %% (%lld of %lld, greedy)\n", accuracy,
              static_cast<long long>(eval.correct), static_cast<long long>(eval.total));
  const nlohmann::json report = {{"accuracy", accuracy / 100.0}, {"correct", eval.correct},
                                 {"total", eval.total},          {"steps", total_steps},
                                 {"final_loss", last_loss},      {"train_seconds", train_seconds},
                                 {"model", model_dir.string()}};
  std::ofstream(out_dir / "eval.json") << report.dump(2) << "\n";
  config.save(out_dir / "config.yaml");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process this runs the worker and never returns
  try {
    return run(argc, argv);
  } catch (const baton::trainer::ConfigError& e) {
    std::fprintf(stderr, "sft: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sft: %s\n", e.what());
    return 1;
  }
}
