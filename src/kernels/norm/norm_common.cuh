// Device building blocks of the row-wise (norm) and elementwise kernels, meant
// to be shared with other kernel families (e.g. a fused norm -> int8 quantizer):
//
//   - act_type_dispatch: ElemType -> C++ type (float, __half, __nv_bfloat16)
//   - ChunkIO<T, kChunk>: one "chunk" of kChunk consecutive elements of a row,
//     loaded and stored as raw bits and converted to/from fp32. kChunk = 8 is
//     the vector path (one 16-byte access for bf16/fp16, two for fp32: every
//     chunk is LDG.E.128 / STG.E.128); kChunk = 1 is the scalar fallback for
//     misaligned or odd-sized rows.
//   - load_params<kChunk>: the matching fp32 parameter-vector load
//     (weights, biases, modulation rows) through the read-only path.
//   - row_sum: the sum of one value per thread over the threads of a row,
//     for blocks laid out as (threads per row) x (rows per block).
//   - RowPlan / plan_rows: how a row of `dim` elements is spread over threads
//     so that it is held entirely in registers (one read of global memory).
//
// Conversions to 16-bit types round to nearest even, as the host references do.
// CUDA C++17, no architecture-specific instructions (sm_80+).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/status.h"

namespace td::kernels::gpu {

// ---- element types -----------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the C++ type of an activation ElemType and
// returns its Status; InvalidArgument for a type that is not F32/F16/BF16.
template <typename F>
inline Status act_type_dispatch(ElemType t, F&& f) {
  switch (t) {
    case ElemType::F32: return f(TypeTag<float>{});
    case ElemType::F16: return f(TypeTag<__half>{});
    case ElemType::BF16: return f(TypeTag<__nv_bfloat16>{});
    default: return Status::InvalidArgument;
  }
}

// Scalar conversions.
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Two 16-bit elements packed in a 32-bit word (element 0 in the low half) <-> floats.
template <typename T>
struct PairCvt;
template <>
struct PairCvt<__nv_bfloat16> {
  // bf16 -> fp32 is exact: the bits are the top half of the float.
  __device__ __forceinline__ static float lo(uint32_t w) { return __uint_as_float(w << 16); }
  __device__ __forceinline__ static float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  __device__ __forceinline__ static uint32_t pack(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a -> low half
    uint32_t w;
    __builtin_memcpy(&w, &h, 4);
    return w;
  }
};
template <>
struct PairCvt<__half> {
  __device__ __forceinline__ static float lo(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  }
  __device__ __forceinline__ static float hi(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ __forceinline__ static uint32_t pack(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);  // a -> low half
    uint32_t w;
    __builtin_memcpy(&w, &h, 4);
    return w;
  }
};

// ---- chunks of a row -------------------------------------------------------------

template <typename T, int kChunk>
struct ChunkIO;

// Vector path: 8 elements = 16 bytes of a 16-bit type or 32 bytes of fp32.
// Needs a 16-byte aligned address. Raw holds the bits so that a thread can
// issue all its loads before converting anything (more bytes in flight).
template <typename T>
struct ChunkIO<T, 8> {
  static constexpr int kWords = int(sizeof(T)) * 8 / 16;  // uint4 per chunk: 1 (16-bit) or 2 (fp32)
  struct Raw {
    uint4 w[kWords];
  };
  __device__ __forceinline__ static Raw load(const T* p) {
    Raw r;
#pragma unroll
    for (int i = 0; i < kWords; ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
    return r;
  }
  __device__ __forceinline__ static void store(T* p, const Raw& r) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) reinterpret_cast<uint4*>(p)[i] = r.w[i];
  }
  __device__ __forceinline__ static void unpack(const Raw& r, float (&f)[8]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        f[4 * i + 0] = __uint_as_float(r.w[i].x);
        f[4 * i + 1] = __uint_as_float(r.w[i].y);
        f[4 * i + 2] = __uint_as_float(r.w[i].z);
        f[4 * i + 3] = __uint_as_float(r.w[i].w);
      }
    } else {
      const uint32_t w[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f[2 * i] = PairCvt<T>::lo(w[i]);
        f[2 * i + 1] = PairCvt<T>::hi(w[i]);
      }
    }
  }
  __device__ __forceinline__ static Raw pack(const float (&f)[8]) {
    Raw r;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kWords; ++i)
        r.w[i] = make_uint4(__float_as_uint(f[4 * i]), __float_as_uint(f[4 * i + 1]), __float_as_uint(f[4 * i + 2]),
                            __float_as_uint(f[4 * i + 3]));
    } else {
      r.w[0] = make_uint4(PairCvt<T>::pack(f[0], f[1]), PairCvt<T>::pack(f[2], f[3]), PairCvt<T>::pack(f[4], f[5]),
                          PairCvt<T>::pack(f[6], f[7]));
    }
    return r;
  }
};

// Scalar path: one element, any alignment of its type.
template <typename T>
struct ChunkIO<T, 1> {
  struct Raw {
    T v;
  };
  __device__ __forceinline__ static Raw load(const T* p) { return Raw{*p}; }
  __device__ __forceinline__ static void store(T* p, const Raw& r) { *p = r.v; }
  __device__ __forceinline__ static void unpack(const Raw& r, float (&f)[1]) { f[0] = to_f32(r.v); }
  __device__ __forceinline__ static Raw pack(const float (&f)[1]) { return Raw{from_f32<T>(f[0])}; }
};

