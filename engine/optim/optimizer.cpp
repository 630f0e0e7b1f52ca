#include "engine/optim/optimizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <functional>
#include <set>
#include <utility>

#include "base/profiler.h"
#include "engine/errors.h"
#include "engine/kernels/optimizer_kernels.h"

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

// One AdamW step of parameter `p` (fp32) with gradient `g`, moments m and v.
void adam_tensor(const at::Tensor& p, at::Tensor g, const at::Tensor& m, const at::Tensor& v,
                 bool decays, const OptimizerOptions& o, double lr, double scale, double bc1,
                 double bc2) {
  g = g.to(at::kFloat);
  if (p.device().is_cpu() && g.device().is_cpu() && p.scalar_type() == at::kFloat &&
      p.is_contiguous() && m.is_contiguous() && v.is_contiguous()) {
    // One pass over the tensor's memory (engine/kernels/optimizer_kernels.h).
    g = g.contiguous();
    cpu::AdamWStep st;
    st.lr = lr;
    st.beta1 = o.beta1;
    st.beta2 = o.beta2;
    st.eps = o.eps;
    st.decay = decays ? o.weight_decay : 0.0;
    st.bias1 = bc1;
    st.bias2 = bc2;
    st.grad_scale = scale;
    cpu::adamw_update(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                      v.data_ptr<float>(), p.numel(), st);
    return;
  }
  if (scale != 1.0) g = g * scale;
  if (decays) p.mul_(1.0 - lr * o.weight_decay);
  m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

bool is_view_of(const at::Tensor& t, const at::Tensor& base, int64_t offset) {
  return t.defined() && t.is_contiguous() && t.scalar_type() == base.scalar_type() &&
         t.data_ptr() == static_cast<const char*>(base.data_ptr()) + offset * base.element_size();
}

// Makes p's gradient its view of `base` at `offset`; a gradient that was
// replaced (released, or accumulated before the views existed) is copied in.
void adopt_grad_view(at::Tensor& p, const at::Tensor& base, int64_t offset) {
  if (is_view_of(p.grad(), base, offset)) return;
  at::Tensor view = base.narrow(0, offset, p.numel()).view(p.sizes());
  if (p.grad().defined())
    view.copy_(p.grad());
  else
    view.zero_();
  p.mutable_grad() = view;
}

// Runs `fn` after a parameter's gradient accumulation.
class AfterAccumulation : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

struct Optimizer::Overlap {
  struct Bucket {
    at::Tensor flat;  // the gradients of `slots`, each a view
    std::vector<size_t> slots;
    size_t pending = 0;  // gradients not final yet in this backward
    c10::intrusive_ptr<c10d::Work> work;
  };
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // DP
  std::vector<at::Tensor> params;             // by slot
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> bucket_of;   // by slot; kNone: reduced in step()
  std::vector<int64_t> offset_of;  // by slot, in its bucket
  std::vector<char> final_grad;    // by slot, in this backward
  std::vector<Bucket> buckets;
  // Each parameter's AccumulateGrad node, which carries the hook; the
  // parameter itself refers to it only weakly.
  // grad_accumulator returns std::shared_ptr<Node> in LibTorch 2.11 and
  // c10::intrusive_ptr<Node> in 2.15: hold whichever it is.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()))>
      accumulators;
  bool armed = false;
  size_t started = 0;  // buckets [0, started) have their all-reduce under way
  int64_t started_in_backward = 0;

  bool late_backward = false;  // a backward after the last one wrote into a started bucket

  // Makes the parameter's gradient its bucket view.
  void attach(size_t slot) {
    if (bucket_of[slot] != kNone)
      adopt_grad_view(params[slot], buckets[bucket_of[slot]].flat, offset_of[slot]);
  }
  void start(Bucket& b) {
    for (size_t slot : b.slots) attach(slot);
    std::vector<at::Tensor> ts{b.flat};
    b.work = pg->allreduce(ts);
  }
  // Before a micro-batch's backward; the last one arms the hooks.
  void before_backward(bool last) {
    if (armed || started != 0)
      throw EngineError(
          "Optimizer (overlap_grad_reduce): forward_backward ran again before step() or "
          "zero_grad(); the previous one's gradients are already being reduced over DP. One "
          "step's gradients come from one forward_backward (give it more micro-batches)");
    if (!last) return;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) attach(i);
    std::fill(final_grad.begin(), final_grad.end(), 0);
    for (auto& b : buckets) b.pending = b.slots.size();
    armed = true;
  }
  // The hook: slot's gradient is final for this step.
  void on_final(size_t slot) {
    if (!armed || bucket_of[slot] == kNone) return;
    if (final_grad[slot]) {
      // A second backward after forward_backward's last one: its gradients
      // went into a bucket that may be on its way. step() refuses it.
      late_backward = true;
      return;
    }
    final_grad[slot] = 1;
    if (--buckets[bucket_of[slot]].pending != 0) return;
    while (started < buckets.size() && buckets[started].pending == 0) start(buckets[started++]);
  }
  // Starts what did not start, in order, and waits for every bucket.
  void finish() {
    at::NoGradGuard no_grad;
    started_in_backward = armed ? static_cast<int64_t>(started) : 0;
    armed = false;
    while (started < buckets.size()) start(buckets[started++]);
    for (auto& b : buckets) {
      b.work->wait();
      b.work.reset();
    }
    started = 0;
    if (late_backward) {
      late_backward = false;
      throw EngineError(
          "Optimizer (overlap_grad_reduce): a backward ran after forward_backward and before "
          "step(); its gradients were added while the DP all-reduce was under way, so they are "
          "lost or half reduced. Call zero_grad() and redo the step; put all of a step's "
          "backwards inside its forward_backward");
    }
  }
  // Waits for any bucket still under way, without starting the rest (a
  // rank that started fewer than its peers leaves them waiting on theirs
  // until the group's timeout: only after a failure).
  void drain() {
    armed = false;
    late_backward = false;
    for (size_t i = 0; i < started; ++i)
      if (buckets[i].work) {
        buckets[i].work->wait();
        buckets[i].work.reset();
      }
    started = 0;
  }
};

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
  const bool ep = model_->parallel().config().ep > 1;
  if (ep && options_.distributed)
    throw EngineError(
        detail::cat("Optimizer: the distributed optimizer does not support expert parallelism (",
                    model_->parallel().config().to_string(), "); use the plain optimizer"));
  // The trainable ones: a LoRA model's adapters, else every parameter.
  for (auto& [name, p] : model_->trainable_params()) {
    Slot s;
    s.name = name;
    s.param = p;
    if (!options_.distributed) {
      if (p.scalar_type() != at::kFloat) s.master = p.detach().to(at::kFloat).clone();
      const at::Tensor& ref = s.master.defined() ? s.master : p;
      s.exp_avg = at::zeros_like(ref);
      s.exp_avg_sq = at::zeros_like(ref);
    }
    s.tp_replicated = Transformer::tp_replicated(name);
    s.tp_partial = model_->tp_partial_grad(name);
    s.tied_copy = tied_copy && name == "output_layer.weight";
    s.expert = ep && is_expert_tensor(name);
    slots_.push_back(std::move(s));
  }
  if (options_.distributed)
    build_flat();
  else if (options_.overlap_grad_reduce && model_->parallel().dp_cp().size > 1)
    build_overlap();
}

