#include "workers/roles/role_model.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "base/log.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/parallel/fused_lm_head.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/parallel/vocab_parallel.h"
#include "runtime/process_group.h"

#if defined(BATON_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace baton::workers {
namespace {

std::string layout_text(int64_t tp, int64_t pp) {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
}

}  // namespace

RoleModel::RoleModel(const WorkerInfo& info, const ModelOptions& options, const std::string& tag,
                     const OptimOptions* optim, std::shared_ptr<engine::ParallelState> share)
    : options_(options) {
  const ParallelLayout& layout = info.layout;
  if (layout.tp != options.tp || layout.pp != options.pp) {
    throw Error("RoleModel(" + tag + "): the worker group is laid out " + layout.to_string() +
                " but the model asks for " + layout_text(options.tp, options.pp) +
                " (spawn the group with that tp and pp)");
  }
  engine::ParallelConfig pc;
  static_cast<ParallelLayout&>(pc) = layout;
  pc.make_vocab_size_divisible_by = options.vocab_divisible_by;
  pc.ep = options.ep;
  if (pc.dp % pc.ep != 0)
    throw Error("RoleModel(" + tag + "): expert_model_parallel_size " + std::to_string(pc.ep) +
                " does not divide the group's data-parallel size " + std::to_string(pc.dp) + " (" +
                layout.to_string() + ")");
  auto backend = engine::CollectiveBackend::kGloo;
#if defined(BATON_CUDA)
  if (info.use_gpu) backend = engine::CollectiveBackend::kNccl;
#endif
  if (share) {
    if (!(share->config() == pc)) {
      throw Error("RoleModel(" + tag + "): the shared parallel state is " +
                  share->config().to_string() + ", this model needs " + pc.to_string());
    }
    state_ = std::move(share);
  } else {
    state_ = engine::ParallelState::create(rendezvous_store(info, "role/" + tag), info.rank, pc,
                                           std::chrono::milliseconds(options.collective_timeout_ms),
                                           backend);
  }
  const engine::Coords& c = state_->coords();
  if (c.tp != info.coords.tp || c.dp != info.coords.dp || c.pp != info.coords.pp) {
    throw Error("RoleModel(" + tag + "): rank " + std::to_string(info.rank) +
                " has different coordinates in the engine and in the worker group's layout");
  }

  engine::HfModel hf = engine::load_hf_model(options.path);
  hf_config_text_ =
      engine::read_json_file(std::filesystem::path(options.path) / "config.json").dump();
  state_->set_num_layers(hf.config.num_layers);
  engine::TransformerOptions topts;
  topts.value_model = options.value_model;
  topts.value_head_seed = options.seed;
  // At tp 1 sequence parallelism splits nothing; the flag would only keep
  // the model from generating (the HybridEngine shares a tp-1 actor).
  topts.sequence_parallel = options.sequence_parallel && options.tp > 1;
  topts.recompute_activations = options.recompute_activations;
  topts.lora = options.lora;
  model_ = std::make_shared<engine::Transformer>(hf.config, state_, topts);
  model_->set_output_lm_head_input(options.fused_lm_head && !options.value_model);
  model_->load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model_->shard_spec()));
  hf.weights.clear();
  if (!options.lora_adapter_path.empty()) {
    engine::copy_peft_adapter(engine::load_peft_adapter(options.lora_adapter_path), hf.config,
                              topts.lora, model_->shard_spec(), model_->lora_params());
  }
  const at::ScalarType dtype = parameter_dtype(options.dtype, "RoleModel(" + tag + ")");
  if (info.use_gpu || dtype != at::kFloat) model_->to(state_->device(), dtype);
  if (optim != nullptr) {
    optimizer_ = std::make_unique<engine::Optimizer>(model_, engine_optimizer_options(*optim));
  } else {
    for (auto& p : model_->parameters()) p.set_requires_grad(false);
  }
}

engine::Optimizer& RoleModel::optimizer() {
  if (!optimizer_) throw Error("RoleModel: this role's model is frozen (no optimizer)");
  return *optimizer_;
}

