// SageAttention-style quantized attention on CUDA: the quantization pre-pass
// (every backend) and the portable kernel (sm_80+: INT8 mma.sync for Q·Kᵀ,
// FP16 mma.sync for P̃·V, fp32 accumulation), dense and LUT block-sparse.
// The quantization contract is in sage_attention.h; sage_attention_cpu
// simulates it.
//
// Pre-pass, three launches on the workspace:
//   1. stats     grid (chunks of 256 tokens, H, B): per chunk, Σ K and max|V| per channel
//   2. finalize  grid (B·H): K mean, V scale per channel (fixed order: deterministic)
//   3. quantize  grid (64-row blocks of Q, K and V, H, B): Q INT8 per token (and
//                scale·q·km for the LSE), K - km INT8 per 64-key block, V·448/amax
//                to FP16 (portable) [B, H, Lk_pad, D]. Padded rows are zero.
//
// Portable attention kernel: one CTA of block_q/16 warps owns block_q (128
// dense) query rows of one (batch, head); each warp owns 16 rows with its INT8
// Q fragments in registers. Key tiles of 64 (INT8 K 64xD, FP16 V 64xD) stream
// through a 3-stage cp.async pipeline; the tile list is 0..n-1 (dense) or the
// LUT row's key blocks (block_k/64 tiles each). Per tile and warp:
//   S = Q·Kᵀ        mma.sync m16n8k32 s8 -> s32 (K fragments by ldmatrix: the
//                   INT8 fragment layout equals the BF16 m16n8k16 one in bytes)
//   dequant         float(S)·(sq·scale·log2 e)·sk, one FMUL per element
//   online softmax  exp2, running max and row sum as in flash_attention.cu
//   O += P̃·V        P̃ rounded to FP16 from the S registers, V by ldmatrix.trans
// Epilogue: O·sv/l staged in shared memory, 16-byte stores; LSE with the
// K-smoothing correction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cp_async.cuh"
#include "kernels/sage_attention/sage_attention.h"
#include "kernels/sage_attention/sage_attention_internal.h"
#include "kernels/sage_attention/sage_prepass.h"

namespace td::kernels {
namespace sage {
namespace {

constexpr int kStatsChunk = 256;  // tokens per stats CTA
constexpr int kPrepThreads = 128;

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// ---------------------------------------------------------------------------
// Pre-pass kernels

template <int D>
__global__ void __launch_bounds__(kPrepThreads) stats_kernel(const PrepParams p) {
  constexpr int kC = D / 8;                  // 16-byte chunks of a bf16 row
  constexpr int kRows = kPrepThreads / kC;   // rows per sweep
  __shared__ float s_sum[kRows][D];
  __shared__ float s_max[kRows][D];
  const int tid = threadIdx.x, chunk = tid % kC, rsub = tid / kC;
  const int h = blockIdx.y, b = blockIdx.z;
  const int t0 = blockIdx.x * kStatsChunk;
  const int t1 = min(p.len_kv, t0 + kStatsChunk);
  float sum[8], mx[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) sum[i] = 0.f, mx[i] = 0.f;
  const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + chunk * 8;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head + chunk * 8;
  for (int t = t0 + rsub; t < t1; t += kRows) {
    const uint4 kr = *reinterpret_cast<const uint4*>(kg + int64_t(t) * p.ks.token);
    const uint4 vr = *reinterpret_cast<const uint4*>(vg + int64_t(t) * p.vs.token);
    const __nv_bfloat16* kk = reinterpret_cast<const __nv_bfloat16*>(&kr);
    const __nv_bfloat16* vv = reinterpret_cast<const __nv_bfloat16*>(&vr);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      sum[i] += __bfloat162float(kk[i]);
      mx[i] = fmaxf(mx[i], fabsf(__bfloat162float(vv[i])));
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s_sum[rsub][chunk * 8 + i] = sum[i];
    s_max[rsub][chunk * 8 + i] = mx[i];
  }
  __syncthreads();
  if (tid < D) {
    float s = 0.f, m = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      s += s_sum[r][tid];
      m = fmaxf(m, s_max[r][tid]);
    }
    float* part = p.partial + ((int64_t(b) * p.heads + h) * p.n_chunks + blockIdx.x) * 2 * D;
    part[tid] = s;
    part[D + tid] = m;
  }
}

__global__ void finalize_kernel(const PrepParams p, int D) {
  const int bh = blockIdx.x, c = threadIdx.x;
  if (c >= D) return;
  const float* part = p.partial + int64_t(bh) * p.n_chunks * 2 * D;
  float s = 0.f, m = 0.f;
  for (int i = 0; i < p.n_chunks; ++i) {
    s += part[int64_t(i) * 2 * D + c];
    m = fmaxf(m, part[int64_t(i) * 2 * D + D + c]);
  }
  p.km[int64_t(bh) * D + c] = s / float(p.len_kv);
  p.vscale[int64_t(bh) * D + c] = m / 448.f;
  p.vinv[int64_t(bh) * D + c] = m > 0.f ? 448.f / m : 0.f;
}

__device__ __forceinline__ int quant_i8(float x) { return max(-127, min(127, int(roundf(x)))); }

__device__ __forceinline__ uint32_t pack_i8x4(float a, float b, float c, float d) {
  return uint32_t(quant_i8(a) & 0xff) | (uint32_t(quant_i8(b) & 0xff) << 8) | (uint32_t(quant_i8(c) & 0xff) << 16) |
         (uint32_t(quant_i8(d) & 0xff) << 24);
}
// pack_i8x4 without the clamp, the same bytes where |x| <= 127.5 (quant_direct:
// v = x·inv with |x| <= amax and inv = RN(127 / amax), so |v| <= 127·(1 +
// 2^-24) before v's own rounding, and roundf gives at most 127; a NaN or inf
// input gives inv = 0 or v = NaN, whose F2I is 0 either way). Two VIMNMX per
// code fewer in a pass that the issue slots limit.
__device__ __forceinline__ uint32_t pack_i8x4_in_range(float a, float b, float c, float d) {
  return uint32_t(int(roundf(a)) & 0xff) | (uint32_t(int(roundf(b)) & 0xff) << 8) |
         (uint32_t(int(roundf(c)) & 0xff) << 16) | (uint32_t(int(roundf(d)) & 0xff) << 24);
}

// Block sums for SageSLA's selection (sage_prepass.h), written by the quantize
// pass's Q and K CTAs when kPool: Σ q and Σ (k - km) of the CTA's 64 rows.
// Predicted cost (H200, 1x12x32760, D 128): the pass moves 302 MB in and
// 150 MB out (~0.13-0.14 ms at ~3.3 TB/s) either way; the sums add 2 x 6 MB of
// writes (~2 us) and one 4 KB shared-memory reduction per Q / K CTA, against
// the default selection's own pooling pass over Q and K (57 us measured) and
// its K mean pass (10 us).
struct PoolOut {
  float* q_sum64 = nullptr;  // [B·H, lq_pad / 64, D]
  float* k_sum64 = nullptr;  // [B·H, lk_pad / 64, D]
};

// The kRows row groups' per-thread sums (each over its kPerThread rows, in row
// order) added in group order through shared memory: one fixed order.
template <int D, int kRows>
__device__ __forceinline__ void store_block_sum(const float (&sum)[8], int chunk, int rsub, float* out) {
  __shared__ float s_pool[kRows][D];
#pragma unroll
  for (int i = 0; i < 8; ++i) s_pool[rsub][chunk * 8 + i] = sum[i];
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += kPrepThreads) {
    float s = s_pool[0][c];
#pragma unroll
    for (int r = 1; r < kRows; ++r) s += s_pool[r][c];
    out[c] = s;
  }
}

// blockIdx.x: [0, nq) Q blocks, [nq, nq + nk) K blocks, [nq + nk, nq + 2nk) V blocks, 64 rows each.
// kPool: the Q and K CTAs also write their block sums (PoolOut) from the same
// loads; the quantized outputs are the same bits either way.
template <int D, bool kPool = false>
__global__ void __launch_bounds__(kPrepThreads) quant_kernel(const PrepParams p, const PoolOut pool) {
  constexpr int kC = D / 8;
  constexpr int kRows = kPrepThreads / kC;
  constexpr int kPerThread = 64 / kRows;
  const int tid = threadIdx.x, chunk = tid % kC, rsub = tid / kC;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int nq = p.lq_pad / 64, nk = p.lk_pad / 64;
  int blk = blockIdx.x;
  const float* km = p.km + bh * D + chunk * 8;

  if (blk < nq) {
    const __nv_bfloat16* qg = p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + chunk * 8;
    float kmv[8], qsum[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) kmv[i] = km[i], qsum[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      float x[8];
      float amax = 0.f, dot = 0.f;
      if (t < p.len_q) {
        const uint4 r = *reinterpret_cast<const uint4*>(qg + int64_t(t) * p.qs.token);
        const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&r);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          x[i] = __bfloat162float(e[i]);
          amax = fmaxf(amax, fabsf(x[i]));
          dot = fmaf(x[i], kmv[i], dot);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = 0.f;
      }
      if constexpr (kPool) {
#pragma unroll
        for (int i = 0; i < 8; ++i) qsum[i] += x[i];
      }
#pragma unroll
      for (int off = 1; off < kC; off <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        dot += __shfl_xor_sync(0xffffffffu, dot, off);
      }
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      uint2 w;
      w.x = pack_i8x4(x[0] * inv, x[1] * inv, x[2] * inv, x[3] * inv);
      w.y = pack_i8x4(x[4] * inv, x[5] * inv, x[6] * inv, x[7] * inv);
      *reinterpret_cast<uint2*>(p.qi8 + (bh * p.lq_pad + t) * D + chunk * 8) = w;
      if (chunk == 0) {
        p.qscale[bh * p.lq_pad + t] = (amax / 127.f) * p.scale_log2;
        p.qkm[bh * p.lq_pad + t] = dot * p.scale;
      }
    }
    if constexpr (kPool) store_block_sum<D, kRows>(qsum, chunk, rsub, pool.q_sum64 + (bh * nq + blk) * D);
    return;
  }
  blk -= nq;
  if (blk < nk) {
    __shared__ float s_red[kPrepThreads / 32];
    const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + chunk * 8;
    float x[kPerThread][8];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      if (t < p.len_kv) {
        const uint4 r = *reinterpret_cast<const uint4*>(kg + int64_t(t) * p.ks.token);
        const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&r);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          x[j][i] = __bfloat162float(e[i]) - km[i];
          amax = fmaxf(amax, fabsf(x[j][i]));
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[j][i] = 0.f;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (tid % 32 == 0) s_red[tid / 32] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kPrepThreads / 32; ++w) amax = fmaxf(amax, s_red[w]);
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      uint2 w;
      w.x = pack_i8x4(x[j][0] * inv, x[j][1] * inv, x[j][2] * inv, x[j][3] * inv);
      w.y = pack_i8x4(x[j][4] * inv, x[j][5] * inv, x[j][6] * inv, x[j][7] * inv);
      *reinterpret_cast<uint2*>(p.ki8 + (bh * p.lk_pad + t) * D + chunk * 8) = w;
    }
    if (tid == 0) p.kscale[bh * (p.lk_pad / 64) + blk] = amax / 127.f;
    if constexpr (kPool) {
      float ksum[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ksum[i] = x[0][i];
#pragma unroll
        for (int j = 1; j < kPerThread; ++j) ksum[i] += x[j][i];
      }
      store_block_sum<D, kRows>(ksum, chunk, rsub, pool.k_sum64 + (bh * nk + blk) * D);
    }
    return;
  }
  blk -= nk;
  if (p.v_fp8) {
    // e4m3 Vᵀ [B·H, D, lk_pad], keys permuted within each 32-key group.
    __shared__ __align__(16) uint8_t s_vt[D][64];
    const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head + chunk * 8;
    const float* vinv = p.vinv + bh * D + chunk * 8;
    float sc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) sc[i] = vinv[i];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = j * kRows + rsub, t = blk * 64 + r;
      float x[8];
      if (t < p.len_kv) {
        const uint4 raw = *reinterpret_cast<const uint4*>(vg + int64_t(t) * p.vs.token);
        const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = __bfloat162float(e[i]) * sc[i];
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = 0.f;
      }
      const int pos = (r / 32) * 32 + v_fp8_position(r % 32);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        s_vt[chunk * 8 + i][pos] = uint8_t(__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3));
    }
    __syncthreads();
    for (int idx = tid; idx < D * 4; idx += kPrepThreads) {
      const int c = idx / 4, q = idx % 4;
      *reinterpret_cast<uint4*>(p.v8 + (bh * D + c) * p.lk_pad + blk * 64 + q * 16) =
          *reinterpret_cast<const uint4*>(&s_vt[c][q * 16]);
    }
    return;
  }
  {
    const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head + chunk * 8;
    const float* vinv = p.vinv + bh * D + chunk * 8;
    float sc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) sc[i] = vinv[i];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      uint4 out = make_uint4(0, 0, 0, 0);
      if (t < p.len_kv) {
        const uint4 r = *reinterpret_cast<const uint4*>(vg + int64_t(t) * p.vs.token);
        const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&r);
        __half2* o2 = reinterpret_cast<__half2*>(&out);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o2[i] = __floats2half2_rn(__bfloat162float(e[2 * i]) * sc[2 * i], __bfloat162float(e[2 * i + 1]) * sc[2 * i + 1]);
      }
      *reinterpret_cast<uint4*>(p.v16 + (bh * p.lk_pad + t) * D + chunk * 8) = out;
    }
  }
}

