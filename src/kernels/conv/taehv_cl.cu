// CUDA kernels of the TAEHV decoder (contract in taehv_cl.h; fp32 references
// in taehv_cl_cpu.cpp). Both are memory-bound:
//   taehv_pointwise: grid-stride over 16-byte chunks (8 bf16 / 4 f32) when n
//     and the pointers allow it, else over elements; fp32 math (tanh via
//     tanhf), one rounding to the output type.
//   taehv_memblock_input: one thread per 16-byte chunk of the output row pair
//     when c fills whole chunks (each chunk comes from x, from the previous
//     frame, from prev or is zero), else one thread per element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/conv/taehv_cl.h"

namespace td::kernels {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  const int64_t cap = int64_t(132) * 64;  // grid-stride loops: a few waves are enough
  return unsigned(b < 1 ? 1 : (b > cap ? cap : b));
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <TaehvPointwise kOp>
__device__ __forceinline__ float apply(float x, float r) {
  if constexpr (kOp == TaehvPointwise::Relu) return fmaxf(x, 0.f);
  else if constexpr (kOp == TaehvPointwise::TanhClamp3) return 3.f * tanhf(x * (1.f / 3.f));
  else return fmaxf(x + r, 0.f);
}

// kVec elements of T per step (kVec * sizeof(T) == 16 for the vector path, 1 for scalar).
template <TaehvPointwise kOp, typename T, int kVec>
__global__ void __launch_bounds__(kThreads) pointwise_kernel(const T* x, const T* r, int64_t steps, T* y) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t s = int64_t(blockIdx.x) * kThreads + threadIdx.x; s < steps; s += stride) {
    if constexpr (kVec == 1) {
      y[s] = from_f<T>(apply<kOp>(to_f(x[s]), kOp == TaehvPointwise::AddRelu ? to_f(r[s]) : 0.f));
    } else {
      uint4 xv = reinterpret_cast<const uint4*>(x)[s];
      uint4 rv{};
      if constexpr (kOp == TaehvPointwise::AddRelu) rv = reinterpret_cast<const uint4*>(r)[s];
      const T* xe = reinterpret_cast<const T*>(&xv);
      const T* re = reinterpret_cast<const T*>(&rv);
      uint4 yv;
      T* ye = reinterpret_cast<T*>(&yv);
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        ye[j] = from_f<T>(apply<kOp>(to_f(xe[j]), kOp == TaehvPointwise::AddRelu ? to_f(re[j]) : 0.f));
      reinterpret_cast<uint4*>(y)[s] = yv;
    }
  }
}

template <TaehvPointwise kOp, typename T>
void launch_pointwise(const void* x, const void* r, int64_t n, void* y, bool vec, cudaStream_t st) {
  constexpr int kV = int(16 / sizeof(T));
  if (vec)
    pointwise_kernel<kOp, T, kV><<<blocks_for(n / kV), kThreads, 0, st>>>(
        static_cast<const T*>(x), static_cast<const T*>(r), n / kV, static_cast<T*>(y));
  else
    pointwise_kernel<kOp, T, 1><<<blocks_for(n), kThreads, 0, st>>>(static_cast<const T*>(x),
                                                                     static_cast<const T*>(r), n, static_cast<T*>(y));
}

template <typename T>
void dispatch_pointwise(TaehvPointwise op, const void* x, const void* r, int64_t n, void* y, bool vec,
                        cudaStream_t st) {
  if (op == TaehvPointwise::Relu) launch_pointwise<TaehvPointwise::Relu, T>(x, r, n, y, vec, st);
  else if (op == TaehvPointwise::TanhClamp3) launch_pointwise<TaehvPointwise::TanhClamp3, T>(x, r, n, y, vec, st);
  else launch_pointwise<TaehvPointwise::AddRelu, T>(x, r, n, y, vec, st);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// W: the unit copied (uint4 = a 16-byte chunk, or one element); cw = units per channel row of c.
template <typename W>
__global__ void __launch_bounds__(kThreads) memblock_input_kernel(const W* x, const W* prev, int64_t t, int64_t hw,
                                                                  int64_t cw, W* y) {
  const int64_t total = t * hw * 2 * cw;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x; o < total; o += stride) {
    const int64_t rowpos = o / (2 * cw), k = o % (2 * cw);  // rowpos = frame * hw + position
    W v;
    if (k < cw) {
      v = x[rowpos * cw + k];
    } else if (rowpos >= hw) {
      v = x[(rowpos - hw) * cw + (k - cw)];
    } else if (prev) {
      v = prev[rowpos * cw + (k - cw)];
    } else {
      v = W{};
    }
    y[o] = v;
  }
}

Status launched() { return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed; }

}  // namespace

Status taehv_pointwise_cuda(TaehvPointwise op, const void* x, const void* r, ElemType type, int64_t n, void* y,
                            void* stream) {
  if (n < 0 || !x || !y || (op == TaehvPointwise::AddRelu && !r)) return Status::InvalidArgument;
  if (op != TaehvPointwise::Relu && op != TaehvPointwise::TanhClamp3 && op != TaehvPointwise::AddRelu)
    return Status::InvalidArgument;
  if (type != ElemType::F32 && type != ElemType::BF16) return Status::InvalidArgument;
  if (n == 0) return Status::Ok;
  const int vecw = type == ElemType::F32 ? 4 : 8;
  const bool vec = n % vecw == 0 && aligned16(x) && aligned16(y) && (op != TaehvPointwise::AddRelu || aligned16(r));
  const auto st = static_cast<cudaStream_t>(stream);
  if (type == ElemType::F32) dispatch_pointwise<float>(op, x, r, n, y, vec, st);
  else dispatch_pointwise<__nv_bfloat16>(op, x, r, n, y, vec, st);
  return launched();
}

Status taehv_memblock_input_cuda(const void* x, const void* prev, ElemType type, int64_t t, int64_t hw, int64_t c,
                                 void* y, void* stream) {
  if (t < 0 || hw < 0 || c <= 0 || !x || !y) return Status::InvalidArgument;
  if (type != ElemType::F32 && type != ElemType::BF16) return Status::InvalidArgument;
  if (t == 0 || hw == 0) return Status::Ok;
  const int64_t es = type == ElemType::F32 ? 4 : 2;
  const int64_t row_bytes = c * es;
  const auto st = static_cast<cudaStream_t>(stream);
  const bool vec = row_bytes % 16 == 0 && aligned16(x) && aligned16(y) && (!prev || aligned16(prev));
  if (vec) {
    const int64_t cw = row_bytes / 16;
    memblock_input_kernel<uint4><<<blocks_for(t * hw * 2 * cw), kThreads, 0, st>>>(
        static_cast<const uint4*>(x), static_cast<const uint4*>(prev), t, hw, cw, static_cast<uint4*>(y));
  } else if (type == ElemType::F32) {
    memblock_input_kernel<float><<<blocks_for(t * hw * 2 * c), kThreads, 0, st>>>(
        static_cast<const float*>(x), static_cast<const float*>(prev), t, hw, c, static_cast<float*>(y));
  } else {
    memblock_input_kernel<uint16_t><<<blocks_for(t * hw * 2 * c), kThreads, 0, st>>>(
        static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(prev), t, hw, c, static_cast<uint16_t*>(y));
  }
  return launched();
}

}  // namespace td::kernels
