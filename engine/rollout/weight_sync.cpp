#include "engine/rollout/weight_sync.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "base/profiler.h"
#include "engine/errors.h"
#include "engine/rollout/weight_stream.h"

namespace baton::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Items in whole_model_tensors() order (weight_stream.h), cut into buckets at
// stage changes, between expert tensors split over EP and the others, and at
// `bucket_bytes`. Region k of a bucket's buffer holds training TP rank k's
// shards (replicated tensors in region 0 only); an expert bucket's region
// j·tp + k those of EP rank j, TP rank k (region_layout).
struct Bucket {
  int64_t stage = 0;
  std::vector<const StreamTensor*> items;
  RegionLayout layout;
};

struct Plan {
  std::vector<StreamTensor> items;
  std::vector<Bucket> buckets;
  int64_t model_bytes = 0;
};

Plan make_plan(const ModelConfig& cfg, bool value_model, const ParallelConfig& training,
               int64_t element_size, int64_t bucket_bytes) {
  Plan plan;
  plan.items = stream_tensors(cfg, value_model, training, element_size);
  int64_t filled = 0;
  for (const StreamTensor& it : plan.items) {
    plan.model_bytes += it.model_bytes();
    if (plan.buckets.empty() || plan.buckets.back().stage != it.stage ||
        (plan.buckets.back().items.back()->ep > 1) != (it.ep > 1) ||
        filled + it.bytes > bucket_bytes) {
      plan.buckets.push_back(Bucket{it.stage, {}, {}});
      filled = 0;
    }
    plan.buckets.back().items.push_back(&it);
    filled += it.bytes;
  }
  for (Bucket& b : plan.buckets) b.layout = region_layout(b.items, training.tp, training.tp);
  return plan;
}

// A digest of everything both sides must agree on: each tensor's full shape
// and owning stage, and each bucket's size.
int64_t plan_digest(const Plan& plan) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over 64-bit words
  auto mix = [&h](int64_t v) {
    h ^= static_cast<uint64_t>(v);
    h *= 1099511628211ULL;
  };
  for (const StreamTensor& it : plan.items) {
    mix(it.stage);
    mix(it.ep);
    for (int64_t d : it.full) mix(d);
    mix(-1);
  }
  for (const Bucket& b : plan.buckets) mix(b.layout.total);
  return static_cast<int64_t>(h);
}

int64_t largest_bucket(const Plan& plan) {
  int64_t most = 0;
  for (const Bucket& b : plan.buckets) most = std::max(most, b.layout.total);
  return most;
}

// Item i's shard of region k in `buffer`, typed and shaped.
at::Tensor segment(const at::Tensor& buffer, const Bucket& b, size_t i, int64_t k, int64_t tp,
                   at::ScalarType dtype) {
  ENGINE_CHECK(b.layout.offset[i][k] >= 0, b.items[i]->name, ": no segment in region ", k);
  return at::from_blob(static_cast<uint8_t*>(buffer.data_ptr()) + b.layout.offset[i][k],
                       b.items[i]->shard_shape(tp),
                       at::TensorOptions().dtype(dtype).device(buffer.device()));
}

// Item i's shard in `region`, a buffer holding region k of a bucket only.
at::Tensor region_segment(const at::Tensor& region, const Bucket& b, size_t i, int64_t k,
                          int64_t tp, at::ScalarType dtype) {
  return at::from_blob(
      static_cast<uint8_t*>(region.data_ptr()) + b.layout.offset[i][k] - b.layout.region_begin[k],
      b.items[i]->shard_shape(tp), at::TensorOptions().dtype(dtype).device(region.device()));
}

// A receiver's rollout layout, as the sender needs it to know which shards
// go where: its TP size and rank and its padded vocabulary rows.
struct ReceiverLayout {
  int64_t tp = 1, rank = 0, vocab_rows = 0;
};

// Whether TP shard k of t's t_tp-way split holds rows of the receiver's
// slice (as copy_tp_slice takes them: real rows only). A replicated tensor
// travels from TP rank 0 only.
bool shard_needed(const StreamTensor& t, int64_t t_tp, int64_t k, const ReceiverLayout& r) {
  if (t.replicated()) return k == 0;
  const int64_t block = t.full[t.split.dim] / t.split.blocks;
  const int64_t real = t.vocab > 0 ? t.vocab : block;
  const int64_t t_len = block / t_tp;
  const int64_t r_len = (t.vocab > 0 ? r.vocab_rows : block) / r.tp;
  const int64_t lo = std::max(r.rank * r_len, k * t_len);
  const int64_t hi = std::min({(r.rank + 1) * r_len, (k + 1) * t_len, real});
  return lo < hi;
}