// ---------------------------------------------------------------------------
// Quantize pass, Direct variant (SageQuantKernel::Direct, sage_prepass.h): the
// same outputs bit for bit as quant_kernel, with the byte traffic as the only
// limit. Why the default is ~2x its floor (2.05 ms against ~1.0 at
// 1x40x75600x128 on the H200):
//  - Q: each row's 16-byte load sits behind the previous row's INT8 store
//    (plain pointers may alias), so a thread has one load in flight;
//  - Vᵀ: single-byte shared stores at s_vt[chunk·8 + i][pos]: the 16 channel
//    chunks of a warp map to one bank (row stride 64 B, chunk stride 512 B),
//    16-way conflicts on 8192 byte stores per CTA (~4k shared cycles per V CTA,
//    ~0.7 ms of shared-pipe time over the 47k V CTAs at 75600);
//  - K keeps 64 fp32 per thread across the CTA's amax barrier: ~100 registers,
//    ~4-5 CTAs per SM for the whole grid (every branch shares the kernel's count).
// Here every row of the thread is loaded first with ld.global.nc (8 x 16 B in
// flight), K is kept as raw bf16 (32 registers) and smoothed again for the
// stores (the same fp32 subtraction: the same bits), and Vᵀ needs no shared
// memory: a thread owns 8 channels x one 8-byte run of the permuted key order
// (keys h·16 + s·4 + {0..3} and h·16 + 8 + s·4 + {0..3}, bytes in order
// 0,1,4,5,2,3,6,7 of those: v_fp8_position), converts pairs with
// cvt.e4m3x2 and stores 8 bytes per channel; a warp's store covers 4 channels x
// 64 contiguous bytes, full sectors.
// Prediction (H200, ~3.5 TB/s): 1x40x75600x128 reads Q, K, V 2.32 GB, writes
// INT8 Q, K, e4m3 Vᵀ 1.16 GB (+ 2 x 39 MB sums, scales): ~1.0-1.1 ms (was 2.05);
// 1x12x32760x128: 302 + 151 MB -> ~0.13-0.15 ms (was 0.28).
__device__ __forceinline__ uint4 ld_stream16(const void* ptr) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(ptr));
  return r;
}

__device__ __forceinline__ float bf16_at(const uint4& r, int i) {
  const uint32_t w = i < 2 ? r.x : i < 4 ? r.y : i < 6 ? r.z : r.w;
  return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}

__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