Optimizer::~Optimizer() {
  if (!overlap_) return;
  model_->clear_backward_hook(overlap_.get());
  try {
    overlap_->drain();  // no all-reduce may outlive the buckets it writes
  } catch (const std::exception&) {
    // A failed group: nothing is left to wait for.
  }
}

int64_t Optimizer::grad_buckets() const {
  return overlap_ ? static_cast<int64_t>(overlap_->buckets.size()) : 0;
}

int64_t Optimizer::buckets_started_in_backward() const {
  return overlap_ ? overlap_->started_in_backward : 0;
}

void Optimizer::build_overlap() {
  if (options_.bucket_bytes < 1)
    throw EngineError(
        detail::cat("Optimizer: bucket_bytes must be positive, got ", options_.bucket_bytes));
  at::NoGradGuard no_grad;
  auto o = std::make_shared<Overlap>();
  o->pg = model_->parallel().dp_cp().pg;
  const size_t n = slots_.size();
  o->bucket_of.assign(n, Overlap::kNone);
  o->offset_of.assign(n, 0);
  o->final_grad.assign(n, 0);
  for (const auto& s : slots_) o->params.push_back(s.param);
  // Reverse parameter order, one dtype and device per bucket, about
  // bucket_bytes each. Parameters whose gradients are reduced over TP or the
  // embedding group before DP stay out (step() reduces them as before).
  std::vector<int64_t> numel;
  int64_t bytes = 0;
  for (size_t k = n; k-- > 0;) {
    if (reduced_before_dp(slots_[k])) continue;
    const at::Tensor& p = slots_[k].param;
    const int64_t b = static_cast<int64_t>(p.nbytes());
    bool fresh = o->buckets.empty() || bytes + b > options_.bucket_bytes;
    if (!fresh) {
      const at::Tensor& head = slots_[o->buckets.back().slots.front()].param;
      fresh = head.scalar_type() != p.scalar_type() || head.device() != p.device();
    }
    if (fresh) {
      o->buckets.emplace_back();
      numel.push_back(0);
      bytes = 0;
    }
    o->bucket_of[k] = o->buckets.size() - 1;
    o->offset_of[k] = numel.back();
    o->buckets.back().slots.push_back(k);
    numel.back() += p.numel();
    bytes += b;
  }
  for (size_t i = 0; i < o->buckets.size(); ++i) {
    const at::Tensor& head = slots_[o->buckets[i].slots.front()].param;
    o->buckets[i].flat = at::zeros({numel[i]}, head.options());
  }
  std::weak_ptr<Overlap> weak = o;
  for (size_t k = 0; k < n; ++k) {
    if (o->bucket_of[k] == Overlap::kNone) continue;
    // A frozen parameter has no accumulator: its bucket starts in step().
    auto acc = torch::autograd::impl::grad_accumulator(slots_[k].param);
    if (!acc) continue;
    acc->add_post_hook(std::make_unique<AfterAccumulation>([weak, k] {
      if (auto live = weak.lock()) live->on_final(k);
    }));
    o->accumulators.push_back(std::move(acc));
  }
  for (size_t k = 0; k < n; ++k) o->attach(k);
  model_->set_backward_hook(o.get(), [weak](bool last) {
    if (auto live = weak.lock()) live->before_backward(last);
  });
  overlap_ = std::move(o);
}

