#include "engine/parallel/parallel_state.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if defined(BATON_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <array>
#include <cstdlib>
#include <map>

#include "engine/errors.h"

namespace baton::engine {
namespace {

constexpr const char* kStorePrefix = "baton/parallel_state/";
constexpr int kNumGroupKinds = static_cast<int>(GroupKind::kExpertData) + 1;

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

// Which coordinates a rank shares with the other members of its group.
struct Fixed {
  bool tp, cp, dp, pp;
};

Fixed fixed_coords(GroupKind kind) {
  switch (kind) {
    case GroupKind::kWorld:
      return {false, false, false, false};
    case GroupKind::kTensor:
      return {false, true, true, true};
    case GroupKind::kContext:
      return {true, false, true, true};
    case GroupKind::kData:
      return {true, true, false, true};
    case GroupKind::kDataContext:
      return {true, false, false, true};
    case GroupKind::kPipeline:
    case GroupKind::kEmbedding:
      return {true, true, true, false};
    case GroupKind::kModel:
      return {false, true, true, false};
    case GroupKind::kExpert:  // dp within the EP block (group_ranks)
      return {true, true, false, true};
    case GroupKind::kExpertData:  // dp with the same EP rank (group_ranks)
      return {true, false, false, true};
  }
  ENGINE_CHECK(false, "unknown group kind ", static_cast<int>(kind));
}

}  // namespace

void ParallelConfig::validate(int64_t world_size) const {
  if (tp < 1 || cp < 1 || dp < 1 || pp < 1)
    throw EngineError("parallel config " + to_string() + ": every size must be at least 1");
  if (make_vocab_size_divisible_by < 1)
    throw EngineError("parallel config " + to_string() +
                      ": make_vocab_size_divisible_by must be at least 1");
  if (!layer_split.empty() && static_cast<int64_t>(layer_split.size()) != pp)
    throw EngineError(detail::cat("parallel config ", to_string(), ": layer_split has ",
                                  layer_split.size(), " entries for ", pp, " pipeline stages"));
  if (ep < 1 || dp % ep != 0)
    throw EngineError(detail::cat(
        "parallel config ", to_string(), ": ep = ", ep, " must be at least 1 and divide dp = ", dp,
        " (expert parallel ranks are carved from the data parallel ones)"));
  for (int64_t n : layer_split)
    if (n < 0)
      throw EngineError("parallel config " + to_string() + ": negative layer count in layer_split");
  if (world_size >= 0 && world_size != this->world_size())
    throw EngineError(detail::cat("parallel config ", to_string(), " needs ", this->world_size(),
                                  " ranks (tp*cp*dp*pp) but the world has ", world_size));
}

std::string ParallelConfig::to_string() const {
  std::string s = ParallelLayout::to_string();
  if (!layer_split.empty()) s += " layer_split=[" + join(layer_split) + "]";
  if (make_vocab_size_divisible_by != kDefaultVocabDivisibleBy)
    s += detail::cat(" make_vocab_size_divisible_by=", make_vocab_size_divisible_by);
  if (ep != 1) s += detail::cat(" ep=", ep);
  return s;
}

Coords coords_of(int64_t rank, const ParallelConfig& config) {
  if (!config.contains(rank))
    throw EngineError(detail::cat("rank ", rank, " is outside the parallel config ",
                                  config.to_string(), " (", config.world_size(), " ranks)"));
  return config.coords(rank);
}

int64_t rank_of(const Coords& c, const ParallelConfig& config) {
  if (!config.contains(c))
    throw EngineError(detail::cat("coordinates tp=", c.tp, " cp=", c.cp, " dp=", c.dp, " pp=", c.pp,
                                  " are outside the parallel config ", config.to_string()));
  return config.rank_of(c);
}

const char* to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::kWorld:
      return "world";
    case GroupKind::kTensor:
      return "tp";
    case GroupKind::kContext:
      return "cp";
    case GroupKind::kData:
      return "dp";
    case GroupKind::kDataContext:
      return "dp_cp";
    case GroupKind::kPipeline:
      return "pp";
    case GroupKind::kModel:
      return "model_parallel";
    case GroupKind::kEmbedding:
      return "embedding";
    case GroupKind::kExpert:
      return "ep";
    case GroupKind::kExpertData:
      return "expert_dp";
  }
  return "?";
}