// Each shard of a send is one message, tagged by the tensor's place in the
// stream and the shard's TP rank (an expert tensor's EP ranks send from
// different sync ranks, which tells their shards apart).
int tag_of(const Plan& plan, const StreamTensor* t, int64_t k, int64_t t_tp) {
  return static_cast<int>((t - plan.items.data()) * t_tp + k);
}

// Bucket buffers reused within one send or receive: a returned buffer serves
// the next bucket that fits, since fresh pages for every bucket cost a page
// fault per 4 KB. When none fits, the pooled ones are let go first, so the
// bytes held stay within the two largest buffers in use at once.
class BufferPool {
 public:
  // Buffers of `options` (bytes; a device, or pinned host memory).
  explicit BufferPool(at::TensorOptions options = at::TensorOptions().dtype(at::kByte))
      : options_(options.dtype(at::kByte)) {}

  // A buffer of exactly `bytes` (a view of a possibly larger one).
  at::Tensor take(int64_t bytes) {
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].numel() < bytes) continue;
      at::Tensor base = free_[i];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return base.narrow(0, 0, bytes);
    }
    clear();
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    return at::empty({bytes}, options_);
  }
  // Gives a buffer from take() back (the whole allocation behind the view).
  void give(at::Tensor& buffer) {
    const auto capacity = static_cast<int64_t>(buffer.storage().nbytes());
    free_.push_back(at::empty({0}, buffer.options()).set_(buffer.storage(), 0, {capacity}));
    buffer = at::Tensor();
  }
  // Frees the pooled buffers and starts a new peak.
  void reset() {
    clear();
    peak_ = held_;
  }
  int64_t peak() const { return peak_; }
  // Starts a new peak, keeping the pooled buffers (their pages stay mapped).
  void new_peak() { peak_ = held_; }

 private:
  void clear() {
    for (const auto& t : free_) held_ -= t.numel();
    free_.clear();
  }

  at::TensorOptions options_;
  std::vector<at::Tensor> free_;
  int64_t held_ = 0, peak_ = 0;
};

// Pinned host memory when `device` is a GPU (fast, asynchronous-capable
// copies); plain host memory otherwise, since pinning needs a CUDA device.
at::TensorOptions host_staging(const at::Device& device) {
  return at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda());
}

// The header rank 0 broadcasts before the buckets.
enum Header : int64_t {
  kVersion,
  kItems,
  kModelBytes,
  kDtype,
  kTrainingTp,
  kTrainingPp,
  kTrainingEp,
  kTrainingVocabRows,  // the training layout's padded vocabulary (vocab_padding.h)
  kBucketBytes,
  kValueModel,
  kBuckets,
  kPlanDigest,
  kTrainerOk,  // 0 when a training rank failed its own checks: nothing follows
  kHeaderSize
};

// The sync group's training ranks: every (stage, TP rank) of the first
// data-parallel replica, under expert parallelism of each of the first ep
// dp ranks (one per EP rank: they hold different experts).
int64_t sync_senders(const ParallelConfig& training) {
  return training.tp * training.pp * training.ep;
}

// The sync rank of the sender of region `region` of a stage's bucket: EP
// rank region / tp, TP rank region % tp (trainer_sync_rank).
int64_t sender_of(const ParallelConfig& training, int64_t stage, int64_t region) {
  const int64_t j = region / training.tp, k = region % training.tp;
  return (j * training.pp + stage) * training.tp + k;
}

void wait_all(std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  for (auto& w : works) w->wait();
  works.clear();
}

