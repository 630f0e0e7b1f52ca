#include "engine/optimizer.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <set>

#include "engine/errors.h"
#include "engine/optimizer_kernels.h"

namespace baton::engine {
namespace {

constexpr double kPi = 3.14159265358979323846;

void all_reduce(at::Tensor& t, const Group& g, c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  if (g.size == 1) return;
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  g.pg->allreduce(ts, opts)->wait();
}

}  // namespace

double learning_rate(const OptimizerOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == LrSchedule::kConstant) return o.lr;
  int64_t decay = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(kPi * progress));
}

Optimizer::Optimizer(std::shared_ptr<Transformer> model, OptimizerOptions options)
    : model_(std::move(model)), options_(options) {
  if (options_.schedule == LrSchedule::kWarmupCosine && options_.total_steps <= 0)
    throw EngineError("OptimizerOptions: the warmup+cosine schedule needs total_steps > 0");
  bool tied_copy = model_->config().tie_word_embeddings && !model_->first_stage();
  for (auto& [name, p] : model_->named_params()) {
    Slot s;
    s.name = name;
    s.param = p;
    if (p.scalar_type() != at::kFloat) s.master = p.detach().to(at::kFloat).clone();
    const at::Tensor& ref = s.master.defined() ? s.master : p;
    s.exp_avg = at::zeros_like(ref);
    s.exp_avg_sq = at::zeros_like(ref);
    s.tp_replicated = Transformer::tp_replicated(name);
    s.tied_copy = tied_copy && name == "output_layer.weight";
    slots_.push_back(std::move(s));
  }
}

void Optimizer::zero_grad() {
  for (auto& s : slots_)
    if (s.param.grad().defined()) s.param.mutable_grad().zero_();
}

void Optimizer::all_reduce_buckets(std::vector<at::Tensor> grads, const Group& group) {
  if (group.size == 1 || grads.empty()) return;
  // Flatten gradients of one dtype into buckets of about bucket_bytes; one
  // all-reduce per bucket instead of one per parameter.
  size_t i = 0;
  while (i < grads.size()) {
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    auto dtype = grads[i].scalar_type();
    while (i < grads.size() && grads[i].scalar_type() == dtype &&
           (bucket.empty() ||
            bytes + static_cast<int64_t>(grads[i].nbytes()) <= options_.bucket_bytes)) {
      bytes += static_cast<int64_t>(grads[i].nbytes());
      bucket.push_back(grads[i++]);
    }
    std::vector<at::Tensor> flat_views;
    for (auto& g : bucket) flat_views.push_back(g.reshape({-1}));
    auto flat = at::cat(flat_views);
    all_reduce(flat, group);
    int64_t off = 0;
    for (auto& g : bucket) {
      g.copy_(flat.narrow(0, off, g.numel()).view(g.sizes()));
      off += g.numel();
    }
  }
}

void Optimizer::reduce_gradients() {
  at::NoGradGuard no_grad;
  const ParallelState& ps = model_->parallel();
  for (auto& s : slots_)
    if (!s.param.grad().defined()) s.param.mutable_grad() = at::zeros_like(s.param);
  // Sequence parallelism: replicated params saw only their rank's tokens.
  if (model_->options().sequence_parallel) {
    std::vector<at::Tensor> grads;
    for (auto& s : slots_)
      if (s.tp_replicated) grads.push_back(s.param.mutable_grad());
    all_reduce_buckets(grads, ps.tp());
  }
  // Tied embeddings over stages: the first stage's embedding and the last
  // stage's output layer are one parameter; sum their gradients.
  if (model_->config().tie_word_embeddings && ps.config().pp > 1 &&
      (model_->first_stage() || model_->last_stage())) {
    for (auto& s : slots_)
      if (s.name == "embedding.word_embeddings.weight" || s.name == "output_layer.weight")
        all_reduce(s.param.mutable_grad(), ps.embedding());
  }
  std::vector<at::Tensor> grads;
  for (auto it = slots_.rbegin(); it != slots_.rend(); ++it)
    grads.push_back(it->param.mutable_grad());
  all_reduce_buckets(grads, ps.dp_cp());
  if (options_.average_dp && ps.dp_cp().size > 1)
    for (auto& g : grads) g.div_(static_cast<double>(ps.dp_cp().size));
}

double Optimizer::global_grad_norm() {
  at::NoGradGuard no_grad;
  const ParallelState& ps = model_->parallel();
  // Where the groups carry tensors (the GPU for NCCL); each parameter's sum
  // is made on its own device and moved there.
  const at::Device device = ps.device();
  auto total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  double host = 0;  // fp32 host gradients, summed in one pass each
  for (auto& s : slots_) {
    // Count each distinct parameter once: replicated ones on TP rank 0, the
    // tied output layer not at all (the embedding stands for it).
    if (s.tied_copy || (s.tp_replicated && ps.coords().tp != 0)) continue;
    const at::Tensor& g = s.param.grad();
    if (!g.defined()) continue;
    if (g.device().is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous())
      host += cpu::sum_of_squares(g.data_ptr<float>(), g.numel());
    else
      total += g.to(at::kDouble).pow(2).sum().to(device);
  }
  total += host;
  all_reduce(total, ps.model_parallel());
  return std::sqrt(total.item<double>());
}

