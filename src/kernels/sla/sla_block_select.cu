// SLA block selection on the GPU (kernels/sla/sla.h): four small kernels.
//
//   1. block_pool:  one CTA per (block index, head, batch), 16-byte loads of
//      several token rows at once (a scalar variant for odd head_dim / strides): the mean of the query block's tokens (pooled Q) and the sum of
//      the key block's tokens (raw K block sums), fp32, a partial last block
//      over the tokens it has.
//   2. key_mean:    the K mean over all tokens from the block sums, summed in a
//      fixed order (deterministic).
//   (pooled smoothed K = block sum / tokens in block - mean, the reference's
//      mean of (k - mean) rearranged, is formed where the score GEMM loads it)
//   3. score:       pooled scores [QB, KB] per head, an fp32 GEMM tiled 16 query
//      blocks x 64 key blocks per CTA.
//   4. topk:        one CTA per (query block, head, batch): each score packed
//      with its index into a 64-bit key that sorts by descending score, then by
//      ascending index (the reference's tie rule; -0 counts as +0), a bitonic
//      sort in shared memory, the first n_sel indices into the LUT and the map.
//      Or (SlaTopkAlgo::Radix) a radix select of the n_sel-th key and a rank
//      count of the selected keys only: the same LUT and map; a warp per row
//      (keys in registers) where a row has <= 1024 key blocks and n_sel <= 640,
//      else (and for SlaTopkAlgo::RadixCta) a CTA per row.
//   3'. score, Tiled variant (SlaScoreKernel::Tiled): the same scores bit for
//      bit (one fmaf chain per score over the channels in order, on the same
//      pooled values), 64 x 64 blocks per CTA with 4 x 4 register blocks.
//   From sums (sla_block_select_from_sums_cuda, SageSLA's fused path): no
//      pooling or K mean kernel; the Tiled score kernel forms pooled Q and
//      smoothed pooled K from the 64-token block sums the sage quantization
//      pass wrote, then the same top-k. By default one kernel does both
//      (score_topk_fused_kernel: a CTA per group of query blocks, scores kept
//      in shared memory, a warp radix select on them; the same LUT and map);
//      TD_SLA_SELECT=two_kernel runs the two, fused_v2 the CTA-barrier
//      variant of the fused kernel (launch_fused_select lists the names).
// The work is tiny next to the attention itself (QB·KB·D MACs per head).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/pdl.cuh"
#include "kernels/sla/sla.h"