// kChunk fp32 parameters (weights, biases, a modulation row) starting at p,
// read through the read-only data cache: they are shared by every row and
// stay in L1/L2. kChunk == 8 needs p 16-byte aligned.
template <int kChunk>
__device__ __forceinline__ void load_params(const float* p, float (&f)[kChunk]) {
  if constexpr (kChunk == 8) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) f[j] = __ldg(p + j);
  }
}

// ---- reductions over the threads of a row ----------------------------------------

// Block layout of the row kernels: blockDim.x threads per row (a power of two
// <= 32, or a multiple of 32), blockDim.y rows per block, blockDim.x *
// blockDim.y a multiple of 32, and every thread of the block reaching each
// row_sum call (no early exit: threads past the last row take part with 0).
// The row kernels call row_sum at most twice per block, with distinct arrays.
//
// Returns the sum of v over the threads of the caller's row, identical in all
// of them. Rows narrower than a warp reduce with xor shuffles alone (the
// lanes of a row are an aligned group, so xor offsets < blockDim.x stay in
// it). Wider rows add one partial per warp through `partials` (32 floats of
// shared memory) and one __syncthreads. Successive calls must use distinct
// `partials` arrays: a call's readers may still be reading when the next
// call's writers write, and distinct arrays make a second barrier unneeded.
__device__ __forceinline__ float row_sum(float v, float* partials) {
  const int tpr = int(blockDim.x);
  if (tpr <= 32) {
    for (int offset = tpr >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warps_per_row = tpr >> 5;
  const int first_warp = int(threadIdx.y) * warps_per_row;
  if ((threadIdx.x & 31u) == 0) partials[first_warp + int(threadIdx.x >> 5)] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps_per_row; ++i) total += partials[first_warp + i];
  return total;
}

// ---- launch planning (host) ----------------------------------------------------------

// Threads per row never exceed this, so every row kernel can declare
// __launch_bounds__(kMaxRowThreads) and keep up to 128 registers per thread.
constexpr int kMaxRowThreads = 512;
// Target block size of the row kernels: one warp (rows narrower than a warp
// share it). Measured on the H200 at 32760 x 1536 bf16: 32-thread blocks beat
// 256-thread ones by 2-4% (RMS 89.3% vs 87.3% of copy bandwidth, LN 86.8% vs
// 83.5%): a finished row frees its slot at once instead of waiting for the
// block's slowest row. residual_gate_norm (two operands per row, ~80-100
// registers) measured better with 256-thread blocks (fp32 residual at 1536:
// 91.6% vs 85.2%) and passes that as block_threads.
constexpr int kRowBlockThreads = 32;

// How rows are spread over threads: each thread holds `vpt` chunks of `chunk`
// elements in registers (chunk c of a row belongs to thread c % tpr), so a
// row is read from global memory once, normalised and written from registers.
struct RowPlan {
  int chunk = 8;  // elements per chunk: 8 (vector path) or 1 (scalar path)
  int vpt = 0;    // chunks per thread: a template argument of the kernel (4, 6, 8 vector; 16 scalar)
  int tpr = 0;    // threads per row = blockDim.x
  int rpb = 0;    // rows per block = blockDim.y
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Picks the plan for rows of `dim` elements. `vectorized` says whether every
// operand allows the vector path (dim, row strides and parameter strides
// multiples of 8 elements, base pointers 16-byte aligned). Among the compiled
// chunks-per-thread counts it takes the one that leaves the fewest idle chunk
// slots (1536 -> 6 chunks x 32 threads, 5120 -> 4 x 160, 4096 -> 8 x 64),
// ties going to more chunks per thread (fewer threads per row, cheaper
// reductions; more chunks per thread with fewer threads, e.g. 1536 as 16 x 12,
// measured slower). `max_vpt` caps the vector path's chunks per thread: kernels
// that hold two operands per chunk (x and y of residual_gate_norm) pass 6 so
// that two fp32 rows still fit in registers. Returns false when the row does
// not fit in kMaxRowThreads threads (dim > 32768 vectorized, > 8192 scalar).
// Rows narrower than `block_threads` (a power of two >= 32) share a block.
inline bool plan_rows(int64_t dim, bool vectorized, RowPlan* plan, int max_vpt = 8,
                      int block_threads = kRowBlockThreads) {
  static constexpr int kVectorVpt[] = {4, 6, 8};
  static constexpr int kScalarVpt[] = {16};
  const int chunk = vectorized ? 8 : 1;
  const int64_t nchunks = dim / chunk;
  const int* cands = vectorized ? kVectorVpt : kScalarVpt;
  const int ncands = vectorized ? 3 : 1;
  RowPlan best;
  int64_t best_waste = -1;
  for (int i = 0; i < ncands; ++i) {
    const int vpt = cands[i];
    if (vectorized && vpt > max_vpt) continue;
    int64_t tpr = (nchunks + vpt - 1) / vpt;
    if (tpr <= 32) {
      int64_t p2 = 1;
      while (p2 < tpr) p2 <<= 1;
      tpr = p2;
    } else {
      tpr = (tpr + 31) / 32 * 32;
    }
    if (tpr > kMaxRowThreads) continue;
    const int64_t waste = tpr * vpt - nchunks;
    if (best_waste < 0 || waste <= best_waste) {
      best_waste = waste;
      best.chunk = chunk;
      best.vpt = vpt;
      best.tpr = int(tpr);
    }
  }
  if (best_waste < 0) return false;
  best.rpb = best.tpr >= block_threads ? 1 : block_threads / best.tpr;
  *plan = best;
  return true;
}

inline Status launch_status() { return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed; }

}  // namespace td::kernels::gpu