std::vector<int64_t> group_ranks(GroupKind kind, int64_t rank, const ParallelConfig& config) {
  const Coords me = coords_of(rank, config);
  const Fixed f = fixed_coords(kind);
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < config.world_size(); ++r) {
    const Coords c = coords_of(r, config);
    if ((f.tp && c.tp != me.tp) || (f.cp && c.cp != me.cp) || (f.dp && c.dp != me.dp) ||
        (f.pp && c.pp != me.pp))
      continue;
    if (kind == GroupKind::kExpert && c.dp / config.ep != me.dp / config.ep) continue;
    if (kind == GroupKind::kExpertData && config.ep_rank_of(c.dp) != config.ep_rank_of(me.dp))
      continue;
    ranks.push_back(r);
  }
  if (kind == GroupKind::kEmbedding) {
    // The pipeline group in stage order: keep its first and last stage.
    const bool end_stage = me.pp == 0 || me.pp == config.pp - 1;
    if (config.pp == 1 || !end_stage) return {rank};
    return {ranks.front(), ranks.back()};
  }
  return ranks;
}

std::vector<std::vector<int64_t>> all_group_ranks(GroupKind kind, const ParallelConfig& config) {
  std::vector<std::vector<int64_t>> groups;
  std::vector<bool> seen(config.world_size(), false);
  for (int64_t r = 0; r < config.world_size(); ++r) {
    if (seen[r]) continue;
    groups.push_back(group_ranks(kind, r, config));
    for (int64_t m : groups.back()) seen[m] = true;
  }
  return groups;
}

std::pair<int64_t, int64_t> stage_layer_range(int64_t stage, int64_t num_layers,
                                              const ParallelConfig& config) {
  ENGINE_CHECK(stage >= 0 && stage < config.pp, "stage ", stage, " of ", config.pp);
  if (num_layers < 0) throw EngineError(detail::cat("negative layer count ", num_layers));
  if (!config.layer_split.empty()) {
    config.validate();
    int64_t total = 0, begin = 0;
    for (int64_t p = 0; p < config.pp; ++p) {
      if (p == stage) begin = total;
      total += config.layer_split[p];
    }
    if (total != num_layers)
      throw EngineError(detail::cat("layer_split [", join(config.layer_split), "] sums to ", total,
                                    " but the model has ", num_layers, " layers"));
    return {begin, begin + config.layer_split[stage]};
  }
  if (num_layers < config.pp)
    throw EngineError(detail::cat("cannot split ", num_layers, " layers over ", config.pp,
                                  " pipeline stages: every stage needs a layer (or give "
                                  "layer_split explicitly)"));
  const int64_t base = num_layers / config.pp, extra = num_layers % config.pp;
  const int64_t begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

namespace {

// This process's current CUDA device, which NCCL groups are bound to.
at::Device current_cuda_device() {
#if defined(BATON_CUDA)
  return at::Device(at::kCUDA, c10::cuda::current_device());
#else
  throw EngineError("ParallelState: the NCCL backend needs a CUDA build (BATON_CUDA)");
#endif
}

std::shared_ptr<::gloo::transport::Device> gloo_device() {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  // A worker a node agent started: the address its node reached the driver at.
  if (const char* addr = std::getenv("BATON_NODE_ADDR"); addr && *addr)
    return c10d::ProcessGroupGloo::createDeviceForHostname(addr);
  return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
}

// In LibTorch 2.x Gloo and NCCL are backends: a ProcessGroup holds one per
// device type and sends each collective to the backend of its tensors' device.
// Ours is a DeadlineGroup, formed (and its ranks met) before the backend.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::shared_ptr<::gloo::transport::Device> device,
                                                  DeadlineGroupOptions deadline) {
  auto options = c10d::ProcessGroupGloo::Options::create(deadline.timeout);
  options->devices.push_back(std::move(device));
  if (size == 1) options->threads = 1;
  auto pg = c10::make_intrusive<DeadlineGroup>(store, rank, size, std::move(deadline));
  pg->set_backend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
                  c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options));
  return pg;
}