// Every member's layout over the sync group (collective); returns the
// receivers' (the members from `trainers` on).
std::vector<ReceiverLayout> gather_layouts(c10d::ProcessGroup& sync, const ReceiverLayout& mine,
                                           int64_t trainers) {
  auto t = at::tensor(std::vector<int64_t>{mine.tp, mine.rank, mine.vocab_rows}, at::kLong);
  std::vector<at::Tensor> in{t};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int64_t r = 0; r < sync.getSize(); ++r) out[0].push_back(at::empty({3}, at::kLong));
  sync.allgather(out, in)->wait();
  std::vector<ReceiverLayout> layouts;
  for (int64_t r = trainers; r < sync.getSize(); ++r) {
    const int64_t* v = out[0][static_cast<size_t>(r)].data_ptr<int64_t>();
    layouts.push_back(ReceiverLayout{v[0], v[1], v[2]});
  }
  return layouts;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> make_sync_group(c10::intrusive_ptr<c10d::Store> store,
                                                       const std::string& name, int64_t rank,
                                                       int64_t size,
                                                       std::chrono::milliseconds timeout) {
  if (name.empty()) throw EngineError("make_sync_group: the group needs a name");
  auto prefixed =
      c10::make_intrusive<c10d::PrefixStore>("baton/weight_sync/" + name, std::move(store));
  return make_gloo_group(prefixed, rank, size, timeout, "weight_sync:" + name);
}

int64_t trainer_sync_rank(const ParallelState& ps) {
  const Coords& c = ps.coords();
  const ParallelConfig& pc = ps.config();
  if (c.dp >= pc.ep || c.cp != 0) return -1;
  return (c.dp * pc.pp + c.pp) * pc.tp + c.tp;  // dp < ep: the EP rank
}

int64_t receiver_sync_rank(const ParallelConfig& training, int64_t rollout_rank) {
  return sync_senders(training) + rollout_rank;
}

int64_t sync_group_size(const ParallelConfig& training, int64_t rollout_world) {
  return sync_senders(training) + rollout_world;
}

// ---------------------------------------------------------------- sender

class WeightSender::Impl {
 public:
  Impl(std::shared_ptr<Transformer> train, c10::intrusive_ptr<c10d::ProcessGroup> sync,
       WeightSyncOptions options)
      : train_(std::move(train)), sync_(std::move(sync)), options_(options) {
    const ParallelState& ps = train_->parallel();
    const int64_t me = trainer_sync_rank(ps), trainers = sync_senders(ps.config());
    if (me >= 0 && !sync_)
      throw EngineError(detail::cat("WeightSender: training rank ", ps.rank(),
                                    " is a sender (the first data-parallel replica, or under "
                                    "expert parallelism dp < ep) and needs the sync group "
                                    "(make_sync_group with trainer_sync_rank = ",
                                    me, ")"));
    if (me < 0) sync_.reset();  // the others take part in the handshake only
    if (sync_ && (sync_->getRank() != me || sync_->getSize() <= trainers))
      throw EngineError(detail::cat("WeightSender: training rank ", ps.rank(), " has sync rank ",
                                    sync_->getRank(), " of ", sync_->getSize(), ", expected ", me,
                                    " of ", trainers, " + the rollout ranks (sync_group_size)"));
    if (options_.bucket_bytes < 1)
      throw EngineError(
          detail::cat("WeightSender: bucket_bytes must be positive, got ", options_.bucket_bytes));
    for (const auto& [name, p] : train_->named_params()) {
      if (params_.empty()) dtype_ = p.scalar_type();
      if (p.scalar_type() != dtype_)
        throw EngineError(detail::cat("WeightSender: parameter ", name, " is ", p.scalar_type(),
                                      " but the others are ", dtype_));
      params_.emplace(name, p);
    }
    // The training groups' device (the GPU for NCCL) for the handshake's
    // flags; the sync group (Gloo) carries host memory.
    device_ = ps.device();
    pool_ = BufferPool(host_staging(device_));
    plan_ = make_plan(train_->config(), train_->options().value_model, ps.config(),
                      static_cast<int64_t>(c10::elementSize(dtype_)), options_.bucket_bytes);
    // This rank's shards, checked now; send() tells every party before streaming.
    for (const StreamTensor& it : plan_.items) {
      if (it.stage != ps.coords().pp) continue;
      auto p = params_.find(it.name);
      auto want = it.shard_shape(ps.config().tp);
      if (p == params_.end())
        problem_ += detail::cat(" no parameter ", it.name, ";");
      else if (p->second.sizes() != at::IntArrayRef(want))
        problem_ += detail::cat(" ", it.name, " is ", p->second.sizes(), ", expected ",
                                at::IntArrayRef(want), ";");
    }
  }

