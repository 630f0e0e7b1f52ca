#include "runtime/process_group.h"

#include <cstdlib>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "base/errors.h"
#include "runtime/internal/auth_store.h"

namespace baton {

c10::intrusive_ptr<c10d::Store> rendezvous_store(const WorkerInfo& info, const std::string& tag) {
  if (info.master_port == 0) throw Error("rendezvous: this worker has no rendezvous address");
  auto store = c10::make_intrusive<AuthStore>(info.master_addr,
                                              static_cast<uint16_t>(info.master_port));
  return c10::make_intrusive<c10d::PrefixStore>(info.group_name + "/" + tag, store);
}

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo_group(const WorkerInfo& info,
                                                           const std::string& tag,
                                                           std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Bound where this node reaches the others: GLOO_SOCKET_IFNAME, else the
  // address a node agent gave it (BATON_NODE_ADDR), else the store's (one host).
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const char* node_addr = std::getenv("BATON_NODE_ADDR");
  options->devices.push_back(
      ifname != nullptr && *ifname != '\0'
          ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
          : c10d::ProcessGroupGloo::createDeviceForHostname(
                node_addr != nullptr && *node_addr != '\0' ? node_addr : info.master_addr));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(rendezvous_store(info, tag), info.rank,
                                                     info.world_size, options);
}

#if defined(BATON_CUDA)
c10::intrusive_ptr<c10d::ProcessGroupNCCL> make_nccl_group(const WorkerInfo& info,
                                                           const std::string& tag,
                                                           std::chrono::milliseconds timeout) {
  if (!info.use_gpu || info.device < 0)
    throw Error("make_nccl_group: rank " + std::to_string(info.rank) +
                " has no GPU (spawn the group on a ResourcePool with gpu(true))");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(rendezvous_store(info, tag), info.rank,
                                                        info.world_size, options);
  // The worker's GPU (current since its start): barrier() and the
  // communicators use it instead of guessing from the rank.
  pg->setBoundDeviceId(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(info.device)));
  return pg;
}
#endif

}  // namespace baton
