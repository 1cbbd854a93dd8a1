// CUDA T5 attention core (contract in t5_attention.h; fp32 reference in
// t5_attention_cpu.cpp).
//
// Design: one block of 128 threads per (query i, head h, sample b). The q row
// goes to shared memory as fp32; each thread scores keys j = tid, tid + 128,
// ... (a dot product over D from the key row, plus the bucket bias), keeping
// the L scores in shared memory; a block max and a block sum give an fp32
// softmax with expf (not the fast exp, to stay close to the reference); then
// threads own output channels d = tid, tid + 128, ... and sum p_j v_j[d] over
// the keys (consecutive threads read consecutive channels of a value row).
// umT5-XXL at L = 512: 512 x 64 blocks per sample, each reading K and V of
// its head (2 x 64 KB of bf16, from L2 after the first blocks). This is a
// simple exact kernel for a once-per-prompt encoder, not a flash kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/t5_attention/t5_attention.h"

namespace td::kernels {
namespace gpu {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Block-wide max or sum of one value per thread (kThreads threads); `red`
// holds kThreads / 32 floats. Every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float x, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red may still be read from a previous reduction
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

template <typename T, typename OT>
__global__ void __launch_bounds__(kThreads) t5_attention_kernel(const T5AttentionArgs a) {
  extern __shared__ float smem[];
  const int L = int(a.len), H = int(a.heads), D = int(a.head_dim);
  float* p = smem;           // [L] scores, then probabilities
  float* qs = smem + L;      // [D]
  float* red = qs + D;       // [kThreads / 32]
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t row = int64_t(H) * D;
  const T* q = static_cast<const T*>(a.q) + (int64_t(b) * L + i) * row + int64_t(h) * D;
  const T* k = static_cast<const T*>(a.k) + int64_t(b) * L * row + int64_t(h) * D;
  const T* v = static_cast<const T*>(a.v) + int64_t(b) * L * row + int64_t(h) * D;
  const int32_t* m = a.key_mask + int64_t(b) * L;
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = to_f32(q[d]);
  __syncthreads();

  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < L; j += kThreads) {
    float s = -INFINITY;
    if (m[j] != 0) {
      const T* kj = k + int64_t(j) * row;
      float acc = 0.f;
      for (int d = 0; d < D; ++d) acc = fmaf(qs[d], to_f32(kj[d]), acc);
      s = acc + a.bias_table[int64_t(a.rel_bucket[j - i + L - 1]) * H + h];
    }
    p[j] = s;
    local_max = fmaxf(local_max, s);
  }
  const float mx = block_reduce<true>(local_max, red);
  float local_sum = 0.f;
  for (int j = threadIdx.x; j < L; j += kThreads) {
    const float e = m[j] != 0 ? expf(p[j] - mx) : 0.f;
    p[j] = e;
    local_sum += e;
  }
  const float inv = 1.f / block_reduce<false>(local_sum, red);  // also orders the p[] writes before the reads
  OT* out = static_cast<OT*>(a.out) + (int64_t(b) * L + i) * row + int64_t(h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.f;
    for (int j = 0; j < L; ++j)
      if (p[j] != 0.f) acc = fmaf(p[j], to_f32(v[int64_t(j) * row + d]), acc);
    out[d] = from_f32<OT>(acc * inv);
  }
}

template <typename T, typename OT>
Status launch(const T5AttentionArgs& a, cudaStream_t stream) {
  const size_t smem = (size_t(a.len) + size_t(a.head_dim) + kThreads / 32) * sizeof(float);
  if (smem > 48 * 1024) {
    if (cudaFuncSetAttribute(t5_attention_kernel<T, OT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
        cudaSuccess)
      return Status::Unsupported;
  }
  const dim3 grid(unsigned(a.len), unsigned(a.heads), unsigned(a.batch));
  t5_attention_kernel<T, OT><<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

template <typename T>
Status dispatch_out(const T5AttentionArgs& a, cudaStream_t s) {
  switch (a.out_type) {
    case ElemType::F32: return launch<T, float>(a, s);
    case ElemType::F16: return launch<T, __half>(a, s);
    case ElemType::BF16: return launch<T, __nv_bfloat16>(a, s);
    default: return Status::InvalidArgument;
  }
}

}  // namespace
}  // namespace gpu

Status t5_attention_cuda(const T5AttentionArgs& a, void* stream) {
  if (const Status s = t5_attention_check(a); s != Status::Ok) return s;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (a.qkv_type) {
    case ElemType::F32: return gpu::dispatch_out<float>(a, st);
    case ElemType::F16: return gpu::dispatch_out<__half>(a, st);
    case ElemType::BF16: return gpu::dispatch_out<__nv_bfloat16>(a, st);
    default: return Status::InvalidArgument;
  }
}

}  // namespace td::kernels