void Optimizer::build_flat() {
  at::NoGradGuard no_grad;
  const Group& dp = model_->parallel().dp_cp();
  auto f = std::make_unique<Flat>();
  const at::Tensor& first = slots_.front().param;
  for (const auto& s : slots_) {
    if (s.param.scalar_type() != first.scalar_type() || s.param.device() != first.device())
      throw EngineError(
          detail::cat("Optimizer (distributed): every parameter must share one dtype "
                      "and device; ",
                      s.name, " is ", s.param.toString(), " on ", s.param.device(), ", ",
                      slots_.front().name, " is ", first.toString(), " on ", first.device()));
    f->offset.push_back(f->numel);
    f->numel += s.param.numel();
  }
  f->padded = (f->numel + dp.size - 1) / dp.size * dp.size;
  f->shard = f->padded / dp.size;
  f->shard_begin = dp.rank * f->shard;
  const bool fp32_cpu = first.device().is_cpu() && first.scalar_type() == at::kFloat;
  // Collective over DP; every rank of one DP group has the same dtype/device.
  // The barrier's timeout only catches a live rank that stopped calling (a
  // dead one is seen at once): the collective deadline, as over c10d.
  if (fp32_cpu && options_.shared_memory)
    f->shm = ShmGroup::create(dp, f->padded, model_->parallel().collective_timeout());
  f->params = at::zeros({f->padded}, first.options());
  f->grads = f->shm ? f->shm->region() : at::zeros({f->padded}, first.options());
  for (size_t i = 0; i < slots_.size(); ++i) {
    at::Tensor& p = slots_[i].param;
    at::Tensor view = f->params.narrow(0, f->offset[i], p.numel()).view(p.sizes());
    view.copy_(p.detach());
    p.set_data(view);  // the model's parameter now lives in the flat buffer
    const int64_t b = std::max(f->offset[i], f->shard_begin);
    const int64_t e = std::min(f->offset[i] + p.numel(), f->shard_begin + f->shard);
    if (b < e) f->segments.push_back({i, b, e - b});
  }
  auto fp32 = first.options().dtype(at::kFloat);
  // The reduced shard: in place in the gradient buffer where the reduction
  // allows it (shared memory, or no other rank), else a buffer of its own.
  if (first.scalar_type() == at::kFloat && (f->shm || dp.size == 1))
    f->grad_shard = f->grads.narrow(0, f->shard_begin, f->shard);
  else
    f->grad_shard = at::zeros({f->shard}, fp32);
  f->exp_avg = at::zeros({f->shard}, fp32);
  f->exp_avg_sq = at::zeros({f->shard}, fp32);
  if (first.scalar_type() != at::kFloat)
    f->master = f->params.narrow(0, f->shard_begin, f->shard).to(at::kFloat).clone();
  flat_ = std::move(f);
  attach_grads();
}