StepStats Optimizer::step() {
  if (offloaded_)
    throw EngineError("Optimizer::step: the optimizer state is offloaded; call reload() first");
  reduce_gradients();
  StepStats stats;
  stats.grad_norm = global_grad_norm();
  stats.lr = learning_rate(options_, steps_);
  if (!std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    zero_grad();
    return stats;
  }
  at::NoGradGuard no_grad;
  double scale = 1.0;
  if (options_.clip_grad > 0 && stats.grad_norm > options_.clip_grad)
    scale = options_.clip_grad / (stats.grad_norm + 1e-6);
  int64_t t = steps_ + 1;
  double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t));
  double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t));
  for (auto& s : slots_) {
    at::Tensor p = s.master.defined() ? s.master : s.param.detach();
    at::Tensor g = s.param.grad().to(at::kFloat);
    const bool decays = options_.weight_decay > 0 && p.dim() > 1;
    if (p.device().is_cpu() && g.device().is_cpu() && p.scalar_type() == at::kFloat &&
        p.is_contiguous() && s.exp_avg.is_contiguous() && s.exp_avg_sq.is_contiguous()) {
      // One pass over the tensor's memory (engine/optimizer_kernels.h).
      g = g.contiguous();
      cpu::AdamWStep st;
      st.lr = stats.lr;
      st.beta1 = options_.beta1;
      st.beta2 = options_.beta2;
      st.eps = options_.eps;
      st.decay = decays ? options_.weight_decay : 0.0;
      st.bias1 = bc1;
      st.bias2 = bc2;
      st.grad_scale = scale;
      cpu::adamw_update(p.data_ptr<float>(), g.data_ptr<float>(), s.exp_avg.data_ptr<float>(),
                        s.exp_avg_sq.data_ptr<float>(), p.numel(), st);
      if (s.master.defined()) s.param.detach().copy_(s.master);
      continue;
    }
    if (scale != 1.0) g = g * scale;
    if (decays) p.mul_(1.0 - stats.lr * options_.weight_decay);
    s.exp_avg.mul_(options_.beta1).add_(g, 1.0 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(g, g, 1.0 - options_.beta2);
    auto denom = (s.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(options_.eps);
    p.addcdiv_(s.exp_avg, denom, -stats.lr / bc1);
    if (s.master.defined()) s.param.detach().copy_(s.master);
  }
  ++steps_;
  return stats;
}

void Optimizer::offload() {
  if (offloaded_ || slots_.empty() || slots_.front().param.device().is_cpu()) return;
  for (auto& s : slots_)
    for (at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
      if (!t->defined()) continue;
      // Pinned: device <-> host copies at full bus speed. Only here, where a
      // GPU is present (pinning needs the CUDA driver).
      at::Tensor host = at::empty(t->sizes(), t->options().device(at::kCPU).pinned_memory(true));
      host.copy_(*t);
      *t = host;
    }
  offloaded_ = true;
}

void Optimizer::reload() {
  if (!offloaded_) return;
  for (auto& s : slots_)
    for (at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq})
      if (t->defined()) *t = t->to(s.param.device());
  offloaded_ = false;
}

std::map<std::string, at::Tensor> Optimizer::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& s : slots_) {
    out["exp_avg." + s.name] = s.exp_avg.clone();
    out["exp_avg_sq." + s.name] = s.exp_avg_sq.clone();
    if (s.master.defined()) out["master." + s.name] = s.master.clone();
  }
  out["step"] = at::scalar_tensor(steps_, at::kLong);
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  std::vector<std::string> problems;
  auto take = [&](const std::string& key, at::Tensor& into) {
    auto it = state.find(key);
    if (it == state.end()) {
      problems.push_back("missing " + key);
    } else if (it->second.sizes() != into.sizes()) {
      problems.push_back("wrong shape " + key);
    } else {
      into.copy_(it->second);
    }
  };
  at::NoGradGuard no_grad;
  for (auto& s : slots_) {
    take("exp_avg." + s.name, s.exp_avg);
    take("exp_avg_sq." + s.name, s.exp_avg_sq);
    if (s.master.defined()) take("master." + s.name, s.master);
  }
  auto it = state.find("step");
  if (it == state.end() || it->second.numel() != 1)
    problems.push_back("missing step");
  else
    steps_ = it->second.item<int64_t>();
  if (!problems.empty()) {
    std::string msg = "Optimizer::load_state_dict:";
    for (const auto& p : problems) msg += " " + p + ";";
    throw EngineError(msg);
  }
}

}  // namespace baton::engine
