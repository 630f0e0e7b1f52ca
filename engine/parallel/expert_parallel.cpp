#include "engine/parallel/expert_parallel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "engine/errors.h"
#include "engine/parallel/deadline_group.h"  // BATON_C10D_ALL_TO_ALL_SINGLE
#include "engine/parallel/tensor_parallel.h"  // detail::save_group

namespace baton::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0L); }

// The raw all-to-all: rows by `send` out, rows by `recv` in.
at::Tensor exchange(const at::Tensor& x, std::vector<int64_t> send, std::vector<int64_t> recv,
                    const Group& ep) {
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(
      [&] {
        std::vector<int64_t> s(in.sizes().begin(), in.sizes().end());
        s[0] = total(recv);
        return s;
      }(),
      in.options());
  ep.pg->BATON_C10D_ALL_TO_ALL_SINGLE(out, in, recv, send)->wait();
  return out;
}

std::vector<int64_t> to_vector(const c10::IValue& v) { return v.toIntVector(); }

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                            const Group& ep) {
    detail::save_group(ctx, ep);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange(x, send, recv, ep);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The gradient of the rows this rank received goes back to their senders.
    at::Tensor g = exchange(grads[0], to_vector(ctx->saved_data["recv"]),
                            to_vector(ctx->saved_data["send"]), detail::saved_group(ctx));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, const Group& ep) {
  if (ep.size == 1) return send;
  const auto n = static_cast<int64_t>(send.size());
  if (n % ep.size != 0)
    throw EngineError(
        detail::cat("exchange_counts: ", n, " counts do not split over ", ep.size, " EP ranks"));
  const at::Device device = ep.pg->getBoundDeviceId().value_or(at::Device(at::kCPU));
  at::Tensor in = at::tensor(send, at::TensorOptions().dtype(at::kLong)).to(device);
  const std::vector<int64_t> each(ep.size, n / ep.size);
  at::Tensor out = exchange(in, each, each, ep).cpu();
  return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + n);
}

at::Tensor all_to_all(const at::Tensor& x, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv, const Group& ep) {
  if (static_cast<int64_t>(send.size()) != ep.size || static_cast<int64_t>(recv.size()) != ep.size)
    throw EngineError(detail::cat("all_to_all: ", send.size(), " send and ", recv.size(),
                                  " receive counts for an EP group of ", ep.size));
  if (x.size(0) != total(send))
    throw EngineError(detail::cat("all_to_all: ", x.size(0), " rows but the send counts add up to ",
                                  total(send)));
  if (ep.size == 1) return x;
  return AllToAll::apply(x, send, recv, ep);
}

}  // namespace baton::engine