RoleModel::Tensors RoleModel::tensors() const {
  Tensors out;
  auto params = model_->named_params();
  for (auto& entry : model_->lora_params()) params.push_back(std::move(entry));
  for (const auto& [name, p] : params) {
    out.params.push_back(p);
    if (p.grad().defined()) out.grads.push_back(p.grad());
  }
  if (optimizer_) out.optimizer = optimizer_->state_tensor_handles();
  return out;
}

void RoleModel::resident(bool training) {
  if (params_away_) {
    params_away_->reload();
    params_away_.reset();
  }
  if (!training) return;
  for (auto* away : {&grads_away_, &optimizer_away_}) {
    if (*away) {
      (*away)->reload();
      away->reset();
    }
  }
}

void RoleModel::idle() {
  const OffloadOptions& o = options_.offload;
  if (!o.params && !o.grads && !o.optimizer) return;
  const Tensors t = tensors();
  auto send_away = [](std::unique_ptr<engine::TensorOffload>& away,
                      const std::vector<at::Tensor>& tensors) {
    if (away) return;
    away = std::make_unique<engine::TensorOffload>(tensors);
    away->offload();
  };
  if (o.grads) send_away(grads_away_, t.grads);
  if (o.optimizer && optimizer_) send_away(optimizer_away_, t.optimizer);
  if (o.params) send_away(params_away_, t.params);
}

int64_t RoleModel::resident_bytes() const {
  Tensors t = tensors();
  std::vector<at::Tensor> all = std::move(t.params);
  all.insert(all.end(), t.grads.begin(), t.grads.end());
  all.insert(all.end(), t.optimizer.begin(), t.optimizer.end());
  std::set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : all) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

OffloadPhase::~OffloadPhase() {
  try {
    role_.idle();
  } catch (const std::exception& e) {
    log(LogLevel::kWarn,
        std::string("offload after a phase failed (the role stays on its device): ") + e.what());
  }
}

int64_t RoleModel::sequence_multiple() const {
  return model_->options().sequence_parallel ? state_->tp().size : 1;
}

MicroBatching RoleModel::batching_for(const DataProto& batch, MicroBatching batching) const {
  batching.sequence_multiple = std::lcm(batching.sequence_multiple, sequence_multiple());
  const engine::Group& ep = state_->ep();
  if (ep.size > 1 && model_->has_sparse_layers()) {
    at::Tensor n = at::full({1}, natural_micro_batches(batch, batching),
                            at::TensorOptions().dtype(at::kLong).device(state_->device()));
    batching.count =
        engine::collective::all_reduce(n, ep, c10d::ReduceOp::MAX).cpu().item<int64_t>();
  }
  return batching;
}

bool RoleModel::is_collector() const {
  const engine::Coords& c = state_->coords();
  return c.tp == 0 && c.cp == 0 && state_->is_last_stage();
}

at::Tensor RoleModel::response_log_probs(const DataProto& batch, const MicroBatching& batching,
                                         double temperature, at::Tensor* entropy,
                                         at::Tensor* sum_pi_squared) {
  const int64_t R = response_width(batch);
  std::vector<at::Tensor> entropies, sums;
  auto outs = engine::forward_only(
      *model_, make_micro_batches(batch, batching_for(batch, batching), {}, model_->device()),
      [&](const at::Tensor& out, const engine::MicroBatch& mb) {
        ResponseScores s =
            scores(out, mb, R, temperature, entropy != nullptr, sum_pi_squared != nullptr);
        if (entropy != nullptr) entropies.push_back(s.entropy.to(at::kFloat).cpu());
        if (sum_pi_squared != nullptr) sums.push_back(s.sum_pi_squared.to(at::kFloat).cpu());
        return s.log_probs.to(at::kFloat).cpu();
      });
  if (outs.empty()) return {};
  if (entropy != nullptr) *entropy = at::cat(entropies, 0);
  if (sum_pi_squared != nullptr) *sum_pi_squared = at::cat(sums, 0);
  return at::cat(outs, 0);
}

