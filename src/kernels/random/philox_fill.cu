// CUDA Philox random fills (contract in philox_fill.h; reference in
// philox_fill_cpu.cpp). One thread per Philox block of four values: a 14B
// model's 28 GB of BF16 weights fill in milliseconds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/random/philox_fill.h"

namespace td::kernels {
namespace {

__global__ void random_fill_kernel(const RandomFill f) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b * 4 >= f.n) return;
  const Philox4 c = philox4x32_10_hd(uint64_t(b), f.stream, f.seed);
  const float span = f.hi - f.lo;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t i = b * 4 + j;
    if (i >= f.n) break;
    if (f.out_type == ElemType::I8) {
      static_cast<int8_t*>(f.out)[i] = int8_t(int(c.v[j] % 255u) - 127);
    } else {
      const float v = __fmaf_rn(span, philox_unit24(c.v[j]), f.lo);
      if (f.out_type == ElemType::F32) static_cast<float*>(f.out)[i] = v;
      else if (f.out_type == ElemType::BF16) static_cast<__nv_bfloat16*>(f.out)[i] = __float2bfloat16_rn(v);
      else static_cast<__half*>(f.out)[i] = __float2half_rn(v);
    }
  }
}

}  // namespace

Status random_fill_cuda(const RandomFill& f, void* stream) {
  if (f.n < 0 || (f.n > 0 && !f.out)) return Status::InvalidArgument;
  if (f.out_type != ElemType::I8 && f.out_type != ElemType::F32 && f.out_type != ElemType::BF16 &&
      f.out_type != ElemType::F16)
    return Status::InvalidArgument;
  if (f.n == 0) return Status::Ok;
  const int threads = 256;
  const int64_t blocks = ((f.n + 3) / 4 + threads - 1) / threads;
  if (blocks > 0x7fffffffLL) return Status::Unsupported;
  random_fill_kernel<<<unsigned(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(f);
  return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

}  // namespace td::kernels