template <int D, bool kPool = false>
__global__ void __launch_bounds__(kPrepThreads, 5) quant_direct_kernel(const PrepParams p, const PoolOut pool) {
  constexpr int kC = D / 8;
  constexpr int kRows = kPrepThreads / kC;
  constexpr int kPerThread = 64 / kRows;
  const int tid = threadIdx.x, chunk = tid % kC, rsub = tid / kC;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int nq = p.lq_pad / 64, nk = p.lk_pad / 64;
  int blk = blockIdx.x;

  if (blk < nq) {
    const __nv_bfloat16* qg = p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + chunk * 8;
    uint4 raw[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      raw[j] = t < p.len_q ? ld_stream16(qg + int64_t(t) * p.qs.token) : make_uint4(0, 0, 0, 0);
    }
    const float* km = p.km + bh * D + chunk * 8;
    float kmv[8], qsum[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) kmv[i] = km[i], qsum[i] = 0.f;
    float row_scale[kPerThread], row_qkm[kPerThread];  // stored by chunk 0 after the loop (one branch, not one per row)
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      // A padded row loads zeros: x 0, amax 0, dot +0, as the default's branch.
      float x[8];
      float amax = 0.f, dot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        x[i] = bf16_at(raw[j], i);
        amax = fmaxf(amax, fabsf(x[i]));
        dot = fmaf(x[i], kmv[i], dot);
      }
      if constexpr (kPool) {
#pragma unroll
        for (int i = 0; i < 8; ++i) qsum[i] += x[i];
      }
#pragma unroll
      for (int off = 1; off < kC; off <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        dot += __shfl_xor_sync(0xffffffffu, dot, off);
      }
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      uint2 w;
      w.x = pack_i8x4_in_range(x[0] * inv, x[1] * inv, x[2] * inv, x[3] * inv);
      w.y = pack_i8x4_in_range(x[4] * inv, x[5] * inv, x[6] * inv, x[7] * inv);
      *reinterpret_cast<uint2*>(p.qi8 + (bh * p.lq_pad + t) * D + chunk * 8) = w;
      row_scale[j] = (amax / 127.f) * p.scale_log2;
      row_qkm[j] = dot * p.scale;
    }
    if (chunk == 0) {
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int64_t row = bh * p.lq_pad + blk * 64 + j * kRows + rsub;
        p.qscale[row] = row_scale[j];
        p.qkm[row] = row_qkm[j];
      }
    }
    if constexpr (kPool) store_block_sum<D, kRows>(qsum, chunk, rsub, pool.q_sum64 + (bh * nq + blk) * D);
    return;
  }
  blk -= nq;
  if (blk < nk) {
    __shared__ float s_red[kPrepThreads / 32];
    const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + chunk * 8;
    uint4 raw[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      raw[j] = t < p.len_kv ? ld_stream16(kg + int64_t(t) * p.ks.token) : make_uint4(0, 0, 0, 0);
    }
    const float* km = p.km + bh * D + chunk * 8;
    float kmv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) kmv[i] = km[i];
    // Smoothed key j, channel i; padded keys are 0 (not -km), as the default.
    // kFull: a block with no padded key (all but the last), whose code has no
    // per-element validity select (FSEL: 192 per thread, 14% of the K path).
    auto xk = [&](int j, int i, auto full_c) {
      if constexpr (decltype(full_c)::value) return bf16_at(raw[j], i) - kmv[i];
      else return blk * 64 + j * kRows + rsub < p.len_kv ? bf16_at(raw[j], i) - kmv[i] : 0.f;
    };
    auto k_block = [&](auto full_c) {
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(xk(j, i, full_c)));
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      if (tid % 32 == 0) s_red[tid / 32] = amax;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kPrepThreads / 32; ++w) amax = fmaxf(amax, s_red[w]);
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      // Opaque to the compiler: it would otherwise keep the 64 smoothed floats of
      // the first pass alive across the barrier (common subexpressions) instead
      // of recomputing them from the 32 raw registers.
#pragma unroll
      for (int j = 0; j < kPerThread; ++j)
        asm volatile("" : "+r"(raw[j].x), "+r"(raw[j].y), "+r"(raw[j].z), "+r"(raw[j].w));
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int t = blk * 64 + j * kRows + rsub;
        uint2 w;
        w.x = pack_i8x4_in_range(xk(j, 0, full_c) * inv, xk(j, 1, full_c) * inv, xk(j, 2, full_c) * inv,
                                 xk(j, 3, full_c) * inv);
        w.y = pack_i8x4_in_range(xk(j, 4, full_c) * inv, xk(j, 5, full_c) * inv, xk(j, 6, full_c) * inv,
                                 xk(j, 7, full_c) * inv);
        *reinterpret_cast<uint2*>(p.ki8 + (bh * p.lk_pad + t) * D + chunk * 8) = w;
      }
      if (tid == 0) p.kscale[bh * (p.lk_pad / 64) + blk] = amax / 127.f;
      if constexpr (kPool) {
        float ksum[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ksum[i] = xk(0, i, full_c);
#pragma unroll
          for (int j = 1; j < kPerThread; ++j) ksum[i] += xk(j, i, full_c);
        }
        store_block_sum<D, kRows>(ksum, chunk, rsub, pool.k_sum64 + (bh * nk + blk) * D);
      }
    };
    if (blk * 64 + 64 <= p.len_kv) k_block(std::true_type{});
    else k_block(std::false_type{});
    return;
  }
  blk -= nk;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;
  if (p.v_fp8) {
    // kC chunks x 8 runs of 8 permuted keys per 64-key block (D 64: half the threads idle).
    for (int task = tid; task < kC * 8; task += kPrepThreads) {
      const int ck = task / 8, half = (task % 8) / 2, sub = task % 2;
      uint4 raw[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int t = blk * 64 + half * 16 + (u / 4) * 8 + sub * 4 + u % 4;
        raw[u] = t < p.len_kv ? ld_stream16(vg + int64_t(t) * p.vs.token + ck * 8) : make_uint4(0, 0, 0, 0);
      }
      const float* vinv = p.vinv + bh * D + ck * 8;
      uint8_t* out = p.v8 + (bh * D + ck * 8) * p.lk_pad + blk * 64 + half * 16 + sub * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float sc = vinv[i];
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) x[u] = bf16_at(raw[u], i) * sc;
        uint2 w;
        w.x = e4m3x2(x[0], x[1]) | (e4m3x2(x[4], x[5]) << 16);
        w.y = e4m3x2(x[2], x[3]) | (e4m3x2(x[6], x[7]) << 16);
        *reinterpret_cast<uint2*>(out + int64_t(i) * p.lk_pad) = w;
      }
    }
    return;
  }
  {
    const float* vinv = p.vinv + bh * D + chunk * 8;
    uint4 raw[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      raw[j] = t < p.len_kv ? ld_stream16(vg + int64_t(t) * p.vs.token + chunk * 8) : make_uint4(0, 0, 0, 0);
    }
    float sc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) sc[i] = vinv[i];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int t = blk * 64 + j * kRows + rsub;
      uint4 out = make_uint4(0, 0, 0, 0);
      if (t < p.len_kv) {
        __half2* o2 = reinterpret_cast<__half2*>(&out);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o2[i] = __floats2half2_rn(bf16_at(raw[j], 2 * i) * sc[2 * i], bf16_at(raw[j], 2 * i + 1) * sc[2 * i + 1]);
      }
      *reinterpret_cast<uint4*>(p.v16 + (bh * p.lk_pad + t) * D + chunk * 8) = out;
    }
  }
}

// ---------------------------------------------------------------------------
// Quantize pass, Direct variant, staged (what SageQuantKernel::Direct and Auto
// run since session 14; TD_SAGE_QUANT=direct1 runs quant_direct_kernel above):
// the same bytes as quant_kernel, from the same fp32 operations per element in
// the same order. Why quant_direct_kernel stays at ~82% of a copy's bandwidth
// (136.5 us under ncu at 1x12x32760x128: DRAM 67% of peak, issue slots 50%,
// 29.6% occupancy):
//  - its loads land in registers (8 x uint4 per thread: 32 of its 96, with the
//    8 km, Q's 8 sums and 16 row scales, K's addresses), so the SM holds 5 CTAs
//    (20 warps) and a CTA has nothing in flight while it computes; the SM's
//    bytes in flight rise and fall with its few CTAs' phases (stalls on the
//    first unpack after the loads: 36% of the samples, long scoreboard 45.6%
//    in all, 29% of them with nothing else to issue);
//  - the CTA order (heads in blockIdx.y) has the ~660 resident CTAs read 256
//    bytes of every 3 KB token row (BLHD, H 12) and the other 11 heads' bytes of
//    those rows ~2 waves later: each DRAM page is opened once per head;
//  - Q spent ~300 of its 1324 instructions per thread on each row's two 4-step
//    butterflies and two IEEE divisions, done alike by the row's 16 lanes; km
//    and the V scales came as eight 4-byte loads (22% of the sectors asked for
//    were excess), V's each behind the previous channel's store.
// Here:
//  - every row is copied into shared memory by cp.async (the block's 64 rows,
//    16 KB; each thread reads back only the slots it copied, so the wait needs
//    no barrier): the bytes in flight hold no registers, and a CTA's 16 KB are
//    all requested within its first ~100 instructions. 56 registers
//    (__launch_bounds__(128, 9); at 48, for 10 CTAs, Q spills) and 20.6 KB of
//    shared memory (+1 KB reserved; carveout set to the maximum): 9 CTAs, 36
//    warps per SM, up to 144 KB requested per SM against the ~27 KB that
//    Little's law asks for (3.5 TB/s x ~1 us / 132 SMs);
//  - the grid has the heads in blockIdx.x (head-minor order), so the 12 (40)
//    CTAs of one 64-token block run together and read whole token rows;
//    TD_SAGE_QUANT=direct_head_major keeps the old order for A/B;
//  - Q: each quartet of a thread's rows is reduced over the row's lanes by a
//    transposed butterfly (row_group_total4: 16 instead of 32 instructions per
//    quantity and quartet, the same pairings); lane c then owns row c & 3,
//    divides once for it and hands 127 / amax to the row's lanes by one shuffle
//    per row; lanes 0..3 store the quartet's scales and q·km;
//  - K: the block sums and the warp amaxes go to shared memory before the one
//    barrier, which serves both (no third pass over the rows for the sums); the
//    codes re-read the rows from shared memory after it instead of keeping 32
//    raw registers across it;
//  - km / vinv as two 16-byte loads ahead of the math; Vᵀ converts 4 channels
//    at a time from 8-byte shared loads.
// SASS per thread (sm_90a, with the sums): Q ~990, K ~910, Vᵀ ~330
// instructions (was 1324, 1032, 385): ~55 M warp instructions instead of 69.8 M
// at 1x12x32760, 104 k issue cycles per scheduler = 54 us at 1.92 GHz.
// Prediction (H200): 1x12x32760x128 reads 302 MB and writes 151 MB of codes +
// 6.3 MB of sums + 3.1 MB of row scales: 462 MB, at ~3.7 TB/s (94% of the 3.94
// TB/s copy ceiling) 125 us, with issue ~44% busy: ~0.125 ms under ncu, ~0.13
// in bench_sla (was 0.1365 / 0.1436-0.145). 1x40x75600x128: 2.32 GB + 1.23 GB
// = 3.55 GB: ~0.96 ms (was 1.015, already ~3.5 TB/s).
__device__ __forceinline__ float bf16_at(const uint2& r, int i) {
  const uint32_t w = i < 2 ? r.x : r.y;
  return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}

