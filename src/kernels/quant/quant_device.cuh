// Device building blocks of the quantization and q/k-norm kernels: 8-element
// "packs" of a row loaded as raw bits (so a thread issues all its loads before
// converting anything), the quantization formulas of quant_common.h in device
// form (bit-identical to the host: correctly rounded division and product,
// cvt.rni.sat), shuffle / block reductions, and the host-side plan of how a
// row is spread over a CTA. CUDA C++17, plain sm_80+ instructions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels::qdev {

// ---- element types ---------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for an activation ElemType (F32, F16, BF16).
template <typename F>
inline Status dispatch_act_type(ElemType t, F&& f) {
  switch (t) {
    case ElemType::F32: return f(TypeTag<float>{});
    case ElemType::F16: return f(TypeTag<__half>{});
    case ElemType::BF16: return f(TypeTag<__nv_bfloat16>{});
    default: return Status::InvalidArgument;
  }
}

inline bool aligned_to(const void* p, unsigned bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

inline Status launch_status() { return cudaGetLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed; }

// ---- packs of 8 elements ---------------------------------------------------

// 8 consecutive elements as raw bits: one uint4 for 16-bit types, two for fp32.
template <typename T>
struct Pack8 {
  static constexpr int kWords = sizeof(T) == 4 ? 2 : 1;
  uint4 w[kWords];
};

template <typename T>
__device__ __forceinline__ Pack8<T> zero_pack() {
  Pack8<T> p;
#pragma unroll
  for (int i = 0; i < Pack8<T>::kWords; ++i) p.w[i] = make_uint4(0u, 0u, 0u, 0u);
  return p;
}

// Vector load of 8 elements at a 16-byte aligned address.
template <typename T>
__device__ __forceinline__ Pack8<T> load_pack(const T* p) {
  Pack8<T> r;
#pragma unroll
  for (int i = 0; i < Pack8<T>::kWords; ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}

// Element-wise load of the first n (0..8) elements at any address; the rest are +0.
template <typename T>
__device__ __forceinline__ Pack8<T> load_pack_partial(const T* p, int n) {
  uint32_t e[8];
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = i < n ? reinterpret_cast<const uint32_t*>(p)[i] : 0u;
    Pack8<T> r;
    r.w[0] = make_uint4(e[0], e[1], e[2], e[3]);
    r.w[1] = make_uint4(e[4], e[5], e[6], e[7]);
    return r;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = i < n ? uint32_t(reinterpret_cast<const unsigned short*>(p)[i]) : 0u;
    Pack8<T> r;
    r.w[0] = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16), e[6] | (e[7] << 16));
    return r;
  }
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float f16_lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
__device__ __forceinline__ float f16_hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }

// The 8 elements as fp32 (exact for every input type).
template <typename T>
__device__ __forceinline__ void unpack(const Pack8<T>& p, float (&f)[8]) {
  if constexpr (sizeof(T) == 4) {
    f[0] = __uint_as_float(p.w[0].x), f[1] = __uint_as_float(p.w[0].y);
    f[2] = __uint_as_float(p.w[0].z), f[3] = __uint_as_float(p.w[0].w);
    f[4] = __uint_as_float(p.w[1].x), f[5] = __uint_as_float(p.w[1].y);
    f[6] = __uint_as_float(p.w[1].z), f[7] = __uint_as_float(p.w[1].w);
  } else {
    const uint32_t w[4] = {p.w[0].x, p.w[0].y, p.w[0].z, p.w[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        f[2 * i] = bf16_lo(w[i]);
        f[2 * i + 1] = bf16_hi(w[i]);
      } else {
        f[2 * i] = f16_lo(w[i]);
        f[2 * i + 1] = f16_hi(w[i]);
      }
    }
  }
}

// 8 fp32 values rounded (to nearest even) to T and stored: vector stores at a
// 16-byte aligned address when n == 8 and `vec`, element-wise otherwise.
template <typename T>
__device__ __forceinline__ void store_values(T* p, const float (&f)[8], int n, bool vec) {
  if constexpr (sizeof(T) == 4) {
    if (vec && n == 8) {
      reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < n) reinterpret_cast<float*>(p)[i] = f[i];
    }
  } else {
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if constexpr (std::is_same<T, __nv_bfloat16>::value)
        h[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f[i]));
      else
        h[i] = __half_as_ushort(__float2half_rn(f[i]));
    }
    if (vec && n == 8) {
      *reinterpret_cast<uint4*>(p) = make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                                                h[6] | (h[7] << 16));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < n) reinterpret_cast<unsigned short*>(p)[i] = (unsigned short)h[i];
    }
  }
}