ResponseScores RoleModel::scores(const at::Tensor& out, const engine::MicroBatch& mb,
                                 int64_t response_width, double temperature, bool with_entropy,
                                 bool with_sum_pi_squared) {
  if (!model_->outputs_lm_head_input())
    return response_scores(out, mb, response_width, temperature, state_->tp(), with_sum_pi_squared);
  if (with_sum_pi_squared)
    throw Error(
        "sum_pi_squared (Σπ² per token, for the optimal-token-baseline estimators) needs the "
        "logits, which the fused LM head never forms: set "
        "actor_rollout_ref.model.use_fused_kernels=false");
  const int64_t S = padded_width(mb);
  const int64_t R = response_width;
  if (R < 1 || R >= S) {
    throw Error("RoleModel::scores: response width " + std::to_string(R) + " for sequences of " +
                std::to_string(S) + " tokens");
  }
  // The head's input at the positions that score the response tokens.
  const at::Tensor hidden = padded_columns(out, mb, S - R - 1, S - 1);  // [b, R, H]
  const at::Tensor targets = padded_columns(mb.input_ids, mb, S - R, S).to(hidden.device());
  engine::FusedLmHeadOptions o;
  o.temperature = temperature > 0 ? temperature : 1.0;
  o.with_entropy = with_entropy;
  auto both = engine::fused_lm_head_log_probs_entropy(
      hidden.reshape({-1, hidden.size(-1)}), model_->lm_head_weight(), model_->vocab_shard().real,
      targets.reshape({-1}), state_->tp(), o);
  const at::IntArrayRef rows = targets.sizes();
  return {both.log_probs.view(rows), with_entropy ? both.entropy.view(rows) : at::Tensor(),
          at::Tensor()};
}

at::Tensor RoleModel::response_values(const DataProto& batch, const MicroBatching& batching,
                                      bool at_tokens) {
  const int64_t R = response_width(batch);
  const int64_t shift = at_tokens ? 0 : 1;
  auto outs = engine::forward_only(
      *model_, make_micro_batches(batch, batching_for(batch, batching), {}, model_->device()),
      [&](const at::Tensor& values, const engine::MicroBatch& mb) {
        const int64_t S = padded_width(mb);
        return padded_columns(values.squeeze(-1), mb, S - R - shift, S - shift)
            .to(at::kFloat)
            .cpu();
      });
  if (outs.empty()) return {};
  return at::cat(outs, 0);
}

namespace {

// Consecutive rows [begin, end) whose real tokens fill one packed row.
struct PackGroup {
  int64_t begin, end;
};

// Rows in order, as many per group as fit in `max_tokens` real tokens.
std::vector<PackGroup> pack_groups(const std::vector<int64_t>& lengths, int64_t max_tokens) {
  std::vector<PackGroup> groups;
  int64_t tokens = 0;
  for (int64_t r = 0; r < static_cast<int64_t>(lengths.size()); ++r) {
    const int64_t len = lengths[static_cast<size_t>(r)];
    if (len < 1) {
      throw Error("make_micro_batches: row " + std::to_string(r) +
                  " has no tokens (attention_mask is all 0)");
    }
    if (len > max_tokens) {
      throw Error("make_micro_batches: row " + std::to_string(r) + " has " + std::to_string(len) +
                  " tokens, more than the dynamic batch's max_token_len " +
                  std::to_string(max_tokens) + " (raise *_max_token_len_per_gpu)");
    }
    if (groups.empty() || tokens + len > max_tokens) {
      groups.push_back({r, r});
      tokens = 0;
    }
    groups.back().end = r + 1;
    tokens += len;
  }
  return groups;
}

// `groups` split until there are `count` of them: the one of most rows in
// halves, again and again (a split group's tokens fit, as its whole did).
// REQUIRES: groups.size() <= count <= rows.
std::vector<PackGroup> split_to(std::vector<PackGroup> groups, int64_t count) {
  while (static_cast<int64_t>(groups.size()) < count) {
    auto widest = std::max_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      return a.end - a.begin < b.end - b.begin;
    });
    const PackGroup g = *widest;
    const int64_t mid = g.begin + (g.end - g.begin) / 2;
    *widest = {g.begin, mid};
    groups.insert(widest + 1, PackGroup{mid, g.end});
  }
  return groups;
}