namespace td::kernels {
namespace {

constexpr int kTopkThreads = 256;
constexpr int64_t kMaxKeyBlocks = 16384;  // 128 KiB of sort keys in shared memory

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct PoolParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  AttnStrides qs, ks;
  int heads, len, dim, block_q, block_k, qblocks, kblocks;
  float* pq;  // [B, H, QB, D] pooled Q (means)
  float* pk;  // [B, H, KB, D] K block sums, then pooled smoothed K
};

__global__ void block_pool_kernel(const PoolParams p) {
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  if (c >= p.dim) return;
  const int64_t bh = int64_t(b) * p.heads + h;
  if (blk < p.qblocks) {
    const int t0 = blk * p.block_q, t1 = min(p.len, t0 + p.block_q);
    const __nv_bfloat16* src = p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + c;
    float acc = 0.f;
    for (int t = t0; t < t1; ++t) acc += __bfloat162float(src[int64_t(t) * p.qs.token]);
    p.pq[(bh * p.qblocks + blk) * p.dim + c] = acc / float(t1 - t0);
  }
  if (blk < p.kblocks) {
    const int t0 = blk * p.block_k, t1 = min(p.len, t0 + p.block_k);
    const __nv_bfloat16* src = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head + c;
    float acc = 0.f;
    for (int t = t0; t < t1; ++t) acc += __bfloat162float(src[int64_t(t) * p.ks.token]);
    p.pk[(bh * p.kblocks + blk) * p.dim + c] = acc;
  }
}

// The same with 16-byte loads (D % 8 == 0, rows 16-byte aligned): D/8 threads
// per token row, 256 / (D/8) rows in flight, then the row groups summed in a
// fixed order through shared memory.
constexpr int kPoolThreads = 256;

__device__ __forceinline__ void add_row8(float (&acc)[8], const __nv_bfloat16* src) {
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(src));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

__device__ __forceinline__ void pool_block_vec(const __nv_bfloat16* base, int64_t token_stride, int t0, int t1, int dim,
                                               float* red, float* out, float divisor) {
  const int tid = threadIdx.x, chunks = dim / 8, groups = kPoolThreads / chunks;
  const int c8 = tid % chunks, g = tid / chunks;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (g < groups) {
    int t = t0 + g;
#pragma unroll 1
    for (; t + 3 * groups < t1; t += 4 * groups) {  // four rows in flight
      add_row8(acc, base + int64_t(t) * token_stride + c8 * 8);
      add_row8(acc, base + int64_t(t + groups) * token_stride + c8 * 8);
      add_row8(acc, base + int64_t(t + 2 * groups) * token_stride + c8 * 8);
      add_row8(acc, base + int64_t(t + 3 * groups) * token_stride + c8 * 8);
    }
    for (; t < t1; t += groups) add_row8(acc, base + int64_t(t) * token_stride + c8 * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) red[g * dim + c8 * 8 + i] = acc[i];
  }
  __syncthreads();
  for (int c = tid; c < dim; c += kPoolThreads) {
    float s = 0.f;
    for (int j = 0; j < groups; ++j) s += red[j * dim + c];
    out[c] = s / divisor;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kPoolThreads) block_pool_vec_kernel(const PoolParams p) {
  extern __shared__ float red[];  // [groups, D]
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  if (blk < p.qblocks) {
    const int t0 = blk * p.block_q, t1 = min(p.len, t0 + p.block_q);
    pool_block_vec(p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head, p.qs.token, t0, t1, p.dim, red,
                   p.pq + (bh * p.qblocks + blk) * p.dim, float(t1 - t0));
  }
  if (blk < p.kblocks) {
    const int t0 = blk * p.block_k, t1 = min(p.len, t0 + p.block_k);
    pool_block_vec(p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head, p.ks.token, t0, t1, p.dim, red,
                   p.pk + (bh * p.kblocks + blk) * p.dim, 1.f);
  }
}

// The K mean over all tokens, from the block sums: grid (D / 32, batch·head),
// 8 warps each summing every 8th block for 32 channels, then the 8 partial sums
// in warp order (a fixed order: deterministic).
constexpr int kMeanGroups = 8;

__global__ void __launch_bounds__(32 * kMeanGroups) key_mean_kernel(const PoolParams p, float* kmean) {
  __shared__ float red[kMeanGroups][32];
  const int lane = threadIdx.x % 32, g = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
  const int64_t bh = blockIdx.y;
  float sum = 0.f;
  if (c < p.dim) {
    const float* pk = p.pk + bh * p.kblocks * p.dim + c;
#pragma unroll 4
    for (int j = g; j < p.kblocks; j += kMeanGroups) sum += pk[int64_t(j) * p.dim];
  }
  red[g][lane] = sum;
  __syncthreads();
  if (g == 0 && c < p.dim) {
    float s = 0.f;
    for (int i = 0; i < kMeanGroups; ++i) s += red[i][lane];
    kmean[bh * p.dim + c] = s / float(p.len);
  }
}

// Pooled scores [B, H, QB, KB] = pool(Q)·pool(K)ᵀ: a small fp32 GEMM per head,
// 16 query blocks x 64 key blocks per CTA over 32-channel slices in shared
// memory (each pooled K row is read once per 16 query blocks, not once per query block).
constexpr int kScoreQ = 16, kScoreK = 64, kScoreC = 32, kScoreThreads = 256;

struct ScoreParams {
  const float* pq;
  const float* pk;     // K block sums
  const float* kmean;  // [B·H, D]
  float* scores;
  int dim, qblocks, kblocks, len, block_k;
};

__global__ void __launch_bounds__(kScoreThreads) score_kernel(const ScoreParams p) {
  __shared__ float qs[kScoreQ][kScoreC + 1];
  __shared__ float ks[kScoreK][kScoreC + 1];
  const int i0 = blockIdx.x * kScoreQ, j0 = blockIdx.y * kScoreK;
  const int64_t bh = blockIdx.z;
  const float* pq = p.pq + bh * p.qblocks * p.dim;
  const float* pk = p.pk + bh * p.kblocks * p.dim;
  const float* kmean = p.kmean + bh * p.dim;
  const int tid = threadIdx.x, qi = tid / 16, kq = tid % 16;
  float acc[kScoreK / 16] = {0.f, 0.f, 0.f, 0.f};
  for (int c0 = 0; c0 < p.dim; c0 += kScoreC) {
    for (int e = tid; e < kScoreQ * kScoreC; e += kScoreThreads) {
      const int r = e / kScoreC, c = e % kScoreC;
      qs[r][c] = (i0 + r < p.qblocks && c0 + c < p.dim) ? pq[int64_t(i0 + r) * p.dim + c0 + c] : 0.f;
    }
    for (int e = tid; e < kScoreK * kScoreC; e += kScoreThreads) {
      const int r = e / kScoreC, c = e % kScoreC;
      const int j = j0 + r;
      // pooled smoothed K = block sum / tokens in the block - K mean
      ks[r][c] = (j < p.kblocks && c0 + c < p.dim)
                     ? pk[int64_t(j) * p.dim + c0 + c] / float(min(p.len, (j + 1) * p.block_k) - j * p.block_k) -
                           kmean[c0 + c]
                     : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int c = 0; c < kScoreC; ++c) {
      const float a = qs[qi][c];
#pragma unroll
      for (int r = 0; r < kScoreK / 16; ++r) acc[r] = fmaf(a, ks[kq + 16 * r][c], acc[r]);
    }
    __syncthreads();
  }
  if (i0 + qi < p.qblocks)
#pragma unroll
    for (int r = 0; r < kScoreK / 16; ++r) {
      const int j = j0 + kq + 16 * r;
      if (j < p.kblocks) p.scores[(bh * p.qblocks + i0 + qi) * p.kblocks + j] = acc[r];
    }
}

// The Tiled score kernel. 64 query x 64 key blocks per CTA, 256 threads, each
// a 4 x 4 register block (rows 4·ty.., columns 4·tx..): per channel two 16-byte
// shared loads feed 16 FMAs (the Simple kernel: 5 loads for 4 FMAs). Channels
// go through shared memory in slices of 32, stored transposed ([channel][block],
// rows padded to 68 floats: 16-byte aligned float4 reads, conflict-free across
// the 16 tx of a warp); the next slice is fetched into registers while this
// one is multiplied. Every score is fmaf(q_c, k_c, acc) for c = 0, 1, ... in
// order, zero-padded slices included, on the values the Simple kernel stages
// (pooled Q means; K block sum / tokens - K mean): the same bits.
// Predicted (H200, from FMA counts; the FMA pipe does 128/clk/SM at ~1.9 GHz):
//   1x12x32760, 64x128 blocks: 512·256·128·12 = 201 M FMA in 8·4·12 = 384 CTAs
//   (one wave, ~3 per SM): 6.2 us at full FMA issue, ~75% issue with the shared
//   loads and slice barriers -> ~9-11 us (Simple: 75 us measured).
//   1x40x75600: 1182·591·128·40 = 3.58 G FMA -> ~110 us at full issue, ~150 us
//   expected (Simple: ~1.3 ms, the bulk of the 2.0 ms selection there).
// From-sums mode (kFromSums): pooled Q = Σ of the block's 64-token sums / tokens,
// pooled K = Σ of its smoothed 64-key sums / tokens, read where they are staged.
constexpr int kTiledQ = 64, kTiledK = 64, kTiledC = 32, kTiledThreads = 256, kTiledStride = 68;

struct TiledScoreParams {
  const float* pq;     // pooled Q means [BH, QB, D], or 64-token Q sums [BH, q_sub_stride, D]
  const float* pk;     // K block sums [BH, KB, D], or smoothed 64-key K sums [BH, k_sub_stride, D]
  const float* kmean;  // [BH, D] (pooled mode only)
  float* scores;       // [BH, QB, KB]
  int dim, qblocks, kblocks, len, block_q, block_k;
  int q_sub, k_sub;                  // 64-token sums per block (from-sums mode)
  int64_t q_sub_stride, k_sub_stride;  // 64-token sums per (b, h) (from-sums mode)
};

// Three CTAs per SM (registers capped at 80; the from-sums instance spills 80
// bytes in its slice loads): 384 CTAs at 1x12x32760 then run as one wave of
// 396 slots instead of 1.45 waves of 264 (127 registers, 2 per SM). H200,
// session 12: fused selection 0.049-0.050 -> 0.0446-0.0448 ms (ncu: the
// from-sums score 34.6 us, 20% achieved occupancy, before).
template <bool kFromSums>
__global__ void __launch_bounds__(kTiledThreads, 3) score_tiled_kernel(const TiledScoreParams p) {
  pdl_wait();  // pdl.cuh: launched as a programmatic dependent
  pdl_launch_dependents();
  __shared__ __align__(16) float qs[kTiledC][kTiledStride];
  __shared__ __align__(16) float ks[kTiledC][kTiledStride];
  const int i0 = blockIdx.x * kTiledQ, j0 = blockIdx.y * kTiledK;
  const int64_t bh = blockIdx.z;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int lrow = tid / 8, lc = (tid % 8) * 4;  // loader: rows lrow and lrow + 32, channels lc..lc+3
  float4 pre_q[2], pre_k[2];
  auto fetch = [&](int c0) {
    const int c = c0 + lc;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i0 + lrow + 32 * h, j = j0 + lrow + 32 * h;
      float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
      if (c < p.dim) {  // dim % 4 == 0: a float4 is all in or all out
        if (i < p.qblocks) {
          if constexpr (kFromSums) {
            const float* src = p.pq + (bh * p.q_sub_stride + int64_t(i) * p.q_sub) * p.dim + c;
            qv = *reinterpret_cast<const float4*>(src);
            for (int s = 1; s < p.q_sub; ++s) {
              const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
              qv.x += a.x, qv.y += a.y, qv.z += a.z, qv.w += a.w;
            }
            const float n = float(min(p.len, (i + 1) * p.block_q) - i * p.block_q);
            qv.x /= n, qv.y /= n, qv.z /= n, qv.w /= n;
          } else {
            qv = *reinterpret_cast<const float4*>(p.pq + (bh * p.qblocks + i) * p.dim + c);
          }
        }
        if (j < p.kblocks) {
          const float n = float(min(p.len, (j + 1) * p.block_k) - j * p.block_k);
          if constexpr (kFromSums) {
            const float* src = p.pk + (bh * p.k_sub_stride + int64_t(j) * p.k_sub) * p.dim + c;
            kv = *reinterpret_cast<const float4*>(src);
            for (int s = 1; s < p.k_sub; ++s) {
              const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
              kv.x += a.x, kv.y += a.y, kv.z += a.z, kv.w += a.w;
            }
            kv.x /= n, kv.y /= n, kv.z /= n, kv.w /= n;
          } else {
            // pooled smoothed K = block sum / tokens in the block - K mean (the Simple kernel's expression)
            const float4 sum = *reinterpret_cast<const float4*>(p.pk + (bh * p.kblocks + j) * p.dim + c);
            const float* km = p.kmean + bh * p.dim + c;
            kv = make_float4(sum.x / n - km[0], sum.y / n - km[1], sum.z / n - km[2], sum.w / n - km[3]);
          }
        }
      }
      pre_q[h] = qv;
      pre_k[h] = kv;
    }
  };
  float acc[4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;
  fetch(0);
  for (int c0 = 0; c0 < p.dim; c0 += kTiledC) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = lrow + 32 * h;
      qs[lc][r] = pre_q[h].x, qs[lc + 1][r] = pre_q[h].y, qs[lc + 2][r] = pre_q[h].z, qs[lc + 3][r] = pre_q[h].w;
      ks[lc][r] = pre_k[h].x, ks[lc + 1][r] = pre_k[h].y, ks[lc + 2][r] = pre_k[h].z, ks[lc + 3][r] = pre_k[h].w;
    }
    __syncthreads();
    if (c0 + kTiledC < p.dim) fetch(c0 + kTiledC);  // in flight during the FMAs below
#pragma unroll 8
    for (int c = 0; c < kTiledC; ++c) {
      const float4 a = *reinterpret_cast<const float4*>(&qs[c][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&ks[c][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(av[x], bv[y], acc[x][y]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int i = i0 + ty * 4 + x;
    if (i >= p.qblocks) continue;
    float* row = p.scores + (bh * p.qblocks + i) * p.kblocks;
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      const int j = j0 + tx * 4 + y;
      if (j < p.kblocks) row[j] = acc[x][y];
    }
  }
}

struct TopkParams {
  const float* scores;
  int heads, qblocks, kblocks, sort_size, n_sel;
  int64_t rows;       // B·H·QB
  int32_t* lut;       // [B, H, QB, n_sel] or null
  uint8_t* map;       // [B, H, QB, KB] or null
};

// Float -> uint32 whose unsigned order is the float order (+0 for -0).
__device__ __forceinline__ uint32_t ordered_bits(float s) {
  uint32_t u = s == 0.f ? 0u : __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const TopkParams p) {
  pdl_wait();  // pdl.cuh: launched as a programmatic dependent
  pdl_launch_dependents();
  extern __shared__ unsigned long long keys[];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x;
  const int64_t bh = int64_t(b) * p.heads + h;
  const float* scores = p.scores + (bh * p.qblocks + i) * p.kblocks;
  // Descending score first, then ascending block index; padding sorts last.
  for (int j = tid; j < p.sort_size; j += kTopkThreads)
    keys[j] = j < p.kblocks ? (uint64_t(~ordered_bits(scores[j])) << 32) | uint32_t(j) : ~0ull;
  __syncthreads();
  for (int k = 2; k <= p.sort_size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int x = tid; x < p.sort_size; x += kTopkThreads) {
        const int y = x ^ j;
        if (y > x) {
          const unsigned long long a = keys[x], c = keys[y];
          const bool ascending = (x & k) == 0;
          if ((a > c) == ascending) {
            keys[x] = c;
            keys[y] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  const int64_t row = bh * p.qblocks + i;
  if (p.lut)
    for (int s = tid; s < p.n_sel; s += kTopkThreads) p.lut[row * p.n_sel + s] = int32_t(uint32_t(keys[s]));
  if (p.map) {
    uint8_t* m = p.map + row * p.kblocks;
    for (int j = tid; j < p.kblocks; j += kTopkThreads) m[j] = 0;
    __syncthreads();
    for (int s = tid; s < p.n_sel; s += kTopkThreads) m[uint32_t(keys[s])] = 1;
  }
}

// The radix-select variant (SlaTopkAlgo::Radix). The same 64-bit keys (smaller
// is better, all distinct since the index is in them): a radix select finds the
// n_sel-th smallest key T digit by digit (8-bit digits from the top; the score
// half has 4 digits, the index half 2, as indices are < 2^16), each digit from a
// 256-bin shared histogram of the keys that still match the prefix. Selected =
// keys <= T, exactly n_sel. They are gathered (in any order) and each one's LUT
// position is its rank among them, counted: the same LUT as the full sort.
constexpr int kRadixMaxSel = 1024;

// Inclusive prefix sum of v over the lanes of a warp (Hillis-Steele, shuffles).
__device__ __forceinline__ unsigned warp_inclusive_sum(unsigned v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

__global__ void __launch_bounds__(kTopkThreads) topk_radix_kernel(const TopkParams p) {
  pdl_wait();  // pdl.cuh: launched as a programmatic dependent
  pdl_launch_dependents();
  extern __shared__ unsigned long long keys[];  // [kblocks], then sel[n_sel]
  __shared__ unsigned hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ unsigned s_remaining, s_count;
  unsigned long long* sel = keys + p.kblocks;
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32;
  const int64_t bh = int64_t(b) * p.heads + h;
  const float* scores = p.scores + (bh * p.qblocks + i) * p.kblocks;
  for (int j = tid; j < p.kblocks; j += kTopkThreads)
    keys[j] = (uint64_t(~ordered_bits(scores[j])) << 32) | uint32_t(j);
  if (tid == 0) {
    s_prefix = 0;
    s_remaining = unsigned(p.n_sel);  // the rank (1-based) of T among the keys still matching
    s_count = 0;
  }
  unsigned long long mask = 0;
#pragma unroll 1
  for (int pass = 0; pass < 6; ++pass) {
    const int shift = pass < 4 ? 56 - 8 * pass : (pass == 4 ? 8 : 0);  // index digits: bits 0-15
    hist[tid] = 0;  // kTopkThreads == 256
    __syncthreads();
    const unsigned long long prefix = s_prefix;
    for (int j = tid; j < p.kblocks; j += kTopkThreads) {
      const unsigned long long key = keys[j];
      if ((key & mask) == prefix) atomicAdd(&hist[unsigned(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid < 32) {  // one warp: the bin where the running count reaches s_remaining
      const unsigned want = s_remaining;
      __syncwarp();  // every lane has read it before one lane rewrites it below
      unsigned c[8], sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = hist[lane * 8 + e];
        sum += c[e];
      }
      const unsigned incl = warp_inclusive_sum(sum, lane);
      const unsigned excl = incl - sum;
      if (excl < want && want <= incl) {  // exactly one lane
        unsigned run = excl;
        int digit = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (run < want && want <= run + c[e] && digit == 0) digit = lane * 8 + e + 1;
          else if (digit == 0) run += c[e];
        --digit;
        s_prefix = prefix | (uint64_t(unsigned(digit)) << shift);
        s_remaining = want - run;
      }
    }
    mask |= 255ull << shift;
    __syncthreads();
  }
  const unsigned long long T = s_prefix;  // the n_sel-th smallest key itself
  const int64_t row = bh * p.qblocks + i;
  if (p.map) {
    uint8_t* m = p.map + row * p.kblocks;
    for (int j = tid; j < p.kblocks; j += kTopkThreads) m[j] = keys[j] <= T ? 1 : 0;
  }
  if (!p.lut) return;
  for (int j = tid; j < p.kblocks; j += kTopkThreads)
    if (keys[j] <= T) sel[atomicAdd(&s_count, 1u)] = keys[j];
  __syncthreads();
  for (int s = tid; s < p.n_sel; s += kTopkThreads) {
    const unsigned long long x = sel[s];
    int rank = 0;
    for (int t = 0; t < p.n_sel; ++t) rank += sel[t] < x;
    p.lut[row * p.n_sel + rank] = int32_t(uint32_t(x));
  }
}

Status launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok;
  return detail::sla_fail(Status::LaunchFailed, std::string("sla_block_select_cuda: ") + what +
                                                    " launch failed: " + cudaGetErrorString(e));
}
// The same for a launch that returned its error (launch_pdl).
Status launch_error(cudaError_t launched, const char* what) {
  if (launched == cudaSuccess) return launch_error(what);
  cudaGetLastError();
  return detail::sla_fail(Status::LaunchFailed, std::string("sla_block_select_cuda: ") + what +
                                                    " launch failed: " + cudaGetErrorString(launched));
}

// The checks both entry points share (sizes the kernels' int indices and grid
// dimensions hold, the workspace).
Status select_checks(const SlaProblem& p, const void* workspace, size_t workspace_bytes, const char* who) {
  using detail::sla_fail;
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if (p.head_dim > 256)
    return sla_fail(Status::Unsupported,
                    std::string(who) + ": head_dim must be <= 256, got " + std::to_string(p.head_dim));
  const int64_t QB = p.query_blocks(), KB = p.key_blocks();
  if (KB > kMaxKeyBlocks)
    return sla_fail(Status::Unsupported, std::string(who) + ": at most " + std::to_string(kMaxKeyBlocks) +
                                             " key blocks, got " + std::to_string(KB));
  if (p.len > (int64_t(1) << 30) || p.heads > 65535 || p.batch > 65535 || QB > (int64_t(1) << 30))
    return sla_fail(Status::Unsupported, std::string(who) + ": len must be < 2^30 and batch, heads <= 65535");
  const size_t need = sla_block_select_workspace_size(p);
  if (workspace_bytes < need || !workspace)
    return sla_fail(Status::InvalidArgument, std::string(who) + ": workspace of " + std::to_string(need) +
                                                 " bytes needed, got " + std::to_string(workspace_bytes));
  return Status::Ok;
}

// SlaScoreKernel::Auto -> Tiled (read per call, for A/B runs): the same fp32
// scores bit for bit as Simple, 0.124 vs 0.213 ms for the whole selection at
// 1x12x32760 and 1.06 vs 3.92 ms at 1x40x75600 on the H200 (2026-11-30,
// bench_sla, GPU tests passed). TD_SLA_SCORE=simple or TD_SLA_FUSED=0 (the
// earlier pipeline) picks Simple. Tiled needs head_dim % 4 == 0 (float4
// staging); other head_dims take Simple, which gives the same scores anyway.
bool use_tiled_score(const SlaProblem& p) {
  if (p.head_dim % 4) return false;
  if (p.score_kernel != SlaScoreKernel::Auto) return p.score_kernel == SlaScoreKernel::Tiled;
  const char* score = std::getenv("TD_SLA_SCORE");
  if (score && std::strcmp(score, "tiled") == 0) return true;
  if (score && std::strcmp(score, "simple") == 0) return false;
  const char* fused = std::getenv("TD_SLA_FUSED");
  return !(fused && std::strcmp(fused, "0") == 0);
}

// The radix select with a warp per row (SlaTopkAlgo::Radix where a row has at
// most 32·32 key blocks and n_sel <= kTopkWarpMaxSel): the same keys and T as
// topk_radix_kernel and the same rank count, hence the same LUT and map bit
// for bit, with the row's keys in registers (key j = lane + 32k of the row), a
// 256-bin histogram per warp in shared memory and __syncwarp only.
// Why: topk_radix_kernel gives a row of 256 (1x12x32760) or 591 (1x40x75600)
// keys a 256-thread CTA with 12 CTA barriers and one warp scanning while the
// others wait: ~33 us for 6144 rows at 1x12x32760 under ncu, and about half
// of the fused selection's 0.86 ms at 1x40x75600 (47280 rows).
// Predicted (H200): 8 rows per CTA, six passes of ~150 cycles per warp:
// ~10 us at 1x12x32760 and ~0.08 ms at 1x40x75600. (Since the fused kernel:
// four passes and a ballot walk for the index half, warp_radix_select_row.)
constexpr int kTopkWarpRows = 8;      // rows (one per warp) per 256-thread CTA
constexpr int kTopkWarpMaxSel = 640;  // 8 warps x n_sel x 8 B of selected keys <= 40 KB

// One row of the warp radix select, shared by topk_radix_warp_kernel (keys in
// registers) and score_topk_fused_kernel (keys in shared memory): key_at(k) is
// the 64-bit key of block j = lane + 32k, called only for j < kblocks. hist:
// this warp's 256 bins (16-byte aligned); sel: its n_sel keys of scratch; lut /
// map: the row's, or null. Every lane of the warp calls it. kUnroll: how far
// the loops over k unroll (KPL where the keys sit in registers, whose indices
// must be constants; less where they are re-read from shared memory).
// The digits: the score half of the key (its top 32 bits) by four 8-bit
// passes, which leave T's score and T's rank among the keys with that score
// (`remaining`). Keys of one score order by index, and j = lane + 32k runs in
// index order over (k, lane), so T's index is the remaining-th of those keys
// in that order: a ballot per k finds it, where the two index passes (bits
// 15..0) took two more histograms. The same T, so the same selection.
template <int KPL, int kUnroll, typename KeyAt>
__device__ __forceinline__ void warp_radix_select_row(const KeyAt& key_at, int kblocks, int n_sel, unsigned* hist,
                                                      unsigned long long* sel, int32_t* lut, uint8_t* map,
                                                      int lane) {
  uint32_t prefix = 0, mask = 0;         // T's score half, digit by digit
  unsigned remaining = unsigned(n_sel);  // the rank (1-based) of T among the keys still matching
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
#pragma unroll
    for (int e = 0; e < 8; ++e) hist[e * 32 + lane] = 0;
    __syncwarp();
#pragma unroll kUnroll
    for (int k = 0; k < KPL; ++k)
      if (lane + 32 * k < kblocks) {
        const uint32_t hi = uint32_t(key_at(k) >> 32);
        if ((hi & mask) == prefix) atomicAdd(&hist[(hi >> shift) & 255u], 1u);
      }
    __syncwarp();
    // The bin where the running count reaches `remaining` (lane l owns bins 8l .. 8l + 7).
    const uint4 h0 = *reinterpret_cast<const uint4*>(hist + lane * 8);
    const uint4 h1 = *reinterpret_cast<const uint4*>(hist + lane * 8 + 4);
    const unsigned c[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    unsigned sum = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += c[e];
    const unsigned incl = warp_inclusive_sum(sum, lane);
    const unsigned excl = incl - sum;
    unsigned run = excl;
    int digit = 0;
    const bool mine = excl < remaining && remaining <= incl;  // exactly one lane
    if (mine) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (run < remaining && remaining <= run + c[e] && digit == 0) digit = lane * 8 + e + 1;
        else if (digit == 0) run += c[e];
      --digit;
    }
    const int owner = __ffs(__ballot_sync(0xffffffffu, mine)) - 1;
    digit = __shfl_sync(0xffffffffu, digit, owner);
    run = __shfl_sync(0xffffffffu, run, owner);
    prefix |= unsigned(digit) << shift;
    remaining -= run;
    mask |= 255u << shift;
    __syncwarp();  // every lane has read the histogram before the next pass (or row) clears it
  }
  // T's index: the remaining-th block, in index order, of those whose score half is `prefix`.
  uint32_t t_index = 0;
  unsigned need = remaining;  // warp-uniform, as are the ballots below
  bool found = false;
#pragma unroll kUnroll
  for (int k = 0; k < KPL; ++k)
    if (!found) {
      const bool match = lane + 32 * k < kblocks && uint32_t(key_at(k) >> 32) == prefix;
      const unsigned bal = __ballot_sync(0xffffffffu, match);
      const unsigned count = __popc(bal);
      if (need <= count) {
        const bool hit = match && unsigned(__popc(bal & ((1u << lane) - 1u))) == need - 1;
        t_index = uint32_t(32 * k + __ffs(__ballot_sync(0xffffffffu, hit)) - 1);
        found = true;
      } else {
        need -= count;
      }
    }
  const unsigned long long T = (uint64_t(prefix) << 32) | t_index;  // the n_sel-th smallest key itself
  if (map) {
#pragma unroll kUnroll
    for (int k = 0; k < KPL; ++k)
      if (lane + 32 * k < kblocks) map[lane + 32 * k] = key_at(k) <= T ? 1 : 0;
  }
  if (!lut) return;
  unsigned base = 0;
#pragma unroll kUnroll
  for (int k = 0; k < KPL; ++k) {
    const bool take = lane + 32 * k < kblocks && key_at(k) <= T;
    const unsigned bal = __ballot_sync(0xffffffffu, take);
    if (take) sel[base + __popc(bal & ((1u << lane) - 1u))] = key_at(k);
    base += __popc(bal);
  }
  __syncwarp();
  for (int s = lane; s < n_sel; s += 32) {
    const unsigned long long x = sel[s];
    int rank = 0;
    for (int t = 0; t < n_sel; ++t) rank += sel[t] < x;
    lut[rank] = int32_t(uint32_t(x));
  }
  __syncwarp();  // every lane has read sel before this warp's next row gathers into it
}

// Registers: <= 128 (2 CTAs per SM) as before; KPL 16 (Wan 480p's 512 key
// blocks of the `sla` path) <= 85, 3 CTAs per SM: 79 without spills (ptxas).
template <int KPL>
__global__ void __launch_bounds__(kTopkWarpRows * 32, KPL == 16 ? 3 : 2) topk_radix_warp_kernel(const TopkParams p) {
  pdl_wait();  // pdl.cuh: launched as a programmatic dependent
  pdl_launch_dependents();
  extern __shared__ unsigned long long wsel[];  // [kTopkWarpRows][n_sel]
  __shared__ __align__(16) unsigned whist[kTopkWarpRows][256];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * kTopkWarpRows + warp;
  if (row >= p.rows) return;  // whole warps: every __syncwarp below has all its lanes
  const float* scores = p.scores + row * p.kblocks;
  unsigned long long key[KPL];
#pragma unroll
  for (int k = 0; k < KPL; ++k) {
    const int j = lane + 32 * k;
    key[k] = j < p.kblocks ? (uint64_t(~ordered_bits(scores[j])) << 32) | uint32_t(j) : ~0ull;
  }
  warp_radix_select_row<KPL, KPL>([&](int k) { return key[k]; }, p.kblocks, p.n_sel, whist[warp],
                             wsel + size_t(warp) * p.n_sel, p.lut ? p.lut + row * p.n_sel : nullptr,
                             p.map ? p.map + row * p.kblocks : nullptr, lane);
}

// Parameters of score_topk_fused_kernel (below; the first fused kernel, a
// CTA of 1024 threads with the scores in shared memory, was measured slower
// than it and the two-kernel path at 1x12x32760 and removed in session 14).
struct FusedSelectParams {
  const float* q_sum;  // 64-token Q sums [BH, q_sub_stride, D]
  const float* k_sum;  // smoothed 64-key K sums [BH, k_sub_stride, D]
  int32_t* lut;        // [B, H, QB, n_sel] or null
  uint8_t* map;        // [B, H, QB, KB] or null
  int heads, dim, qblocks, kblocks, len, block_q, block_k, q_sub, k_sub, n_sel;
  int rows;            // query blocks per CTA: 16, 32, 48 or 64
  int key_stride;      // keys per row of the shared key array (kblocks rounded up to 4)
  int scratch;         // byte offset of the staging / top-k scratch in shared memory
  int sel_stride;      // selected keys per warp in the top-k scratch: (n_sel + 2) & ~1 (score_topk_fused_kernel)
  int64_t q_sub_stride, k_sub_stride;
};

// v / n per component, the bits of the IEEE quotient: where n is a power of two
// (full blocks of 64 / 128 tokens), v·(1/n) with 1/n exact is the same exact
// value rounded the same way (no flush to zero in this build), in one multiply.
__device__ __forceinline__ float4 div_tokens(float4 v, int n) {
  if ((n & (n - 1)) == 0) {
    const float r = __int_as_float((128 - __ffs(n)) << 23);  // 2^-(ffs(n) - 1) = 1/n, n <= 2^30
    return make_float4(v.x * r, v.y * r, v.z * r, v.w * r);
  }
  const float f = float(n);
  return make_float4(v.x / f, v.y / f, v.z / f, v.w / f);
}


// score_topk_fused_kernel (the comment above it): its constants and helpers.
constexpr int kSelThreads = 512;
constexpr int kSelWarps = kSelThreads / 32;
constexpr int kSelKC = 256;                      // key blocks per chunk: 8 warp columns x 8 lanes x 4
constexpr int kSelCS = 16;                       // channels per pooled K slice
constexpr int kSelKStride = kSelKC + 4;          // floats per slice row: 16-byte rows
constexpr int kSelSlice = kSelCS * kSelKStride;  // floats per pooled K slice buffer (two of them)
constexpr int kSelHist = 260;                    // words per warp's histogram: 256 bins, a dummy, 16-byte rows
static_assert(kSelThreads * 8 == kSelKC * kSelCS, "staging: 2 key blocks x 4 channels per thread per slice");
static_assert(kSelWarps == 16, "warps: 2 row halves x 8 key columns of 32");

// A thread's RPT rows of the CTA's 8·RPT (warp row wr, lane row group g =
// lane / 8): 4·RPT·wr + (the first 4·(RPT / 4) rows: 4·(RPT / 4)·g + x, then
// the last RPT % 4 (0 or 2): 16·(RPT / 4) + 2g + ..), so that a channel's rows
// are RPT / 4 16-byte and one 8-byte shared load (RPT 6: 2 loads, not 3), each
// of 4 distinct addresses per warp.
template <int RPT>
__device__ __forceinline__ int thread_row(int wr, int g, int x) {
  constexpr int kQuads = RPT / 4;
  return 4 * RPT * wr + (x < 4 * kQuads ? 4 * kQuads * g + x : 16 * kQuads + 2 * g + (x - 4 * kQuads));
}
template <int RPT>
__device__ __forceinline__ void load_rows(float (&a)[RPT], const float* row0, int wr, int g) {
  constexpr int kQuads = RPT / 4;
  static_assert(RPT % 2 == 0, "rows per thread: even");
#pragma unroll
  for (int i = 0; i < kQuads; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(row0 + thread_row<RPT>(wr, g, 4 * i));
    a[4 * i] = v.x, a[4 * i + 1] = v.y, a[4 * i + 2] = v.z, a[4 * i + 3] = v.w;
  }
  if constexpr (RPT % 4 != 0) {
    const float2 v = *reinterpret_cast<const float2*>(row0 + thread_row<RPT>(wr, g, 4 * kQuads));
    a[4 * kQuads] = v.x, a[4 * kQuads + 1] = v.y;
  }
}

// r + (y < x): a 64-bit compare and a predicated add (3 instructions; written
// in C, the compiler adds with a select: 4).
__device__ __forceinline__ unsigned add_if_less(unsigned r, unsigned long long y, unsigned long long x) {
  asm("{\n\t.reg .pred p;\n\tsetp.lt.u64 p, %1, %2;\n\t@p add.u32 %0, %0, 1;\n\t}" : "+r"(r) : "l"(y), "l"(x));
  return r;
}

// A barrier of the 64 threads of warps 2·id - 2 and 2·id - 1 (named barrier id,
// 1..8; 0 is __syncthreads'): score_topk_fused_kernel<.., true>'s warp pair.
__device__ __forceinline__ void pair_sync(int id) {
  asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory");
}

// One row's top-k for score_topk_fused_kernel: the LUT and map of
// warp_radix_select_row (the same T, the n_sel-th smallest 64-bit key
// (~ordered_bits(score) << 32) | j, selected = keys <= T, LUT by rank), by a
// cheaper route. keys: the row's score halves in shared memory (j < kblocks
// read); the lane holds hi[k] for j = lane + 32k in registers, 0xFFFFFFFF past
// kblocks (padding: above every real key, since a real key with that score
// half has the smaller index, so never among the n_sel <= kblocks smallest).
//   - The leading bytes all candidates share are skipped (below).
//   - Radix passes over the score half, 8 bits each from the top: one shared
//     atomic add per key into the warp's 256 bins (keys off the prefix into a
//     dummy bin), the owner lane of the bin where the count reaches
//     `remaining` by one warp scan and a ballot, the digit by an 8-lane scan of
//     that lane's bins. A pass ends the search where T's bin holds exactly
//     `remaining` keys: then the whole bin is selected and nothing below its
//     prefix matters (selected = score half <= prefix | ~mask, the same set as
//     keys <= T); the bin at T's rank rarely holds two keys after 16 bits, so
//     random rows take 2.2 passes on average (CPU emulation, 256 or 591
//     normal scores) instead of 4.
//   - After four passes without that: T's score half is exact and its index the
//     remaining-th of the keys with it in index order (the ballot walk of
//     warp_radix_select_row).
//   - The LUT: the selected keys gathered by ballots into `sel` (n_sel, padded
//     to even with ~0), each one's rank counted against pairs of them (one
//     16-byte broadcast load per two keys).
// hist: the warp's 256 bins and a dummy (kSelHist words, 16-byte aligned);
// sel: its (n_sel + 2) & ~1 keys.
template <int KPL>
__device__ __forceinline__ void fused_select_row(const uint32_t* keys, int kblocks, int n_sel, unsigned* hist,
                                                 unsigned long long* sel, int32_t* lut, uint8_t* map, int lane) {
  uint32_t hi[KPL];
#pragma unroll
  for (int k = 0; k < KPL; ++k) {
    const int j = lane + 32 * k;
    hi[k] = j < kblocks ? keys[j] : 0xFFFFFFFFu;
  }
  const int sub = lane & 7;
  // Leading bytes every candidate shares: T's score half lies between the
  // row's smallest and an upper bound `ub` (with m = ceil(n_sel / 32) <= 2,
  // every lane holds m keys <= the largest lane's m-th smallest, so at least
  // n_sel keys are). The bits above the first one where those two differ are
  // T's, and no key lies below that prefix: the passes start at the byte that
  // differs (the second where the top scores share sign and exponent's top 7
  // bits: one pass of four fewer).
  uint32_t lo1 = 0xFFFFFFFFu, lo2 = 0xFFFFFFFFu;  // the lane's smallest and second smallest
  if (n_sel <= 32) {
#pragma unroll
    for (int k = 0; k < KPL; ++k) lo1 = min(lo1, hi[k]);
  } else {
#pragma unroll
    for (int k = 0; k < KPL; ++k) lo2 = min(lo2, max(lo1, hi[k])), lo1 = min(lo1, hi[k]);
  }
  const uint32_t row_min = __reduce_min_sync(0xffffffffu, lo1);
  const uint32_t ub = n_sel <= 32   ? __reduce_max_sync(0xffffffffu, lo1)
                      : n_sel <= 64 ? __reduce_max_sync(0xffffffffu, lo2)
                                    : 0xFFFFFFFFu;
  const int skip = __clz(row_min ^ ub) / 8;  // whole bytes (4 where equal)
  uint32_t mask = skip == 0 ? 0u : ~0u << (32 - 8 * skip);  // T's score half, digit by digit
  uint32_t prefix = row_min & mask;
  unsigned remaining = unsigned(n_sel);  // T's rank (1-based) among the keys matching prefix
  bool whole_bin = false;
#pragma unroll 1
  for (int pass = skip; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    const unsigned byte_sel = 0x4440u | unsigned(3 - pass);  // __byte_perm: that byte, zeros above
    reinterpret_cast<uint4*>(hist)[2 * lane] = make_uint4(0u, 0u, 0u, 0u);
    reinterpret_cast<uint4*>(hist)[2 * lane + 1] = make_uint4(0u, 0u, 0u, 0u);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < KPL; ++k) {
      // Keys off the prefix count in bin 256, never read: an add under an
      // `if` (or a predicated red.shared) compiles to a branch around it, 3
      // more instructions a key; the unconditional one is ATOMS.POPC.INC,
      // which adds once per distinct address of the warp.
      const unsigned bin = __byte_perm(hi[k], 0u, byte_sel);
      atomicAdd(hist + (((hi[k] ^ prefix) & mask) == 0u ? bin : 256u), 1u);
    }
    __syncwarp();
    // The owner lane (bins 8·lane .. 8·lane + 7) of the bin where the count reaches `remaining`.
    const uint4 h0 = reinterpret_cast<const uint4*>(hist)[2 * lane];
    const uint4 h1 = reinterpret_cast<const uint4*>(hist)[2 * lane + 1];
    const unsigned sum = h0.x + h0.y + h0.z + h0.w + h1.x + h1.y + h1.z + h1.w;
    const unsigned incl = warp_inclusive_sum(sum, lane);
    const int owner = __ffs(__ballot_sync(0xffffffffu, incl >= remaining)) - 1;
    const unsigned below_owner = __shfl_sync(0xffffffffu, incl - sum, owner);
    // The digit: an inclusive scan of the owner's 8 bins over lanes 0-7 (each 8-lane group the same).
    const unsigned c = hist[owner * 8 + sub];
    unsigned ci = c;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      const unsigned u = __shfl_up_sync(0xffffffffu, ci, o, 8);
      if (sub >= o) ci += u;
    }
    const int e = __ffs(__ballot_sync(0xffffffffu, below_owner + ci >= remaining) & 0xffu) - 1;
    const unsigned count = __shfl_sync(0xffffffffu, c, e);
    const unsigned below = below_owner + __shfl_sync(0xffffffffu, ci, e) - count;  // matching keys in lower bins
    prefix |= unsigned(owner * 8 + e) << shift;
    mask |= 255u << shift;
    remaining -= below;
    __syncwarp();  // every lane has read the bins before the next pass (or row) clears them
    if (count == remaining) {  // warp-uniform
      whole_bin = true;
      break;
    }
  }
  uint32_t t_hi = prefix, t_index = 0xFFFFFFFFu;
  if (whole_bin) {
    t_hi = prefix | ~mask;
  } else {
    // T's index: the remaining-th block, in index order, of those whose score half is `prefix`.
    unsigned need = remaining;
    bool found = false;
#pragma unroll
    for (int k = 0; k < KPL; ++k)
      if (!found) {
        const bool match = hi[k] == prefix;
        const unsigned bal = __ballot_sync(0xffffffffu, match);
        const unsigned cnt = __popc(bal);
        if (need <= cnt) {
          const bool hit = match && unsigned(__popc(bal & ((1u << lane) - 1u))) == need - 1;
          t_index = uint32_t(32 * k + __ffs(__ballot_sync(0xffffffffu, hit)) - 1);
          found = true;
        } else {
          need -= cnt;
        }
      }
  }
  const unsigned long long T = (uint64_t(t_hi) << 32) | t_index;
  if (map) {
#pragma unroll
    for (int k = 0; k < KPL; ++k) {
      const int j = lane + 32 * k;
      if (j < kblocks) map[j] = ((uint64_t(hi[k]) << 32) | uint32_t(j)) <= T ? 1 : 0;
    }
  }
  if (!lut) return;
  unsigned base = 0;
#pragma unroll
  for (int k = 0; k < KPL; ++k) {
    const unsigned long long key = (uint64_t(hi[k]) << 32) | uint32_t(lane + 32 * k);
    const bool take = key <= T;
    const unsigned bal = __ballot_sync(0xffffffffu, take);
    if (take) sel[base + __popc(bal & ((1u << lane) - 1u))] = key;
    base += __popc(bal);
  }
  if (lane == 0 && (n_sel & 1)) sel[n_sel] = ~0ull;  // pairs: the pad counts for no one
  __syncwarp();
  const ulonglong2* const sel2 = reinterpret_cast<const ulonglong2*>(sel);
  const int pairs = (n_sel + 1) / 2;
  for (int s0 = 0; s0 < n_sel; s0 += 64) {  // warp-uniform
    const int sa = s0 + lane, sb = s0 + 32 + lane;
    const unsigned long long xa = sa < n_sel ? sel[sa] : ~0ull;
    unsigned ra = 0;
    if (n_sel - s0 > 32) {
      const unsigned long long xb = sb < n_sel ? sel[sb] : ~0ull;
      unsigned rb = 0;
#pragma unroll 4
      for (int t = 0; t < pairs; ++t) {
        const ulonglong2 y = sel2[t];
        ra = add_if_less(ra, y.x, xa), ra = add_if_less(ra, y.y, xa);
        rb = add_if_less(rb, y.x, xb), rb = add_if_less(rb, y.y, xb);
      }
      if (sb < n_sel) lut[rb] = int32_t(uint32_t(xb));
    } else {
#pragma unroll 4
      for (int t = 0; t < pairs; ++t) {
        const ulonglong2 y = sel2[t];
        ra = add_if_less(ra, y.x, xa), ra = add_if_less(ra, y.y, xa);
      }
    }
    if (sa < n_sel) lut[ra] = int32_t(uint32_t(xa));
  }
  __syncwarp();  // every lane has read sel before this warp's next row gathers into it
}

// Score and top-k in one kernel (sla_block_select_from_sums_cuda's default;
// TD_SLA_SELECT=two_kernel runs score_tiled_kernel<true> then the top-k). A
// CTA of 512 threads takes 8·RPT query
// blocks (16, 32, 48 or 64) of one (b, h) against all key blocks:
//   1. pooled Q of its rows from the 64-token sums, all channels, [channel][row];
//   2. the scores in chunks of 256 key blocks: smoothed pooled K staged in
//      16-channel slices ([channel][block], two buffers: one barrier a slice),
//      the next slice's sums loaded into registers while this one is
//      multiplied; a thread holds RPT rows x 4 blocks (warp: 4 row groups x 8
//      block quads; per channel RPT / 4 + 1 16-byte shared loads, and one 8-byte
//      load where RPT % 4 = 2, for 4·RPT FMAs); each finished chunk leaves
//      ~ordered_bits(score), the top half of the top-k key, in shared memory;
//   3. a warp per row (rows warp, warp + 16, ..) runs fused_select_row on those
//      keys: the LUT and map of topk_radix_warp_kernel.
// The same bits as the two kernels: pooled Q and K are the values
// score_tiled_kernel<true> stages (the same float4 sums over the 64-token
// blocks in the same order, then / tokens; a power-of-two token count is
// multiplied by its exact reciprocal, which rounds the same exact quotient),
// every score is fmaf(q_c, k_c, acc) from 0.f for c = 0, 1, ... in order (the
// channels padded with zeros to a multiple of 16 here and of 32 there:
// fmaf(0, 0, acc) is acc, or +0 for -0, the same key), and the key is
// (~ordered_bits(score) << 32) | j; fused_select_row selects the same set and
// ranks it the same (ties by index). The scores never reach global memory (no
// reader of the workspace's score slot exists after this call).
// Why it replaced the first fused kernel (1024 threads x 64 registers, 4 x
// 4 blocks; removed in session 14): that one measured 45 us at 1x12x32760 (ncu 38.4 us, 60% issue,
// like the two kernels), not the ~14 us it predicted. Its SASS profile: the
// top-k was 40% of the stall samples and 43% of the instructions, 1545 warp
// instructions a row (4 histogram passes of ~232: shared load, bounds check
// and a branch around each key's atomic, ~17 a key; the index walk, gather and
// rank count ~530), 12 rows per scheduler with 48 rows on 32 warps; the score
// phase issued 92 staging instructions per thread per slice (half as many as
// its FFMAs: 64-bit address math, per-slice token counts), ran 6 of its 8
// warps a scheduler at 48 rows, and at 64 registers the compiler fetched one
// channel of shared loads ahead (short_scoreboard: the FFMAs waiting on them).
// This one: 128 registers (RPT x 4 accumulators; shared loads two channels
// ahead), every warp doing FMAs (8·RPT rows, not 64 rows with a quarter idle),
// 4·RPT FMAs a warp-channel for RPT / 4 + 1.5 loads (48 rows: 24 for 3, was
// 16 for 2), per-chunk staging state (~50 instructions a warp-slice, was
// ~90); the top-k of fused_select_row: keys in registers, 5 instructions a key
// a pass, the leading byte skipped and most rows done after 2.2 passes (was 4
// and the walk): ~550 instructions a row at 256 blocks, ~1.3 K at 591.
// One CTA per SM (512 x 128 registers); launch_fused_select picks the rows
// whose ceil(CTAs / SMs) x (rows + 16) is least among those whose shared
// memory fits: keys rows x KB x 4 B + max(staging: Q dpad x (rows + 4) x 4 B
// + K 33 KB, top-k scratch: 16 x (1 KB of bins + 8·n_sel B)).
// Predicted (H200, 132 SMs, ~1.9 GHz, 4 schedulers x 32 FP32 lanes per SM):
//   1x12x32760 (QB 512, KB 256, n_sel 25): 48 rows (RPT 6) -> 11 x 12 = 132
//   CTAs, one wave, 106.5 KB. Scores: 8 slices x 4 warps a scheduler x (384
//   FFMA + 48 LDS + ~90) = 16.7 K issue cycles (FFMA alone 12.3 K), ~18.5 K at
//   90%; top-k 4 warps x 3 rows x ~550 = 6.6 K cycles (~7 K with latency);
//   prologue (PDL wait, Q, first slice: one L2 round trip) ~1.5 K, barriers
//   ~0.5 K: ~27.5 K cycles = ~14.5 us (v1: 38.4 us under ncu, 45 in bench_sla:
//   ~20 us there).
//   1x40x75600 (QB 1182, KB 591, n_sel 59): 64 rows (RPT 8) -> 19 x 40 = 760
//   CTAs, 5.76 waves, 214.5 KB. Scores: 16 full slices x 4 x (512 + 48 + 90) =
//   41.6 K + the 79-block chunk's 8 slices at <= 2 active warps a scheduler
//   ~12 K, ~59.5 K at 90%; top-k 4 x 4 rows x ~1.3 K = 20.8 K; ~82 K cycles =
//   ~43 us a CTA, 6 waves: ~0.26 ms (v1: 0.575-0.599 ms; the FMA floor 3.58 G
//   / (132 x 128 x 1.9 GHz) = 0.11 ms).
// Measured (kPairSync false, now TD_SLA_SELECT=fused_v2 / fused16..64): 34-36
// us in bench_sla at 1x12x32760 (ncu 33.6 us = ~64 K cycles, not 27.5 K),
// 0.439 ms at 1x40x75600. Its SASS samples by phase (1x12x32760): prologue 10%
// (~6.5 K cycles: the pooled sums' first global loads, long_scoreboard), score
// loop 54% (~35 K cycles for ~16.8 K warp instructions a scheduler: 48%
// issue), keys + barrier 6%, top-k 29% (~18.5 K cycles, 7.5 K instructions a
// scheduler: latency-bound, 4 warps each). In the score loop the stalls were
// those of warps in lock step: not_selected 22% (the scheduler's other warps
// ready at the same moment), no_instruction 17% (all 16 warps fetching the same
// new code after each barrier), mio 16% and short_scoreboard 13% (all warps'
// shared loads issued in the same burst), barrier 3%; the CTA-wide
// __syncthreads after every 16-channel slice re-aligns all 16 warps 8 times a
// chunk.
// kPairSync (the default; TD_SLA_SELECT=fused_v3[_16/32/48/64]): the slice
// barrier is a named barrier of the 2 warps of one key column (bar.sync 1 +
// wc, 64 threads). Warps 2c and 2c + 1 stage exactly the key blocks 32c ..
// 32c + 31 that they alone read (thread t stages blocks 2(t / 4), + 1: warp w
// blocks 16w .. 16w + 15), so a slice's consumers and producers are that pair;
// pooled Q (read by every warp) keeps the __syncthreads after it, and the
// keys the one before the top-k. The 8 pairs drift apart, so one pair's
// barrier wait, instruction fetch or shared-load burst overlaps another's
// FFMAs. The generic k_sub / q_sub loops (not 128- / 64-token blocks) are not
// unrolled (less cold code between the hot blocks). Every value, and every
// fmaf chain, is unchanged: the same bits.
// Predicted: score loop issue from 48% to ~70% (of the ~16.8 K instructions a
// scheduler: ~24 K cycles instead of ~35 K, -5.8 us); prologue and top-k
// unchanged (~6.5 K + ~18.5 K + ~4 K keys/barrier): ~53 K cycles = ~28 us at
// 1x12x32760 under ncu (bench ~29 us); at 1x40x75600 the loop is ~60% of the
// time: ~0.38 ms (from 0.439). Reaching ~20 us needs the top-k's 18.5 K
// cycles hidden too (it runs with all 16 warps idle of FFMAs; a second CTA
// per SM at 24 rows, 256 threads would need the staging re-laid for 8 warps).
template <int RPT, int KPL, bool kPairSync>
__global__ void __launch_bounds__(kSelThreads, 1) score_topk_fused_kernel(const FusedSelectParams p) {
  pdl_wait();  // pdl.cuh: launched as a programmatic dependent
  pdl_launch_dependents();
  constexpr int kRows = 8 * RPT, kQStride = kRows + 4;
  extern __shared__ __align__(16) unsigned char fused_smem[];
  uint32_t* const skey = reinterpret_cast<uint32_t*>(fused_smem);  // [kRows][key_stride]
  const int dpad = (p.dim + kSelCS - 1) / kSelCS * kSelCS;
  float* const qs = reinterpret_cast<float*>(fused_smem + p.scratch);  // [dpad][kQStride]
  float* const ks = qs + dpad * kQStride;                               // [2][kSelCS][kSelKStride]
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int i0 = int(blockIdx.x) * kRows;
  const int64_t bh = int64_t(blockIdx.z) * p.heads + blockIdx.y;
  const int rows_here = min(kRows, p.qblocks - i0);

  // K staging: thread t pools channels 4(t % 4) .. + 3 of the slice for key
  // blocks kp, kp + 1 of the chunk (a warp: 16 blocks x 64 contiguous bytes per
  // 64-token sum) and stores them as four 8-byte pairs ([channel][block]).
  const int cq = tid % 4, kp = 2 * (tid / 4);
  const float* const ksrc = p.k_sum + bh * p.k_sub_stride * p.dim + 4 * cq;
  float4 pre[2][2];  // [block][sum]: the next slice's sums in flight (k_sub == 2: both halves, added at staging)
  // The fetched chunk's two blocks: their sums at channel 4·cq (null past
  // kblocks), 1/tokens where tokens is a power of two (else 0), tokens.
  int f_chunk = -1;
  const float* f_src[2];
  float f_recip[2], f_tokens[2];
  auto fetch = [&](int chunk, int slice) {
    if (chunk != f_chunk) {  // warp-uniform; once per chunk
      f_chunk = chunk;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = chunk * kSelKC + kp + h, n = min(p.len, (j + 1) * p.block_k) - j * p.block_k;
        f_src[h] = j < p.kblocks ? ksrc + int64_t(j) * p.k_sub * p.dim : nullptr;
        f_recip[h] = (n & (n - 1)) == 0 ? __int_as_float((128 - __ffs(n)) << 23) : 0.f;  // as div_tokens
        f_tokens[h] = float(n);
      }
    }
    const bool in = slice * kSelCS + 4 * cq < p.dim;  // dim % 4 == 0: a float4 is all in or all out
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pre[h][0] = pre[h][1] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (f_src[h] && in) {
        const float* src = f_src[h] + slice * kSelCS;
        pre[h][0] = *reinterpret_cast<const float4*>(src);
        if (p.k_sub == 2) {
          pre[h][1] = *reinterpret_cast<const float4*>(src + p.dim);
        } else if constexpr (kPairSync) {
#pragma unroll 1
          for (int s = 1; s < p.k_sub; ++s) {  // the same order as score_tiled_kernel's sum
            const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
            pre[h][0].x += a.x, pre[h][0].y += a.y, pre[h][0].z += a.z, pre[h][0].w += a.w;
          }
        } else {
          for (int s = 1; s < p.k_sub; ++s) {  // the same order as score_tiled_kernel's sum
            const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
            pre[h][0].x += a.x, pre[h][0].y += a.y, pre[h][0].z += a.z, pre[h][0].w += a.w;
          }
        }
      }
    }
  };
  // The fetched slice, pooled (sum / tokens, the bits of div_tokens), into `buf`.
  auto stage = [&](float* buf) {
    float4 v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      v[h] = pre[h][0];
      if (p.k_sub == 2) v[h].x += pre[h][1].x, v[h].y += pre[h][1].y, v[h].z += pre[h][1].z, v[h].w += pre[h][1].w;
      if (f_src[h]) {
        if (f_recip[h] != 0.f) {
          const float r = f_recip[h];
          v[h] = make_float4(v[h].x * r, v[h].y * r, v[h].z * r, v[h].w * r);
        } else {
          const float n = f_tokens[h];
          v[h] = make_float4(v[h].x / n, v[h].y / n, v[h].z / n, v[h].w / n);
        }
      }
    }
    float* const dst = buf + 4 * cq * kSelKStride + kp;
    *reinterpret_cast<float2*>(dst) = make_float2(v[0].x, v[1].x);
    *reinterpret_cast<float2*>(dst + kSelKStride) = make_float2(v[0].y, v[1].y);
    *reinterpret_cast<float2*>(dst + 2 * kSelKStride) = make_float2(v[0].z, v[1].z);
    *reinterpret_cast<float2*>(dst + 3 * kSelKStride) = make_float2(v[0].w, v[1].w);
  };
  fetch(0, 0);  // in flight during pooled Q

  // Pooled Q of the CTA's rows, all channels, [channel][row] (lanes along rows).
#pragma unroll 4
  for (int e = tid; e < kRows * (dpad / 4); e += kSelThreads) {
    const int r = e % kRows, c = e / kRows * 4;
    float4 qv = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows_here && c < p.dim) {
      const int i = i0 + r;
      const float* src = p.q_sum + (bh * p.q_sub_stride + int64_t(i) * p.q_sub) * p.dim + c;
      qv = *reinterpret_cast<const float4*>(src);
      if constexpr (kPairSync) {
#pragma unroll 1
        for (int s = 1; s < p.q_sub; ++s) {
          const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
          qv.x += a.x, qv.y += a.y, qv.z += a.z, qv.w += a.w;
        }
      } else {
        for (int s = 1; s < p.q_sub; ++s) {
          const float4 a = *reinterpret_cast<const float4*>(src + int64_t(s) * p.dim);
          qv.x += a.x, qv.y += a.y, qv.z += a.z, qv.w += a.w;
        }
      }
      qv = div_tokens(qv, min(p.len, (i + 1) * p.block_q) - i * p.block_q);
    }
    qs[(c + 0) * kQStride + r] = qv.x;
    qs[(c + 1) * kQStride + r] = qv.y;
    qs[(c + 2) * kQStride + r] = qv.z;
    qs[(c + 3) * kQStride + r] = qv.w;
  }
  stage(ks);

  // Scores. Warp w: rows 4·RPT·(w % 2) .. (thread_row), key blocks 32·(w / 2) ..
  // of the chunk (the key columns of a short last chunk spread over the 4
  // schedulers); lanes 4 x 8: RPT rows, key blocks kq .. kq + 3.
  const int wr = warp % 2, wc = warp / 2, g = lane / 8;
  const int kq = 32 * wc + 4 * (lane % 8);
  const bool warp_rows = 4 * RPT * wr < rows_here;  // warp-uniform
  float acc[RPT][4];
#pragma unroll
  for (int x = 0; x < RPT; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y) acc[x][y] = 0.f;
  const int slices = dpad / kSelCS, chunks = (p.kblocks + kSelKC - 1) / kSelKC;
  __syncthreads();  // pooled Q and the first slice
  int step = 0;
#pragma unroll 1
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const bool active = warp_rows && chunk * kSelKC + 32 * wc < p.kblocks;  // warp-uniform
#pragma unroll 1
    for (int slice = 0; slice < slices; ++slice, ++step) {
      const bool last = slice + 1 == slices, more = !last || chunk + 1 < chunks;
      if (more) fetch(last ? chunk + 1 : chunk, last ? 0 : slice + 1);  // in flight during the FMAs below
      if (active) {
        const float* const qc = qs + slice * kSelCS * kQStride;
        const float* const kc = ks + (step & 1) * kSelSlice + kq;
#pragma unroll
        for (int c = 0; c < kSelCS; ++c) {
          float a[RPT];
          load_rows<RPT>(a, qc + c * kQStride, wr, g);
          const float4 b = *reinterpret_cast<const float4*>(kc + c * kSelKStride);
#pragma unroll
          for (int x = 0; x < RPT; ++x) {
            acc[x][0] = fmaf(a[x], b.x, acc[x][0]);
            acc[x][1] = fmaf(a[x], b.y, acc[x][1]);
            acc[x][2] = fmaf(a[x], b.z, acc[x][2]);
            acc[x][3] = fmaf(a[x], b.w, acc[x][3]);
          }
        }
      }
      if (more) stage(ks + ((step + 1) & 1) * kSelSlice);
      if constexpr (kPairSync)
        pair_sync(1 + wc);  // this slice consumed and the next staged by the 2 warps that read its 32 columns
      else
        __syncthreads();  // this slice consumed, the next staged
    }
    // The chunk's scores are complete: their keys' top halves (rows past
    // rows_here and blocks past kblocks are written, never read).
    const int j0 = chunk * kSelKC + kq;
    if (j0 < p.key_stride)
#pragma unroll
      for (int x = 0; x < RPT; ++x)
        *reinterpret_cast<uint4*>(skey + thread_row<RPT>(wr, g, x) * p.key_stride + j0) =
            make_uint4(~ordered_bits(acc[x][0]), ~ordered_bits(acc[x][1]), ~ordered_bits(acc[x][2]),
                       ~ordered_bits(acc[x][3]));
#pragma unroll
    for (int x = 0; x < RPT; ++x)
#pragma unroll
      for (int y = 0; y < 4; ++y) acc[x][y] = 0.f;
  }
  __syncthreads();  // the keys are complete (and the staging memory free for the top-k)

  // Top-k: a warp per row (rows warp, warp + 16, ...); bins and sel reuse the staging memory.
  unsigned* const hist = reinterpret_cast<unsigned*>(fused_smem + p.scratch) + warp * kSelHist;
  unsigned long long* const sel =
      reinterpret_cast<unsigned long long*>(fused_smem + p.scratch + kSelWarps * kSelHist * 4) +
      size_t(warp) * p.sel_stride;
  for (int r = warp; r < rows_here; r += kSelWarps) {  // warp-uniform
    const int64_t row = bh * p.qblocks + i0 + r;
    fused_select_row<KPL>(skey + r * p.key_stride, p.kblocks, p.n_sel, hist, sel,
                          p.lut ? p.lut + row * p.n_sel : nullptr, p.map ? p.map + row * p.kblocks : nullptr, lane);
  }
}

// Shared memory of score_topk_fused_kernel for `rows` (8·RPT) query blocks per
// CTA: the keys' score halves, then the larger of the staging (pooled Q, two
// pooled K slices) and the top-k scratch (16 warps x (257 bins + the selected keys)).
size_t fused_smem_bytes(int rows, int64_t KB, int64_t D, int64_t n_sel) {
  const size_t keys = size_t(rows) * size_t((KB + 3) / 4 * 4) * 4;
  const size_t dpad = size_t((D + kSelCS - 1) / kSelCS * kSelCS);
  const size_t staging = (dpad * size_t(rows + 4) + 2 * size_t(kSelSlice)) * 4;
  const size_t topk = size_t(kSelWarps) * (kSelHist * 4 + size_t((n_sel + 2) & ~int64_t(1)) * 8);
  return keys + (staging > topk ? staging : topk);
}

// The top-k algorithm p asks for (Auto: read per call from TD_SLA_TOPK).
SlaTopkAlgo resolve_topk_algo(const SlaProblem& p) {
  if (p.topk_algo != SlaTopkAlgo::Auto) return p.topk_algo;
  const char* env = std::getenv("TD_SLA_TOPK");
  // Radix: 0.18 vs 0.21 ms at 1x12x32760 and 1.95-2.07 vs 3.6 ms at
  // 1x40x75600 on the H200 (2026-11-30), the same LUT (GPU tests passed).
  return env && std::strcmp(env, "bitonic") == 0     ? SlaTopkAlgo::Bitonic
         : env && std::strcmp(env, "radix_cta") == 0 ? SlaTopkAlgo::RadixCta
                                                     : SlaTopkAlgo::Radix;
}

// The top-k of every query block's row of scores into the LUT / map (either algorithm: the same result).
Status launch_topk(const SlaProblem& p, const float* scores, uint8_t* block_map, int32_t* lut, cudaStream_t st) {
  using detail::sla_fail;
  const int64_t QB = p.query_blocks(), KB = p.key_blocks();
  TopkParams tp;
  tp.scores = scores;
  tp.heads = int(p.heads);
  tp.qblocks = int(QB);
  tp.kblocks = int(KB);
  int sort_size = 1;
  while (sort_size < KB) sort_size <<= 1;
  tp.sort_size = sort_size;
  tp.n_sel = int(sla_selected_blocks(p.topk, KB));
  tp.lut = lut;
  tp.map = block_map;
  tp.rows = p.batch * p.heads * QB;
  const SlaTopkAlgo algo = resolve_topk_algo(p);
  if (algo == SlaTopkAlgo::Radix && KB <= 32 * 32 && tp.n_sel <= kTopkWarpMaxSel) {
    const unsigned grid = unsigned((tp.rows + kTopkWarpRows - 1) / kTopkWarpRows);
    const size_t smem = size_t(kTopkWarpRows) * size_t(tp.n_sel) * 8;
    auto go = [&](auto kpl) -> Status {
      constexpr int kKPL = decltype(kpl)::value;
      return launch_error(
          launch_pdl(true, topk_radix_warp_kernel<kKPL>, dim3(grid), dim3(kTopkWarpRows * 32), smem, st, tp),
          "topk_radix_warp");
    };
    if (KB <= 64) return go(std::integral_constant<int, 2>{});
    if (KB <= 128) return go(std::integral_constant<int, 4>{});
    if (KB <= 256) return go(std::integral_constant<int, 8>{});
    if (KB <= 512) return go(std::integral_constant<int, 16>{});
    if (KB <= 768) return go(std::integral_constant<int, 24>{});
    return go(std::integral_constant<int, 32>{});
  }
  if ((algo == SlaTopkAlgo::Radix || algo == SlaTopkAlgo::RadixCta) && tp.n_sel <= kRadixMaxSel) {
    const size_t smem = size_t(KB + tp.n_sel) * 8;
    if (smem > 48 * 1024) {
      const cudaError_t e =
          cudaFuncSetAttribute(topk_radix_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (e != cudaSuccess)
        return sla_fail(Status::Unsupported, "sla_block_select_cuda: " + std::to_string(KB) + " key blocks need " +
                                                 std::to_string(smem) + " bytes of shared memory: " +
                                                 cudaGetErrorString(e));
    }
    return launch_error(launch_pdl(true, topk_radix_kernel, dim3(unsigned(QB), unsigned(p.heads), unsigned(p.batch)),
                                   dim3(kTopkThreads), smem, st, tp),
                        "topk_radix");
  }
  const size_t smem = size_t(sort_size) * 8;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess)
      return sla_fail(Status::Unsupported, "sla_block_select_cuda: " + std::to_string(KB) + " key blocks need " +
                                               std::to_string(smem) + " bytes of shared memory: " +
                                               cudaGetErrorString(e));
  }
  return launch_error(launch_pdl(true, topk_kernel, dim3(unsigned(QB), unsigned(p.heads), unsigned(p.batch)),
                                 dim3(kTopkThreads), smem, st, tp),
                      "topk");
}