// cp_async_16 that fills the 16 bytes with zeros, reading nothing, where !valid
// (a padded row: src may lie past the tensor). One instruction either way: a
// plain zero store before a copy to the same slot costs three more (ptxas
// orders the two writes).
__device__ __forceinline__ void cp_async_16_or_zeros(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void load8(const float* src, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(src)), c = __ldg(reinterpret_cast<const float4*>(src) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
}

// The total over a row group's kC lanes (16 or 8, lane = chunk) of four rows'
// per-lane partials v0..v3 (kMax: fmaxf, else +), lane c ending with row c & 3.
// The per-row xor butterfly 1, 2, 4 (, 8) costs 2·log2(kC) instructions per
// row; here the xor-1 step sends the two rows this lane drops and combines the
// two it keeps, the xor-2 step likewise with one of the two, and the rest is
// the plain butterfly on that row: 16 instructions for the four rows (kC 16),
// with every combination pairing the same two partial values as the per-row
// butterfly does (a + b == b + a bit for bit): the same totals.
template <int kC, bool kMax>
__device__ __forceinline__ float row_group_total4(float v0, float v1, float v2, float v3, int chunk) {
  const auto op = [](float a, float b) { return kMax ? fmaxf(a, b) : a + b; };
  const bool b0 = chunk & 1, b1 = chunk & 2;
  const float w0 = op(b0 ? v1 : v0, __shfl_xor_sync(0xffffffffu, b0 ? v0 : v1, 1));  // row b0
  const float w1 = op(b0 ? v3 : v2, __shfl_xor_sync(0xffffffffu, b0 ? v2 : v3, 1));  // row 2 + b0
  float z = op(b1 ? w1 : w0, __shfl_xor_sync(0xffffffffu, b1 ? w0 : w1, 2));          // row chunk & 3
#pragma unroll
  for (int off = 4; off < kC; off <<= 1) z = op(z, __shfl_xor_sync(0xffffffffu, z, off));
  return z;
}

constexpr int kStagedCtasPerSm = 9;

// Grid: (64-row blocks, H, B), or (H, blocks, B) when head_minor.
template <int D, bool kPool = false>
__global__ void __launch_bounds__(kPrepThreads, kStagedCtasPerSm)
    quant_staged_kernel(const PrepParams p, const PoolOut pool, const int head_minor) {
  constexpr int kC = D / 8;
  constexpr int kRows = kPrepThreads / kC;
  constexpr int kPerThread = 64 / kRows;
  constexpr int kVTasks = kC * 8;  // Vᵀ: channel chunks x runs of 8 permuted keys (D 64: half the threads idle)
  static_assert(kPerThread % 4 == 0, "Q rows are reduced four at a time");
  __shared__ uint4 s_rows[64 * kC];  // the block's rows, one 16-byte slot per copy
  __shared__ float s_pool[kPool ? kRows : 1][D];
  __shared__ float s_red[kPrepThreads / 32];
  const int tid = threadIdx.x, chunk = tid % kC, rsub = tid / kC;
  const int h = head_minor ? blockIdx.x : blockIdx.y, b = blockIdx.z;
  int blk = head_minor ? blockIdx.y : blockIdx.x;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int nq = p.lq_pad / 64, nk = p.lk_pad / 64;

  // Row j of this thread (Q, K, FP16 V: token blk·64 + j·kRows + rsub, channels
  // chunk·8 ..) into slot j·128 + tid; a padded row is zeros.
  auto stage_rows = [&](const __nv_bfloat16* g, int64_t token, int len) {
    const __nv_bfloat16* src = g + int64_t(blk * 64 + rsub) * token;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      cp_async_16_or_zeros(uint32_t(__cvta_generic_to_shared(&s_rows[j * kPrepThreads + tid])), src,
                           blk * 64 + j * kRows + rsub < len);
      src += kRows * token;
    }
    cp_async_commit();
  };
  // Σ over the kRows row groups of each thread's column sums, in group order.
  static_assert(D <= kPrepThreads, "one block-sum column per thread");
  auto store_pool = [&](float* out) {
    if (tid < D) {
      float s = s_pool[0][tid];
#pragma unroll
      for (int r = 1; r < kRows; ++r) s += s_pool[r][tid];
      out[tid] = s;
    }
  };

  if (blk < nq) {
    stage_rows(p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + chunk * 8, p.qs.token, p.len_q);
    float kmv[8], qsum[8];
    load8(p.km + bh * D + chunk * 8, kmv);
#pragma unroll
    for (int i = 0; i < 8; ++i) qsum[i] = 0.f;
    uint8_t* q_out = p.qi8 + (bh * p.lq_pad + blk * 64 + rsub) * D + chunk * 8;  // row j at + j·kRows·D
    cp_async_wait<0>();
#pragma unroll
    for (int g = 0; g < kPerThread / 4; ++g) {
      // Rows 4g .. 4g + 3; a padded row is zeros: x 0, amax 0, dot +0, as the default's branch.
      uint4 raw[4];
      float amax[4], dot[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        raw[r] = s_rows[(4 * g + r) * kPrepThreads + tid];
        amax[r] = 0.f, dot[r] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float x = bf16_at(raw[r], i);
          amax[r] = fmaxf(amax[r], fabsf(x));
          dot[r] = fmaf(x, kmv[i], dot[r]);
          if constexpr (kPool) qsum[i] += x;
        }
      }
      const float row_amax = row_group_total4<kC, true>(amax[0], amax[1], amax[2], amax[3], chunk);
      const float row_dot = row_group_total4<kC, false>(dot[0], dot[1], dot[2], dot[3], chunk);
      const float row_inv = row_amax > 0.f ? 127.f / row_amax : 0.f;
      if (chunk < 4) {
        const int64_t row = bh * p.lq_pad + blk * 64 + rsub + (4 * g + chunk) * kRows;
        p.qscale[row] = (row_amax / 127.f) * p.scale_log2;
        p.qkm[row] = row_dot * p.scale;
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float inv = __shfl_sync(0xffffffffu, row_inv, r, kC);
        uint2 w;
        w.x = pack_i8x4_in_range(bf16_at(raw[r], 0) * inv, bf16_at(raw[r], 1) * inv, bf16_at(raw[r], 2) * inv,
                                 bf16_at(raw[r], 3) * inv);
        w.y = pack_i8x4_in_range(bf16_at(raw[r], 4) * inv, bf16_at(raw[r], 5) * inv, bf16_at(raw[r], 6) * inv,
                                 bf16_at(raw[r], 7) * inv);
        *reinterpret_cast<uint2*>(q_out + (4 * g + r) * kRows * D) = w;
      }
    }
    if constexpr (kPool) {
#pragma unroll
      for (int i = 0; i < 8; ++i) s_pool[rsub][chunk * 8 + i] = qsum[i];
      __syncthreads();
      store_pool(pool.q_sum64 + (bh * nq + blk) * D);
    }
    return;
  }
  blk -= nq;
  if (blk < nk) {
    stage_rows(p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + chunk * 8, p.ks.token, p.len_kv);
    float kmv[8];
    load8(p.km + bh * D + chunk * 8, kmv);
    cp_async_wait<0>();
    // Smoothed key j, channel i; padded keys are 0 (not -km), as the default.
    // kFull: a block with no padded key (all but the last): no validity select.
    auto xk = [&](const uint4& raw, int j, int i, auto full_c) {
      if constexpr (decltype(full_c)::value) return bf16_at(raw, i) - kmv[i];
      else return blk * 64 + j * kRows + rsub < p.len_kv ? bf16_at(raw, i) - kmv[i] : 0.f;
    };
    auto k_block = [&](auto full_c) {
      float amax = 0.f, ksum[8];
      (void)ksum;  // kPool only
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint4 raw = s_rows[j * kPrepThreads + tid];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float x = xk(raw, j, i, full_c);
          amax = fmaxf(amax, fabsf(x));
          if constexpr (kPool) ksum[i] = j == 0 ? x : ksum[i] + x;  // rows in order, from row 0's value
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      if (tid % 32 == 0) s_red[tid / 32] = amax;
      if constexpr (kPool) {
#pragma unroll
        for (int i = 0; i < 8; ++i) s_pool[rsub][chunk * 8 + i] = ksum[i];
      }
      __syncthreads();  // the block amax and the block sums
#pragma unroll
      for (int w = 0; w < kPrepThreads / 32; ++w) amax = fmaxf(amax, s_red[w]);
      if constexpr (kPool) store_pool(pool.k_sum64 + (bh * nk + blk) * D);
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      uint8_t* k_out = p.ki8 + (bh * p.lk_pad + blk * 64 + rsub) * D + chunk * 8;  // row j at + j·kRows·D
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint4 raw = s_rows[j * kPrepThreads + tid];
        uint2 w;
        w.x = pack_i8x4_in_range(xk(raw, j, 0, full_c) * inv, xk(raw, j, 1, full_c) * inv,
                                 xk(raw, j, 2, full_c) * inv, xk(raw, j, 3, full_c) * inv);
        w.y = pack_i8x4_in_range(xk(raw, j, 4, full_c) * inv, xk(raw, j, 5, full_c) * inv,
                                 xk(raw, j, 6, full_c) * inv, xk(raw, j, 7, full_c) * inv);
        *reinterpret_cast<uint2*>(k_out + j * kRows * D) = w;
      }
      if (tid == 0) p.kscale[bh * (p.lk_pad / 64) + blk] = amax / 127.f;
    };
    if (blk * 64 + 64 <= p.len_kv) k_block(std::true_type{});
    else k_block(std::false_type{});
    return;
  }
  blk -= nk;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;
  if (p.v_fp8) {
    // e4m3 Vᵀ as quant_direct_kernel: thread `task` owns channel chunk ck and the
    // 8 keys half·16 + {0..3, 8..11} + sub·4 of the block (permuted order
    // v_fp8_position); key u of them in slot u·kVTasks + task.
    if (tid < kVTasks) {
      const int ck = tid / 8, half = (tid % 8) / 2, sub = tid % 2;
      const int t0 = blk * 64 + half * 16 + sub * 4;
      const __nv_bfloat16* src = vg + int64_t(t0) * p.vs.token + ck * 8;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int dt = (u / 4) * 8 + u % 4;  // key t0 + dt
        cp_async_16_or_zeros(uint32_t(__cvta_generic_to_shared(&s_rows[u * kVTasks + tid])), src + dt * p.vs.token,
                             t0 + dt < p.len_kv);
      }
      cp_async_commit();
      float sc[8];
      load8(p.vinv + bh * D + ck * 8, sc);
      uint8_t* out = p.v8 + (bh * D + ck * 8) * p.lk_pad + blk * 64 + half * 16 + sub * 8;
      cp_async_wait<0>();
#pragma unroll
      for (int q = 0; q < 2; ++q) {  // channels 4q .. 4q + 3: the low / high 8 bytes of each slot
        uint2 raw[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) raw[u] = reinterpret_cast<const uint2*>(&s_rows[u * kVTasks + tid])[q];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          const int i = 4 * q + ii;
          float x[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) x[u] = bf16_at(raw[u], ii) * sc[i];
          uint2 w;
          w.x = e4m3x2(x[0], x[1]) | (e4m3x2(x[4], x[5]) << 16);
          w.y = e4m3x2(x[2], x[3]) | (e4m3x2(x[6], x[7]) << 16);
          *reinterpret_cast<uint2*>(out + int64_t(i) * p.lk_pad) = w;
        }
      }
    }
    return;
  }
  {
    stage_rows(vg + chunk * 8, p.vs.token, p.len_kv);
    float sc[8];
    load8(p.vinv + bh * D + chunk * 8, sc);
    __half* v_out = p.v16 + (bh * p.lk_pad + blk * 64 + rsub) * D + chunk * 8;  // row j at + j·kRows·D
    cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      uint4 out = make_uint4(0, 0, 0, 0);
      if (blk * 64 + j * kRows + rsub < p.len_kv) {
        const uint4 raw = s_rows[j * kPrepThreads + tid];
        __half2* o2 = reinterpret_cast<__half2*>(&out);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o2[i] = __floats2half2_rn(bf16_at(raw, 2 * i) * sc[2 * i], bf16_at(raw, 2 * i + 1) * sc[2 * i + 1]);
      }
      *reinterpret_cast<uint4*>(v_out + j * kRows * D) = out;
    }
  }
}

