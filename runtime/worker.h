// Worker: the base class of every user worker. A worker lives in its own
// process, owns one device slot, and runs its registered methods one at a
// time, in the order the driver submitted them.
//
// Example (in the driver's own source file; no extra build step):
//
//   class Adder : public baton::Worker {
//    public:
//     explicit Adder(const baton::List& init_args) : base_(init_args.at(0).as_int()) {}
//     int64_t add(int64_t x) { return base_ + x + rank(); }
//     static void register_methods(baton::MethodTable<Adder>& t) {
//       t.def("add", &Adder::add);  // ONE_TO_ALL, execute on all ranks
//     }
//    private:
//     int64_t base_;
//   };
//   BATON_WORKER(Adder);
//
// A worker class needs a constructor taking `const baton::List&` (the init
// arguments given to WorkerGroup::spawn) or a default constructor.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>
#include <cstdint>

#include "base/parallel_layout.h"
#include "runtime/threads.h"

namespace baton {

// Where a worker sits. Set before the worker's constructor runs; every role
// of a colocated process gets the same.
struct WorkerInfo {
  std::string class_name;     // "ActorWorker+RefWorker" for colocated roles
  std::string group_name;     // unique per group; prefixes its c10d store keys
  int rank = 0;               // global rank within the group
  int world_size = 1;
  int local_rank = 0;         // rank among the group's workers on this node
  int local_world_size = 1;
  int node = 0;
  bool use_gpu = false;
  // GPU ordinal as seen by this process (CUDA_VISIBLE_DEVICES holds just the
  // worker's GPU, so this is 0; it is the current CUDA device before the
  // worker's constructor runs), or -1 on CPU.
  int device = -1;
  // The worker's slot on its node. With use_gpu: the slot-th GPU the driver
  // may use (the slot-th entry of the driver's CUDA_VISIBLE_DEVICES, or GPU
  // `slot` when that is unset). Otherwise a CPU slot index.
  int slot = 0;
  int intra_op_threads = 1;   // LibTorch intra-op threads set for this worker
  WaitPolicy wait_policy = WaitPolicy::kPassive;  // its OpenMP threads' (runtime/threads.h)
  std::string master_addr;    // rendezvous: the StoreServer the driver hosts
  int master_port = 0;
  ParallelLayout layout;      // given at spawn (default: all data parallel)
  ParallelCoords coords;      // this rank's place in it
};

class Worker {
 public:
  Worker();
  virtual ~Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const WorkerInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }

  // Registers this worker's place in a named mesh ("actor", "critic",
  // "rollout", ...) for mesh-dispatched methods: which data-parallel chunk it
  // receives, and whether the driver collects its result. Call it in the
  // constructor. Throws baton::Error if the mesh is already registered.
  void register_mesh(const std::string& mesh, int dp_rank, bool is_collector);

  // [dp_rank, is_collector] for `mesh` (the built-in method "_query_mesh").
  // Throws baton::Error if the mesh was never registered.
  std::vector<int64_t> mesh_entry(const std::string& mesh);

 private:
  WorkerInfo info_;
  std::map<std::string, std::pair<int, bool>> meshes_;
};

namespace detail {
// The info the next constructed Worker takes (set by the worker process).
void set_pending_worker_info(WorkerInfo info);
}  // namespace detail

}  // namespace baton
