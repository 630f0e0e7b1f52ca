#include "tests/runtime/test_workers.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "runtime/process_group.h"
#include "runtime/shared_tensor.h"
#if defined(BATON_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

class TestWorker : public baton::Worker {
 public:
  explicit TestWorker(const baton::List& init_args) {
    if (!init_args.empty() && init_args[0].kind() == baton::ValueKind::kString &&
        init_args[0].as_string() == "fail") {
      throw std::runtime_error("constructor asked to fail");
    }
    if (!init_args.empty()) init_ = init_args[0];
  }

  baton::Value echo(const baton::Value& v) { return v; }
  baton::Value init_value() { return init_; }
  int64_t add(int64_t a, int64_t b) { return a + b + 0 * rank(); }
  int64_t times_rank(int64_t x) { return x * rank(); }
  int64_t my_rank() { return rank(); }
  baton::Value info_dict() {
    const baton::WorkerInfo& i = info();
    return baton::Dict{{"rank", i.rank},
                       {"world_size", i.world_size},
                       {"local_rank", i.local_rank},
                       {"local_world_size", i.local_world_size},
                       {"threads", i.intra_op_threads},
                       {"slot", i.slot},
                       {"device", i.device},
                       {"class", i.class_name},
                       {"omp", std::string(std::getenv("OMP_NUM_THREADS"))},
                       {"torch_threads", static_cast<int64_t>(at::get_num_threads())},
                       {"wait", env_or_empty("OMP_WAIT_POLICY")},
                       {"spin", env_or_empty("GOMP_SPINCOUNT")},
                       {"pid", static_cast<int64_t>(getpid())},
                       {"master_addr", i.master_addr},
                       {"master_port", static_cast<int64_t>(i.master_port)},
                       {"token_env", env_or_empty("BATON_CLUSTER_TOKEN")}};
  }
  double mean(const std::vector<double>& xs) {
    double s = 0;
    for (double x : xs) s += x;
    return xs.empty() ? 0 : s / xs.size();
  }
  void throw_error(const std::string& message) { throw std::runtime_error(message); }
  at::Tensor torch_error() { return at::ones({2}) + at::ones({3}); }
  int64_t count() { return ++calls_; }
  void sleep_ms(int64_t ms) { usleep(static_cast<useconds_t>(ms * 1000)); }
  void block() {
    for (;;) pause();
  }
  // Sleeps, then throws `message` unless it is empty.
  void fail_or_sleep(const std::string& message, int64_t ms) {
    usleep(static_cast<useconds_t>(ms * 1000));
    if (!message.empty()) throw std::runtime_error(message);
  }
  // Forks a child that holds this worker's socket open until it is killed,
  // so that the worker's death is not seen by the driver (as with a process
  // that SIGKILL cannot end at once, stuck in the kernel). Returns its pid.
  int64_t fork_holder() {
    pid_t child = fork();
    if (child == 0) {
      for (;;) pause();
    }
    return child;
  }
  void crash(const std::string& how) {
    std::fflush(stdout);
    if (how == "abort") std::abort();
    if (how == "segfault") raise(SIGSEGV);
    if (how == "null_call") {
      // A call through a null function pointer: the pc becomes 0, which no
      // unwind table covers. `volatile` keeps the compiler from seeing it.
      void (*volatile fn)() = nullptr;
      fn();
    }
    if (how == "exit") std::_Exit(3);
  }
  // Allocates `mib` MiB the way `how` says: "touch" (4 MiB blocks, each
  // written, so that they are resident), "new" (one operator new, which
  // throws std::bad_alloc when it fails) or "tensor" (one at::empty, which
  // LibTorch's CPU allocator fails with a c10::Error). Frees it all and
  // returns the bytes, if it lives.
  int64_t hog(const std::string& how, int64_t mib) {
    const int64_t bytes = mib << 20;
    if (how == "new") {
      char* p = new char[static_cast<size_t>(bytes)];
      asm volatile("" : : "g"(p) : "memory");  // not elided: it may fail
      delete[] p;
    } else if (how == "tensor") {
      at::Tensor t = at::empty({bytes}, at::kByte);
    } else {
      std::vector<std::unique_ptr<char[]>> blocks;
      for (int64_t done = 0; done < bytes; done += 4 << 20) {
        blocks.emplace_back(new char[4 << 20]);
        std::memset(blocks.back().get(), 1, 4 << 20);
      }
    }
    return bytes;
  }
  void print(const std::string& text) {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "err:%s\n", text.c_str());
  }
  at::Tensor scale(const at::Tensor& t, double factor) { return t * factor; }
  at::Tensor make(int64_t n) { return at::arange(n, at::kFloat); }
  double sum(const at::Tensor& t) { return t.sum().item<double>(); }
  // Writes into its argument: shows in the caller's tensor only when shared.
  void fill(const at::Tensor& t, double value) { at::Tensor(t).fill_(value); }
  at::Tensor make_shared(int64_t n) {
    at::Tensor t = baton::shared_empty({n});
    t.copy_(at::arange(n, at::kFloat));
    return t;
  }
  void keep(const at::Tensor& t) { kept_ = t; }
  double kept_sum() { return kept_.sum().item<double>(); }
  at::Tensor all_reduce(const at::Tensor& t) {
    if (!pg_) pg_ = baton::make_gloo_group(info());
    std::vector<at::Tensor> ts{t.clone()};
    pg_->allreduce(ts)->wait();
    return ts[0];
  }
  // Where a GPU worker's CUDA stands: its CUDA_VISIBLE_DEVICES, the devices
  // it sees and the current one (-1 each without CUDA in the build).
  baton::Value gpu_info() {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    int64_t count = -1, current = -1;
#if defined(BATON_CUDA)
    count = c10::cuda::device_count();
    if (count > 0) current = c10::cuda::current_device();
#endif
    return baton::Dict{{"visible", std::string(visible != nullptr ? visible : "<unset>")},
                       {"device_count", count},
                       {"current_device", current},
                       {"device", info().device}};
  }
  // `t` summed over the group on the GPUs, over NCCL (make_nccl_group).
  at::Tensor nccl_all_reduce(const at::Tensor& t) {
#if defined(BATON_CUDA)
    if (!nccl_) nccl_ = baton::make_nccl_group(info());
    std::vector<at::Tensor> ts{
        t.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(info().device)))};
    nccl_->allreduce(ts)->wait();
    return ts[0].cpu();