// ---------------------------------------------------------------------------
// Portable attention kernel

constexpr int kTileK = 64;  // keys per K/V tile
constexpr int kStages = 3;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kChunks
// chunks per row, XOR-swizzled so 8 consecutive rows at one chunk hit 8
// distinct 16-byte bank groups (for 4-chunk rows, pairs of rows share a 128-byte line).
template <int kChunks>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  if constexpr (kChunks >= 8) return uint32_t(row * kChunks * 16 + ((chunk ^ (row & 7)) << 4));
  else return uint32_t(row * kChunks * 16 + ((chunk ^ ((row >> 1) & 3)) << 4));
}

// Copies kRows x (kChunks x 16 bytes) from a dense row-major source into a swizzled tile.
template <int kChunks, int kRows, int kThreads>
__device__ __forceinline__ void load_rows(uint32_t dst, const uint8_t* src, int tid) {
  static_assert(kRows * kChunks % kThreads == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = i * kThreads + tid;
    const int row = idx / kChunks, chunk = idx % kChunks;
    cp_async_16(dst + swz<kChunks>(row, chunk), src + (int64_t(row) * kChunks + chunk) * 16);
  }
}

template <int D, int kWarps>
struct PortableTraits {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16;
  static constexpr int kQChunks = D / 16;  // INT8 row
  static constexpr int kVChunks = D / 8;   // FP16 row
  static constexpr int kQBytes = kBlockM * D;
  static constexpr int kKBytes = kTileK * D;
  static constexpr int kVBytes = kTileK * D * 2;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  static_assert(kStages * kStageBytes >= kBlockM * D * 2, "O staging must fit in the K/V stages");
};