// The from-sums selection by score_topk_fused_kernel, where it takes the
// problem; *launched false (and Ok) where the caller runs the two kernels:
//   - TD_SLA_SELECT=two_kernel (read per call, for A/B), or a top-k other than
//     Radix asked for (p.topk_algo / TD_SLA_TOPK): those run as asked;
//   - rows of more than 32·32 key blocks or n_sel > kTopkWarpMaxSel (the warp
//     select's limits: a lane holds 32 keys at most, and the rank count is
//     quadratic in n_sel), or no row count whose shared memory fits the device
//     (n_sel = 640: 96.5 KB of top-k scratch).
// TD_SLA_SELECT=fused_v3_16 / 32 / 48 / 64 fixes the rows per CTA of the
// default (score_topk_fused_kernel<.., true>; fused_v3: rows by the wave count
// below), for measuring; fused_v2 or fused (rows by the same rule) and
// fused_v2_16 .. or fused16 / fused32 / fused48 / fused64 run
// score_topk_fused_kernel<.., false> (a CTA barrier per slice);
Status launch_fused_select(const SlaProblem& p, const float* q_sum64, int64_t q_sub_stride, const float* k_sum64,
                           int64_t k_sub_stride, uint8_t* block_map, int32_t* lut, cudaStream_t st, bool* launched) {
  *launched = false;
  const char* env = std::getenv("TD_SLA_SELECT");
  if (env && std::strcmp(env, "two_kernel") == 0) return Status::Ok;
  if (resolve_topk_algo(p) != SlaTopkAlgo::Radix) return Status::Ok;
  const int64_t QB = p.query_blocks(), KB = p.key_blocks(), n_sel = sla_selected_blocks(p.topk, KB);
  if (KB > 32 * 32 || n_sel > kTopkWarpMaxSel) return Status::Ok;
  int dev = 0, sms = 0, smem_max = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || sms <= 0) {
    cudaGetLastError();
    return Status::Ok;
  }
  // fused_v2[_N] or fusedN / fused: score_topk_fused_kernel<.., false> (CTA-wide
  // barrier a slice); else (unset, fused_v3[_N]) <.., true> (warp-pair barriers).
  const bool v3 = env && std::strncmp(env, "fused_v3", 8) == 0;
  const bool v2 = !v3 && env && std::strncmp(env, "fused", 5) == 0;
  int forced = 0;
  if (v3 || (v2 && std::strncmp(env, "fused_v2", 8) == 0)) forced = std::atoi(env + 8 + (env[8] == '_' ? 1 : 0));
  else if (v2) forced = std::atoi(env + 5);
  auto smem_for = [&](int r) {
    return fused_smem_bytes(r, KB, p.head_dim, n_sel);
  };
  int rows = 0;
  int64_t best = 0;
  for (const int r : {64, 48, 32, 16}) {
    if (smem_for(r) > size_t(smem_max)) continue;
    if (r == forced) {
      rows = r;
      break;
    }
    // One CTA per SM: whole waves of `sms` CTAs, each ~ (rows + 16) rows' time
    // (16: its K pooling and the top-k / prologue latency, in rows).
    const int64_t ctas = (QB + r - 1) / r * p.batch * p.heads, cost = (ctas + sms - 1) / sms * (r + 16);
    if (rows == 0 || cost < best) rows = r, best = cost;
  }
  if (rows == 0) return Status::Ok;
  FusedSelectParams fp;
  fp.q_sum = q_sum64;
  fp.k_sum = k_sum64;
  fp.lut = lut;
  fp.map = block_map;
  fp.heads = int(p.heads);
  fp.dim = int(p.head_dim);
  fp.qblocks = int(QB);
  fp.kblocks = int(KB);
  fp.len = int(p.len);
  fp.block_q = int(p.block_q);
  fp.block_k = int(p.block_k);
  fp.q_sub = int(p.block_q / 64);
  fp.k_sub = int(p.block_k / 64);
  fp.n_sel = int(n_sel);
  fp.rows = rows;
  fp.key_stride = int((KB + 3) / 4 * 4);
  fp.scratch = rows * fp.key_stride * 4;
  fp.sel_stride = int((n_sel + 2) & ~int64_t(1));
  fp.q_sub_stride = q_sub_stride;
  fp.k_sub_stride = k_sub_stride;
  const size_t smem = smem_for(rows);
  const dim3 grid(unsigned((QB + rows - 1) / rows), unsigned(p.heads), unsigned(p.batch));
  // One instance: kernel<...> with `threads` per CTA (not launched, Ok, where
  // the device refuses its shared memory: the two kernels run).
  auto launch = [&](auto kernel, unsigned threads) -> Status {
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess) {
      cudaGetLastError();
      return Status::Ok;
    }
    *launched = true;
    return launch_error(launch_pdl(true, kernel, grid, dim3(threads), smem, st, fp), "score_topk_fused");
  };
  // Keys per lane in the top-k: the fewest that hold a row.
  auto by_kpl = [&](auto go) -> Status {
    if (KB <= 64) return go(std::integral_constant<int, 2>{});
    if (KB <= 128) return go(std::integral_constant<int, 4>{});
    if (KB <= 256) return go(std::integral_constant<int, 8>{});
    if (KB <= 512) return go(std::integral_constant<int, 16>{});
    if (KB <= 640) return go(std::integral_constant<int, 20>{});
    if (KB <= 768) return go(std::integral_constant<int, 24>{});
    return go(std::integral_constant<int, 32>{});
  };
  auto by_rows = [&](auto rpt) -> Status {
    constexpr int kRPT = decltype(rpt)::value;
    return by_kpl([&](auto kpl) {
      if (v2) return launch(score_topk_fused_kernel<kRPT, decltype(kpl)::value, false>, unsigned(kSelThreads));
      return launch(score_topk_fused_kernel<kRPT, decltype(kpl)::value, true>, unsigned(kSelThreads));
    });
  };
  switch (rows) {
    case 16: return by_rows(std::integral_constant<int, 2>{});
    case 32: return by_rows(std::integral_constant<int, 4>{});
    case 48: return by_rows(std::integral_constant<int, 6>{});
    default: return by_rows(std::integral_constant<int, 8>{});
  }
}

}  // namespace

