// CUDA channels-last kernels of the Wan VAE (contract in vae_cl.h; fp32
// references in vae_cl_cpu.cpp). All are memory-bound and simple: fp32 math,
// one rounding to the output type.
//   channel_rms_norm_cl: one warp per position (row of c channels), two reads
//     of the row (the second from L1/L2), sum of squares reduced by shuffles.
//   upsample_nearest2x_cl: one thread per output 16-byte chunk when a row of
//     c channels is a whole number of them, else per element.
//   softmax_rows: one block per row, three passes (max, sum, write).
//   to_channels_last / to_channels_first: one thread per output element
//     (coalesced writes; the reads stride over channels).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/conv/vae_cl.h"

namespace td::kernels {
namespace {

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

Status launched(const char* /*what*/) {
  return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return unsigned(b < 1 ? 1 : (b > (int64_t(1) << 31) - 1 ? (int64_t(1) << 31) - 1 : b));
}

// ------------------------------------------------------------------ norm

template <typename T>
__global__ void __launch_bounds__(kThreads) rms_norm_cl_kernel(const T* x, int64_t rows, int c, const float* gamma,
                                                               bool silu, float root_c, T* y) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  for (int64_t r = int64_t(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5); r < rows; r += warps) {
    const T* xr = x + r * c;
    T* yr = y + r * c;
    float ss = 0.f;
    for (int i = lane; i < c; i += 32) {
      const float v = load_f(xr, i);
      ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = root_c / fmaxf(sqrtf(ss), 1e-12f);
    for (int i = lane; i < c; i += 32) {
      float v = load_f(xr, i) * inv * gamma[i];
      if (silu) v = v / (1.f + expf(-v));
      store_f(yr, i, v);
    }
  }
}

// ------------------------------------------------------------------ upsample

template <typename V>
__global__ void __launch_bounds__(kThreads) upsample2x_cl_kernel(const V* x, int64_t planes, int64_t h, int64_t w,
                                                                 int64_t cv, V* y) {
  const int64_t total = planes * 4 * h * w * cv;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t ci = i % cv;
    int64_t rest = i / cv;
    const int64_t ox = rest % (2 * w);
    rest /= 2 * w;
    const int64_t oy = rest % (2 * h);
    const int64_t pl = rest / (2 * h);
    y[i] = x[((pl * h + oy / 2) * w + ox / 2) * cv + ci];
  }
}

// ------------------------------------------------------------------ softmax

__device__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // red may still be read from the previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int k = 1; k < kThreads / 32; ++k) v = is_max ? fmaxf(v, red[k]) : v + red[k];
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(const float* s, int64_t cols, float scale, T* p) {
  __shared__ float red[kThreads / 32];
  const float* sr = s + int64_t(blockIdx.x) * cols;
  T* pr = p + int64_t(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) m = fmaxf(m, scale * sr[j]);
  m = block_reduce(m, true, red);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) sum += expf(scale * sr[j] - m);
  sum = block_reduce(sum, false, red);
  const float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) store_f(pr, j, expf(scale * sr[j] - m) * inv);
}

// ------------------------------------------------------------------ layouts

template <typename T>
__global__ void __launch_bounds__(kThreads) to_cl_kernel(ToChannelsLast p, const float* x, T* y) {
  const int64_t total = p.n * p.t * p.hw * p.c;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t ci = i % p.c;
    int64_t rest = i / p.c;
    const int64_t s = rest % p.hw;
    rest /= p.hw;
    const int64_t f = rest % p.t, b = rest / p.t;
    float v = x[((b * p.c + ci) * p.t_total + p.t0 + f) * p.hw + s];
    v = v * (p.scale ? p.scale[ci] : 1.f) + (p.shift ? p.shift[ci] : 0.f);
    store_f(y, i, v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) to_cf_kernel(ToChannelsFirst p, const T* x, float* y) {
  const int64_t total = p.n * p.c * p.t * p.hw;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t s = i % p.hw;
    int64_t rest = i / p.hw;
    const int64_t f = rest % p.t;
    rest /= p.t;
    const int64_t ci = rest % p.c, b = rest / p.c;
    float v = load_f(x, ((b * p.t + f) * p.hw + s) * p.c_x + ci);
    v = v * (p.scale ? p.scale[ci] : 1.f) + (p.shift ? p.shift[ci] : 0.f);
    if (p.clamp) v = fminf(fmaxf(v, -1.f), 1.f);
    y[((b * p.c + ci) * p.t_total + p.t0 + f) * p.hw + s] = v;
  }
}

bool float_or_bf16(ElemType t) { return t == ElemType::F32 || t == ElemType::BF16; }

}  // namespace