// kTilesPerBlock: 64-key tiles per LUT key block (block_k / 64); 0 = dense.
template <int D, int kWarps, int kTilesPerBlock>
__global__ void __launch_bounds__(kWarps * 32, 1) portable_kernel(const AttnParams p) {
  using T = PortableTraits<D, kWarps>;
  constexpr int kThreads = T::kThreads, kBlockM = T::kBlockM;
  constexpr int kQC = T::kQChunks, kVC = T::kVChunks;
  constexpr int kKSteps = D / 32;         // k-steps of Q·Kᵀ (32 INT8 channels)
  constexpr int kSTiles = kTileK / 8;     // n-tiles of S
  constexpr int kPSteps = kTileK / 16;    // k-steps of P·V
  constexpr int kOTiles = D / 8;
  constexpr bool kSparse = kTilesPerBlock > 0;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_q = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t smem_kv = smem_q + T::kQBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int qblk = blockIdx.x, q0 = qblk * kBlockM;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;

  const uint8_t* qg = p.qi8 + (bh * p.lq_pad + q0) * D;
  const uint8_t* kg = p.ki8 + bh * p.lk_pad * D;
  const uint8_t* vg = reinterpret_cast<const uint8_t*>(p.v16 + bh * p.lk_pad * D);
  const float* kscale = p.kscale + bh * (p.lk_pad / 64);
  const int32_t* lut = kSparse ? p.lut + (bh * p.n_qblocks + qblk) * p.n_sel : nullptr;
  const int n_tiles = kSparse ? p.n_sel * kTilesPerBlock : (p.len_kv + kTileK - 1) / kTileK;
  const int n_ktiles_total = (p.len_kv + kTileK - 1) / kTileK;

  // Tile index of the j-th visited tile; -1 when it holds no key (past len_kv or a bad LUT entry).
  auto tile_at = [&](int j) -> int {
    if constexpr (!kSparse) {
      return j;
    } else {
      const int kb = __ldg(lut + j / kTilesPerBlock);
      const int t = kb * kTilesPerBlock + j % kTilesPerBlock;
      return (kb < 0 || t >= n_ktiles_total) ? -1 : t;
    }
  };
  auto load_stage = [&](int stage, int tile) {
    const uint32_t dst = smem_kv + stage * T::kStageBytes;
    load_rows<kQC, kTileK, kThreads>(dst, kg + int64_t(tile) * kTileK * D, tid);
    load_rows<kVC, kTileK, kThreads>(dst + T::kKBytes, vg + int64_t(tile) * kTileK * D * 2, tid);
  };

  load_rows<kQC, kBlockM, kThreads>(smem_q, qg, tid);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) {
      const int t = tile_at(s);
      if (t >= 0) load_stage(s, t);
    }
    cp_async_commit();
  }

  const int r0 = warp * 16 + (lane >> 2);
  const float qs0 = p.qscale[bh * p.lq_pad + q0 + r0];
  const float qs1 = p.qscale[bh * p.lq_pad + q0 + r0 + 8];

  uint32_t qf[kKSteps][4];
  float o[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  int stage_compute = 0, stage_load = kStages - 1;
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int chunk = ks * 2 + (lane >> 4);
        ldmatrix_x4(qf[ks], smem_q + swz<kQC>(row, chunk));
      }
    }
    {
      const int jn = j + kStages - 1;
      if (jn < n_tiles) {
        const int t = tile_at(jn);
        if (t >= 0) load_stage(stage_load, t);
      }
      cp_async_commit();
      stage_load = stage_load + 1 == kStages ? 0 : stage_load + 1;
    }
    const uint32_t sk = smem_kv + stage_compute * T::kStageBytes;
    const uint32_t sv = sk + T::kKBytes;
    stage_compute = stage_compute + 1 == kStages ? 0 : stage_compute + 1;

    const int tile = tile_at(j);
    if (tile < 0) continue;  // uniform over the CTA

    int acc[kSTiles][4];
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        const int key = np * 16 + (lane >> 4) * 8 + (lane & 7);
        const int chunk = ks * 2 + ((lane >> 3) & 1);
        uint32_t kb[4];
        ldmatrix_x4(kb, sk + swz<kQC>(key, chunk));
        mma_s8(acc[2 * np], qf[ks], kb[0], kb[1]);
        mma_s8(acc[2 * np + 1], qf[ks], kb[2], kb[3]);
      }
    }

    const float ksc = __ldg(kscale + tile);
    const float c0 = qs0 * ksc, c1 = qs1 * ksc;
    float s[kSTiles][4];
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      s[t][0] = float(acc[t][0]) * c0;
      s[t][1] = float(acc[t][1]) * c0;
      s[t][2] = float(acc[t][2]) * c1;
      s[t][3] = float(acc[t][3]) * c1;
    }
    if ((tile + 1) * kTileK > p.len_kv) {
      const int valid = p.len_kv - tile * kTileK;
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
        const int key = t * 8 + (lane & 3) * 2;
        if (key >= valid) s[t][0] = s[t][2] = -INFINITY;
        if (key + 1 >= valid) s[t][1] = s[t][3] = -INFINITY;
      }
    }

    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      mx0 = fmaxf(mx0, fmaxf(s[t][0], s[t][1]));
      mx1 = fmaxf(mx1, fmaxf(s[t][2], s[t][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float m0_new = fmaxf(m0, mx0), m1_new = fmaxf(m1, mx1);
    const float alpha0 = fast_exp2(m0 - m0_new), alpha1 = fast_exp2(m1 - m1_new);
    m0 = m0_new;
    m1 = m1_new;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      s[t][0] = fast_exp2(s[t][0] - m0);
      s[t][1] = fast_exp2(s[t][1] - m0);
      s[t][2] = fast_exp2(s[t][2] - m1);
      s[t][3] = fast_exp2(s[t][3] - m1);
      sum0 += s[t][0] + s[t][1];
      sum1 += s[t][2] + s[t][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
      o[t][0] *= alpha0;
      o[t][1] *= alpha0;
      o[t][2] *= alpha1;
      o[t][3] *= alpha1;
    }
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        const int key = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int chunk = dp * 2 + (lane >> 4);
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sv + swz<kVC>(key, chunk));
        mma_f16(o[2 * dp], pa, vb[0], vb[1]);
        mma_f16(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the K/V stages: reuse them to stage O

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // A row that saw no key at all (every LUT entry invalid) has l = 0: write zeros, not NaN.
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;

  const float* vscale = p.vscale + bh * D;
  const uint32_t so = smem_kv + warp * 16 * D * 2;  // this warp's 16 x D bf16 rows
  constexpr int kOC = D / 8;
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) {
    const int c = t * 8 + (lane & 3) * 2;
    const float v0 = __ldg(vscale + c), v1 = __ldg(vscale + c + 1);
    const uint32_t col_bytes = uint32_t((lane & 3) * 4);
    const uint32_t w0 = pack_bf16(o[t][0] * inv0 * v0, o[t][1] * inv0 * v1);
    const uint32_t w1 = pack_bf16(o[t][2] * inv1 * v0, o[t][3] * inv1 * v1);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(so + swz<kOC>(lane >> 2, t) + col_bytes), "r"(w0) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(so + swz<kOC>((lane >> 2) + 8, t) + col_bytes), "r"(w1) : "memory");
  }
  __syncwarp();
  __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head;
#pragma unroll
  for (int i = 0; i < 16 * kOC / 32; ++i) {
    const int idx = i * 32 + lane;
    const int r = idx / kOC, chunk = idx % kOC;
    const int row = q0 + warp * 16 + r;
    if (row < p.len_q) {
      uint4 val;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(so + swz<kOC>(r, chunk)));
      *reinterpret_cast<uint4*>(og + int64_t(row) * p.os.token + chunk * 8) = val;
    }
  }

  if (p.lse != nullptr && (lane & 3) == 0) {
    constexpr float kLn2 = 0.69314718055994531f;
    float* lse = p.lse + bh * p.len_q;
    const int row0 = q0 + r0, row1 = row0 + 8;
    if (row0 < p.len_q) lse[row0] = (m0 + __log2f(l0)) * kLn2 + p.qkm[bh * p.lq_pad + row0];
    if (row1 < p.len_q) lse[row1] = (m1 + __log2f(l1)) * kLn2 + p.qkm[bh * p.lq_pad + row1];
  }
}

template <int D, int kWarps, int kTPB>
Status launch_portable(const AttnParams& ap, int64_t batch, int64_t heads, int64_t q_blocks, cudaStream_t stream) {
  auto kernel = portable_kernel<D, kWarps, kTPB>;
  constexpr int smem = PortableTraits<D, kWarps>::kSmemBytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("sage_attention (portable): cannot raise shared memory to ") +
                                                       std::to_string(smem) + " bytes: " + cudaGetErrorString(e));
  const dim3 grid{unsigned(q_blocks), unsigned(heads), unsigned(batch)};
  kernel<<<grid, kWarps * 32, smem, stream>>>(ap);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed,
                             std::string("sage_attention (portable): launch failed: ") + cudaGetErrorString(e));
  return Status::Ok;
}

template <int D>
Status run_portable(const AttnParams& ap, const AttnProblem& p, const SageSparse* sp, cudaStream_t stream) {
  if (!sp) return launch_portable<D, 8, 0>(ap, p.batch, p.heads, (p.len_q + 127) / 128, stream);
  const int64_t qb = (p.len_q + sp->block_q - 1) / sp->block_q;
  if (sp->block_q == 128 && sp->block_k == 64) return launch_portable<D, 8, 1>(ap, p.batch, p.heads, qb, stream);
  if (sp->block_q == 128 && sp->block_k == 128) return launch_portable<D, 8, 2>(ap, p.batch, p.heads, qb, stream);
  if (sp->block_q == 64 && sp->block_k == 64) return launch_portable<D, 4, 1>(ap, p.batch, p.heads, qb, stream);
  return launch_portable<D, 4, 2>(ap, p.batch, p.heads, qb, stream);
}

}  // namespace

Layout layout_for(const AttnProblem& p, bool fp8_v) {
  Layout l;
  const int64_t BH = p.batch * p.heads, D = p.head_dim;
  l.lq_pad = (p.len_q + 127) / 128 * 128;
  l.lk_pad = (p.len_kv + 127) / 128 * 128;
  l.n_chunks = (p.len_kv + kStatsChunk - 1) / kStatsChunk;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.partial = take(size_t(BH * l.n_chunks * 2 * D) * 4);
  l.km = take(size_t(BH * D) * 4);
  l.vscale = take(size_t(BH * D) * 4);
  l.vinv = take(size_t(BH * D) * 4);
  l.qscale = take(size_t(BH * l.lq_pad) * 4);
  l.qkm = take(size_t(BH * l.lq_pad) * 4);
  l.kscale = take(size_t(BH * (l.lk_pad / 64)) * 4);
  l.qi8 = take(size_t(BH * l.lq_pad * D));
  l.ki8 = take(size_t(BH * l.lk_pad * D));
  l.v = take(size_t(BH * l.lk_pad * D) * (fp8_v ? 1 : 2));
  l.total = off;
  return l;
}

