#include "engine/parallel/parallel_linear.h"

#include <ostream>

#include "engine/errors.h"
#include "engine/parallel/tensor_parallel.h"

namespace baton::engine {
namespace {

int64_t per_rank(int64_t global, const Group& tp, const char* layer, const char* what, int64_t in,
                 int64_t out) {
  if (global <= 0 || in <= 0 || out <= 0)
    throw EngineError(detail::cat(layer, "(in_features=", in, ", out_features=", out,
                                  "): sizes must be positive"));
  if (global % tp.size != 0)
    throw EngineError(detail::cat(layer, "(in_features=", in, ", out_features=", out, "): ", what,
                                  " ", global, " is not divisible by the tensor-parallel size ",
                                  tp.size));
  return global / tp.size;
}

thread_local bool skip_weight_init = false;

at::Tensor init_weight(std::initializer_list<int64_t> shape) {
  at::Tensor w = at::empty(shape, at::kFloat);
  return skip_weight_init ? w : w.normal_(0.0, 0.02);
}

}  // namespace

SkipWeightInit::SkipWeightInit() : previous_(skip_weight_init) { skip_weight_init = true; }
SkipWeightInit::~SkipWeightInit() { skip_weight_init = previous_; }

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions options, Group tp)
    : options_(options), tp_(std::move(tp)) {
  const int64_t out = per_rank(options_.out_features, tp_, "ColumnParallelLinear", "out_features",
                               options_.in_features, options_.out_features);
  if (options_.sequence_parallel && options_.gather_output)
    throw EngineError(
        "ColumnParallelLinear: sequence_parallel and gather_output cannot be combined");
  weight = register_parameter("weight", init_weight({out, options_.in_features}));
  if (options_.bias) bias = register_parameter("bias", at::zeros({out}, at::kFloat));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor input =
      options_.sequence_parallel ? gather_from_sequence_region(x, tp_) : copy_to_tp_region(x, tp_);
  at::Tensor y = at::linear(input, weight, bias);
  return options_.gather_output ? gather_from_tp_region(y, tp_) : y;
}

void ColumnParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "baton::engine::ColumnParallelLinear(in_features=" << options_.in_features
         << ", out_features=" << options_.out_features << ", tp=" << tp_.size
         << ", bias=" << options_.bias << ", gather_output=" << options_.gather_output
         << ", sequence_parallel=" << options_.sequence_parallel << ")";
}

RowParallelLinearImpl::RowParallelLinearImpl(RowParallelLinearOptions options, Group tp)
    : options_(options), tp_(std::move(tp)) {
  const int64_t in = per_rank(options_.in_features, tp_, "RowParallelLinear", "in_features",
                              options_.in_features, options_.out_features);
  if (options_.sequence_parallel && !options_.input_is_parallel)
    throw EngineError("RowParallelLinear: sequence_parallel requires input_is_parallel");
  weight = register_parameter("weight", init_weight({options_.out_features, in}));
  if (options_.bias)
    bias = register_parameter("bias", at::zeros({options_.out_features}, at::kFloat));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor input = options_.input_is_parallel ? x : scatter_to_tp_region(x, tp_);
  at::Tensor partial = at::linear(input, weight);
  at::Tensor y = options_.sequence_parallel ? reduce_scatter_to_sequence_region(partial, tp_)
                                            : reduce_from_tp_region(partial, tp_);
  return bias.defined() ? y + bias : y;
}

void RowParallelLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "baton::engine::RowParallelLinear(in_features=" << options_.in_features
         << ", out_features=" << options_.out_features << ", tp=" << tp_.size
         << ", bias=" << options_.bias << ", input_is_parallel=" << options_.input_is_parallel
         << ", sequence_parallel=" << options_.sequence_parallel << ")";
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options,
                                                       Group tp)
    : options_(options), tp_(std::move(tp)) {
  if (options_.vocab_size <= 0 || options_.hidden_size <= 0)
    throw EngineError(detail::cat("VocabParallelEmbedding(vocab_size=", options_.vocab_size,
                                  ", hidden_size=", options_.hidden_size,
                                  "): sizes must be positive"));
  if (options_.vocab_size % tp_.size != 0)
    throw EngineError(detail::cat("VocabParallelEmbedding(vocab_size=", options_.vocab_size,
                                  ", hidden_size=", options_.hidden_size, "): vocab_size ",
                                  options_.vocab_size,
                                  " is not divisible by the tensor-parallel size ", tp_.size));
  const int64_t rows = options_.vocab_size / tp_.size;
  vocab_start_ = tp_.rank * rows;
  vocab_end_ = vocab_start_ + rows;
  weight = register_parameter("weight", init_weight({rows, options_.hidden_size}));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids, bool check_range) {
  if (ids.scalar_type() != at::kLong || ids.dim() != 2)
    throw EngineError(detail::cat("VocabParallelEmbedding: expected [B, S] int64 token ids, got ",
                                  ids.scalar_type(), " of shape ", ids.sizes()));
  if (check_range && ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 0 || hi >= options_.vocab_size)
      throw EngineError(detail::cat("VocabParallelEmbedding: token id ", lo < 0 ? lo : hi,
                                    " is outside the vocabulary [0, ", options_.vocab_size, ")"));
  }
  at::Tensor out;
  if (tp_.size == 1) {
    out = at::embedding(weight, ids);
  } else {
    const at::Tensor foreign = (ids < vocab_start_).logical_or_(ids >= vocab_end_);
    const at::Tensor local = (ids - vocab_start_).masked_fill_(foreign, 0);
    out = at::embedding(weight, local).masked_fill(foreign.unsqueeze(-1), 0.0);
  }
  return options_.sequence_parallel ? reduce_scatter_to_sequence_region(out, tp_)
                                    : reduce_from_tp_region(out, tp_);
}

void VocabParallelEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "baton::engine::VocabParallelEmbedding(vocab_size=" << options_.vocab_size
         << ", hidden_size=" << options_.hidden_size << ", tp=" << tp_.size << ", vocab=["
         << vocab_start_ << ", " << vocab_end_ << ")"
         << ", sequence_parallel=" << options_.sequence_parallel << ")";
}

}  // namespace baton::engine
