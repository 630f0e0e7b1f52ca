#include "engine/kernels/paged_attention.h"

#include <ATen/ATen.h>

#if defined(BATON_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "engine/kernels/paged_attention_kernel.h"
#endif

#include <limits>
#include <string>

#include "engine/errors.h"

namespace baton::engine {
namespace {

using detail::cat;

struct PagedArgs {
  const at::Tensor& q;
  const at::Tensor& k_cache;
  const at::Tensor& v_cache;
  const at::Tensor& block_tables;
  const at::Tensor& context_lens;
  int64_t block_size;
  double scale;

  std::string shapes() const {
    return cat("q ", q.sizes(), ", k_cache ", k_cache.sizes(), ", v_cache ", v_cache.sizes(),
               ", block_tables ", block_tables.sizes(), ", context_lens ", context_lens.sizes());
  }
};

bool is_float_type(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

// Sizes, dtypes and devices only: nothing is read from the device.
void check(const char* what, const PagedArgs& a) {
  if (!a.q.defined() || !a.k_cache.defined() || !a.v_cache.defined() || !a.block_tables.defined() ||
      !a.context_lens.defined())
    throw EngineError(cat(what, ": a tensor argument is undefined"));
  auto fail = [&](const std::string& why) {
    throw EngineError(cat(what, ": ", why, " (", a.shapes(), ")"));
  };
  if (a.q.dim() != 3 || a.k_cache.dim() != 3 || a.v_cache.dim() != 3 || a.block_tables.dim() != 2 ||
      a.context_lens.dim() != 1)
    fail(
        "expected q [B, Hq, D], k_cache and v_cache [slots, Hkv, D], block_tables [B, W] and "
        "context_lens [B]");
  if (a.k_cache.sizes() != a.v_cache.sizes()) fail("k_cache and v_cache differ in shape");
  const int64_t batch = a.q.size(0), q_heads = a.q.size(1), kv_heads = a.k_cache.size(1);
  if (a.q.size(2) != a.k_cache.size(2))
    fail(cat("q's head dim ", a.q.size(2), " is not the caches' ", a.k_cache.size(2)));
  if (kv_heads < 1 || q_heads % kv_heads != 0)
    fail(cat(q_heads, " query heads are not a multiple of ", kv_heads, " kv heads"));
  if (a.block_tables.size(0) != batch || a.context_lens.size(0) != batch)
    fail(cat("block_tables and context_lens must have q's batch size ", batch));
  if (!is_float_type(a.q.scalar_type()))
    fail(cat("q is ", a.q.scalar_type(), "; expected Float, BFloat16 or Half"));
  if (a.k_cache.scalar_type() != a.q.scalar_type() || a.v_cache.scalar_type() != a.q.scalar_type())
    fail(cat("k_cache is ", a.k_cache.scalar_type(), " and v_cache ", a.v_cache.scalar_type(),
             "; expected q's ", a.q.scalar_type()));
  if (a.block_tables.scalar_type() != at::kInt && a.block_tables.scalar_type() != at::kLong)
    fail(cat("block_tables is ", a.block_tables.scalar_type(), "; expected Int or Long"));
  if (a.context_lens.scalar_type() != at::kLong)
    fail(cat("context_lens is ", a.context_lens.scalar_type(), "; expected Long"));
  const at::Device device = a.q.device();
  if (a.k_cache.device() != device || a.v_cache.device() != device ||
      a.block_tables.device() != device || a.context_lens.device() != device)
    fail(cat("the tensors must all be on q's device ", device, "; k_cache is on ",
             a.k_cache.device(), ", v_cache on ", a.v_cache.device(), ", block_tables on ",
             a.block_tables.device(), ", context_lens on ", a.context_lens.device()));
  if (a.block_size < 1) fail(cat("block_size is ", a.block_size, "; expected >= 1"));
}

at::Tensor reference(const PagedArgs& a) {
  const int64_t batch = a.q.size(0), q_heads = a.q.size(1), head_dim = a.q.size(2);
  const int64_t kv_heads = a.k_cache.size(1), group = q_heads / kv_heads;
  const int64_t positions = a.block_tables.size(1) * a.block_size;
  const at::TensorOptions longs = a.block_tables.options().dtype(at::kLong);
  const at::Tensor slots =
      (a.block_tables.to(at::kLong).unsqueeze(2) * a.block_size + at::arange(a.block_size, longs))
          .reshape({-1});
  const at::Tensor keys = a.k_cache.index_select(0, slots)
                              .view({batch, positions, kv_heads, head_dim})
                              .permute({0, 2, 3, 1})
                              .to(at::kFloat);  // [B, Hkv, D, L]
  const at::Tensor values = a.v_cache.index_select(0, slots)
                                .view({batch, positions, kv_heads, head_dim})
                                .transpose(1, 2)
                                .to(at::kFloat);  // [B, Hkv, L, D]
  // [B, Hkv, G, D]: the query heads of one kv head share its keys through the batch dims.
  const at::Tensor q = a.q.to(at::kFloat).reshape({batch, kv_heads, group, head_dim});
  at::Tensor scores = at::matmul(q, keys).mul_(a.scale);  // [B, Hkv, G, L]
  const at::Tensor hidden =
      at::arange(positions, longs).unsqueeze(0) >= a.context_lens.unsqueeze(1);
  scores.masked_fill_(hidden.view({batch, 1, 1, positions}),
                      -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), values)
      .reshape({batch, q_heads, head_dim})
      .to(a.q.scalar_type());
}

#if defined(BATON_CUDA)
cuda::PagedDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kBFloat16) return cuda::PagedDtype::kBFloat16;
  if (t == at::kHalf) return cuda::PagedDtype::kFloat16;
  return cuda::PagedDtype::kFloat32;
}