  WeightSyncStats send(int64_t version) {
    pool_.new_peak();
    const auto t0 = Clock::now();
    const ParallelState& ps = train_->parallel();
    handshake(version);
    WeightSyncStats stats;
    stats.version = version;
    stats.model_bytes = plan_.model_bytes;
    stats.buckets = static_cast<int64_t>(plan_.buckets.size());
    stats.largest_bucket_bytes = largest_bucket(plan_);
    if (sync_) {
      // A LoRA model sends its weights with the adapters merged in, made
      // now (the adapters have trained since the last send) and held until
      // every message that reads them has gone.
      std::map<std::string, at::Tensor> merged;
      if (train_->lora_enabled())
        for (const auto& [name, p] : train_->merged_params()) merged.emplace(name, p);
      const std::map<std::string, at::Tensor>& params = merged.empty() ? params_ : merged;
      // Each sender (a training rank of the first replica; under EP, of the first ep) sends its own
      // shards of its stage's buckets straight to the receivers that need them (those whose rollout
      // slice they overlap), one message per shard: no gathering hop among the trainers. Shards go
      // out of the parameters themselves when they are contiguous host memory, else through a host
      // buffer per bucket (a GPU model). At most two buckets in flight.
      const int64_t trainers = sync_senders(ps.config());
      const int64_t t_tp = ps.config().tp, k = ps.coords().tp;
      // This rank's region of a bucket: under EP, its EP rank's row of an
      // expert bucket; the rows of the others are EP rank 0's alone.
      const int64_t ep_rank = ps.coords().dp;
      std::deque<std::pair<at::Tensor, std::vector<c10::intrusive_ptr<c10d::Work>>>> flying;
      for (const Bucket& bucket : plan_.buckets) {
        const bool experts = bucket.items.front()->ep > 1;
        if (bucket.stage != ps.coords().pp || (!experts && ep_rank > 0)) continue;
        const int64_t region = (experts ? ep_rank * t_tp : 0) + k;
        if (bucket.layout.region_bytes[region] == 0) continue;
        bool in_place = true;
        for (size_t i = 0; i < bucket.items.size(); ++i) {
          if (bucket.layout.offset[i][region] < 0) continue;
          const at::Tensor& p = params.at(bucket.items[i]->name);
          in_place = in_place && p.device().is_cpu() && p.is_contiguous();
        }
        at::Tensor buf = in_place ? at::Tensor() : fill_region(bucket, region, params);
        std::vector<c10::intrusive_ptr<c10d::Work>> works;
        for (size_t i = 0; i < bucket.items.size(); ++i) {
          if (bucket.layout.offset[i][region] < 0) continue;
          const StreamTensor& t = *bucket.items[i];
          at::Tensor src = in_place ? params.at(t.name).detach()
                                    : region_segment(buf, bucket, i, region, t_tp, dtype_);
          for (size_t j = 0; j < receivers_.size(); ++j) {
            if (!shard_needed(t, t_tp, k, receivers_[j])) continue;
            std::vector<at::Tensor> ts{src};
            stats.transferred_bytes += static_cast<int64_t>(src.nbytes());
            works.push_back(sync_->send(ts, static_cast<int>(trainers + static_cast<int64_t>(j)),
                                        tag_of(plan_, &t, k, t_tp)));
          }
        }
        flying.emplace_back(buf, std::move(works));
        if (flying.size() > 1) {
          wait_all(flying.front().second);
          if (flying.front().first.defined()) pool_.give(flying.front().first);
          flying.pop_front();
        }
      }
      for (auto& [buf, works] : flying) {
        wait_all(works);
        if (buf.defined()) pool_.give(buf);
      }
    }
    stats.peak_buffer_bytes = pool_.peak();
    if (!options_.keep_buffers) pool_.reset();
    stats.seconds = seconds_since(t0);
    return stats;
  }

