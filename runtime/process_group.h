// Collectives among the workers of one group (worker side). The driver hosts
// the rendezvous store and hands its address to every worker (WorkerInfo);
// it never joins a collective itself.
//
// Example, inside a worker method:
//   auto pg = baton::make_gloo_group(info());
//   std::vector<at::Tensor> ts{t};
//   pg->allreduce(ts)->wait();
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#if defined(BATON_CUDA)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <string>

#include "runtime/worker.h"

namespace baton {

// A client of the group's rendezvous store, its keys prefixed with the group
// name and `tag` so that several process groups can share it.
c10::intrusive_ptr<c10d::Store> rendezvous_store(const WorkerInfo& info, const std::string& tag);

// A Gloo process group over all ranks of this worker's group, bound as the
// engine's groups are (GLOO_SOCKET_IFNAME, else the node agent's address, else
// the store's). Every rank must call it with the same `tag`. Blocks until all
// ranks joined. An operation that waits longer than `timeout` for a peer
// fails with Gloo's error, which does not say who is missing; a worker that
// links the engine gets a group whose errors name the ranks that did not
// arrive (a DeadlineGroup, as every engine group is) from
//   engine::make_gloo_group(rendezvous_store(info, tag), info.rank,
//                           info.world_size, timeout, "my_group")
// (engine/parallel/parallel_state.h).
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo_group(
    const WorkerInfo& info, const std::string& tag = "world",
    std::chrono::milliseconds timeout = std::chrono::minutes(5));

#if defined(BATON_CUDA)
// An NCCL process group over all ranks of this worker's group, bound to the
// worker's GPU (WorkerInfo::device); tensors it carries must be there. Throws
// baton::Error in a worker without a GPU. Only in builds against a CUDA
// LibTorch.
c10::intrusive_ptr<c10d::ProcessGroupNCCL> make_nccl_group(
    const WorkerInfo& info, const std::string& tag = "world",
    std::chrono::milliseconds timeout = std::chrono::minutes(5));
#endif

}  // namespace baton