// 8 fp32 parameters (weights, a modulation row) through the read-only path;
// p 16-byte aligned. They are shared by every row and stay in L1/L2.
__device__ __forceinline__ void load_params8(const float* p, float (&f)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// The second pass of the exact two-pass variance: the sum of (x - mean)^2
// over a thread's packs raw[j] whose row index first + j * stride is below
// packs (in j order, one fma per element).
template <typename T, int V>
__device__ __forceinline__ float centered_square_sum(const Pack8<T> (&raw)[V], int first, int stride, int packs,
                                                     float mean) {
  float c = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (first + j * stride < packs) {
      float f[8];
      unpack(raw[j], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = f[i] - mean;
        c = fmaf(d, d, c);
      }
    }
  }
  return c;
}

// AdaLN-modulated LayerNorm of one pack: (x - mean) * rstd * (1 + scale) +
// shift, the modulation rows (fp32, 16-byte aligned) through L1. The block128
// fused kernels share it so that their y agree bit for bit given the row's
// statistics.
template <typename T>
__device__ __forceinline__ void modulate_pack(const Pack8<T>& raw, float mean, float rstd, const float* shift,
                                              const float* scale, float (&y)[8]) {
  float f[8], sh[8], sc[8];
  unpack(raw, f);
  load_params8(shift, sh);
  load_params8(scale, sc);
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = fmaf((f[i] - mean) * rstd, 1.f + sc[i], sh[i]);
}

// ---- quantization ------------------------------------------------------------

// Round half to even, saturate to [-128, 127], NaN -> 0.
__device__ __forceinline__ int cvt_rn_sat_s8(float v) {
  int r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(v));
  return r;
}

// quant_common.h's parameter formulas with explicitly IEEE-rounded operations
// (immune to -use_fast_math), so the device matches the host bit for bit.
__device__ __forceinline__ QuantParams block128_params_dev(float amax) {
  const float a = fmaxf(amax, kBlockAmaxFloor);
  return {__fmul_rn(a, 1.f / kBlockQuantRange), __fdiv_rn(kBlockQuantRange, a)};
}
__device__ __forceinline__ QuantParams symmetric_params_dev(float amax) {
  if (!(amax >= kSymAmaxMin)) return {0.f, 0.f};
  return {__fdiv_rn(amax, kSymQuantRange), __fdiv_rn(kSymQuantRange, amax)};
}

// Codes of 8 values with multiplier inv, packed little-endian into 8 bytes.
__device__ __forceinline__ uint2 quantize8(const float (&f)[8], float inv) {
  uint32_t b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = uint32_t(cvt_rn_sat_s8(__fmul_rn(f[i], inv))) & 0xffu;
  return make_uint2(b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24), b[4] | (b[5] << 8) | (b[6] << 16) | (b[7] << 24));
}

// quantize8 with the bytes gathered by PRMT (3 per 4 codes) instead of a
// mask, shift and OR per code: the same codes, ~1.25 fewer instructions per
// element. Used by the variants written for issue 3's bandwidth bar.
__device__ __forceinline__ uint2 quantize8_prmt(const float (&f)[8], float inv) {
  uint32_t c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) c[i] = uint32_t(cvt_rn_sat_s8(__fmul_rn(f[i], inv)));  // low byte = the code
  return make_uint2(__byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410),
                    __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410));
}

// Stores the first n (0..8) of 8 packed codes: one 8-byte store when n == 8
// and `vec` (p 8-byte aligned), bytes otherwise.
__device__ __forceinline__ void store_codes(int8_t* p, uint2 codes, int n, bool vec) {
  if (vec && n == 8) {
    *reinterpret_cast<uint2*>(p) = codes;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) p[i] = int8_t((i < 4 ? codes.x >> (8 * i) : codes.y >> (8 * (i - 4))) & 0xffu);
  }
}

__device__ __forceinline__ float absmax8(const float (&f)[8]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
  return m;
}