 private:
  // The training ranks agree that their shards are sound; rank 0 tells the
  // receivers what comes (or that nothing does); their verdicts come back
  // summed and the training world learns the outcome, so all fail together.
  // Every member of the sync group (the senders) takes part in
  // its broadcast and all-reduce.
  void handshake(int64_t version) {
    const ParallelState& ps = train_->parallel();
    // Flags over the training world on its groups' device, over the sync
    // group on the host.
    auto trainer_bad = at::full({1}, problem_.empty() ? 0 : 1,
                                at::TensorOptions().dtype(at::kLong).device(device_));
    {
      std::vector<at::Tensor> ts{trainer_bad};
      ps.world().pg->allreduce(ts)->wait();
    }
    const bool trainer_ok = trainer_bad.item<int64_t>() == 0;
    auto rejected = at::zeros({1}, at::kLong);
    if (sync_) {
      auto header = at::zeros({kHeaderSize}, at::kLong);
      auto h = header.accessor<int64_t, 1>();
      h[kVersion] = version;
      h[kItems] = static_cast<int64_t>(plan_.items.size());
      h[kModelBytes] = plan_.model_bytes;
      h[kDtype] = static_cast<int64_t>(dtype_);
      h[kTrainingTp] = ps.config().tp;
      h[kTrainingPp] = ps.config().pp;
      h[kTrainingEp] = ps.config().ep;
      h[kTrainingVocabRows] = train_->padded_vocab_size();
      h[kBucketBytes] = options_.bucket_bytes;
      h[kValueModel] = train_->options().value_model ? 1 : 0;
      h[kBuckets] = static_cast<int64_t>(plan_.buckets.size());
      h[kPlanDigest] = plan_digest(plan_);
      h[kTrainerOk] = trainer_ok ? 1 : 0;
      std::vector<at::Tensor> ts{header};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      sync_->broadcast(ts, opts)->wait();
      receivers_ = gather_layouts(*sync_, ReceiverLayout{}, sync_senders(ps.config()));
      std::vector<at::Tensor> verdict{rejected};
      sync_->allreduce(verdict)->wait();
    }
    if (!trainer_ok)
      throw EngineError(detail::cat("WeightSender (training rank ", ps.rank(), "): ",
                                    problem_.empty() ? std::string(" another training rank's "
                                                                   "shards do not fit the model;")
                                                     : problem_,
                                    " nothing was sent"));
    std::vector<at::Tensor> ts{rejected.to(device_)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    ps.world().pg->broadcast(ts, opts)->wait();
    int64_t n = ts[0].item<int64_t>();
    if (n > 0)
      throw EngineError(detail::cat("WeightSender: ", n,
                                    " rollout rank(s) rejected the weights (their model or "
                                    "options differ; see their errors); nothing was sent"));
  }

  // Region `region` of a bucket: this rank's shards of `params`, in host
  // memory (copied from the GPU when the model is there).
  at::Tensor fill_region(const Bucket& b, int64_t region,
                         const std::map<std::string, at::Tensor>& params) {
    at::NoGradGuard no_grad;
    const int64_t t_tp = train_->parallel().config().tp;
    at::Tensor buf = pool_.take(b.layout.region_bytes[region]);
    for (size_t i = 0; i < b.items.size(); ++i)
      if (b.layout.offset[i][region] >= 0)
        region_segment(buf, b, i, region, t_tp, dtype_).copy_(params.at(b.items[i]->name));
    return buf;
  }

  std::shared_ptr<Transformer> train_;
  c10::intrusive_ptr<c10d::ProcessGroup> sync_;  // null but on the senders (trainer_sync_rank)
  WeightSyncOptions options_;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;  // the training groups' (ParallelState::device)
  std::map<std::string, at::Tensor> params_;
  Plan plan_;
  std::string problem_;  // this rank's shards that do not fit the model
  BufferPool pool_;      // host memory (pinned beside a GPU): regions on their way
  std::vector<ReceiverLayout> receivers_;  // by receiver (sync rank - trainers)
};

WeightSender::WeightSender(std::shared_ptr<Transformer> train,
                           c10::intrusive_ptr<c10d::ProcessGroup> sync, WeightSyncOptions options)
    : impl_(std::make_unique<Impl>(std::move(train), std::move(sync), options)) {}
WeightSender::~WeightSender() = default;
WeightSyncStats WeightSender::send(int64_t version) {
  BATON_PROFILE_SCOPE("engine", "weight sync (send)");
  return impl_->send(version);
}

// ---------------------------------------------------------------- receiver

class WeightReceiver::Impl {
 public:
  Impl(std::shared_ptr<Transformer> rollout, const ParallelConfig& training,
       c10::intrusive_ptr<c10d::ProcessGroup> sync, WeightSyncOptions options)
      : rollout_(std::move(rollout)),
        training_(training),
        sync_(std::move(sync)),
        options_(options) {
    if (!rollout_->first_stage() || !rollout_->last_stage())
      throw EngineError("WeightReceiver: the rollout model must be one stage (pp = 1)");
    ENGINE_CHECK(sync_, "WeightReceiver: no sync group");
    if (sync_->getRank() < sync_senders(training_))
      throw EngineError(detail::cat("WeightReceiver: sync rank ", sync_->getRank(),
                                    " belongs to a trainer (the first ", sync_senders(training_),
                                    " ranks); use receiver_sync_rank"));
    for (const auto& [name, p] : rollout_->named_params()) params_.emplace(name, p);
  }

