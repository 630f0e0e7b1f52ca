#include "engine/rollout/reshard.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "engine/rollout/weight_stream.h"

namespace baton::engine {
namespace {

using Clock = std::chrono::steady_clock;

// One rollout parameter and where its elements come from.
struct Item : StreamTensor {
  at::Tensor dst;  // the rollout parameter (this rank's TP_r slice)
};

// A run of consecutive items of one owning stage, streamed together.
struct Bucket {
  int64_t stage = 0;
  std::vector<const Item*> items;
};

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Everything that decides the parameter layout must agree.
void check_same_model(const ModelConfig& a, const ModelConfig& b) {
  std::vector<std::string> diffs;
  auto cmp = [&](const char* what, const auto& x, const auto& y) {
    if (detail::cat(x) != detail::cat(y)) diffs.push_back(detail::cat(what, " ", x, " vs ", y));
  };
  cmp("architecture", a.architecture, b.architecture);
  auto flag = [](bool v) { return v ? "true" : "false"; };
  cmp("family", family_name(a.family), family_name(b.family));
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("hidden_size", a.hidden_size, b.hidden_size);
  cmp("intermediate_size", a.intermediate_size, b.intermediate_size);
  cmp("num_layers", a.num_layers, b.num_layers);
  cmp("num_heads", a.num_heads, b.num_heads);
  cmp("num_kv_heads", a.num_kv_heads, b.num_kv_heads);
  cmp("head_dim", a.head_dim, b.head_dim);
  cmp("tie_word_embeddings", flag(a.tie_word_embeddings), flag(b.tie_word_embeddings));
  cmp("qkv_bias", flag(a.qkv_bias), flag(b.qkv_bias));
  cmp("mlp_bias", flag(a.mlp_bias), flag(b.mlp_bias));
  cmp("qk_norm", flag(a.qk_norm), flag(b.qk_norm));
  cmp("num_experts", a.moe.num_experts, b.moe.num_experts);
  cmp("moe_intermediate_size", a.moe.intermediate_size, b.moe.intermediate_size);
  cmp("experts per token", a.moe.top_k, b.moe.top_k);
  if (diffs.empty()) return;
  std::string msg =
      "reshard_weights: the training and rollout models differ (training vs rollout):";
  for (const auto& d : diffs) msg += " " + d + ";";
  throw EngineError(msg);
}

void validate(const Transformer& train, const Transformer& rollout) {
  check_same_model(train.config(), rollout.config());
  if (train.options().value_model != rollout.options().value_model)
    throw EngineError(detail::cat(
        "reshard_weights: the training model is ", train.options().value_model ? "" : "not ",
        "a value model but the rollout model is", rollout.options().value_model ? "" : " not"));
  const ParallelState& t = train.parallel();
  const ParallelState& r = rollout.parallel();
  if (r.config().pp != 1)
    throw EngineError(detail::cat("reshard_weights: the rollout layout must have pp = 1, got ",
                                  r.config().to_string()));
  if (r.world().size != t.world().size)
    throw EngineError(detail::cat("reshard_weights: the rollout world has ", r.world().size,
                                  " ranks (", r.config().to_string(), ") but the training world ",
                                  t.world().size, " (", t.config().to_string(), ")"));
  if (r.rank() != t.rank())
    throw EngineError(detail::cat("reshard_weights: this process is rank ", t.rank(),
                                  " of the training world but rank ", r.rank(),
                                  " of the rollout world"));
}

// The whole model's tensors (weight_stream.h), each bound to its rollout
// parameter, so every rank knows the whole plan without exchanging metadata.
std::vector<Item> plan_items(const Transformer& rollout, const ParallelConfig& training) {
  const ParallelConfig& r_layout = rollout.parallel().config();
  std::map<std::string, at::Tensor> params;
  for (const auto& [name, param] : rollout.named_params()) params.emplace(name, param);
  std::vector<Item> items;
  const auto element_size =
      static_cast<int64_t>(rollout.named_params().front().second.element_size());
  for (auto& t :
       stream_tensors(rollout.config(), rollout.options().value_model, training, element_size)) {
    auto p = params.find(t.name);
    if (p == params.end())
      throw EngineError(detail::cat("reshard_weights: the rollout model has no ", t.name));
    Item it;
    static_cast<StreamTensor&>(it) = std::move(t);
    it.dst = p->second;
    params.erase(p);
    ENGINE_CHECK(it.dst.is_contiguous(), "rollout parameter ", it.name, " is not contiguous");
    if (it.dst.sizes() != at::IntArrayRef(it.shard_shape_in(r_layout)))
      throw EngineError(detail::cat("reshard_weights: rollout parameter ", it.name, " is ",
                                    shape_str(it.dst.sizes()), ", expected ",
                                    shape_str(it.shard_shape_in(r_layout))));
    items.push_back(std::move(it));
  }
  if (!params.empty())
    throw EngineError(detail::cat("reshard_weights: rollout parameter ", params.begin()->first,
                                  " is not part of the model's tensor plan"));
  return items;
}

// Per stage, consecutive items up to `bucket_bytes` of full tensors, expert
// tensors split over EP in buckets of their own (they travel over the EP
// group as well); the stages' buckets interleaved (stage 0's first, stage
// 1's first, ...) so that two buckets in flight usually come from different
// stages and travel in opposite directions over the pipeline group.
std::vector<Bucket> make_buckets(const std::vector<Item>& items, int64_t pp, int64_t bucket_bytes) {
  std::vector<std::vector<Bucket>> per_stage(pp);
  std::vector<int64_t> filled(pp, 0);
  for (const Item& it : items) {
    auto& list = per_stage[it.stage];
    int64_t& bytes = filled[it.stage];
    if (list.empty() || bytes + it.bytes > bucket_bytes ||
        (list.back().items.back()->ep > 1) != (it.ep > 1)) {
      list.push_back(Bucket{it.stage, {}});
      bytes = 0;
    }
    list.back().items.push_back(&it);
    bytes += it.bytes;
  }
  std::vector<Bucket> out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (auto& list : per_stage)
      if (i < list.size()) {
        out.push_back(std::move(list[i]));
        any = true;
      }
    if (!any) break;
  }
  return out;
}

// The reshard of one call: the plan plus this rank's coordinates.
class Resharder {
 public:
  Resharder(const Transformer& train, Transformer& rollout, const ReshardOptions& options)
      : train_ps_(train.parallel()),
        t_tp_(train_ps_.tp().size),
        r_tp_(rollout.parallel().tp().size),
        t_rank_(train_ps_.coords().tp),
        r_rank_(rollout.parallel().coords().tp),
        stage_(train_ps_.coords().pp),
        ep_rank_(train_ps_.ep_rank()),
        device_(train_ps_.device()),
        // Equal TP sizes that pad the vocabulary differently split it
        // differently too: the owning stage gathers then as well.
        gather_(t_tp_ > 1 &&
                (t_tp_ != r_tp_ || train.padded_vocab_size() != rollout.padded_vocab_size())),
        items_(plan_items(rollout, train_ps_.config())),
        buckets_(make_buckets(items_, train_ps_.config().pp, options.bucket_bytes)) {
    // A LoRA model's rollout generates with its adapters merged in (new
    // tensors, held here for the whole reshard).
    for (const auto& [name, p] :
         train.lora_enabled() ? train.merged_params() : train.named_params())
      train_params_.emplace(name, p);
    // Check this rank's own training shards before any communication.
    for (const Item& it : items_) {
      if (it.stage != stage_) continue;
      auto found = train_params_.find(it.name);
      if (found == train_params_.end())
        throw EngineError(detail::cat("reshard_weights: training rank ", train_ps_.rank(),
                                      " (pp stage ", stage_, ") has no parameter ", it.name));
      auto want = it.shard_shape(t_tp_);
      if (found->second.sizes() != at::IntArrayRef(want))
        throw EngineError(detail::cat("reshard_weights: training rank ", train_ps_.rank(), "'s ",
                                      it.name, " is ", shape_str(found->second.sizes()),
                                      ", expected ", shape_str(want)));
    }
  }

