#include <cuda_bf16.h>

#include "bench_util.h"

namespace td::bench {
namespace {

__device__ float hash_normal(unsigned seed, size_t i) {
  // Two rounds of an integer hash -> two uniforms -> Box-Muller.
  auto h = [](unsigned x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
  };
  unsigned a = h(unsigned(i) * 2u + 1u + seed * 0x9e3779b9u);
  unsigned b = h(a ^ unsigned(i >> 32) ^ 0x85ebca6bu);
  float u1 = (float(a >> 8) + 1.0f) * (1.0f / 16777217.0f);
  float u2 = float(b >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, float s, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(s * hash_normal(seed, i));
}
__global__ void fill_f32_kernel(float* p, size_t n, float s, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = s * hash_normal(seed, i);
}

}  // namespace

void fill_random_bf16(void* d, size_t n, float stddev, unsigned seed, cudaStream_t stream) {
  fill_bf16_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(d), n, stddev, seed);
  TD_BENCH_CUDA(cudaGetLastError());
}
void fill_random_f32(void* d, size_t n, float stddev, unsigned seed, cudaStream_t stream) {
  fill_f32_kernel<<<1024, 256, 0, stream>>>(static_cast<float*>(d), n, stddev, seed);
  TD_BENCH_CUDA(cudaGetLastError());
}

}  // namespace td::bench