  WeightSyncStats receive() {
    const auto t0 = Clock::now();
    pool_.new_peak();
    const ReceiverLayout me = layout();
    const at::Tensor header = handshake(me);
    auto h = header.accessor<int64_t, 1>();
    const Placement where{training_.tp, me, static_cast<at::ScalarType>(h[kDtype])};
    WeightSyncStats stats;
    stats.version = h[kVersion];
    stats.model_bytes = plan_.model_bytes;
    stats.buckets = static_cast<int64_t>(plan_.buckets.size());
    stats.largest_bucket_bytes = largest_bucket(plan_);
    // Two buckets posted at once: the next arrives while this one is copied
    // out.
    const std::vector<size_t> order = bucket_order();
    std::deque<PostedBucket> posted;
    if (!order.empty()) posted.push_back(post(order[0], where, stats));
    at::NoGradGuard no_grad;
    for (size_t n = 0; n < order.size(); ++n) {
      if (n + 1 < order.size()) posted.push_back(post(order[n + 1], where, stats));
      PostedBucket p = std::move(posted.front());
      posted.pop_front();
      wait_all(p.works);
      unpack(p, where);
    }
    stats.peak_buffer_bytes = pool_.peak();
    if (!options_.keep_buffers) pool_.reset();
    stats.seconds = seconds_since(t0);
    return stats;
  }

 private:
  // Where one receive's shards go: the trainer's TP size, this rank's rollout
  // layout and the stream's dtype.
  struct Placement {
    int64_t t_tp;
    ReceiverLayout me;  // me.tp: the rollout's TP size; me.rank: this rank's
    at::ScalarType dtype;
  };

  // A bucket whose shards are on their way.
  struct PostedBucket {
    size_t bucket;
    at::Tensor buf;  // undefined when every shard lands in place
    std::vector<bool> in_place;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // This rank's rollout layout, as the sender needs it.
  ReceiverLayout layout() const {
    return ReceiverLayout{rollout_->parallel().tp().size, rollout_->parallel().coords().tp,
                          rollout_->padded_vocab_size()};
  }

  // This rank's part of WeightSender's handshake: takes the header, sends
  // `me`, checks the header against this model (building the plan) and
  // joins the verdict. Returns the header; throws EngineError, after the
  // verdict, when the trainer, this rank or another rollout rank rejected.
  at::Tensor handshake(const ReceiverLayout& me) {
    auto header = at::zeros({kHeaderSize}, at::kLong);
    {
      std::vector<at::Tensor> ts{header};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      sync_->broadcast(ts, opts)->wait();
    }
    gather_layouts(*sync_, me, sync_senders(training_));
    auto h = header.accessor<int64_t, 1>();
    if (h[kTrainerOk] == 0) {
      // The trainer failed its own checks; it still counts on our verdict.
      std::vector<at::Tensor> verdict{at::zeros({1}, at::kLong)};
      sync_->allreduce(verdict)->wait();
      throw EngineError(
          "WeightReceiver: the trainer's shards failed its own checks; "
          "nothing was sent (see the trainer's error)");
    }
    std::string problem;
    try {
      problem = check(h);
    } catch (const std::exception& e) {
      problem = e.what();
    }
    auto rejected = at::full({1}, problem.empty() ? 0 : 1, at::kLong);
    std::vector<at::Tensor> verdict{rejected};
    sync_->allreduce(verdict)->wait();
    if (!problem.empty()) throw EngineError("WeightReceiver: " + problem);
    if (rejected.item<int64_t>() > 0)
      throw EngineError(detail::cat("WeightReceiver: ", rejected.item<int64_t>(),
                                    " other rollout rank(s) rejected the weights"));
    return header;
  }

  // Whether the whole parameter is shard me.rank (same TP size and padding).
  bool whole(const StreamTensor& t, const Placement& where) const {
    return t.replicated() ||
           (where.t_tp == where.me.tp &&
            params_.at(t.name).sizes() == at::IntArrayRef(t.shard_shape(where.t_tp)));
  }