// Builds the process groups of one ParallelState, sharing one process group
// between group kinds with the same ranks.
class GroupFactory {
 public:
  GroupFactory(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout,
               CollectiveBackend backend)
      : store_(std::move(store)), timeout_(timeout), backend_(backend) {}

  // The group of `ranks`, called `name` in its messages.
  c10::intrusive_ptr<c10d::ProcessGroup> get(const std::vector<int64_t>& ranks, int64_t rank,
                                             const std::string& name) {
    auto it = cache_.find(ranks);
    if (it != cache_.end()) return it->second;
    int64_t group_rank = 0;
    while (ranks[group_rank] != rank) ++group_rank;
    // Members of a size-1 group never talk to anyone: a private store will do.
    c10::intrusive_ptr<c10d::Store> store;
    if (ranks.size() == 1)
      store = c10::make_intrusive<c10d::HashStore>();
    else
      store = c10::make_intrusive<c10d::PrefixStore>(detail::cat(kStorePrefix, "pg/", join(ranks)),
                                                     store_);
    DeadlineGroupOptions deadline;
    deadline.name = name;
    deadline.timeout = timeout_;
    deadline.global_ranks = ranks;
    auto pg = make(store, static_cast<int>(group_rank), static_cast<int>(ranks.size()),
                   std::move(deadline));
    cache_.emplace(ranks, pg);
    return pg;
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> make(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, DeadlineGroupOptions deadline) {
    if (backend_ == CollectiveBackend::kNccl) {
#if defined(BATON_CUDA)
      auto pg = c10::make_intrusive<DeadlineGroup>(store, rank, size, std::move(deadline));
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout_;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
      // Bound to this process's GPU (ParallelState::device): barrier() and
      // the communicators use it rather than guess one from the rank.
      const at::Device gpu = current_cuda_device();
      nccl->setBoundDeviceId(gpu);
      pg->set_backend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL,
                      std::move(nccl));
      pg->setBoundDeviceId(gpu);
      return pg;
#else
      throw EngineError("ParallelState: the NCCL backend needs a CUDA build (BATON_CUDA)");
#endif
    }
    if (!device_) device_ = gloo_device();
    return gloo_group(store, rank, size, device_, std::move(deadline));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  CollectiveBackend backend_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>> cache_;
};

}  // namespace

void barrier(const Group& group) {
  if (group.size > 1) group.pg->barrier()->wait();
}

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(c10::intrusive_ptr<c10d::Store> store,
                                                       int64_t rank, int64_t size,
                                                       std::chrono::milliseconds timeout,
                                                       const std::string& name) {
  ENGINE_CHECK(size >= 1 && rank >= 0 && rank < size, "make_gloo_group: rank ", rank, " of ", size);
  DeadlineGroupOptions deadline;
  deadline.name = name;
  deadline.timeout = timeout;
  return gloo_group(store, static_cast<int>(rank), static_cast<int>(size), gloo_device(),
                    std::move(deadline));
}

ParallelState::ParallelState(ParallelConfig config, int64_t rank)
    : config_(std::move(config)), rank_(rank), coords_(coords_of(rank, config_)) {}

ParallelState::~ParallelState() = default;