// `mb`'s sequence padded to a multiple of `multiple` (MicroBatching::
// sequence_multiple): masked columns on the left of padded rows (as a
// left-padded prompt's; the columns counted from the end stay), one more
// sequence of padding tokens at the end of a packed row (its packed_index
// still points at the real tokens).
void pad_sequence(engine::MicroBatch& mb, int64_t multiple) {
  const int64_t s = mb.input_ids.size(1);
  const int64_t pad = (multiple - s % multiple) % multiple;
  if (pad == 0) return;
  auto zeros = [&](const at::Tensor& like) {
    return at::zeros({like.size(0), pad}, like.options());
  };
  if (mb.packed_lengths.empty()) {
    mb.input_ids = at::cat({zeros(mb.input_ids), mb.input_ids}, 1);
    mb.attention_mask = at::cat({zeros(mb.attention_mask), mb.attention_mask}, 1);
    mb.position_ids = at::cat({zeros(mb.position_ids), mb.position_ids}, 1);
    return;
  }
  mb.input_ids = at::cat({mb.input_ids, zeros(mb.input_ids)}, 1);
  mb.position_ids =
      at::cat({mb.position_ids, at::arange(pad, mb.position_ids.options()).unsqueeze(0)}, 1);
  mb.attention_mask = at::ones_like(mb.input_ids);
  mb.packed_lengths.push_back(pad);
}

}  // namespace

std::vector<engine::MicroBatch> make_micro_batches(const DataProto& batch,
                                                   const MicroBatching& batching,
                                                   const std::vector<std::string>& extra,
                                                   at::Device device) {
  if (batching.max_tokens <= 0 && batching.rows < 1) {
    throw Error("make_micro_batches: micro-batch size " + std::to_string(batching.rows) +
                " (must be >= 1)");
  }
  if (batching.sequence_multiple < 1) {
    throw Error("make_micro_batches: sequence multiple " +
                std::to_string(batching.sequence_multiple) + " (must be >= 1)");
  }
  std::vector<std::string> required = {"input_ids", "attention_mask"};
  required.insert(required.end(), extra.begin(), extra.end());
  batch.require_tensors(required, "make_micro_batches");
  // One host-to-device copy per tensor, then the micro-batches are views.
  const at::Tensor ids = batch.tensor("input_ids").to(device);
  const at::Tensor mask = batch.tensor("attention_mask").to(device, at::kLong);
  const at::Tensor pos = batch.has_tensor("position_ids") ? batch.tensor("position_ids").to(device)
                                                          : (mask.cumsum(1) - 1).clamp_min(0);
  std::map<std::string, at::Tensor> extras;
  for (const auto& key : extra) extras[key] = batch.tensor(key).to(device);
  std::vector<engine::MicroBatch> out;
  const int64_t n = batch.size();
  auto with_extras = [&](engine::MicroBatch& mb, int64_t begin, int64_t end) {
    for (const auto& [key, t] : extras) mb.extra[key] = t.slice(0, begin, end);
  };
  if (batching.count > n)
    throw Error("make_micro_batches: " + std::to_string(n) + " rows cannot make the " +
                std::to_string(batching.count) +
                " micro-batches the expert-parallel ranks agreed on (each needs a row; give the "
                "ranks more rows or balance them)");
  if (batching.max_tokens <= 0) {
    // `count`: n rows in count runs, the first n % count one row longer.
    const int64_t runs =
        batching.count > 0 ? batching.count : (n + batching.rows - 1) / batching.rows;
    for (int64_t i = 0, start = 0; i < runs && start < n; ++i) {
      const int64_t len = batching.count > 0 ? n / runs + (i < n % runs ? 1 : 0)
                                             : std::min(batching.rows, n - start);
      const int64_t end = start + len;
      engine::MicroBatch mb;
      mb.input_ids = ids.slice(0, start, end);
      mb.attention_mask = mask.slice(0, start, end);
      mb.position_ids = pos.slice(0, start, end);
      with_extras(mb, start, end);
      pad_sequence(mb, batching.sequence_multiple);
      out.push_back(std::move(mb));
      start = end;
    }
    return out;
  }
  // Packed: the lengths decide the groups on the host; the gathers run on
  // `device`.
  const at::Tensor host_lengths = batch.tensor("attention_mask").to(at::kLong).sum(1).cpu();
  const std::vector<int64_t> lengths(host_lengths.data_ptr<int64_t>(),
                                     host_lengths.data_ptr<int64_t>() + n);
  const at::Tensor real = mask.ne(0);
  const at::Tensor before = real.to(at::kLong).cumsum(1) - 1;  // real tokens before a column
  std::vector<PackGroup> groups = pack_groups(lengths, batching.max_tokens);
  if (batching.count > 0) groups = split_to(std::move(groups), batching.count);
  for (const PackGroup& g : groups) {
    engine::MicroBatch mb;
    const at::Tensor sel = real.slice(0, g.begin, g.end);
    mb.input_ids = ids.slice(0, g.begin, g.end).masked_select(sel).unsqueeze(0);
    mb.position_ids = pos.slice(0, g.begin, g.end).masked_select(sel).unsqueeze(0);
    mb.attention_mask = at::ones_like(mb.input_ids);
    mb.packed_lengths.assign(lengths.begin() + g.begin, lengths.begin() + g.end);
    std::vector<int64_t> offsets(mb.packed_lengths.size(), 0);
    for (size_t i = 1; i < offsets.size(); ++i)
      offsets[i] = offsets[i - 1] + mb.packed_lengths[i - 1];
    const at::Tensor first =
        at::tensor(offsets, at::TensorOptions().dtype(at::kLong)).to(device).unsqueeze(1);
    mb.packed_index = at::where(sel, first + before.slice(0, g.begin, g.end), first);
    with_extras(mb, g.begin, g.end);
    pad_sequence(mb, batching.sequence_multiple);
    out.push_back(std::move(mb));
  }
  return out;
}