  // Whether t's shards land in the rollout parameter itself: the shards this
  // rank needs are a contiguous run of the parameter's rows (same dtype,
  // host memory). Else they land in the bucket's host buffer, copied out by
  // copy_tp_slice.
  bool lands_in_place(const StreamTensor& t, const Placement& where) const {
    const at::Tensor& dst = params_.at(t.name);
    if (!dst.device().is_cpu() || !dst.is_contiguous() || dst.scalar_type() != where.dtype)
      return false;
    if (whole(t, where)) return true;
    // Under EP, EP rank j's shard of an expert tensor is the experts
    // [j·E/ep, (j+1)·E/ep) of the parameter when the TP split is the same.
    if (t.ep > 1)
      return where.t_tp == where.me.tp && dst.size(t.split.dim) * where.t_tp == t.full[t.split.dim];
    if (t.split.dim != 0 || t.split.blocks != 1) return false;
    const int64_t t_tp = where.t_tp, r_rank = where.me.rank;
    const int64_t t_len = t.full[0] / t_tp, r_len = dst.size(0);
    for (int64_t k = 0; k < t_tp; ++k)
      if (shard_needed(t, t_tp, k, where.me) &&
          (k * t_len < r_rank * r_len || (k + 1) * t_len > (r_rank + 1) * r_len))
        return false;
    return true;
  }

  // Posts the receives of bucket b: each shard this rank needs is one
  // message from the sync rank that holds it (sender_of: stage, EP rank, TP
  // rank k).
  PostedBucket post(size_t b, const Placement& where, WeightSyncStats& stats) {
    const Bucket& bucket = plan_.buckets[b];
    const int64_t t_tp = where.t_tp;
    PostedBucket p{b, {}, std::vector<bool>(bucket.items.size()), {}};
    for (size_t i = 0; i < bucket.items.size(); ++i) {
      p.in_place[i] = lands_in_place(*bucket.items[i], where);
      if (!p.in_place[i] && !p.buf.defined()) p.buf = pool_.take(bucket.layout.total);
    }
    const auto regions = static_cast<int64_t>(bucket.layout.region_begin.size());
    for (size_t i = 0; i < bucket.items.size(); ++i) {
      const StreamTensor& t = *bucket.items[i];
      for (int64_t region = 0; region < regions; ++region) {
        const int64_t k = region % t_tp;
        if (bucket.layout.offset[i][region] < 0 || !shard_needed(t, t_tp, k, where.me)) continue;
        at::Tensor into;
        if (!p.in_place[i]) {
          into = segment(p.buf, bucket, i, region, t_tp, where.dtype);
        } else if (whole(t, where)) {
          into = params_.at(t.name).detach();
        } else if (t.ep > 1) {
          const int64_t n = t.full[0] / t.ep;
          into = params_.at(t.name).detach().narrow(0, region / t_tp * n, n);
        } else {
          const at::Tensor& dst = params_.at(t.name);
          const int64_t t_len = t.full[0] / t_tp;
          into = dst.detach().narrow(0, k * t_len - where.me.rank * dst.size(0), t_len);
        }
        std::vector<at::Tensor> ts{into};
        stats.transferred_bytes += static_cast<int64_t>(into.nbytes());
        p.works.push_back(sync_->recv(ts,
                                      static_cast<int>(sender_of(training_, bucket.stage, region)),
                                      tag_of(plan_, &t, k, t_tp)));
      }
    }
    return p;
  }

  // After p's receives completed: copies the buffered shards into the
  // parameters, zeroes the padding rows of those that landed in place, and
  // returns the buffer to the pool.
  void unpack(PostedBucket& p, const Placement& where) {
    const Bucket& bucket = plan_.buckets[p.bucket];
    const int64_t t_tp = where.t_tp, r_rank = where.me.rank;
    for (size_t i = 0; i < bucket.items.size(); ++i) {
      const StreamTensor& it = *bucket.items[i];
      at::Tensor dst = params_.at(it.name);
      if (p.in_place[i]) {
        // This layout's padding rows of a vocabulary tensor (the trainer's
        // may hold anything, or not have come at all).
        if (it.vocab > 0) {
          const int64_t first = std::max(it.vocab - r_rank * dst.size(0), int64_t{0});
          if (first < dst.size(0)) dst.detach().narrow(0, first, dst.size(0) - first).zero_();
        }
        continue;
      }
      auto shard = [&](int64_t k) { return segment(p.buf, bucket, i, k, t_tp, where.dtype); };
      if (it.replicated())
        dst.copy_(shard(0));
      else
        copy_tp_slice(dst, it, t_tp, where.me.tp, r_rank, 0, t_tp, shard);
    }
    if (p.buf.defined()) pool_.give(p.buf);
  }

