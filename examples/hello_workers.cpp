// hello_workers: a custom worker defined right here, in the driver's own file,
// run as a group of 4 CPU worker processes; then two roles colocated in one
// process per slot.
//
//   ./build/examples/hello_workers
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>

#include <unistd.h>

#include <cstdio>

#include "dispatch/data_proto.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/baton.h"
#include "runtime/process_group.h"

class Hello : public baton::Worker {
 public:
  explicit Hello(const baton::List& init_args) : greeting_(init_args.at(0).as_string()) {
    // A worker's stdout reaches the driver's console as "[Hello:<rank>] ...".
    std::printf("rank %d of %d ready (pid %d, %d intra-op threads, tp %lld dp %lld)\n", rank(),
                world_size(), static_cast<int>(getpid()), info().intra_op_threads,
                static_cast<long long>(info().coords.tp), static_cast<long long>(info().coords.dp));
    // Mesh "actor": this rank's data-parallel chunk, and tp rank 0 collects.
    register_mesh("actor", info().coords.dp, info().coords.tp == 0);
  }

  // Marks each row of its chunk with this worker's rank.
  baton::DataProto tag(const baton::DataProto& batch) {
    baton::DataProto out = batch;
    out.set_tensor("rank", at::full({batch.size()}, static_cast<int64_t>(rank()), at::kLong));
    return out;
  }

  std::string greet(const std::string& name) {
    return greeting_ + ", " + name + ", from rank " + std::to_string(rank()) + " of " +
           std::to_string(world_size());
  }

  int64_t scale(int64_t x) { return x * (rank() + 1); }

  at::Tensor double_it(const at::Tensor& t) { return t * 2; }

  // Sums each rank's tensor over the workers' own c10d (Gloo) group.
  at::Tensor all_reduce() {
    if (!pg_) pg_ = baton::make_gloo_group(info());
    std::vector<at::Tensor> ts{at::full({4}, static_cast<double>(rank() + 1))};
    pg_->allreduce(ts)->wait();
    return ts[0];
  }

  static void register_methods(baton::MethodTable<Hello>& t) {
    t.def("greet", &Hello::greet);  // ONE_TO_ALL by default
    t.def("scale", &Hello::scale,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kAllToAll));
    t.def("double_it", &Hello::double_it,
          baton::MethodOptions().set_execute_mode(baton::Execute::kRankZero));
    t.def("all_reduce", &Hello::all_reduce);
    t.def("tag", &Hello::tag,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
    t.def("tag_mesh", &Hello::tag,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::mesh_proto("actor")));
  }

 private:
  std::string greeting_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};
BATON_WORKER(Hello);

// A second role, colocated with a Hello "actor" in the same processes.
class Critic : public baton::Worker {
 public:
  baton::DataProto values(const baton::DataProto& batch) {
    return baton::DataProto({{"values", batch.tensor("x") * 0.5}});
  }
  static void register_methods(baton::MethodTable<Critic>& t) {
    t.def("values", &Critic::values,
          baton::MethodOptions().set_dispatch_mode(baton::dispatch_mode::kDpComputeProto));
  }
};
BATON_WORKER(Critic);

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process, this runs the worker and never returns

  baton::ResourcePool pool = baton::ResourcePool::cpu(4);
  // Four workers laid out as tp=2 x dp=2 (Megatron order: tp fastest).
  baton::WorkerGroup group = baton::WorkerGroup::spawn(
      "Hello", pool, {"hello"},
      baton::WorkerGroupOptions().set_layout(baton::ParallelLayout{.tp = 2, .dp = 2}));

  // ONE_TO_ALL: the same argument to every worker, one result per rank.
  baton::Value greetings = group.call("greet", {"driver"}).get();
  for (const baton::Value& line : greetings.as_list()) {
    std::printf("greet      -> %s\n", line.as_string().c_str());
  }

  // ALL_TO_ALL: argument i is a list; rank r gets its element r.
  baton::Value scaled = group.call("scale", {baton::List{10, 20, 30, 40}}).get();
  std::printf("scale      -> %s\n", scaled.to_string().c_str());

  // A tensor round trip (RANK_ZERO: only rank 0 runs it). 1 MiB goes through shared memory.
  at::Tensor t = at::arange(262144, at::kFloat);
  at::Tensor back = group.call("double_it", {t}).get().as_tensor();
  std::printf("double_it  -> %s, back[0..3] = %.0f %.0f %.0f, matches: %s\n",
              baton::Value(back).to_string().c_str(), back[0].item<float>(),
              back[1].item<float>(), back[2].item<float>(), back.equal(t * 2) ? "yes" : "no");

  // An all-reduce among the workers; the driver only hosts the rendezvous.
  baton::Value sums = group.call("all_reduce").get();
  for (const baton::Value& r : sums.as_list()) {
    const at::Tensor& s = r.as_tensor();
    std::printf("all_reduce -> [%.0f %.0f %.0f %.0f] (1+2+3+4 = 10)\n", s[0].item<float>(),
                s[1].item<float>(), s[2].item<float>(), s[3].item<float>());
  }

  // DataProto dispatch: a batch of 6 rows. DP_COMPUTE_PROTO pads it to 8 for 4
  // ranks and trims the result; the mesh call sends each dp chunk (written to
  // shared memory once) to both tp ranks of its replica and collects tp 0.
  baton::DataProto batch({{"x", at::arange(6, at::kFloat)}}, {{"prompt", {"a", "b", "c", "d", "e", "f"}}});
  for (const char* method : {"tag", "tag_mesh"}) {
    baton::DataProto out = group.call(method, {batch}).get().as<baton::DataProto>();
    std::printf("%-10s -> %lld rows, seen by ranks:", method, static_cast<long long>(out.size()));
    for (int64_t i = 0; i < out.size(); ++i) {
      std::printf(" %lld", static_cast<long long>(out.tensor("rank")[i].item<int64_t>()));
    }
    std::printf("\n");
  }

  // Colocated roles: each of 2 processes hosts a Hello ("actor") and a Critic
  // ("critic"). Methods are reached as "actor_tag" or through role("critic").
  // The actor's result, still pending, goes straight into the critic's call.
  baton::ResourcePool pair = baton::ResourcePool::cpu(2);
  baton::WorkerGroup colocated = baton::WorkerGroup::spawn_colocated(
      {{"actor", "Hello", {"hi"}}, {"critic", "Critic", {}}}, pair);
  baton::Future<baton::Value> tagged = colocated.call("actor_tag", {batch});  // does not block
  baton::DataProto values =
      colocated.role("critic").call("values", {tagged}).get().as<baton::DataProto>();
  std::printf("colocated  -> critic values of the actor's rows:");
  for (int64_t i = 0; i < values.size(); ++i) {
    std::printf(" %.1f", values.tensor("values")[i].item<float>());
  }
  std::printf("\n");
  return 0;
}