int64_t natural_micro_batches(const DataProto& batch, const MicroBatching& batching) {
  const int64_t n = batch.size();
  if (batching.max_tokens <= 0)
    return batching.rows < 1 ? 0 : (n + batching.rows - 1) / batching.rows;
  const at::Tensor host_lengths = batch.tensor("attention_mask").to(at::kLong).sum(1).cpu();
  const std::vector<int64_t> lengths(host_lengths.data_ptr<int64_t>(),
                                     host_lengths.data_ptr<int64_t>() + n);
  return static_cast<int64_t>(pack_groups(lengths, batching.max_tokens).size());
}

int64_t padded_width(const engine::MicroBatch& mb) {
  return mb.packed_lengths.empty() ? mb.input_ids.size(1) : mb.packed_index.size(1);
}

at::Tensor padded_columns(const at::Tensor& out, const engine::MicroBatch& mb, int64_t from,
                          int64_t to) {
  if (mb.packed_lengths.empty()) return out.slice(1, from, to);
  const at::Tensor index = mb.packed_index.slice(1, from, to);
  std::vector<int64_t> shape = {index.size(0), index.size(1)};
  for (int64_t d = 2; d < out.dim(); ++d) shape.push_back(out.size(d));
  return out.select(0, 0).index_select(0, index.reshape({-1}).to(out.device())).view(shape);
}

std::vector<std::vector<int64_t>> unpadded_prompts(const at::Tensor& ids, const at::Tensor& mask,
                                                   const std::string& where) {
  at::Tensor i = ids.to(at::kLong).contiguous().cpu(), m = mask.to(at::kLong).contiguous().cpu();
  const int64_t n = i.size(0), p = i.size(1);
  const int64_t* ip = i.data_ptr<int64_t>();
  const int64_t* mp = m.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < p; ++c) {
      if (mp[r * p + c] != 0) out[static_cast<size_t>(r)].push_back(ip[r * p + c]);
    }
    if (out[static_cast<size_t>(r)].empty()) {
      throw Error(where + ": prompt row " + std::to_string(r) + " has no tokens");
    }
  }
  return out;
}