PrepParams prep_params(const AttnProblem& p, const Layout& l, const void* q, const void* k, const void* v,
                       void* workspace) {
  auto* ws = static_cast<uint8_t*>(workspace);
  PrepParams pp;
  pp.q = static_cast<const __nv_bfloat16*>(q);
  pp.k = static_cast<const __nv_bfloat16*>(k);
  pp.v = static_cast<const __nv_bfloat16*>(v);
  pp.qs = p.q;
  pp.ks = p.k;
  pp.vs = p.v;
  pp.heads = int(p.heads);
  pp.len_q = int(p.len_q);
  pp.len_kv = int(p.len_kv);
  pp.lq_pad = int(l.lq_pad);
  pp.lk_pad = int(l.lk_pad);
  pp.n_chunks = int(l.n_chunks);
  pp.scale = p.scale;
  pp.scale_log2 = float(double(p.scale) * 1.4426950408889634);
  pp.partial = reinterpret_cast<float*>(ws + l.partial);
  pp.km = reinterpret_cast<float*>(ws + l.km);
  pp.vscale = reinterpret_cast<float*>(ws + l.vscale);
  pp.vinv = reinterpret_cast<float*>(ws + l.vinv);
  pp.qscale = reinterpret_cast<float*>(ws + l.qscale);
  pp.qkm = reinterpret_cast<float*>(ws + l.qkm);
  pp.kscale = reinterpret_cast<float*>(ws + l.kscale);
  pp.qi8 = ws + l.qi8;
  pp.ki8 = ws + l.ki8;
  pp.v16 = reinterpret_cast<__half*>(ws + l.v);
  pp.v8 = ws + l.v;
  return pp;
}

Status run_stats(const PrepParams& pp, const AttnProblem& p, cudaStream_t stream) {
  const dim3 grid(unsigned(pp.n_chunks), unsigned(p.heads), unsigned(p.batch));
  if (p.head_dim == 64) stats_kernel<64><<<grid, kPrepThreads, 0, stream>>>(pp);
  else stats_kernel<128><<<grid, kPrepThreads, 0, stream>>>(pp);
  finalize_kernel<<<unsigned(p.batch * p.heads), unsigned(p.head_dim), 0, stream>>>(pp, int(p.head_dim));
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("sage_attention: stats launch failed: ") + cudaGetErrorString(e));
  return Status::Ok;
}


// quant_staged_kernel with the shared-memory carveout at its maximum (10 CTAs
// of ~21 KB per SM; the driver's own pick gave the previous kernel 64 KB).
template <int D, bool kPool>
static void launch_quant_staged(const PrepParams& pp, const PoolOut& pool, const dim3 grid, bool head_minor,
                                cudaStream_t stream) {
  if (cudaFuncSetAttribute(quant_staged_kernel<D, kPool>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           cudaSharedmemCarveoutMaxShared) != cudaSuccess)
    (void)cudaGetLastError();  // a hint: launch without it
  quant_staged_kernel<D, kPool><<<grid, kPrepThreads, 0, stream>>>(pp, pool, head_minor ? 1 : 0);
}

// The quantize launch, with the block sums when pool has any pointer;
// `direct`: a Direct kernel (the same bits), chosen per call by TD_SAGE_QUANT:
// quant_staged_kernel in head-minor CTA order (any value but the two below),
// `direct_head_major` the same kernel in quant_direct_kernel's order (heads in
// blockIdx.y), `direct1` quant_direct_kernel (session 13's Direct kernel).
static Status run_quant_pool(const PrepParams& pp, const AttnProblem& p, const PoolOut& pool, cudaStream_t stream,
                             bool direct = false) {
  const unsigned n_blocks = unsigned(pp.lq_pad / 64 + 2 * (pp.lk_pad / 64));
  const dim3 grid(n_blocks, unsigned(p.heads), unsigned(p.batch));
  const bool with_sums = pool.q_sum64 || pool.k_sum64;
  if (with_sums && (!pool.q_sum64 || !pool.k_sum64))
    return detail::attn_fail(Status::InvalidArgument, "sage_prepare_cuda: give both block sum arrays or neither");
  const char* env = direct ? std::getenv("TD_SAGE_QUANT") : nullptr;
  const bool direct1 = env && std::strcmp(env, "direct1") == 0;
  if (direct && !direct1) {
    // Head-minor needs the blocks in gridDim.y (<= 65535: up to ~1.4 M tokens).
    const bool head_minor = !(env && std::strcmp(env, "direct_head_major") == 0) && n_blocks <= 65535u;
    const dim3 staged_grid = head_minor ? dim3(unsigned(p.heads), n_blocks, unsigned(p.batch)) : grid;
    if (p.head_dim == 64) {
      if (with_sums) launch_quant_staged<64, true>(pp, pool, staged_grid, head_minor, stream);
      else launch_quant_staged<64, false>(pp, pool, staged_grid, head_minor, stream);
    } else {
      if (with_sums) launch_quant_staged<128, true>(pp, pool, staged_grid, head_minor, stream);
      else launch_quant_staged<128, false>(pp, pool, staged_grid, head_minor, stream);
    }
  } else if (direct) {
    if (p.head_dim == 64) {
      if (with_sums) quant_direct_kernel<64, true><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
      else quant_direct_kernel<64><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
    } else {
      if (with_sums) quant_direct_kernel<128, true><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
      else quant_direct_kernel<128><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
    }
  } else if (p.head_dim == 64) {
    if (with_sums) quant_kernel<64, true><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
    else quant_kernel<64><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
  } else {
    if (with_sums) quant_kernel<128, true><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
    else quant_kernel<128><<<grid, kPrepThreads, 0, stream>>>(pp, pool);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("sage_attention: quantize launch failed: ") + cudaGetErrorString(e));
  return Status::Ok;
}

// SageQuantKernel::Auto -> Direct (read per call): the same bytes as Default
// (GPU test SlaGpu.SageQuantDirectEqualsDefaultBitForBit), 0.149 vs 0.285 ms
// at 1x12x32760x128 and 1.09 vs 2.08 ms at 1x40x75600 on the H200
// (2026-11-30, bench_sla `sagesla_fused_kv_sage_prepare[_direct]`).
// TD_SAGE_QUANT=default picks the earlier kernel; `direct1` / `direct_head_major`
// pick among the Direct kernels (run_quant_pool).
static bool use_direct_quant(SageQuantKernel k) {
  if (k != SageQuantKernel::Auto) return k == SageQuantKernel::Direct;
  const char* env = std::getenv("TD_SAGE_QUANT");
  return !(env && std::strcmp(env, "default") == 0);
}

Status run_quant(const PrepParams& pp, const AttnProblem& p, cudaStream_t stream) {
  return run_quant_pool(pp, p, PoolOut{}, stream, use_direct_quant(SageQuantKernel::Auto));
}

AttnParams attn_params(const AttnProblem& p, const PrepParams& pp, void* o, float* lse, const SageSparse* sp) {
  AttnParams ap;
  ap.qi8 = pp.qi8;
  ap.ki8 = pp.ki8;
  ap.v16 = pp.v16;
  ap.v8 = pp.v8;
  ap.qscale = pp.qscale;
  ap.qkm = pp.qkm;
  ap.kscale = pp.kscale;
  ap.vscale = pp.vscale;
  ap.o = static_cast<__nv_bfloat16*>(o);
  ap.lse = lse;
  ap.os = p.o;
  ap.heads = int(p.heads);
  ap.len_q = int(p.len_q);
  ap.len_kv = int(p.len_kv);
  ap.lq_pad = pp.lq_pad;
  ap.lk_pad = pp.lk_pad;
  if (sp) {
    ap.lut = sp->lut;
    ap.n_sel = int(sp->n_sel);
    ap.n_qblocks = int((p.len_q + sp->block_q - 1) / sp->block_q);
  }
  return ap;
}

Status run_portable_attention(const AttnParams& ap, const AttnProblem& p, const SageSparse* sp, cudaStream_t stream) {
  return p.head_dim == 64 ? run_portable<64>(ap, p, sp, stream) : run_portable<128>(ap, p, sp, stream);
}

#if !TURBODIFF_HAVE_SM90
// No sm_90a kernel in this build: Auto picks the portable kernel.
bool sm90_available() { return false; }
Status sm90_supports(const AttnProblem&, const SageSparse*) {
  return detail::attn_fail(Status::Unsupported, "sage_attention: the sm_90a kernel is not in this build");
}
Status sm90_attention(const AttnParams&, const AttnProblem&, const SageSparse*, cudaStream_t) {
  return sm90_supports({}, nullptr);
}
#endif

}  // namespace sage

// ---------------------------------------------------------------------------
// Entry points

namespace {

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

int device_cc_major() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// The backend Auto resolves to on the current device for this problem: the
// sm_90a kernel on a Hopper GPU when it is built and takes the problem (its
// sparse mode wants 64x128 blocks), else the portable kernel.
SageBackend resolve(SageBackend backend, const AttnProblem& p, const SageSparse* sparse) {
  if (backend != SageBackend::Auto) return backend;
  const bool sm90 = sage::sm90_available() && device_cc_major() == 9 && sage::sm90_supports(p, sparse) == Status::Ok;
  return sm90 ? SageBackend::Sm90 : SageBackend::Portable;
}

}  // namespace

