// Device-side dequantization of an INT8 weight for int8_linear's cuBLAS BF16
// fallback (ops/int8_linear.cpp): w[n, k] = q[n, k] * scale, written as
// bf16 / f16 / f32 into a transient buffer. Memory-bound; one thread per
// 8 consecutive elements of a row. C++17.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/status.h"

namespace td::ops {
namespace {

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void dequantize_int8_kernel(const int8_t* __restrict__ q, int64_t n, int64_t k,
                                       const float* __restrict__ scale, bool per_channel, T* __restrict__ out) {
  const int64_t chunks_per_row = (k + 7) / 8;
  const int64_t total = n * chunks_per_row;
  const int64_t kb = (k + 127) / 128;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row, c0 = (i % chunks_per_row) * 8;
    const int64_t end = c0 + 8 < k ? c0 + 8 : k;
    // A chunk of 8 never crosses a 128-column block boundary (128 % 8 == 0).
    const float s = per_channel ? scale[row] : scale[(row / 128) * kb + c0 / 128];
    for (int64_t c = c0; c < end; ++c) out[row * k + c] = from_float<T>(float(q[row * k + c]) * s);
  }
}

template <typename T>
void launch(const int8_t* q, int64_t n, int64_t k, const float* scale, bool per_channel, void* out,
            cudaStream_t stream) {
  const int64_t work = n * ((k + 7) / 8);
  if (work == 0) return;
  const int threads = 256;
  const int64_t blocks = (work + threads - 1) / threads;
  const unsigned grid = unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);
  dequantize_int8_kernel<T><<<grid, threads, 0, stream>>>(q, n, k, scale, per_channel, static_cast<T*>(out));
}

}  // namespace

// Ok, InvalidArgument for an output type other than F32/BF16/F16, or
// LaunchFailed when the launch was refused.
kernels::Status dequantize_int8_weight_cuda(const int8_t* q, int64_t n, int64_t k, const float* scale,
                                            bool per_channel, void* out, kernels::ElemType out_type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (out_type) {
    case kernels::ElemType::F32: launch<float>(q, n, k, scale, per_channel, out, s); break;
    case kernels::ElemType::BF16: launch<__nv_bfloat16>(q, n, k, scale, per_channel, out, s); break;
    case kernels::ElemType::F16: launch<__half>(q, n, k, scale, per_channel, out, s); break;
    default: return kernels::Status::InvalidArgument;
  }
  return cudaGetLastError() == cudaSuccess ? kernels::Status::Ok : kernels::Status::LaunchFailed;
}

}  // namespace td::ops