  ReshardStats run() {
    ReshardStats stats;
    for (const Item& it : items_) stats.model_bytes += it.model_bytes();
    stats.buckets = static_cast<int64_t>(buckets_.size());
    // Two buckets in flight: the next one travels while this one is copied out.
    std::vector<InFlight> flights(buckets_.size());
    if (!buckets_.empty()) launch(buckets_[0], flights[0]);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (i + 1 < buckets_.size()) launch(buckets_[i + 1], flights[i + 1]);
      finish(buckets_[i], flights[i]);
    }
    stats.peak_buffer_bytes = peak_bytes_;
    return stats;
  }

 private:
  // A bucket's buffer (weight_stream.h): one region per training TP rank
  // when gathering, else one region with this rank's own shards. Each region
  // is one broadcast's payload.
  struct InFlight {
    bool direct = false;    // no communication: copy from the training params
    bool received = false;  // the owning stage sent this rank its slices, in place
    RegionLayout layout;
    at::Tensor buffer;
    // The owner's slices for other stages until sent; a receiver's staging
    // tensors for rollout parameters off the groups' device.
    std::vector<at::Tensor> staged;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // Regions per row of a bucket's buffer (one row per EP rank of an expert
  // bucket, else one).
  int64_t regions() const { return gather_ ? t_tp_ : 1; }