void Optimizer::attach_grads() {
  // Each parameter's gradient must be its view of the flat buffer; one that
  // was replaced (released, or accumulated before the views existed) is
  // copied in and replaced by the view.
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i)
    adopt_grad_view(slots_[i].param, flat_->grads, flat_->offset[i]);
}

void Optimizer::zero_grad() {
  if (flat_) {
    attach_grads();
    flat_->grads.zero_();
    flat_->shard_squares.reset();
    return;
  }
  if (overlap_) {
    overlap_->drain();
    at::NoGradGuard no_grad;
    for (size_t k = 0; k < slots_.size(); ++k) overlap_->attach(k);
    for (auto& b : overlap_->buckets) b.flat.zero_();
    for (size_t k = 0; k < slots_.size(); ++k)
      if (overlap_->bucket_of[k] == Overlap::kNone && slots_[k].param.grad().defined())
        slots_[k].param.mutable_grad().zero_();
    return;
  }
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

bool Optimizer::tied_across_stages(const Slot& s) const {
  return model_->config().tie_word_embeddings && model_->parallel().config().pp > 1 &&
         (model_->first_stage() || model_->last_stage()) &&
         (s.name == "embedding.word_embeddings.weight" || s.name == "output_layer.weight");
}

bool Optimizer::reduced_before_dp(const Slot& s) const {
  return s.tp_partial || s.expert || tied_across_stages(s);
}

void Optimizer::reduce_gradients() {
  at::NoGradGuard no_grad;
  const ParallelState& ps = model_->parallel();
  if (flat_) attach_grads();
  if (overlap_) overlap_->finish();  // the buckets' gradients, reduced over DP
  for (auto& s : slots_)
    if (!s.param.grad().defined()) s.param.mutable_grad() = at::zeros_like(s.param);
  // Replicated params whose gradient each TP rank has a part of: its tokens
  // (sequence parallelism) or its heads (q / k norms).
  std::vector<at::Tensor> partial;
  for (auto& s : slots_)
    if (s.tp_partial) partial.push_back(s.param.mutable_grad());
  if (!partial.empty()) all_reduce_buckets(partial, ps.tp());
  // Tied embeddings over stages: the first stage's embedding and the last
  // stage's output layer are one parameter; sum their gradients.
  for (auto& s : slots_)
    if (tied_across_stages(s)) all_reduce(s.param.mutable_grad(), ps.embedding());
  if (flat_) {
    reduce_scatter_flat();
    return;
  }
  // Over DP: everything, or with the overlapped reduction the parameters it
  // leaves out (those reduced over TP or the embedding group first, so that
  // each sum is taken in the same order either way).
  // Expert parameters (EP) over the ranks holding the same experts.
  std::vector<at::Tensor> grads, expert_grads;
  for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) {
    if (it->expert)
      expert_grads.push_back(it->param.mutable_grad());
    else if (!overlap_ || reduced_before_dp(*it))
      grads.push_back(it->param.mutable_grad());
  }
  all_reduce_buckets(grads, ps.dp_cp());
  all_reduce_buckets(expert_grads, ps.expert_dp());
  if (options_.average_dp && ps.dp_cp().size > 1)
    for (auto& s : slots_) s.param.mutable_grad().div_(static_cast<double>(ps.dp_cp().size));
}