Status channel_rms_norm_cl_cuda(const void* x, ElemType type, int64_t rows, int64_t c, const float* gamma, bool silu,
                                void* y, void* stream) {
  if (rows < 0 || c <= 0 || c > (int64_t(1) << 30) || !x || !gamma || !y || !float_or_bf16(type))
    return Status::InvalidArgument;
  if (rows == 0) return Status::Ok;
  const unsigned grid = blocks_for(rows, kThreads / 32);
  const auto st = static_cast<cudaStream_t>(stream);
  const float root_c = sqrtf(float(c));
  if (type == ElemType::F32)
    rms_norm_cl_kernel<float><<<grid, kThreads, 0, st>>>(static_cast<const float*>(x), rows, int(c), gamma, silu,
                                                         root_c, static_cast<float*>(y));
  else
    rms_norm_cl_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(static_cast<const __nv_bfloat16*>(x), rows, int(c),
                                                                 gamma, silu, root_c, static_cast<__nv_bfloat16*>(y));
  return launched("channel_rms_norm_cl");
}

Status upsample_nearest2x_cl_cuda(const void* x, ElemType type, int64_t planes, int64_t h, int64_t w, int64_t c,
                                  void* y, void* stream) {
  if (planes < 0 || h <= 0 || w <= 0 || c <= 0 || !x || !y || !float_or_bf16(type)) return Status::InvalidArgument;
  if (planes == 0) return Status::Ok;
  const int64_t row_bytes = c * (type == ElemType::F32 ? 4 : 2);
  const bool vec = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const auto st = static_cast<cudaStream_t>(stream);
  const int64_t total_bytes = planes * 4 * h * w * row_bytes;
  if (vec) {
    const int64_t cv = row_bytes / 16;
    upsample2x_cl_kernel<uint4><<<blocks_for(total_bytes / 16), kThreads, 0, st>>>(
        static_cast<const uint4*>(x), planes, h, w, cv, static_cast<uint4*>(y));
  } else if (type == ElemType::F32) {
    upsample2x_cl_kernel<float><<<blocks_for(total_bytes / 4), kThreads, 0, st>>>(
        static_cast<const float*>(x), planes, h, w, c, static_cast<float*>(y));
  } else {
    upsample2x_cl_kernel<uint16_t><<<blocks_for(total_bytes / 2), kThreads, 0, st>>>(
        static_cast<const uint16_t*>(x), planes, h, w, c, static_cast<uint16_t*>(y));
  }
  return launched("upsample_nearest2x_cl");
}

Status softmax_rows_cuda(const float* s, int64_t rows, int64_t cols, float scale, void* p, ElemType p_type,
                         void* stream) {
  if (rows < 0 || cols <= 0 || !s || !p || !(scale > 0) || !std::isfinite(scale) || !float_or_bf16(p_type) ||
      rows > (int64_t(1) << 31) - 1)
    return Status::InvalidArgument;
  if (rows == 0) return Status::Ok;
  const auto st = static_cast<cudaStream_t>(stream);
  if (p_type == ElemType::F32)
    softmax_rows_kernel<float><<<unsigned(rows), kThreads, 0, st>>>(s, cols, scale, static_cast<float*>(p));
  else
    softmax_rows_kernel<__nv_bfloat16><<<unsigned(rows), kThreads, 0, st>>>(s, cols, scale,
                                                                              static_cast<__nv_bfloat16*>(p));
  return launched("softmax_rows");
}

Status to_channels_last_cuda(const ToChannelsLast& p, const float* x, void* y, ElemType type, void* stream) {
  if (p.n <= 0 || p.c <= 0 || p.t <= 0 || p.hw <= 0 || p.t0 < 0 || p.t0 + p.t > p.t_total || !x || !y ||
      !float_or_bf16(type))
    return Status::InvalidArgument;
  const auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = blocks_for(p.n * p.t * p.hw * p.c);
  if (type == ElemType::F32)
    to_cl_kernel<float><<<grid, kThreads, 0, st>>>(p, x, static_cast<float*>(y));
  else
    to_cl_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(p, x, static_cast<__nv_bfloat16*>(y));
  return launched("to_channels_last");
}

Status to_channels_first_cuda(const ToChannelsFirst& p, const void* x, ElemType type, float* y, void* stream) {
  if (p.n <= 0 || p.c <= 0 || p.c > p.c_x || p.t <= 0 || p.hw <= 0 || p.t0 < 0 || p.t0 + p.t > p.t_total || !x ||
      !y || !float_or_bf16(type))
    return Status::InvalidArgument;
  const auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = blocks_for(p.n * p.c * p.t * p.hw);
  if (type == ElemType::F32)
    to_cf_kernel<float><<<grid, kThreads, 0, st>>>(p, static_cast<const float*>(x), y);
  else
    to_cf_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(p, static_cast<const __nv_bfloat16*>(x), y);
  return launched("to_channels_first");
}

Status copy2d_cuda(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                   void* stream) {
  if (rows == 0 || row_bytes == 0) return Status::Ok;
  if (!dst || !src) return Status::InvalidArgument;
  if (rows == 1) dst_pitch = src_pitch = row_bytes;
  if (row_bytes > dst_pitch || row_bytes > src_pitch) return Status::InvalidArgument;
  return cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice,
                           static_cast<cudaStream_t>(stream)) == cudaSuccess
             ? Status::Ok
             : Status::LaunchFailed;
}

}  // namespace td::kernels
