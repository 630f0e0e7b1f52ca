// Paged decode attention on the GPU (paged_attention_kernel.h). Plain CUDA:
// no LibTorch header, so that nvcc compiles it in seconds.
//
// One thread block per (sequence, kv head), kThreads threads, the context in
// tiles of kThreads positions. Per tile:
//   A. thread t scores position t of the tile for every query head of the
//      group: it reads its key row once (16-byte loads) and keeps one dot
//      product per head in registers;
//   B. one warp per head: the tile's max, the running max and sum rescaled,
//      the scores replaced by their exponentials;
//   C. threads over (heads, 16-byte chunk of the head dim, position lane)
//      accumulate p·V, reading value rows coalesced along the head dim.
// The position lanes' partial sums are added in a fixed order at the end,
// so a rerun gives the same bits. Exponentials are exp2 of scores scaled by
// log2(e) (folded into q).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/kernels/paged_attention_kernel.h"

namespace baton::engine::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block, positions per tile
constexpr int kMaxGroup = 16;  // query heads per kv head
constexpr int kMaxHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half(x);
}

// V consecutive elements at p as floats: one 16-byte load when V·sizeof(T)
// is 16 (p then 16-byte aligned), V scalar loads otherwise.
template <typename T, int V>
__device__ __forceinline__ void load(const T* __restrict__ p, float (&out)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    if constexpr (sizeof(T) == 4) {
      const float* f = reinterpret_cast<const float*>(&raw);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = f[i];
    } else {
      const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = to_float(h[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_float(p[i]);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Floats of dynamic shared memory: q and the tile's scores during the loop,
// the position lanes' partial sums after it (the same memory).
__host__ __device__ constexpr int64_t shared_floats(int64_t group, int64_t head_dim, int hpt,
                                                    int v) {
  const int64_t loop = group * head_dim + group * kThreads;
  const int64_t partials = static_cast<int64_t>(hpt) * v * kThreads;
  return loop > partials ? loop : partials;
}

// T: element type. V: elements per load (16 bytes, or 1 for the scalar
// path). HPT: query heads per thread in phase C (V·HPT accumulators).
// kD: the head dim when known at compile time, 0 for any.
template <typename T, int V, int HPT, int kD>
__global__ void __launch_bounds__(kThreads, 2) paged_decode_kernel(const PagedDecodeArgs a) {
  const int64_t b = blockIdx.x;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int d_model = kD > 0 ? kD : static_cast<int>(a.head_dim);
  const int group = static_cast<int>(a.q_heads / a.kv_heads);
  const int chunks = d_model / V;

  extern __shared__ float smem[];
  float* s_q = smem;                        // [group][d_model], scaled
  float* s_score = smem + group * d_model;  // [group][kThreads]
  float* s_part = smem;                     // [HPT·V][kThreads], after the loop
  __shared__ int64_t s_slot[kThreads];
  __shared__ float s_max[kMaxGroup], s_sum[kMaxGroup], s_corr[kMaxGroup];

  const T* q = static_cast<const T*>(a.q);
  const float q_scale = a.scale * kLog2e;
  for (int i = tid; i < group * d_model; i += kThreads) {
    const int h = i / d_model, d = i % d_model;
    s_q[i] =
        to_float(q[b * a.q_stride[0] + (kvh * group + h) * a.q_stride[1] + d * a.q_stride[2]]) *
        q_scale;
  }
  if (tid < kMaxGroup) {
    s_max[tid] = -INFINITY;
    s_sum[tid] = 0.f;
  }
  int64_t len = a.context_lens[b * a.context_lens_stride];
  len = len < 0 ? 0 : (len > a.max_blocks * a.block_size ? a.max_blocks * a.block_size : len);
  __syncthreads();

  // Phase C's mapping: unit = (head set, chunk), then position lanes.
  const int head_sets = (group + HPT - 1) / HPT;
  const int units = chunks * head_sets;
  const int lanes = kThreads / units;
  const int unit = tid % units, lane = tid / units;
  const bool accumulates = lane < lanes;
  const int chunk = unit % chunks, head0 = (unit / chunks) * HPT;
  float acc[HPT][V];
#pragma unroll
  for (int i = 0; i < HPT; ++i)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[i][e] = 0.f;

  const T* k_cache = static_cast<const T*>(a.k_cache) + kvh * a.k_stride[1];
  const T* v_cache = static_cast<const T*>(a.v_cache) + kvh * a.v_stride[1];
  const int64_t* tables64 = static_cast<const int64_t*>(a.block_tables);
  const int32_t* tables32 = static_cast<const int32_t*>(a.block_tables);
  const int warp = tid / 32, warp_lane = tid % 32;

  for (int64_t start = 0; start < len; start += kThreads) {
    const int n = static_cast<int>(len - start < kThreads ? len - start : kThreads);
    // A: scores of position start + tid for every head of the group.
    if (tid < n) {
      const int64_t pos = start + tid;
      const int64_t entry =
          b * a.block_tables_stride[0] + (pos / a.block_size) * a.block_tables_stride[1];
      const int64_t block = a.block_tables_int64 ? tables64[entry] : tables32[entry];
      const int64_t slot = block * a.block_size + pos % a.block_size;
      s_slot[tid] = slot;
      const T* key = k_cache + slot * a.k_stride[0];
      float dot[kMaxGroup];
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) dot[h] = 0.f;
#pragma unroll 4
      for (int c = 0; c < chunks; ++c) {
        float k[V];
        load<T, V>(key + c * V, k);
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h < group) {
            const float* qh = s_q + h * d_model + c * V;
#pragma unroll
            for (int e = 0; e < V; ++e) dot[h] = fmaf(qh[e], k[e], dot[h]);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h)
        if (h < group) s_score[h * kThreads + tid] = dot[h];
    } else {
      for (int h = 0; h < group; ++h) s_score[h * kThreads + tid] = -INFINITY;
    }
    __syncthreads();

    // B: online softmax, one warp per head.
    for (int h = warp; h < group; h += kThreads / 32) {
      float* s = s_score + h * kThreads;
      float tile_max = -INFINITY;
      for (int j = warp_lane; j < kThreads; j += 32) tile_max = fmaxf(tile_max, s[j]);
      tile_max = warp_max(tile_max);
      const float old_max = s_max[h];
      const float new_max = fmaxf(old_max, tile_max);
      float sum = 0.f;
      for (int j = warp_lane; j < kThreads; j += 32) {
        const float p = exp2f(s[j] - new_max);  // 0 for the -inf of positions past len
        s[j] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (warp_lane == 0) {
        const float corr = old_max == -INFINITY ? 0.f : exp2f(old_max - new_max);
        s_corr[h] = corr;
        s_sum[h] = s_sum[h] * corr + sum;
        s_max[h] = new_max;
      }
    }
    __syncthreads();

    // C: acc = acc·corr + Σ_t p_t·v_t over this thread's positions.
    if (accumulates) {
#pragma unroll
      for (int i = 0; i < HPT; ++i) {
        if (head0 + i < group) {
          const float corr = s_corr[head0 + i];
#pragma unroll
          for (int e = 0; e < V; ++e) acc[i][e] *= corr;
        }
      }
#pragma unroll 4
      for (int t = lane; t < n; t += lanes) {
        float v[V];
        load<T, V>(v_cache + s_slot[t] * a.v_stride[0] + chunk * V, v);
#pragma unroll
        for (int i = 0; i < HPT; ++i) {
          if (head0 + i < group) {
            const float p = s_score[(head0 + i) * kThreads + t];
#pragma unroll
            for (int e = 0; e < V; ++e) acc[i][e] = fmaf(p, v[e], acc[i][e]);
          }
        }
      }
    }
    __syncthreads();
  }

  // The position lanes' partial sums, added lane by lane in order.
  if (accumulates) {
#pragma unroll
    for (int i = 0; i < HPT; ++i)
#pragma unroll
      for (int e = 0; e < V; ++e) s_part[(i * V + e) * kThreads + tid] = acc[i][e];
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out) + (b * a.q_heads + kvh * group) * d_model;
  for (int idx = tid; idx < group * d_model; idx += kThreads) {
    const int h = idx / d_model, d = idx % d_model;
    const int u = (h / HPT) * chunks + d / V;
    const float* part = s_part + ((h % HPT) * V + d % V) * kThreads + u;
    float sum = 0.f;
    for (int l = 0; l < lanes; ++l) sum += part[l * units];
    const float total = s_sum[h];
    out[idx] = from_float<T>(total > 0.f ? sum / total : 0.f);
  }
}

bool aligned16(const void* p, int64_t stride0, int64_t stride1, int64_t elem) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride0 * elem) % 16 == 0 &&
         (stride1 * elem) % 16 == 0;
}

template <typename T, int V, int HPT, int kD>
cudaError_t launch(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int64_t group = a.q_heads / a.kv_heads;
  const size_t bytes = shared_floats(group, a.head_dim, HPT, V) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(a.kv_heads));
  paged_decode_kernel<T, V, HPT, kD><<<grid, kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

// 16-byte loads when the head dim and the caches' rows allow them: V·HPT
// accumulators of 32 floats (units = head_dim/V · ⌈group/HPT⌉ <= 128 <=
// kThreads); the scalar path keeps the whole group (units = head_dim <= 256).
template <typename T>
cudaError_t dispatch(const PagedDecodeArgs& a, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  constexpr int HPT = 32 / V;
  const bool vectorised = a.head_dim % V == 0 &&
                          aligned16(a.k_cache, a.k_stride[0], a.k_stride[1], sizeof(T)) &&
                          aligned16(a.v_cache, a.v_stride[0], a.v_stride[1], sizeof(T));
  if (!vectorised) return launch<T, 1, kMaxGroup, 0>(a, stream);
  if (a.head_dim == 64) return launch<T, V, HPT, 64>(a, stream);
  if (a.head_dim == 128) return launch<T, V, HPT, 128>(a, stream);
  return launch<T, V, HPT, 0>(a, stream);
}

}  // namespace

bool paged_decode_supported(int64_t head_dim, int64_t q_heads, int64_t kv_heads) {
  return head_dim >= 1 && head_dim <= kMaxHeadDim && kv_heads >= 1 && q_heads % kv_heads == 0 &&
         q_heads / kv_heads >= 1 && q_heads / kv_heads <= kMaxGroup && kv_heads <= 65535;
}

cudaError_t launch_paged_decode_attention(const PagedDecodeArgs& args, cudaStream_t stream) {
  if (!paged_decode_supported(args.head_dim, args.q_heads, args.kv_heads) || args.block_size < 1 ||
      args.batch < 0 || args.batch > 0x7fffffff)
    return cudaErrorInvalidValue;
  if (args.batch == 0) return cudaSuccess;
  switch (args.dtype) {
    case PagedDtype::kFloat32:
      return dispatch<float>(args, stream);
    case PagedDtype::kBFloat16:
      return dispatch<__nv_bfloat16>(args, stream);
    case PagedDtype::kFloat16:
      return dispatch<__half>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace baton::engine::cuda