std::shared_ptr<ParallelState> ParallelState::create(c10::intrusive_ptr<c10d::Store> store,
                                                     int64_t rank, ParallelConfig config,
                                                     std::chrono::milliseconds timeout,
                                                     CollectiveBackend backend) {
  if (!store) throw EngineError("ParallelState::create: no store");
  config.validate();
  std::shared_ptr<ParallelState> state(new ParallelState(config, rank));
  state->backend_ = backend;
  state->timeout_ = timeout;
  state->device_ =
      backend == CollectiveBackend::kNccl ? current_cuda_device() : at::Device(at::kCPU);

  // Every rank must agree on the layout, or the groups below would never form.
  const std::string key = detail::cat(kStorePrefix, "config");
  const std::string mine = config.to_string();
  if (rank == 0) {
    store->set(key, std::vector<uint8_t>(mine.begin(), mine.end()));
  } else {
    try {
      store->wait({key}, timeout);
    } catch (const std::exception&) {
      throw EngineError(
          detail::cat("ParallelState::create: rank 0 did not publish its parallel config within ",
                      timeout.count(), " ms (the collective deadline; rank ", rank, " waited)"));
    }
    const std::vector<uint8_t> v = store->get(key);
    const std::string theirs(v.begin(), v.end());
    if (theirs != mine)
      throw EngineError(detail::cat("ParallelState::create: rank ", rank, "'s parallel config (",
                                    mine, ") differs from rank 0's (", theirs, ")"));
  }

  // All ranks build the kinds in the same order; within one kind the groups
  // partition the world, so no rank waits on a group another rank builds later.
  GroupFactory factory(store, timeout, backend);
  state->groups_.resize(kNumGroupKinds);
  for (int k = 0; k < kNumGroupKinds; ++k) {
    Group& g = state->groups_[k];
    g.ranks = group_ranks(static_cast<GroupKind>(k), rank, state->config_);
    g.size = static_cast<int64_t>(g.ranks.size());
    while (g.ranks[g.rank] != rank) ++g.rank;
  }
  for (int k = 0; k < kNumGroupKinds; ++k) {
    Group& g = state->groups_[k];
    // Named after every kind it serves ("world/tp/model_parallel"); the
    // expert kinds only under expert parallelism (else they repeat dp_cp
    // and the rank alone).
    std::string name;
    for (int j = 0; j < kNumGroupKinds; ++j) {
      const auto kind = static_cast<GroupKind>(j);
      const bool expert_kind = kind == GroupKind::kExpert || kind == GroupKind::kExpertData;
      if (expert_kind && state->config_.ep == 1) continue;
      if (state->groups_[j].ranks == g.ranks)
        name += (name.empty() ? "" : "/") + std::string(to_string(kind));
    }
    g.pg = factory.get(g.ranks, rank, name.empty() ? to_string(static_cast<GroupKind>(k)) : name);
  }
  return state;
}

std::shared_ptr<ParallelState> ParallelState::single(ParallelConfig config) {
  config.validate(1);
  std::shared_ptr<ParallelState> state(new ParallelState(std::move(config), 0));
  GroupFactory factory(c10::intrusive_ptr<c10d::Store>(), kDefaultCollectiveTimeout,
                       CollectiveBackend::kGloo);
  auto pg = factory.get({0}, 0, "world");
  state->groups_.assign(kNumGroupKinds, Group{pg, 0, 1, {0}});
  return state;
}

const Group& ParallelState::group(GroupKind kind) const {
  const int k = static_cast<int>(kind);
  ENGINE_CHECK(k >= 0 && k < static_cast<int>(groups_.size()), "group kind ", k);
  return groups_[k];
}

void ParallelState::set_num_layers(int64_t num_layers) {
  layers_ = stage_layer_range(coords_.pp, num_layers, config_);
  num_layers_ = num_layers;
}

int64_t ParallelState::num_layers() const {
  ENGINE_CHECK(num_layers_ >= 0, "ParallelState::set_num_layers was not called");
  return num_layers_;
}

int64_t ParallelState::layer_begin() const {
  num_layers();
  return layers_.first;
}

int64_t ParallelState::layer_end() const {
  num_layers();
  return layers_.second;
}

}  // namespace baton::engine