int64_t response_width(const DataProto& batch) {
  if (batch.has_tensor("responses")) return batch.tensor("responses").size(1);
  if (batch.has_tensor("response_mask")) return batch.tensor("response_mask").size(1);
  throw Error(
      "the RL batch has neither 'responses' nor 'response_mask' (which give the response "
      "width)");
}

at::Tensor response_mask_of(const DataProto& batch) {
  if (batch.has_tensor("response_mask")) return batch.tensor("response_mask").to(at::kFloat);
  const int64_t R = response_width(batch);
  const at::Tensor& mask = batch.tensor("attention_mask");
  return mask.slice(1, mask.size(1) - R).to(at::kFloat);
}

ResponseScores response_scores(const at::Tensor& logits_shard, const engine::MicroBatch& mb,
                               int64_t response_width, double temperature, const engine::Group& tp,
                               bool with_sum_pi_squared) {
  const int64_t S = padded_width(mb);
  const int64_t R = response_width;
  if (R < 1 || R >= S) {
    throw Error("response_scores: response width " + std::to_string(R) + " for sequences of " +
                std::to_string(S) + " tokens");
  }
  at::Tensor logits = padded_columns(logits_shard, mb, S - R - 1, S - 1);
  if (temperature > 0 && temperature != 1.0) logits = logits / temperature;
  at::Tensor targets = padded_columns(mb.input_ids, mb, S - R, S).to(logits.device());
  auto both = engine::vocab_parallel_log_probs_entropy(logits, targets, tp);
  return {both.log_probs, both.entropy,
          with_sum_pi_squared ? engine::vocab_parallel_sum_pi_squared(logits, tp) : at::Tensor()};
}

void all_reduce_sum(std::vector<double>& values, const engine::Group& group, at::Device device) {
  if (group.size <= 1 || values.empty()) return;
  at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(device);
  std::vector<at::Tensor> ts{t};
  group.pg->allreduce(ts)->wait();
  const at::Tensor host = t.cpu();
  const double* sums = host.data_ptr<double>();
  std::copy(sums, sums + values.size(), values.begin());
}