Status sage_attention_supports(const AttnProblem& p, const SageSparse* sparse, SageBackend backend) {
  using detail::attn_fail;
  if (Status s = sage_sparse_check(p, sparse); s != Status::Ok) return s;
  if (p.qkv_type != ElemType::BF16 || p.o_type != ElemType::BF16)
    return attn_fail(Status::Unsupported, "sage_attention: takes bf16 Q/K/V and O only");
  if (p.head_dim != 64 && p.head_dim != 128)
    return attn_fail(Status::Unsupported,
                     "sage_attention: head_dim must be 64 or 128, got " + std::to_string(p.head_dim));
  const std::pair<const char*, const AttnStrides*> all[] = {{"Q", &p.q}, {"K", &p.k}, {"V", &p.v}, {"O", &p.o}};
  for (const auto& [name, s] : all)
    if (s->batch % 8 || s->head % 8 || s->token % 8)
      return attn_fail(Status::Unsupported, std::string("sage_attention: ") + name +
                                                " strides must be multiples of 8 elements (16-byte rows)");
  if (p.len_q > (int64_t(1) << 30) || p.len_kv > (int64_t(1) << 30) || p.heads > 65535 || p.batch > 65535)
    return attn_fail(Status::Unsupported, "sage_attention: len_q/len_kv must be <= 2^30 and batch/heads <= 65535");
  const SageBackend be = resolve(backend, p, sparse);
  const int major = device_cc_major();
  if (be == SageBackend::Sm90) {
    if (!sage::sm90_available())
      return attn_fail(Status::Unsupported, "sage_attention: the sm_90a kernel is not in this build (built without 90a)");
    if (major != 9)
      return attn_fail(Status::Unsupported, "sage_attention: the sm_90a kernel needs a Hopper GPU (compute capability 9.0), device has " +
                                                std::to_string(major) + ".x");
    if (Status s = sage::sm90_supports(p, sparse); s != Status::Ok) return s;
  } else if (major < 8) {
    return attn_fail(Status::Unsupported, "sage_attention (portable): needs compute capability 8.0 or newer, device has " +
                                              std::to_string(major) + ".x");
  }
  detail::attn_clear_error();
  return Status::Ok;
}

size_t sage_attention_workspace_size(const AttnProblem& p, SageBackend backend) {
  // Auto may resolve to either kernel depending on the sparse block sizes: enough for both.
  if (backend == SageBackend::Auto)
    return std::max(sage::layout_for(p, true).total, sage::layout_for(p, false).total);
  return sage::layout_for(p, backend == SageBackend::Sm90).total;
}

Status sage_attention_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                           const SageSparse* sparse, SageBackend backend, void* workspace, size_t workspace_bytes,
                           void* stream) {
  using detail::attn_fail;
  if (Status s = sage_attention_supports(p, sparse, backend); s != Status::Ok) return s;
  if (!q || !k || !v || !o)
    return attn_fail(Status::InvalidArgument, std::string("sage_attention: null pointer for ") +
                                                  (!q ? "Q" : !k ? "K" : !v ? "V" : "O"));
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o))
    return attn_fail(Status::Unsupported, std::string("sage_attention: ") +
                                              (!aligned16(q) ? "Q" : !aligned16(k) ? "K" : !aligned16(v) ? "V" : "O") +
                                              " is not 16-byte aligned");
  const SageBackend be = resolve(backend, p, sparse);
  const sage::Layout l = sage::layout_for(p, be == SageBackend::Sm90);
  if (!workspace || workspace_bytes < l.total || !aligned16(workspace))
    return attn_fail(Status::InvalidArgument, "sage_attention: needs a 16-byte aligned workspace of " +
                                                  std::to_string(l.total) + " bytes, got " +
                                                  std::to_string(workspace_bytes));
  const auto st = static_cast<cudaStream_t>(stream);
  sage::PrepParams pp = sage::prep_params(p, l, q, k, v, workspace);
  pp.v_fp8 = be == SageBackend::Sm90;
  if (Status s = sage::run_stats(pp, p, st); s != Status::Ok) return s;
  if (Status s = sage::run_quant(pp, p, st); s != Status::Ok) return s;
  const sage::AttnParams ap = sage::attn_params(p, pp, o, lse, sparse);
  if (be == SageBackend::Sm90) return sage::sm90_attention(ap, p, sparse, st);
  return sage::run_portable_attention(ap, p, sparse, st);
}

// ---------------------------------------------------------------------------
// The same in two calls with the block sums (sage_prepass.h, SageSLA's fused path)

int64_t sage_sum64_blocks(int64_t len) { return (len + 127) / 128 * 2; }  // layout_for's padding, in 64s

namespace {
// What both halves check: the problem, a resolved backend, the workspace.
Status two_call_checks(const AttnProblem& p, const SageSparse* sparse, SageBackend backend, const void* workspace,
                       size_t workspace_bytes, const char* who) {
  using detail::attn_fail;
  if (backend == SageBackend::Auto)
    return attn_fail(Status::InvalidArgument, std::string(who) + ": give the resolved backend (Sm90 or Portable)");
  if (Status s = sage_attention_supports(p, sparse, backend); s != Status::Ok) return s;
  const sage::Layout l = sage::layout_for(p, backend == SageBackend::Sm90);
  if (!workspace || workspace_bytes < l.total || !aligned16(workspace))
    return attn_fail(Status::InvalidArgument, std::string(who) + ": needs a 16-byte aligned workspace of " +
                                                  std::to_string(l.total) + " bytes, got " +
                                                  std::to_string(workspace_bytes));
  return Status::Ok;
}
}  // namespace

Status sage_prepare_cuda(const AttnProblem& p, const void* q, const void* k, const void* v, const SageSparse* sparse,
                         SageBackend backend, const SagePoolSums& sums, void* workspace, size_t workspace_bytes,
                         void* stream) {
  using detail::attn_fail;
  if (Status s = two_call_checks(p, sparse, backend, workspace, workspace_bytes, "sage_prepare_cuda"); s != Status::Ok)
    return s;
  if (!q || !k || !v)
    return attn_fail(Status::InvalidArgument, std::string("sage_prepare_cuda: null pointer for ") +
                                                  (!q ? "Q" : !k ? "K" : "V"));
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(sums.q_sum64) || !aligned16(sums.k_sum64))
    return attn_fail(Status::Unsupported, "sage_prepare_cuda: Q, K, V and the block sums must be 16-byte aligned");
  const sage::Layout l = sage::layout_for(p, backend == SageBackend::Sm90);
  const auto st = static_cast<cudaStream_t>(stream);
  sage::PrepParams pp = sage::prep_params(p, l, q, k, v, workspace);
  pp.v_fp8 = backend == SageBackend::Sm90;
  if (!sums.stats_given)
    if (Status s = sage::run_stats(pp, p, st); s != Status::Ok) return s;
  sage::PoolOut pool;
  pool.q_sum64 = sums.q_sum64;
  pool.k_sum64 = sums.k_sum64;
  return sage::run_quant_pool(pp, p, pool, st, sage::use_direct_quant(sums.quant_kernel));
}

SageStatsSlots sage_stats_slots(const AttnProblem& p, SageBackend backend, void* workspace) {
  const sage::Layout l = sage::layout_for(p, backend == SageBackend::Sm90);
  auto* ws = static_cast<uint8_t*>(workspace);
  SageStatsSlots slots;
  slots.km = reinterpret_cast<float*>(ws + l.km);
  slots.vscale = reinterpret_cast<float*>(ws + l.vscale);
  slots.vinv = reinterpret_cast<float*>(ws + l.vinv);
  return slots;
}

Status sage_attend_cuda(const AttnProblem& p, void* o, float* lse, const SageSparse* sparse, SageBackend backend,
                        void* workspace, size_t workspace_bytes, void* stream) {
  using detail::attn_fail;
  if (Status s = two_call_checks(p, sparse, backend, workspace, workspace_bytes, "sage_attend_cuda"); s != Status::Ok)
    return s;
  if (!o || !aligned16(o)) return attn_fail(Status::InvalidArgument, "sage_attend_cuda: O is null or not 16-byte aligned");
  const sage::Layout l = sage::layout_for(p, backend == SageBackend::Sm90);
  const auto st = static_cast<cudaStream_t>(stream);
  const sage::PrepParams pp = sage::prep_params(p, l, nullptr, nullptr, nullptr, workspace);
  const sage::AttnParams ap = sage::attn_params(p, pp, o, lse, sparse);
  if (backend == SageBackend::Sm90) return sage::sm90_attention(ap, p, sparse, st);
  return sage::run_portable_attention(ap, p, sparse, st);
}

}  // namespace td::kernels
