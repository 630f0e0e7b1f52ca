#include "engine/kernels/packed_linear.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <optional>
#include <string_view>

#include "engine/errors.h"

namespace baton::engine {
namespace {

struct Ops {
  std::optional<c10::OperatorHandle> reorder, linear;
};

const Ops& ops() {
  static const Ops o = [] {
    Ops r;
    if (!at::hasMKLDNN()) return r;
    auto& d = c10::Dispatcher::singleton();
    r.reorder = d.findSchema({"mkldnn::_reorder_linear_weight", ""});
    r.linear = d.findSchema({"mkldnn::_linear_pointwise", ""});
    // Registered schemas without a CPU kernel would fail at the first call.
    for (auto* op : {&r.reorder, &r.linear})
      if (*op && !(*op)->hasKernelForDispatchKey(c10::DispatchKey::CPU)) op->reset();
    return r;
  }();
  return o;
}

}  // namespace

bool packed_linear_available() { return ops().reorder && ops().linear; }

at::Tensor pack_linear_weight(const at::Tensor& weight) {
  ENGINE_CHECK(packed_linear_available(), "pack_linear_weight: this LibTorch has no oneDNN linear");
  ENGINE_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu(),
               "pack_linear_weight: needs a 2-D fp32 CPU weight, got ", weight.toString(), " ",
               weight.sizes());
  return ops().reorder->typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>().call(
      weight.contiguous(), std::nullopt);
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  RECORD_FUNCTION("baton::packed_linear", std::vector<c10::IValue>());
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  return ops()
      .linear
      ->typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                         std::string_view, c10::List<std::optional<at::Scalar>>,
                         std::optional<std::string_view>)>()
      .call(x, packed, b, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
}

}  // namespace baton::engine