size_t sla_block_select_workspace_size(const SlaProblem& p) {
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim);
  return align256(bh * size_t(p.query_blocks()) * d * 4) + align256(bh * size_t(p.key_blocks()) * d * 4) +
         align256(bh * size_t(p.query_blocks()) * size_t(p.key_blocks()) * 4) + align256(bh * d * 4);
}

Status sla_block_select_cuda(const SlaProblem& p, const void* q, const void* k, uint8_t* block_map, int32_t* lut,
                             void* workspace, size_t workspace_bytes, void* stream) {
  using detail::sla_fail;
  if (Status s = select_checks(p, workspace, workspace_bytes, "sla_block_select_cuda"); s != Status::Ok) return s;
  if (!q || !k) return sla_fail(Status::InvalidArgument, "sla_block_select_cuda: null Q or K");
  const int64_t QB = p.query_blocks(), KB = p.key_blocks();
  if (!lut && !block_map) return Status::Ok;
  const auto st = static_cast<cudaStream_t>(stream);
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim);

  PoolParams pp;
  pp.q = static_cast<const __nv_bfloat16*>(q);
  pp.k = static_cast<const __nv_bfloat16*>(k);
  pp.qs = p.q;
  pp.ks = p.k;
  pp.heads = int(p.heads);
  pp.len = int(p.len);
  pp.dim = int(p.head_dim);
  // A block larger than the sequence is one (partial) block: clamp, so int holds it.
  pp.block_q = int(p.block_q > p.len ? p.len : p.block_q);
  pp.block_k = int(p.block_k > p.len ? p.len : p.block_k);
  pp.qblocks = int(QB);
  pp.kblocks = int(KB);
  pp.pq = static_cast<float*>(workspace);
  pp.pk = reinterpret_cast<float*>(static_cast<char*>(workspace) + align256(bh * size_t(QB) * d * 4));
  const unsigned threads = unsigned((p.head_dim + 31) / 32 * 32);
  const dim3 pool_grid(unsigned(QB > KB ? QB : KB), unsigned(p.heads), unsigned(p.batch));
  const bool vec = p.head_dim % 8 == 0 && p.q.batch % 8 == 0 && p.q.head % 8 == 0 && p.q.token % 8 == 0 &&
                   p.k.batch % 8 == 0 && p.k.head % 8 == 0 && p.k.token % 8 == 0 &&
                   (reinterpret_cast<uintptr_t>(q) & 15) == 0 && (reinterpret_cast<uintptr_t>(k) & 15) == 0;
  if (vec) {
    const size_t red = size_t(kPoolThreads / (p.head_dim / 8)) * size_t(p.head_dim) * 4;  // 8 KiB at most
    block_pool_vec_kernel<<<pool_grid, kPoolThreads, red, st>>>(pp);
  } else {
    block_pool_kernel<<<pool_grid, threads, 0, st>>>(pp);
  }
  if (Status s = launch_error("block_pool"); s != Status::Ok) return s;
  char* const ws = static_cast<char*>(workspace);
  float* const kmean = reinterpret_cast<float*>(ws + align256(bh * size_t(QB) * d * 4) +
                                                align256(bh * size_t(KB) * d * 4) +
                                                align256(bh * size_t(QB) * size_t(KB) * 4));
  key_mean_kernel<<<dim3(unsigned((p.head_dim + 31) / 32), unsigned(bh)), 32 * kMeanGroups, 0, st>>>(pp, kmean);
  if (Status s = launch_error("key_mean"); s != Status::Ok) return s;

  float* const scores =
      reinterpret_cast<float*>(ws + align256(bh * size_t(QB) * d * 4) + align256(bh * size_t(KB) * d * 4));
  if (use_tiled_score(p)) {
    TiledScoreParams tsp;
    tsp.pq = pp.pq;
    tsp.pk = pp.pk;
    tsp.kmean = kmean;
    tsp.scores = scores;
    tsp.dim = int(p.head_dim);
    tsp.qblocks = int(QB);
    tsp.kblocks = int(KB);
    tsp.len = int(p.len);
    tsp.block_q = pp.block_q;
    tsp.block_k = pp.block_k;
    tsp.q_sub = tsp.k_sub = 1;
    tsp.q_sub_stride = QB;
    tsp.k_sub_stride = KB;
    score_tiled_kernel<false><<<dim3(unsigned((QB + kTiledQ - 1) / kTiledQ), unsigned((KB + kTiledK - 1) / kTiledK),
                                     unsigned(bh)),
                                kTiledThreads, 0, st>>>(tsp);
    if (Status s = launch_error("score_tiled"); s != Status::Ok) return s;
  } else {
    ScoreParams sp;
    sp.pq = pp.pq;
    sp.pk = pp.pk;
    sp.kmean = kmean;
    sp.scores = scores;
    sp.len = int(p.len);
    sp.block_k = pp.block_k;
    sp.dim = int(p.head_dim);
    sp.qblocks = int(QB);
    sp.kblocks = int(KB);
    score_kernel<<<dim3(unsigned((QB + kScoreQ - 1) / kScoreQ), unsigned((KB + kScoreK - 1) / kScoreK),
                        unsigned(bh)),
                   kScoreThreads, 0, st>>>(sp);
    if (Status s = launch_error("score"); s != Status::Ok) return s;
  }
  return launch_topk(p, scores, block_map, lut, st);
}