void Optimizer::reduce_scatter_flat() {
  const Group& dp = model_->parallel().dp_cp();
  Flat& f = *flat_;
  f.shard_squares.reset();
  if (f.shm) {
    f.shard_squares = f.shm->reduce_scatter(f.grad_shard);
  } else if (dp.size > 1) {
    // A real reduce-scatter: each rank receives only its shard's sums.
    at::Tensor out = f.grads.scalar_type() == at::kFloat ? f.grad_shard
                                                         : at::empty({f.shard}, f.grads.options());
    // _reduce_scatter_base / _allgather_base: the names LibTorch 2.11 to 2.15
    // all have (2.15 deprecates them for *_single, which 2.11 lacks).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    dp.pg->_reduce_scatter_base(out, f.grads)->wait();
#pragma GCC diagnostic pop
    if (!out.is_same(f.grad_shard)) f.grad_shard.copy_(out);
  } else if (!f.grad_shard.is_alias_of(f.grads)) {
    f.grad_shard.copy_(f.grads);
  }
  if (options_.average_dp && dp.size > 1) {
    f.grad_shard.div_(static_cast<double>(dp.size));
    if (f.shard_squares) *f.shard_squares /= static_cast<double>(dp.size * dp.size);
  }
}

void Optimizer::all_gather_into(const at::Tensor& mine, at::Tensor& full) const {
  const Group& dp = model_->parallel().dp_cp();
  if (flat_->shm) {
    flat_->shm->all_gather(mine, full);  // `mine` may be full's own slice
  } else if (dp.size > 1) {
    at::Tensor in = mine.is_alias_of(full) ? mine.clone() : mine;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    dp.pg->_allgather_base(full, in)->wait();
#pragma GCC diagnostic pop
  } else if (!mine.is_alias_of(full)) {
    full.copy_(mine);
  }
}

at::Tensor Optimizer::gather_shard(const at::Tensor& shard) const {
  at::Tensor mine = shard.contiguous();
  at::Tensor full = at::empty({flat_->padded}, mine.options());
  all_gather_into(mine, full);
  return full;
}

void Optimizer::distributed_update(const StepStats& stats, double scale, double bc1, double bc2) {
  Flat& f = *flat_;
  for (const Segment& seg : f.segments) {
    const Slot& s = slots_[seg.slot];
    const int64_t local = seg.begin - f.shard_begin;
    at::Tensor p = f.master.defined() ? f.master.narrow(0, local, seg.length)
                                      : f.params.narrow(0, seg.begin, seg.length);
    adam_tensor(p, f.grad_shard.narrow(0, local, seg.length),
                f.exp_avg.narrow(0, local, seg.length), f.exp_avg_sq.narrow(0, local, seg.length),
                options_.weight_decay > 0 && s.param.dim() > 1, options_, stats.lr, scale, bc1,
                bc2);
  }
  at::Tensor mine = f.params.narrow(0, f.shard_begin, f.shard);
  if (f.master.defined()) mine.copy_(f.master);
  all_gather_into(mine, f.params);
}