bool kernel_takes(const PagedArgs& a) {
  return cuda::paged_decode_supported(a.q.size(2), a.q.size(1), a.k_cache.size(1)) &&
         a.k_cache.stride(2) == 1 && a.v_cache.stride(2) == 1 &&
         a.q.size(0) <= std::numeric_limits<int32_t>::max();
}

at::Tensor launch_kernel(const PagedArgs& a) {
  const c10::cuda::CUDAGuard on_device(a.q.device());
  at::Tensor out = at::empty(a.q.sizes(), a.q.options());
  cuda::PagedDecodeArgs args;
  args.q = a.q.data_ptr();
  for (int i = 0; i < 3; ++i) args.q_stride[i] = a.q.stride(i);
  args.k_cache = a.k_cache.data_ptr();
  args.v_cache = a.v_cache.data_ptr();
  for (int i = 0; i < 2; ++i) {
    args.k_stride[i] = a.k_cache.stride(i);
    args.v_stride[i] = a.v_cache.stride(i);
    args.block_tables_stride[i] = a.block_tables.stride(i);
  }
  args.block_tables = a.block_tables.data_ptr();
  args.block_tables_int64 = a.block_tables.scalar_type() == at::kLong;
  args.context_lens = a.context_lens.data_ptr<int64_t>();
  args.context_lens_stride = a.context_lens.stride(0);
  args.out = out.data_ptr();
  args.batch = a.q.size(0);
  args.q_heads = a.q.size(1);
  args.kv_heads = a.k_cache.size(1);
  args.head_dim = a.q.size(2);
  args.max_blocks = a.block_tables.size(1);
  args.block_size = a.block_size;
  args.scale = static_cast<float>(a.scale);
  args.dtype = kernel_dtype(a.q.scalar_type());
  const cudaError_t status = cuda::launch_paged_decode_attention(
      args, c10::cuda::getCurrentCUDAStream(a.q.device().index()).stream());
  if (status != cudaSuccess)
    throw EngineError(cat("paged_decode_attention: the CUDA kernel failed to launch: ",
                          cudaGetErrorString(status), " (", a.shapes(), ")"));
  return out;
}
#endif

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size,
                                  double scale) {
  const PagedArgs args{q, k_cache, v_cache, block_tables, context_lens, block_size, scale};
  check("paged_decode_attention", args);
#if defined(BATON_CUDA)
  if (q.is_cuda() && kernel_takes(args)) return launch_kernel(args);
#endif
  return reference(args);
}

at::Tensor paged_decode_attention_reference(const at::Tensor& q, const at::Tensor& k_cache,
                                            const at::Tensor& v_cache,
                                            const at::Tensor& block_tables,
                                            const at::Tensor& context_lens, int64_t block_size,
                                            double scale) {
  const PagedArgs args{q, k_cache, v_cache, block_tables, context_lens, block_size, scale};
  check("paged_decode_attention_reference", args);
  return reference(args);
}

}  // namespace baton::engine