Status sla_block_select_from_sums_cuda(const SlaProblem& p, const float* q_sum64, int64_t q_sub_stride,
                                       const float* k_sum64, int64_t k_sub_stride, uint8_t* block_map, int32_t* lut,
                                       void* workspace, size_t workspace_bytes, void* stream) {
  using detail::sla_fail;
  if (Status s = select_checks(p, workspace, workspace_bytes, "sla_block_select_from_sums_cuda"); s != Status::Ok)
    return s;
  if (!q_sum64 || !k_sum64)
    return sla_fail(Status::InvalidArgument, "sla_block_select_from_sums_cuda: null block sums");
  if (p.block_q % 64 || p.block_k % 64 || p.head_dim % 4)
    return sla_fail(Status::Unsupported,
                    "sla_block_select_from_sums_cuda: block_q and block_k must be multiples of 64 and head_dim of 4, "
                    "got " + std::to_string(p.block_q) + " x " + std::to_string(p.block_k) + ", head_dim " +
                        std::to_string(p.head_dim));
  const int64_t QB = p.query_blocks(), KB = p.key_blocks();
  if (q_sub_stride < QB * (p.block_q / 64) || k_sub_stride < KB * (p.block_k / 64))
    return sla_fail(Status::InvalidArgument, "sla_block_select_from_sums_cuda: the block sums hold " +
                                                 std::to_string(q_sub_stride) + " / " + std::to_string(k_sub_stride) +
                                                 " 64-token blocks per head, need " +
                                                 std::to_string(QB * (p.block_q / 64)) + " / " +
                                                 std::to_string(KB * (p.block_k / 64)));
  if (!lut && !block_map) return Status::Ok;
  const auto st = static_cast<cudaStream_t>(stream);
  bool fused = false;
  if (Status s = launch_fused_select(p, q_sum64, q_sub_stride, k_sum64, k_sub_stride, block_map, lut, st, &fused);
      s != Status::Ok || fused)
    return s;
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim);
  char* const ws = static_cast<char*>(workspace);
  float* const scores =
      reinterpret_cast<float*>(ws + align256(bh * size_t(QB) * d * 4) + align256(bh * size_t(KB) * d * 4));
  TiledScoreParams tsp;
  tsp.pq = q_sum64;
  tsp.pk = k_sum64;
  tsp.kmean = nullptr;
  tsp.scores = scores;
  tsp.dim = int(p.head_dim);
  tsp.qblocks = int(QB);
  tsp.kblocks = int(KB);
  tsp.len = int(p.len);
  tsp.block_q = int(p.block_q);
  tsp.block_k = int(p.block_k);
  tsp.q_sub = int(p.block_q / 64);
  tsp.k_sub = int(p.block_k / 64);
  tsp.q_sub_stride = q_sub_stride;
  tsp.k_sub_stride = k_sub_stride;
  const dim3 score_grid(unsigned((QB + kTiledQ - 1) / kTiledQ), unsigned((KB + kTiledK - 1) / kTiledK), unsigned(bh));
  if (Status s = launch_error(launch_pdl(true, score_tiled_kernel<true>, score_grid, dim3(kTiledThreads), 0, st, tsp),
                              "score_tiled (from sums)");
      s != Status::Ok)
    return s;
  return launch_topk(p, scores, block_map, lut, st);
}

}  // namespace td::kernels