double Optimizer::global_grad_norm() {
  at::NoGradGuard no_grad;
  const ParallelState& ps = model_->parallel();
  // Where the groups carry tensors (the GPU for NCCL); each parameter's sum
  // is made on its own device and moved there.
  const at::Device device = ps.device();
  auto total = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  double host = 0;  // fp32 host gradients, summed in one pass each
  // Count each distinct parameter once: replicated ones on TP rank 0, the
  // tied output layer not at all (the embedding stands for it).
  auto counted = [&](const Slot& s) {
    return !(s.tied_copy || (s.tp_replicated && ps.coords().tp != 0));
  };
  // Into a host sum and a device sum: fp32 host gradients through the
  // CPU kernel, others on their device (no host sync per parameter).
  auto add_squares_to = [&](const at::Tensor& g, double sign, double& into_host,
                            at::Tensor& into_device) {
    if (g.device().is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous())
      into_host += sign * cpu::sum_of_squares(g.data_ptr<float>(), g.numel());
    else
      into_device += sign * g.to(at::kDouble).pow(2).sum().to(device);
  };
  auto add_squares = [&](const at::Tensor& g, double sign) {
    add_squares_to(g, sign, host, total);
  };
  if (flat_) {
    // This rank's shard; the DP ranks' shards partition the gradients. The
    // shared-memory reduction summed the shard's squares as it went: only
    // the pieces not counted are summed again, and taken off.
    const bool have = flat_->shard_squares.has_value();
    if (have) host = *flat_->shard_squares;
    for (const Segment& seg : flat_->segments) {
      if (have == counted(slots_[seg.slot])) continue;
      add_squares(flat_->grad_shard.narrow(0, seg.begin - flat_->shard_begin, seg.length),
                  have ? -1.0 : 1.0);
    }
    // Two differently ordered sums: a counted part of ~0 could come out
    // a hair below zero.
    host = std::max(host, 0.0);
    if (flat_->shm) {
      // A scalar through the shared segment: no socket round trip.
      host += total.item<double>();
      total.fill_(flat_->shm->all_reduce_sum(host));
    } else {
      total += host;
      all_reduce(total, ps.dp_cp());
    }
    all_reduce(total, ps.model_parallel());
    return std::sqrt(total.item<double>());
  }
  // Experts (EP): each EP rank holds different ones; sum theirs first.
  auto experts = at::zeros({1}, total.options());
  double experts_host = 0;
  for (auto& s : slots_)
    if (s.expert && s.param.grad().defined())
      add_squares_to(s.param.grad(), 1.0, experts_host, experts);
  experts += experts_host;
  if (ps.config().ep > 1) all_reduce(experts, ps.ep());
  for (auto& s : slots_)
    if (!s.expert && counted(s) && s.param.grad().defined()) add_squares(s.param.grad(), 1.0);
  total += host;
  total += experts;
  all_reduce(total, ps.model_parallel());
  return std::sqrt(total.item<double>());
}

StepStats Optimizer::step() {
  BATON_PROFILE_SCOPE("engine", "optimizer step");
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
  if (flat_) {
    distributed_update(stats, scale, bc1, bc2);
    ++steps_;
    return stats;
  }
  for (auto& s : slots_) {
    at::Tensor p = s.master.defined() ? s.master : s.param.detach();
    adam_tensor(p, s.param.grad(), s.exp_avg, s.exp_avg_sq,
                options_.weight_decay > 0 && p.dim() > 1, options_, stats.lr, scale, bc1, bc2);
    if (s.master.defined()) s.param.detach().copy_(s.master);
  }
  ++steps_;
  return stats;
}

std::vector<const at::Tensor*> Optimizer::state_tensors() const {
  std::vector<const at::Tensor*> out;
  for (const auto& s : slots_)
    for (const at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq})
      if (t->defined()) out.push_back(t);
  if (flat_)
    for (const at::Tensor* t : {&flat_->master, &flat_->exp_avg, &flat_->exp_avg_sq})
      if (t->defined()) out.push_back(t);
  return out;
}