#else
    (void)t;
    throw std::runtime_error("nccl_all_reduce: this build has no CUDA");
#endif
  }

  static void register_methods(baton::MethodTable<TestWorker>& t) {
    using baton::Execute;
    using baton::MethodOptions;
    namespace mode = baton::dispatch_mode;
    t.def("echo", &TestWorker::echo);
    t.def("init_value", &TestWorker::init_value);
    t.def("add", &TestWorker::add);
    t.def("times_rank", &TestWorker::times_rank, MethodOptions().set_dispatch_mode(mode::kAllToAll));
    t.def("my_rank", &TestWorker::my_rank);
    t.def("rank_zero_rank", &TestWorker::my_rank, MethodOptions().set_execute_mode(Execute::kRankZero));
    t.def("info", &TestWorker::info_dict);
    t.def("mean", &TestWorker::mean);
    t.def("throw_error", &TestWorker::throw_error);
    t.def("torch_error", &TestWorker::torch_error);
    t.def("count", &TestWorker::count);
    t.def("sleep_ms", &TestWorker::sleep_ms);
    t.def("block", &TestWorker::block);
    t.def("fail_or_sleep", &TestWorker::fail_or_sleep);
    t.def("fork_holder", &TestWorker::fork_holder);
    t.def("crash", &TestWorker::crash);
    t.def("hog", &TestWorker::hog);
    t.def("print", &TestWorker::print);
    t.def("scale", &TestWorker::scale);
    t.def("make", &TestWorker::make);
    t.def("sum", &TestWorker::sum);
    t.def("fill", &TestWorker::fill);
    t.def("make_shared", &TestWorker::make_shared);
    t.def("keep", &TestWorker::keep);
    t.def("kept_sum", &TestWorker::kept_sum);
    t.def("all_reduce", &TestWorker::all_reduce);
    t.def("gpu_info", &TestWorker::gpu_info);
    t.def("nccl_all_reduce", &TestWorker::nccl_all_reduce);
  }

 private:
  baton::Value init_;
  int64_t calls_ = 0;
  at::Tensor kept_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
#if defined(BATON_CUDA)
  decltype(baton::make_nccl_group(baton::WorkerInfo{})) nccl_;
#endif
};
BATON_WORKER(TestWorker);

}  // namespace

namespace baton::testing {

// A driver that spawns two workers, reports their pids on the fd named by
// BATON_TEST_PID_FD, and then dies the way BATON_TEST_DRIVER says:
// "kill" (SIGKILL to itself mid-call), "exit" (exit(0) with the group alive).
bool maybe_run_test_driver() {
  const char* how = std::getenv("BATON_TEST_DRIVER");
  if (how == nullptr) return false;
  int fd = std::atoi(std::getenv("BATON_TEST_PID_FD"));
  ResourcePool pool = ResourcePool::cpu(2);
  static WorkerGroup* group = new WorkerGroup(WorkerGroup::spawn("TestWorker", pool));
  // Keep a large tensor in flight in shared memory in both directions.
  group->call("keep", {at::ones({1 << 20})}).get();
  auto pending = group->call("block");
  std::string pids;
  for (pid_t p : group->pids()) pids += std::to_string(p) + "\n";
  if (write(fd, pids.data(), pids.size()) != static_cast<ssize_t>(pids.size())) std::_Exit(2);
  close(fd);
  if (std::string(how) == "kill") raise(SIGKILL);
  std::exit(0);
}

}  // namespace baton::testing