  static bool experts(const Bucket& b) { return b.items.front()->ep > 1; }

  RegionLayout layout_of(const Bucket& b) const {
    std::vector<const StreamTensor*> tensors(b.items.begin(), b.items.end());
    return region_layout(tensors, regions(), t_tp_);
  }

  // Item i's shard in region `k` of a buffer, typed and shaped.
  at::Tensor segment(const InFlight& f, const Bucket& b, size_t i, int64_t k) const {
    const Item& it = *b.items[i];
    const int64_t off = f.layout.offset[i][k];
    ENGINE_CHECK(off >= 0, it.name, ": no segment in region ", k);
    return at::from_blob(static_cast<uint8_t*>(f.buffer.data_ptr()) + off, it.shard_shape(t_tp_),
                         at::TensorOptions().dtype(it.dst.scalar_type()).device(f.buffer.device()));
  }

  void launch(const Bucket& b, InFlight& f) {
    const int64_t pp = train_ps_.config().pp;
    const bool owner = b.stage == stage_;
    // Expert buckets always travel: every rank holds only its EP rank's experts.
    if (pp == 1 && !gather_ && !experts(b)) {
      f.direct = true;
      return;
    }
    if (!owner) {
      // Another stage owns the bucket: it sends this rank its rollout slices,
      // straight into the rollout parameters (a scatter, not the whole
      // bucket).
      const Group& pg = train_ps_.pp();
      for (size_t i = 0; i < b.items.size(); ++i) {
        // Where the groups take tensors; a rollout parameter elsewhere gets
        // its slice through a staging tensor (copied in finish()).
        const at::Tensor& dst = b.items[i]->dst;
        at::Tensor into =
            dst.device() == device_ ? dst : at::empty(dst.sizes(), dst.options().device(device_));
        if (!into.is_same(dst)) stage(f, into);
        std::vector<at::Tensor> ts{into};
        f.works.push_back(pg.pg->recv(ts, static_cast<int>(b.stage), tag(b, i)));
      }
      f.received = true;
      return;
    }
    // This rank's stage owns the bucket. Without a TP gather (nor an EP
    // one) its own shards are the source (direct); with one, the bucket's
    // buffer.
    if (!gather_ && !experts(b)) {
      f.direct = true;
    } else {
      f.layout = layout_of(b);
      const int64_t total = f.layout.total;
      // Where the training groups carry tensors (the GPU for NCCL, else the
      // host); copies into and out of it move between devices as needed.
      f.buffer = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device_));
      hold(total);
      // This rank's region: its EP rank's row of an expert bucket.
      const int64_t row = experts(b) ? ep_rank_ : 0;
      const int64_t mine = row * regions() + (gather_ ? t_rank_ : 0);
      {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < b.items.size(); ++i)
          if (f.layout.offset[i][mine] >= 0)
            segment(f, b, i, mine).copy_(train_params_.at(b.items[i]->name));
      }
      // Gloo's all-gather copies through a temporary of the whole output;
      // one in-place broadcast per TP rank, all in flight at once, fills
      // the buffer with no second copy.
      if (gather_) {
        const Group& tp = train_ps_.tp();
        for (int64_t k = 0; k < t_tp_; ++k) {
          const int64_t region = row * regions() + k;
          if (f.layout.region_bytes[region] == 0) continue;
          std::vector<at::Tensor> ts{
              f.buffer.narrow(0, f.layout.region_begin[region], f.layout.region_bytes[region])};
          c10d::BroadcastOptions opts;
          opts.rootRank = k;
          f.works.push_back(tp.pg->broadcast(ts, opts));
        }
      }
      // Then each EP rank's row (complete once its TP gather is) over the EP
      // group, whose members share this rank's TP rank: one broadcast per row.
      if (experts(b)) {
        wait(f);
        const Group& ep = train_ps_.ep();
        for (int64_t j = 0; j < ep.size; ++j) {
          const int64_t first = j * regions();
          const int64_t begin = f.layout.region_begin[first];
          const int64_t end = f.layout.region_begin[first + regions() - 1] +
                              f.layout.region_bytes[first + regions() - 1];
          std::vector<at::Tensor> ts{f.buffer.narrow(0, begin, end - begin)};
          c10d::BroadcastOptions opts;
          opts.rootRank = j;
          f.works.push_back(ep.pg->broadcast(ts, opts));
        }
      }
    }
    if (pp > 1) {
      // The owning stage must hold the whole bucket before it cuts the other
      // stages' slices out of it: each gets only its rollout TP rank's.
      wait(f);
      at::NoGradGuard no_grad;
      const Group& pg = train_ps_.pp();
      for (int64_t d = 0; d < pg.size; ++d) {
        if (d == stage_) continue;  // pipeline group ranks are stages
        const int64_t r_rank = pg.ranks[static_cast<size_t>(d)] % r_tp_;
        for (size_t i = 0; i < b.items.size(); ++i) {
          const Item& it = *b.items[i];
          at::Tensor slice = at::empty(it.dst.sizes(), it.dst.options().device(device_));
          copy_slice(slice, b, f, i, r_rank);
          stage(f, slice);
          std::vector<at::Tensor> ts{slice};
          f.works.push_back(pg.pg->send(ts, static_cast<int>(d), tag(b, i)));
        }
      }
    }
  }

  // Bucket-buffer bytes now held, for peak_buffer_bytes.
  void hold(int64_t bytes) {
    live_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
  void stage(InFlight& f, const at::Tensor& t) {
    f.staged.push_back(t);
    hold(static_cast<int64_t>(t.nbytes()));
  }

  // One item's message: its place in the plan.
  int tag(const Bucket& b, size_t i) const { return static_cast<int>(b.items[i] - items_.data()); }

  static void wait(InFlight& f) {
    for (auto& w : f.works) w->wait();
    f.works.clear();
  }

  void finish(const Bucket& b, InFlight& f) {
    wait(f);
    if (f.received && !f.staged.empty()) {
      at::NoGradGuard no_grad;
      size_t s = 0;
      for (const Item* it : b.items)
        if (it->dst.device() != device_) it->dst.copy_(f.staged[s++]);
    }
    for (const auto& t : f.staged) live_bytes_ -= static_cast<int64_t>(t.nbytes());
    f.staged.clear();
    if (!f.received) {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < b.items.size(); ++i) copy_slice(b.items[i]->dst, b, f, i, r_rank_);
    }
    if (f.buffer.defined()) {
      live_bytes_ -= f.buffer.numel();
      f.buffer = at::Tensor();
    }
  }

  // Copies rollout TP rank r_rank's slice of item i into `dst` out of the
  // training shards this rank holds: all when gathered, else only its own
  // (then it is the rollout slice, or TP_t = 1 and it is everything).
  void copy_slice(const at::Tensor& dst, const Bucket& b, const InFlight& f, size_t i,
                  int64_t r_rank) {
    const Item& it = *b.items[i];
    // Shard j·t_tp + k: EP rank j's (0 but for experts), TP rank k's.
    auto shard = [&](int64_t index) -> at::Tensor {
      if (f.direct) return train_params_.at(it.name);
      const int64_t j = index / t_tp_, k = index % t_tp_;
      return segment(f, b, i, j * regions() + (gather_ ? k : 0));
    };
    if (it.replicated()) {
      dst.copy_(shard(0));
      return;
    }
    const int64_t k_begin = gather_ ? 0 : t_rank_;
    const int64_t k_end = gather_ ? t_tp_ : t_rank_ + 1;
    copy_tp_slice(dst, it, t_tp_, r_tp_, r_rank, k_begin, k_end, shard);
  }

  const ParallelState& train_ps_;
  const int64_t t_tp_, r_tp_;      // TP sizes: training, rollout
  const int64_t t_rank_, r_rank_;  // this rank's TP ranks
  const int64_t stage_;            // this rank's training pipeline stage
  const int64_t ep_rank_;          // this rank's EP rank: its experts' block
  const at::Device device_;        // the training groups': bucket buffers live there
  const bool gather_;              // the owning stage all-gathers its TP shards
  std::vector<Item> items_;
  std::vector<Bucket> buckets_;
  std::map<std::string, at::Tensor> train_params_;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace

std::shared_ptr<ParallelState> make_rollout_state(c10::intrusive_ptr<c10d::Store> store,
                                                  int64_t rank, const ParallelConfig& training,
                                                  int64_t rollout_tp, CollectiveBackend backend,
                                                  std::chrono::milliseconds timeout) {
  const int64_t world = training.world_size();
  if (rollout_tp < 1 || world % rollout_tp != 0)
    throw EngineError(detail::cat("make_rollout_state: rollout tp ", rollout_tp,
                                  " does not divide the training world of ", world, " ranks (",
                                  training.to_string(), ")"));
  ParallelConfig rollout;
  rollout.tp = rollout_tp;
  rollout.dp = world / rollout_tp;
  rollout.make_vocab_size_divisible_by = training.make_vocab_size_divisible_by;
  // Every rank makes its rollout states in the same order, so the n-th call's
  // prefix names the same groups everywhere; a fresh prefix per call keeps a
  // new state's rendezvous away from an earlier one's keys.
  static std::atomic<int64_t> calls{0};
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
      detail::cat("baton/rollout/", calls.fetch_add(1)), std::move(store));
  return ParallelState::create(prefixed, rank, rollout, timeout, backend);
}

ReshardStats reshard_weights(const Transformer& train, Transformer& rollout,
                             const ReshardOptions& options) {
  const auto t0 = Clock::now();
  if (options.bucket_bytes < 1)
    throw EngineError(
        detail::cat("reshard_weights: bucket_bytes must be positive, got ", options.bucket_bytes));
  validate(train, rollout);
  // Each rank checks its own shards; the world agrees on the outcome before
  // any bucket moves, so a bad shard fails every rank instead of hanging them.
  std::unique_ptr<Resharder> resharder;
  std::string problem;
  try {
    resharder = std::make_unique<Resharder>(train, rollout, options);
  } catch (const EngineError& e) {
    problem = e.what();
  }
  auto bad = at::full({1}, problem.empty() ? 0 : 1,
                      at::TensorOptions().dtype(at::kLong).device(train.parallel().device()));
  std::vector<at::Tensor> flag{bad};
  train.parallel().world().pg->allreduce(flag)->wait();
  if (!problem.empty()) throw EngineError(problem);
  if (bad.item<int64_t>() > 0)
    throw EngineError(detail::cat("reshard_weights: ", bad.item<int64_t>(),
                                  " other training rank(s) found shards that do not fit the "
                                  "model (see their errors); nothing was moved"));
  ReshardStats stats = resharder->run();
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

}  // namespace baton::engine