std::vector<at::Tensor*> Optimizer::state_tensors() {
  std::vector<at::Tensor*> out;
  for (const at::Tensor* t : std::as_const(*this).state_tensors())
    out.push_back(const_cast<at::Tensor*>(t));  // this optimizer's own, non-const members
  return out;
}

void Optimizer::offload() {
  if (offloaded_ || slots_.empty() || slots_.front().param.device().is_cpu()) return;
  for (at::Tensor* t : state_tensors()) {
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
  const at::Device device = slots_.front().param.device();
  for (at::Tensor* t : state_tensors()) *t = t->to(device);
  offloaded_ = false;
}

std::vector<at::Tensor> Optimizer::state_tensor_handles() const {
  std::vector<at::Tensor> out;
  for (const at::Tensor* t : state_tensors()) out.push_back(*t);
  if (flat_ && flat_->grad_shard.defined()) out.push_back(flat_->grad_shard);
  return out;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : state_tensors()) bytes += static_cast<int64_t>(t->nbytes());
  if (flat_ && !flat_->grad_shard.is_alias_of(flat_->grads))
    bytes += static_cast<int64_t>(flat_->grad_shard.nbytes());
  return bytes;
}

std::map<std::string, at::Tensor> Optimizer::state_dict() const {
  std::map<std::string, at::Tensor> out;
  if (flat_) {
    // Collective over DP: every rank's shard, gathered into full tensors.
    at::Tensor m = gather_shard(flat_->exp_avg), v = gather_shard(flat_->exp_avg_sq);
    at::Tensor master = flat_->master.defined() ? gather_shard(flat_->master) : at::Tensor();
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      // Views of the freshly gathered tensors: no second copy of the state.
      auto piece = [&](const at::Tensor& full) {
        return full.narrow(0, flat_->offset[i], s.param.numel()).view(s.param.sizes());
      };
      out["exp_avg." + s.name] = piece(m);
      out["exp_avg_sq." + s.name] = piece(v);
      if (master.defined()) out["master." + s.name] = piece(master);
    }
    out["step"] = at::scalar_tensor(steps_, at::kLong);
    return out;
  }
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
  auto find = [&](const std::string& key, at::IntArrayRef sizes) -> const at::Tensor* {
    auto it = state.find(key);
    if (it == state.end()) {
      problems.push_back("missing " + key);
      return nullptr;
    }
    if (it->second.sizes() != sizes) {
      problems.push_back("wrong shape " + key);
      return nullptr;
    }
    return &it->second;
  };
  at::NoGradGuard no_grad;
  if (flat_) {
    // Every entry is checked on every rank (they agree on the verdict);
    // each takes its shard of the full tensors.
    for (const auto& s : slots_) {
      find("exp_avg." + s.name, s.param.sizes());
      find("exp_avg_sq." + s.name, s.param.sizes());
      if (flat_->master.defined()) find("master." + s.name, s.param.sizes());
    }
    for (const Segment& seg : flat_->segments) {
      if (!problems.empty()) break;
      const Slot& s = slots_[seg.slot];
      const int64_t local = seg.begin - flat_->shard_begin;
      const int64_t within = seg.begin - flat_->offset[seg.slot];
      auto take = [&](const std::string& key, at::Tensor& into) {
        into.narrow(0, local, seg.length)
            .copy_(state.at(key).reshape({-1}).narrow(0, within, seg.length));
      };
      take("exp_avg." + s.name, flat_->exp_avg);
      take("exp_avg_sq." + s.name, flat_->exp_avg_sq);
      if (flat_->master.defined()) take("master." + s.name, flat_->master);
    }
  } else {
    for (auto& s : slots_) {
      auto take = [&](const std::string& key, at::Tensor& into) {
        if (const at::Tensor* t = find(key, into.sizes())) into.copy_(*t);
      };
      take("exp_avg." + s.name, s.exp_avg);
      take("exp_avg_sq." + s.name, s.exp_avg_sq);
      if (s.master.defined()) take("master." + s.name, s.master);
    }
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