  // The buckets in the order they are received: the stages' taken in turn,
  // so that the two posted at once come from different stages' ranks, which
  // then send at the same time.
  std::vector<size_t> bucket_order() const {
    std::vector<size_t> order;
    std::vector<std::vector<size_t>> by_stage(static_cast<size_t>(training_.pp));
    for (size_t b = 0; b < plan_.buckets.size(); ++b)
      by_stage[static_cast<size_t>(plan_.buckets[b].stage)].push_back(b);
    for (size_t i = 0; order.size() < plan_.buckets.size(); ++i)
      for (const auto& list : by_stage)
        if (i < list.size()) order.push_back(list[i]);
    return order;
  }

  // Empty when the header fits this model; else what differs. Builds the plan.
  std::string check(at::TensorAccessor<int64_t, 1> h) {
    std::vector<std::string> diffs;
    auto cmp = [&](const char* what, int64_t sender, int64_t mine) {
      if (sender != mine) diffs.push_back(detail::cat(what, " ", sender, " vs ", mine));
    };
    cmp("training tp", h[kTrainingTp], training_.tp);
    cmp("training pp", h[kTrainingPp], training_.pp);
    cmp("training ep", h[kTrainingEp], training_.ep);
    // The stream carries the trainer's padding rows: both sides must agree on them.
    cmp("training padded vocab_size (make_vocab_size_divisible_by x tp)", h[kTrainingVocabRows],
        training_.padded_vocab_size(rollout_->config().vocab_size));
    cmp("bucket_bytes", h[kBucketBytes], options_.bucket_bytes);
    cmp("value model", h[kValueModel], rollout_->options().value_model ? 1 : 0);
    if (h[kDtype] < 0 || h[kDtype] >= static_cast<int64_t>(at::ScalarType::NumOptions))
      diffs.push_back(detail::cat("unknown dtype code ", h[kDtype]));
    if (!diffs.empty()) return join("the sender's header differs (sender vs this rank):", diffs);
    const auto dtype = static_cast<at::ScalarType>(h[kDtype]);
    plan_ = make_plan(rollout_->config(), rollout_->options().value_model, training_,
                      static_cast<int64_t>(c10::elementSize(dtype)), options_.bucket_bytes);
    cmp("tensors", h[kItems], static_cast<int64_t>(plan_.items.size()));
    cmp("model bytes", h[kModelBytes], plan_.model_bytes);
    cmp("buckets", h[kBuckets], static_cast<int64_t>(plan_.buckets.size()));
    if (diffs.empty() && h[kPlanDigest] != plan_digest(plan_))
      diffs.push_back(
          "tensor shapes, stages or layer split (the plan digests differ: check "
          "training.layer_split and the model config)");
    size_t found = 0;
    for (const StreamTensor& it : plan_.items) {
      auto p = params_.find(it.name);
      if (p == params_.end()) {
        diffs.push_back("missing " + it.name);
        continue;
      }
      ++found;
      auto want = it.shard_shape_in(rollout_->parallel().config());
      if (p->second.sizes() != at::IntArrayRef(want))
        diffs.push_back(
            detail::cat(it.name, " is ", p->second.sizes(), ", expected ", at::IntArrayRef(want)));
    }
    if (found != params_.size())
      diffs.push_back(
          detail::cat(params_.size() - found, " rollout parameter(s) not in the stream"));
    if (!diffs.empty())
      return join("the sender's model does not fit this rollout model (sender vs this rank):",
                  diffs);
    return "";
  }

  static std::string join(const std::string& head, const std::vector<std::string>& parts) {
    std::string out = head;
    for (const auto& p : parts) out += " " + p + ";";
    return out;
  }

  std::shared_ptr<Transformer> rollout_;
  ParallelConfig training_;
  c10::intrusive_ptr<c10d::ProcessGroup> sync_;
  WeightSyncOptions options_;
  std::map<std::string, at::Tensor> params_;
  Plan plan_;
  BufferPool pool_;
};

WeightReceiver::WeightReceiver(std::shared_ptr<Transformer> rollout, const ParallelConfig& training,
                               c10::intrusive_ptr<c10d::ProcessGroup> sync,
                               WeightSyncOptions options)
    : impl_(std::make_unique<Impl>(std::move(rollout), training, std::move(sync), options)) {}
WeightReceiver::~WeightReceiver() = default;
WeightSyncStats WeightReceiver::receive() {
  BATON_PROFILE_SCOPE("engine", "weight sync (receive)");
  return impl_->receive();
}

}  // namespace baton::engine
