#include "engine/parallel/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include "engine/errors.h"

namespace baton::engine {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace collective {
namespace {

int64_t checked_dim(const at::Tensor& x, int64_t dim) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  ENGINE_CHECK(d >= 0 && d < x.dim(), "dim ", dim, " of a ", x.dim(), "-d tensor");
  return d;
}

int64_t shard_size(const at::Tensor& x, int64_t dim, const Group& group, const char* what) {
  const int64_t n = x.size(dim);
  if (n % group.size != 0)
    throw EngineError(detail::cat(what, ": size ", n, " of dim ", dim, " (shape ", x.sizes(),
                                  ") is not divisible by the group size ", group.size));
  return n / group.size;
}

}  // namespace

at::Tensor all_reduce(const at::Tensor& x, const Group& group, c10d::ReduceOp::RedOpType op) {
  if (group.size == 1) return x;
  std::vector<at::Tensor> buf{x.clone(at::MemoryFormat::Contiguous)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(op);
  group.pg->allreduce(buf, opts)->wait();
  return buf[0];
}

at::Tensor all_gather(const at::Tensor& x, int64_t dim, const Group& group) {
  if (group.size == 1) return x;
  dim = checked_dim(x, dim);
  std::vector<at::Tensor> input{x.contiguous()};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < group.size; ++r) outputs[0].push_back(at::empty_like(input[0]));
  group.pg->allgather(outputs, input)->wait();
  return at::cat(outputs[0], dim);
}

at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, const Group& group) {
  if (group.size == 1) return x;
  dim = checked_dim(x, dim);
  const int64_t n = shard_size(x, dim, group, "reduce_scatter");
  // A real reduce-scatter on both backends (Gloo has one from LibTorch 2.x).
  std::vector<at::Tensor> out{at::empty_like(x.narrow(dim, 0, n), at::MemoryFormat::Contiguous)};
  std::vector<std::vector<at::Tensor>> in(1);
  for (const at::Tensor& c : x.chunk(group.size, dim)) in[0].push_back(c.contiguous());
  group.pg->reduce_scatter(out, in)->wait();
  return out[0];
}

at::Tensor split(const at::Tensor& x, int64_t dim, const Group& group) {
  if (group.size == 1) return x;
  dim = checked_dim(x, dim);
  const int64_t n = shard_size(x, dim, group, "split");
  return x.narrow(dim, group.rank * n, n).contiguous();
}

}  // namespace collective

namespace detail {
namespace {
// Carries a Group from forward to backward through the autograd context.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(Group g) : group(std::move(g)) {}
  Group group;
};
}  // namespace

void save_group(AutogradContext* ctx, const Group& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
}

// The capsule lives in ctx->saved_data as long as the autograd node does.
const Group& saved_group(AutogradContext* ctx) {
  auto holder = ctx->saved_data["group"].toCapsule();
  return static_cast<GroupCapsule*>(holder.get())->group;
}
}  // namespace detail

namespace {
using detail::save_group;
using detail::saved_group;

// One autograd function per (forward, backward) pair of collectives. `Fwd`
// and `Bwd` map a tensor and the group to the result.
template <typename Tag>
struct Region : torch::autograd::Function<Region<Tag>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    save_group(ctx, group);
    return Tag::forward(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The Group argument gets no gradient.
    return {Tag::backward(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct CopyTag {
  static at::Tensor forward(const at::Tensor& x, const Group&) { return x; }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::all_reduce(g, grp);
  }
};
struct ReduceTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::all_reduce(x, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group&) { return g; }
};
struct GatherLastTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::all_gather(x, -1, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::split(g, -1, grp);
  }
};
struct ScatterLastTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::split(x, -1, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::all_gather(g, -1, grp);
  }
};
struct GatherSeqTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::all_gather(x, 1, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::reduce_scatter(g, 1, grp);
  }
};
struct ReduceScatterSeqTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::reduce_scatter(x, 1, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::all_gather(g, 1, grp);
  }
};
struct ScatterSeqTag {
  static at::Tensor forward(const at::Tensor& x, const Group& grp) {
    return collective::split(x, 1, grp);
  }
  static at::Tensor backward(const at::Tensor& g, const Group& grp) {
    return collective::all_gather(g, 1, grp);
  }
};

void check_group(const Group& group, const char* fn) {
  ENGINE_CHECK(group.pg && group.size >= 1 && group.rank >= 0 && group.rank < group.size, fn,
               ": invalid group (size ", group.size, ", rank ", group.rank, ")");
}

void check_sequence_input(const at::Tensor& x, const char* fn) {
  if (x.dim() != 3)
    throw EngineError(detail::cat(fn, ": expected [B, S, H] activations, got shape ", x.sizes()));
}

template <typename Tag>
at::Tensor apply(const at::Tensor& x, const Group& group, const char* fn) {
  check_group(group, fn);
  if (group.size == 1) return x;
  return Region<Tag>::apply(x, group);
}

}  // namespace

at::Tensor copy_to_tp_region(const at::Tensor& x, const Group& tp) {
  return apply<CopyTag>(x, tp, "copy_to_tp_region");
}

at::Tensor reduce_from_tp_region(const at::Tensor& x, const Group& tp) {
  return apply<ReduceTag>(x, tp, "reduce_from_tp_region");
}

at::Tensor gather_from_tp_region(const at::Tensor& x, const Group& tp) {
  return apply<GatherLastTag>(x, tp, "gather_from_tp_region");
}

at::Tensor scatter_to_tp_region(const at::Tensor& x, const Group& tp) {
  return apply<ScatterLastTag>(x, tp, "scatter_to_tp_region");
}

at::Tensor gather_from_sequence_region(const at::Tensor& x, const Group& tp) {
  check_sequence_input(x, "gather_from_sequence_region");
  return apply<GatherSeqTag>(x, tp, "gather_from_sequence_region");
}

at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& x, const Group& tp) {
  check_sequence_input(x, "reduce_scatter_to_sequence_region");
  return apply<ReduceScatterSeqTag>(x, tp, "reduce_scatter_to_sequence_region");
}

at::Tensor scatter_to_sequence_region(const at::Tensor& x, const Group& tp) {
  check_sequence_input(x, "scatter_to_sequence_region");
  return apply<ScatterSeqTag>(x, tp, "scatter_to_sequence_region");
}

void all_reduce_grads(const std::vector<at::Tensor>& params, const Group& group) {
  if (group.size == 1) return;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  std::vector<at::Tensor> flat;
  for (const at::Tensor& g : grads) {
    ENGINE_CHECK(g.scalar_type() == grads[0].scalar_type(), "all_reduce_grads: mixed dtypes ",
                 g.scalar_type(), " and ", grads[0].scalar_type());
    flat.push_back(g.reshape(-1));
  }
  at::Tensor sum = collective::all_reduce(at::cat(flat), group);
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    g.copy_(sum.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

}  // namespace baton::engine