namespace {

// Runs one rank's part of a collective job, then agrees with every rank on
// whether all parts succeeded: a rank that failed rethrows its error, the
// others throw naming the phase, so none is left waiting at a barrier for a
// rank that threw (the all-reduce is the barrier).
template <typename Part>
void part_then_agree(engine::ParallelState& ps, const char* phase, Part&& part) {
  std::exception_ptr error;
  try {
    part();
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<double> failed = {error ? 1.0 : 0.0};
  all_reduce_sum(failed, ps.world(), ps.device());
  if (error) std::rethrow_exception(error);
  if (failed[0] > 0)
    throw Error(std::string("export_hf: ") + phase + " failed on " +
                std::to_string(static_cast<int64_t>(failed[0])) +
                " other rank(s); their error is in their log");
}

}  // namespace

void export_hf_model(RoleModel& role, const std::string& dir) {
  namespace fs = std::filesystem;
  engine::ParallelState& ps = role.state();
  const engine::Coords& c = ps.coords();
  const fs::path out(dir);
  const fs::path shards = out.string() + ".shards";
  const auto& cfg = role.model().config();
  const nlohmann::json base = nlohmann::json::parse(role.hf_config_text());
  engine::ShardedLayout layout;
  layout.tp = ps.config().tp;
  layout.pp = ps.config().pp;
  layout.value_model = role.options().value_model;
  layout.make_vocab_size_divisible_by = ps.config().make_vocab_size_divisible_by;
  // Expert parallelism: dp ranks 0..ep-1 hold different experts, each
  // writes its own file; load_sharded_all joins them (join_expert_shards).
  layout.ep = cfg.moe.num_experts > 0 ? ps.config().ep : 1;
  part_then_agree(ps, "preparing the shard folder", [&] {
    if (ps.rank() != 0) return;
    baton::remove_tree(shards);
    fs::create_directories(shards);
    engine::write_sharded_layout(shards, cfg, layout, &base);
  });
  part_then_agree(ps, "writing the shards", [&] {
    if (c.dp >= layout.ep || c.cp != 0) return;
    // A LoRA model exports its merged weights: an HF model without adapters;
    // its adapters travel beside them, for the PEFT adapter under `dir`/adapter.
    engine::TensorMap weights;
    if (role.model().options().lora.enabled()) {
      for (const auto& [name, t] : role.model().merged_params()) weights.emplace(name, t.detach());
      for (const auto& [name, t] : role.model().lora_params()) weights.emplace(name, t.detach());
    } else {
      weights = role.model().state_dict();
    }
    engine::write_sharded_rank(shards, c.tp, c.pp, weights, layout.ep > 1 ? ps.ep_rank() : 0,
                               layout.ep);
  });
  part_then_agree(ps, "merging the shards into the HF checkpoint", [&] {
    if (ps.rank() != 0) return;
    const auto saved = engine::load_sharded_layout(shards);
    auto all = engine::load_sharded_all(shards);
    const auto adapters = engine::take_lora_tensors(all);
    engine::TensorMap hf = engine::shards_to_hf(all, cfg, saved.layer_split, saved.value_model,
                                                saved.make_vocab_size_divisible_by);
    engine::save_hf_model(out, cfg, hf, saved.value_model, engine::kDefaultMaxShardBytes, &base);
    if (const engine::LoraOptions& lora = role.model().options().lora; lora.enabled()) {
      // The adapters alone, for PEFT on the base model (not on the merged one).
      engine::PeftAdapter adapter;
      adapter.lora = lora;
      adapter.base_model = role.options().path;
      adapter.weights = engine::lora_shards_to_peft(adapters, cfg, lora, saved.layer_split);
      engine::save_peft_adapter(out / "adapter", adapter);
    }
    baton::remove_tree(shards);
    // The source directory's other files (tokenizer, generation config),
    // listed in the export's checksum manifest with the weights.
    ChecksumManifest manifest = ChecksumManifest::read(out).value_or(ChecksumManifest());
    for (const auto& e : fs::directory_iterator(role.options().path)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || name == "config.json" || name == kChecksumManifestFile ||
          name.find(".safetensors") != std::string::npos)
        continue;
      const FileChecksum sum = copy_file_atomically(e.path(), out / name);
      try {
        manifest.add(name, sum);
      } catch (const InvalidArgument&) {  // a name with a space: copied, not listed
      }
    }
    manifest.write(out);
  });
}

at::ScalarType parameter_dtype(const std::string& name, const std::string& where) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  throw Error(where + ": parameter dtype '" + name + "' (known: float32, bfloat16)");
}

engine::OptimizerOptions engine_optimizer_options(const OptimOptions& optim) {
  engine::OptimizerOptions o;
  o.lr = optim.lr;
  o.weight_decay = optim.weight_decay;
  o.beta1 = optim.beta1;
  o.beta2 = optim.beta2;
  o.clip_grad = optim.grad_clip;
  o.distributed = optim.distributed;
  o.overlap_grad_reduce = optim.overlap_grad_reduce;
  o.bucket_bytes = optim.bucket_bytes;
  o.warmup_steps = optim.warmup_steps;
  // verl's losses multiply by the DP size (agg_loss with GlobalBatchInfo), and
  // expect gradients averaged over DP.
  o.average_dp = true;
  if (optim.scheduler == "cosine") {
    o.schedule = engine::LrSchedule::kWarmupCosine;
    o.total_steps = optim.total_steps;
    o.min_lr = optim.lr * optim.min_lr_ratio;
  } else if (optim.scheduler != "constant") {
    throw Error("optimizer: unknown lr scheduler '" + optim.scheduler +
                "' (known: constant, cosine)");
  }
  return o;
}

}  // namespace baton::workers