// max |x| over packs, computed on the raw bits: for non-negative floats
// (sign bit cleared) the integer order is the numeric order, for fp32, fp16
// and bf16 alike, so the amax pass needs no conversion (and no registers for
// converted values). 16-bit types keep two running maxima per word
// (__vmaxu2); amax_from_bits folds them and converts once.
template <typename T>
__device__ __forceinline__ uint32_t absmax_bits(const Pack8<T>& p, uint32_t acc) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      acc = max(acc, p.w[i].x & 0x7fffffffu);
      acc = max(acc, p.w[i].y & 0x7fffffffu);
      acc = max(acc, p.w[i].z & 0x7fffffffu);
      acc = max(acc, p.w[i].w & 0x7fffffffu);
    }
  } else {
    acc = __vmaxu2(acc, p.w[0].x & 0x7fff7fffu);
    acc = __vmaxu2(acc, p.w[0].y & 0x7fff7fffu);
    acc = __vmaxu2(acc, p.w[0].z & 0x7fff7fffu);
    acc = __vmaxu2(acc, p.w[0].w & 0x7fff7fffu);
  }
  return acc;
}

template <typename T>
__device__ __forceinline__ float amax_from_bits(uint32_t acc) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(acc);
  } else {
    const uint32_t m = max(acc >> 16, acc & 0xffffu);
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
      return __uint_as_float(m << 16);
    else
      return __half2float(__ushort_as_half((unsigned short)m));
  }
}

// ---- reductions ----------------------------------------------------------------

// Max over the aligned group of `width` lanes (a power of two <= 32) holding
// the caller; every lane of the warp must call it.
template <int width>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the `nthreads` threads (a multiple of 32) starting at warp
// `first_warp` of the block, identical in all of them (partials are added in
// the same order by every thread). `partials` holds >= nthreads/32 floats of
// shared memory; `barrier` is the hardware barrier those threads sync on (0 =
// the whole block, __syncthreads; 1..15 = a named barrier of nthreads). A
// caller must not reuse `partials` in the very next call: alternate two arrays.
__device__ __forceinline__ float group_sum(float v, float* partials, int first_warp, int nthreads, int barrier) {
  v = warp_sum(v);
  const int nwarps = nthreads >> 5;
  if (nwarps == 1) return v;
  const int warp = int(threadIdx.x >> 5) - first_warp;
  if ((threadIdx.x & 31u) == 0) partials[warp] = v;
  if (barrier == 0)
    __syncthreads();
  else
    asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(nthreads) : "memory");
  float total = 0.f;
  for (int i = 0; i < nwarps; ++i) total += partials[i];
  return total;
}

// ---- row plans (host) ------------------------------------------------------------

// How a row of `packs` 8-element packs is spread over the threads of a CTA:
// pack p belongs to thread p % threads, as its register slot p / threads. So
// the 16 packs of a 128-column group sit in one aligned half-warp (threads is
// a multiple of 32), for the group amax by shuffles.
struct RowPlan {
  int packs_per_thread = 0;  // a template argument of the kernels
  int threads = 0;           // multiple of 32, <= kMaxRowThreads
};

inline constexpr int kMaxRowThreads = 512;  // kernels declare __launch_bounds__(512): <= 128 registers
inline constexpr int kMaxRowDim = kMaxRowThreads * 8 * 8;  // 32768 elements

// Packs per thread compiled for the row kernels, in order of preference
// (enough bytes in flight per thread, CTAs of 64-256 threads); the first
// with the fewest idle slots wins: 1536 columns (192 packs) -> 3 packs x 64
// threads, 5120 (640 packs) -> 4 x 160, 3072 -> 4 x 96.
inline RowPlan plan_row(int64_t packs) {
  static constexpr int kOrder[] = {4, 3, 5, 6, 8, 2};
  RowPlan best;
  int64_t best_idle = -1;
  for (int vpt : kOrder) {
    const int64_t threads = ((packs + vpt - 1) / vpt + 31) / 32 * 32;
    if (threads > kMaxRowThreads) continue;
    const int64_t idle = threads * vpt - packs;
    if (best_idle < 0 || idle < best_idle) {
      best_idle = idle;
      best.packs_per_thread = vpt;
      best.threads = int(threads);
    }
  }
  return best;  // threads == 0: the row does not fit
}

// Calls f(std::integral_constant<int, V>{}) for the plan's packs per thread.
template <typename F>
inline Status dispatch_packs(int vpt, F&& f) {
  switch (vpt) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: return Status::InvalidArgument;
  }
}

}  // namespace td::kernels::qdev
