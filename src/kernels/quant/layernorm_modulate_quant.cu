// CUDA fused LayerNorm (no affine) + AdaLN modulation + INT8 quantization.
//
// Row layout (both kernels): a row of dim = 8 * packs elements is spread over
// a team of `threads` (plan_row: 64 threads x 3 packs for 1536, 160 x 4 for
// 5120); pack p belongs to thread p % threads, slot p / threads, so the 16
// packs of a 128-column group sit in one aligned half-warp. A thread issues
// all its 16-byte loads first, then the statistics are two reductions over
// the row held in registers (mean, then the centered sum of squares: the
// exact two-pass variance, no E[x^2] - mean^2 cancellation), then
// y = fma((x - mean) * rstd, 1 + scale, shift) with the fp32 modulation rows
// read through L1 (shared by all rows of a sample).
//
// token128: one CTA per row; the group amax is 4 xor shuffles in the
// half-warp, codes go out as 8-byte stores, scales K-block-major. One pass:
// 2 bytes read + 1 written per element (+ 4 B per 128 of scale).
// Predicted (bytes / 4.0 TB/s), bf16:
//   32760 x 1536: 152.5 MB -> 38.1 us;  75600 x 5120: 1173.3 MB -> 293 us.
//
// block128: the scale of a 128x128 block needs the amax of y over 128 rows,
// and y needs each row's statistics, so no code can be written before the
// whole 128-row stripe has been seen. Three paths:
//
//  * cluster (sm_90+, LnQuantBlockPath::Cluster, explicit only): the stripe
//    resident in a thread-block cluster's shared memory, x read once
//    (layernorm_modulate_quant_cluster.cu). 3 bytes per element, as token128:
//      32760 x 1536: 151.0 MB -> 37.7 us;  75600 x 5120: 1161.2 MB -> 290 us.
//    Measured 102 / 930 us on the H200 (session 15): its per-stripe chain,
//    not the bytes, bounds it.
//  * row statistics (LnQuantBlockPath::RowStats, Auto's pick with a
//    workspace): layernorm_modulate_quant_rowstats.cu.
//  * portable (sm_80+): one CTA per 128-row stripe, split into teams (one
//    row each at a time, named barriers per team, up to 512 threads): pass 1
//    computes each row's statistics (kept in shared memory) and running
//    per-slot maxima of |y|, folded at the end into per-group maxima; pass 2
//    reads x again, recomputes y and writes the codes. The second read comes
//    from L2 only while the stripes of all concurrently running CTAs fit in
//    L2 (~50 MB on H100/H200): 128 x 1536 bf16 = 384 KB per CTA x 2-4 CTAs
//    per SM x 132 SMs = 100-200 MB does not, so at Wan's shapes expect most
//    of the second read from HBM: 2 reads + 1 write = 5 B/element:
//      32760 x 1536: 251.6 MB -> 62.9 us;  75600 x 5120: 1935 MB -> 484 us.
#include <cstdlib>
#include <cstring>

#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/layernorm_modulate_quant_cluster.h"
#include "kernels/quant/layernorm_modulate_quant_columns.h"
#include "kernels/quant/layernorm_modulate_quant_rowstats.h"
#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;

// Mean and rstd of a row held as V packs per thread by a team of `threads`
// (pack p = t + j * threads valid while p < packs).
template <typename T, int V>
__device__ __forceinline__ void row_stats(const Pack8<T> (&raw)[V], int t, int threads, int packs, int dim, float eps,
                                          float* red0, float* red1, int first_warp, int barrier, float& mean,
                                          float& rstd) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float f[8];
    unpack(raw[j], f);  // invalid packs are zeros
#pragma unroll
    for (int i = 0; i < 8; ++i) s += f[i];
  }
  mean = group_sum(s, red0, first_warp, threads, barrier) / float(dim);
  const float c = centered_square_sum<T, V>(raw, t, threads, packs, mean);
  const float var = group_sum(c, red1, first_warp, threads, barrier) / float(dim);
  rstd = __fdiv_rn(1.f, __fsqrt_rn(var + eps));
}

template <typename T, int V>
__global__ void __launch_bounds__(kMaxRowThreads) ln_mod_quant_token128_kernel(LnQuantArgs a) {
  __shared__ float red[2][kMaxRowThreads / 32];
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const int64_t r = blockIdx.x;
  const int packs = a.dim / 8;
  const T* xrow = static_cast<const T*>(a.x) + r * a.ld_x;

  Pack8<T> raw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    raw[j] = p < packs ? load_pack(xrow + p * 8) : zero_pack<T>();
  }
  float mean, rstd;
  row_stats<T, V>(raw, t, threads, packs, a.dim, a.eps, red[0], red[1], 0, 0, mean, rstd);

  const int64_t b = r / a.rows_per_batch;
  const float* shift = a.shift + b * a.ld_mod;
  const float* scale = a.scale + b * a.ld_mod;
  int8_t* qrow = a.q + r * a.ld_q;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    const bool valid = p < packs;
    float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (valid) modulate_pack(raw[j], mean, rstd, shift + p * 8, scale + p * 8, y);
    const float amax = group_max<16>(absmax8(y));  // every lane takes part
    const QuantParams qp = symmetric_params_dev(amax);
    if (valid) {
      store_codes(qrow + p * 8, quantize8(y, qp.inv), 8, true);
      if ((t & 15) == 0) a.scales[int64_t(p >> 4) * a.ld_scales + r] = qp.scale;
    }
  }
}


// LnQuantTokenRows::WarpRows (variant beside the kernels above): a row per
// warp, built like quant_token128's RowSlabs to cut instructions per element.
// The profile of the one-row kernel (H200, bf16 32760x1536: 80% of issue
// slots, ~34.6 thread instructions per element against ~26 that 4 TB/s
// allows at 100% issue for 3 bytes per element) charges it for two CTA-wide
// reductions with barriers per row, the 1 + scale and the two IEEE divisions
// of every 128-group in every lane of its half-warp (~25 instructions per 8
// elements), mask/shift/OR code packing, and 64-bit addresses per pack.
// Here a 128-thread CTA holds 4 independent rows (no barrier at all):
//  * lane l holds packs l + 32 s (s < S = VD * W, VD x 32W the default's
//    plan for this dim: 1536 -> 6 packs, 5120 -> 20, 4096 -> 16), each slot's
//    16-lane halves one aligned 128-column group; all loads issued first.
//  * Statistics in the default's exact order: slot s belongs to the
//    default's thread l + 32 (s % W), so W per-"thread" partials summed in
//    slot order, one xor-tree warp_sum each, then added in warp order as
//    group_sum does; the same centered second pass. mean and rstd are the
//    default's bits, hence y, amax, scales and codes too: bit-identical.
//  * Quantization parameters per chunk of C slots (C = S up to 6-8, 5 or 4
//    for the widest rows, so C x 8 fp32 y stay in registers): lane j of each
//    half-warp does slot j's division pair, one shuffle per slot brings the
//    inverse back, lane j stores slot j's scale (one pair per lane per chunk
//    instead of one per slot); codes packed by PRMT, 8-byte stores.
//  * Sample index by one 32-bit division per row; 32-bit pack offsets.
// Counted per bf16 element (1536, S = 6): unpack 1, sum 1, centered square 2
// (d = x - mean kept for y), y 3 (FMUL rstd, FADD 1 + scale, FFMA), |y| max 1,
// group max 1 (4 SHFL + 4 FMNMX per 8), product + cvt 2, PRMT 0.75,
// parameter LDG.128 0.5, x LDG / code STG 0.2, per row (2 x 2 warp_sums,
// the division pair, shuffles of inv, scale stores, addresses: ~130 per
// lane / 48) ~2.7: ~15 (5120, S = 20: the raw row stays packed in 80
// registers and is unpacked in each of the 3 passes: ~17), against ~34.6
// measured for the default. The sm_90a SASS (nvcc 13.0): 1536 bf16, 96
// registers, no spills, 1091 instructions for a lane's 48 elements, ~770 of
// them on the main path (the 3 IEEE-division slow-path subroutines aside):
// ~16 per element; 5120 bf16, 150 registers, no spills, 3278 for 160: ~19.5
// (the default: 1208 for 24, ~34.6 measured).
// Predicted: HBM-bound, 88-93% of copy at 32760x1536 and 85-92% at
// 75600x5120 (from 58.7% / 57.9%).
constexpr int kWarpRowsCta = 128;
constexpr int kWarpRowsPerCta = kWarpRowsCta / 32;
constexpr int kWarpRowsMaxWords = 20;  // uint4 of raw row per lane (80 registers): bf16 5120, fp32 2560

// Slots per chunk of quantization parameters: the largest divisor of S up to
// 8 (5 once the raw row takes 64+ registers), so y of a chunk fits beside it.
constexpr int warp_rows_chunk(int S, int words, int cap_limit = 8) {
  const int cap = 4 * words * S >= 64 ? 5 : cap_limit;
  for (int d = cap; d > 1; --d)
    if (S % d == 0) return d;
  return 1;
}

// kFull: the row fills all S slots of every lane (1536, 3072, 4096, 5120):
// no per-pack bounds tests, so no divergent branches and the compiler can
// keep one x - mean for the variance and y. kHold: the unpacked fp32 row
// (S x 8 floats) is kept instead of re-unpacking it in each of the 3 passes
// where it fits (<= 48 floats; fp32 inputs need no unpacking).

// The loads of row r (slot s: pack lane + 32 s; zeros past the row).
template <typename T, int S, bool kFull>
__device__ __forceinline__ void warp_row_load(const LnQuantArgs& a, int64_t r, Pack8<T> (&raw)[S]) {
  const int lane = int(threadIdx.x & 31u), packs = a.dim / 8;
  const T* xr = static_cast<const T*>(a.x) + r * a.ld_x;
#pragma unroll
  for (int s = 0; s < S; ++s)
    raw[s] = kFull || lane + 32 * s < packs ? load_pack(xr + (lane + 32 * s) * 8) : zero_pack<T>();
}

// Statistics, y, codes and scales of row r held in raw (kHold: see above;
// the lean kernel passes false, and takes chunks of <= 3 slots (1536: two
// division pairs per lane instead of one, 24 fp32 y instead of 48), to fit
// 72 registers).
template <typename T, int VD, int W, bool kFull, bool kHoldAllowed>
__device__ __forceinline__ void warp_row_finish(const LnQuantArgs& a, int64_t r, const Pack8<T> (&raw)[VD * W]) {
  constexpr int S = VD * W;
  constexpr int C = warp_rows_chunk(S, Pack8<T>::kWords, kHoldAllowed ? 8 : 3);
  constexpr bool kHold = kHoldAllowed && (sizeof(T) == 4 || S * 8 <= 48);
  const int lane = int(threadIdx.x & 31u), lane16 = lane & 15, half = lane & 16;
  const int packs = a.dim / 8;
  auto valid = [&](int s) { return kFull || lane + 32 * s < packs; };
  float held[kHold ? S : 1][8];
  if constexpr (kHold) {
#pragma unroll
    for (int s = 0; s < S; ++s) unpack(raw[s], held[s]);
  }
  auto elems = [&](int s, float (&f)[8]) {
    if constexpr (kHold) {
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = held[s][e];
    } else {
      // An empty asm per pass makes the words opaque, so the compiler cannot
      // keep one pass's unpacked floats for the next (at 5120 bf16 it did:
      // 255 registers, 2 CTAs per SM); each pass re-unpacks (1 instruction
      // per element) from the 80 registers of the raw row.
      Pack8<T> q = raw[s];
#pragma unroll
      for (int k = 0; k < Pack8<T>::kWords; ++k)
        asm volatile("" : "+r"(q.w[k].x), "+r"(q.w[k].y), "+r"(q.w[k].z), "+r"(q.w[k].w));
      unpack(q, f);
    }
  };
  // Mean: the default's thread l + 32w sums its packs (slots w, w + W, ...)
  // in order, each warp_sum'd, then added in warp order from 0.f.
  float part[W];
#pragma unroll
  for (int w = 0; w < W; ++w) part[w] = 0.f;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    float f[8];
    elems(s, f);  // invalid packs are zeros, added as the default adds them
#pragma unroll
    for (int e = 0; e < 8; ++e) part[s % W] += f[e];
  }
#pragma unroll
  for (int w = 0; w < W; ++w) part[w] = warp_sum(part[w]);
  float total = 0.f;
  if (W == 1) {
    total = part[0];  // group_sum returns the warp sum itself for one warp
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) total += part[w];
  }
  const float mean = total / float(a.dim);
  // Centered second pass, invalid packs skipped as in row_stats.
#pragma unroll
  for (int w = 0; w < W; ++w) part[w] = 0.f;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (valid(s)) {
      float f[8];
      elems(s, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float d = f[e] - mean;
        part[s % W] = fmaf(d, d, part[s % W]);
      }
    }
  }
#pragma unroll
  for (int w = 0; w < W; ++w) part[w] = warp_sum(part[w]);
  float c = 0.f;
  if (W == 1) {
    c = part[0];
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) c += part[w];
  }
  const float rstd = __fdiv_rn(1.f, __fsqrt_rn(c / float(a.dim) + a.eps));

  const int64_t b = lnq_sample_of(r, a.rows_per_batch);
  const float* shift = a.shift + b * a.ld_mod;
  const float* scale = a.scale + b * a.ld_mod;
  int8_t* qrow = a.q + r * a.ld_q;
#pragma unroll
  for (int c0 = 0; c0 < S; c0 += C) {
    float y[C][8], amax[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int p = lane + 32 * (c0 + j);
      float m = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) y[j][e] = 0.f;
      if (valid(c0 + j)) {
        // modulate_pack's expression on the same fp32 x.
        float f[8], sh[8], sc[8];
        elems(c0 + j, f);
        load_params8(shift + p * 8, sh);
        load_params8(scale + p * 8, sc);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          y[j][e] = fmaf((f[e] - mean) * rstd, 1.f + sc[e], sh[e]);
          m = fmaxf(m, fabsf(y[j][e]));
        }
      }
      amax[j] = group_max<16>(m);  // every lane takes part
    }
    float my_amax = amax[0];
#pragma unroll
    for (int j = 1; j < C; ++j)
      if (lane16 == j) my_amax = amax[j];
    const QuantParams qp = symmetric_params_dev(my_amax);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float inv = __shfl_sync(0xffffffffu, qp.inv, half | j);
      const int p = lane + 32 * (c0 + j);
      if (valid(c0 + j)) *reinterpret_cast<uint2*>(qrow + p * 8) = quantize8_prmt(y[j], inv);
    }
    if (lane16 < C) {
      const int pg = 32 * (c0 + lane16) + half;  // first pack of slot c0 + lane16's group in this half
      if (kFull || pg < packs) a.scales[int64_t(pg >> 4) * a.ld_scales + r] = qp.scale;
    }
  }
}

template <typename T, int VD, int W, bool kFull>
__global__ void __launch_bounds__(kWarpRowsCta) ln_mod_quant_token128_warp_rows_kernel(LnQuantArgs a) {
  const int64_t r = int64_t(blockIdx.x) * kWarpRowsPerCta + int(threadIdx.x >> 5);
  if (r >= a.rows) return;  // a whole warp; no CTA-wide barrier follows
  Pack8<T> raw[VD * W];
  warp_row_load<T, VD * W, kFull>(a, r, raw);
  warp_row_finish<T, VD, W, kFull, true>(a, r, raw);
}

// LnQuantTokenRows::WarpRowsLean: WarpRows for 16-bit rows of <= 6 words per
// lane that fill every slot (bf16 1536) traded for occupancy: the raw row
// re-unpacked in each pass instead of held as 48 floats and quantization
// parameters in chunks of 3 slots (two division pairs per lane), bounded to
// 7 CTAs per SM: 72 registers, no spills (8 CTAs = 64 registers spilled 20
// bytes), 28 warps per SM instead of WarpRows' 20 (96 registers), i.e. 40%
// more rows of loads in flight, for ~+2.6 instructions per element (~18.5),
// for the case that WarpRows is latency-bound (the removed WarpTeams kernel,
// 16 warps per SM, was: ~30% issue at 58.7% of copy).
// Bit-identical to One. Predicted at 32760x1536 bf16: 90-95% of copy.
template <typename T, int VD, int W>
__global__ void __launch_bounds__(kWarpRowsCta, 7) ln_mod_quant_token128_warp_rows_lean_kernel(LnQuantArgs a) {
  const int64_t r = int64_t(blockIdx.x) * kWarpRowsPerCta + int(threadIdx.x >> 5);
  if (r >= a.rows) return;  // a whole warp; no CTA-wide barrier follows
  Pack8<T> raw[VD * W];
  warp_row_load<T, VD * W, true>(a, r, raw);
  warp_row_finish<T, VD, W, true, false>(a, r, raw);
}

// Raw row words per lane up to which WarpRowsLean runs (bf16 / fp16 1536:
// 6; at 8+ words the bounded registers spill). A persistent variant with
// the next row in flight (WarpRowsPrefetch) measured 64.6-65.8% against
// lean's 67.4-67.6% on the H200 (2026-11-30) and was removed.
constexpr int kWarpRowsLeanMaxWords = 6;

// Launches the WarpRows kernel for the default's plan (VD packs x 32W
// threads) where its raw row fits kWarpRowsMaxWords per lane and W <= 5;
// Unsupported otherwise (the caller runs the one-row kernel).
template <typename T, int VD>
Status launch_token128_warp_rows(const LnQuantArgs& a, int W, bool lean, cudaStream_t s) {
  constexpr int kWords = Pack8<T>::kWords;
  const unsigned grid = unsigned((a.rows + kWarpRowsPerCta - 1) / kWarpRowsPerCta);
  auto go = [&](auto wtag) -> Status {
    constexpr int kW = decltype(wtag)::value;
    if constexpr (sizeof(T) == 2 && VD * kW * kWords <= kWarpRowsLeanMaxWords) {
      if (lean && a.dim == 256 * VD * kW) {
        ln_mod_quant_token128_warp_rows_lean_kernel<T, VD, kW><<<grid, kWarpRowsCta, 0, s>>>(a);
        return launch_status();
      }
    }
    if constexpr (VD * kW * kWords <= kWarpRowsMaxWords) {
      if (a.dim == 256 * VD * kW)
        ln_mod_quant_token128_warp_rows_kernel<T, VD, kW, true><<<grid, kWarpRowsCta, 0, s>>>(a);
      else
        ln_mod_quant_token128_warp_rows_kernel<T, VD, kW, false><<<grid, kWarpRowsCta, 0, s>>>(a);
      return launch_status();
    } else {
      return Status::Unsupported;
    }
  };
  switch (W) {
    case 1: return go(std::integral_constant<int, 1>{});
    case 2: return go(std::integral_constant<int, 2>{});
    case 3: return go(std::integral_constant<int, 3>{});
    case 4: return go(std::integral_constant<int, 4>{});
    case 5: return go(std::integral_constant<int, 5>{});
    default: return Status::Unsupported;
  }
}

// LnQuantTokenRows::PairRows (variant beside the kernels above; issue 3).
// Why the warp-per-row kernels stop at ~57-68% of copy: the H200 profile of
// WarpRowsLean (32760x1536 bf16, Nsight Compute, 2026-11-30) shows issue
// slots only 60% busy and DRAM 52%, but the L1/TEX pipe at 73% (the busiest
// unit) with "short scoreboard" (waiting on L1) the top stall: every row
// reads its sample's fp32 shift and scale, 8 bytes per column, through L1,
// four LDG.128 per 8-element pack against one for x, i.e. ~75% of the L1
// wavefronts are parameters. Changes here:
//  * A team (one warp at 1536, alone in a 32-thread CTA; 2-8 warps, one
//    team per CTA, for wider rows) owns TWO consecutive rows, each lane the
//    same columns of both: a pack's shift / scale are loaded once for the
//    two rows (and 1 + scale added once), halving the parameter wavefronts
//    (rows of two samples: the second row loads its own).
//  * Lane l of a 64-pack slot pair k holds packs 64k + 16(l/8) + (l%8) and
//    that + 8: both of one 128-column group, so a group is 8 lanes x 16
//    elements: the group max is 3 xor shuffles per 16 elements instead of 4
//    per 8. Each LDG.128 / STG.64 still covers whole 128-byte / 64-byte
//    segments (8 consecutive lanes read 8 consecutive packs).
//  * Per slot pair, lane (l%8) == i of each 8-lane group derives row i's
//    scale and inverse (one IEEE division pair per lane), two shuffles bring
//    the inverses back; lanes 0 and 1 store the two rows' scales.
//  * Statistics: the exact two-pass (centered) variance, the raw row kept
//    packed (16-bit inputs: S x 4 registers per row) and unpacked per pass;
//    a multi-warp team adds its warps' sums through shared memory in warp
//    order (one barrier per statistic and row pair).
// y, the parameters and the codes use the default's expressions
// (fmaf((x - mean) * rstd, 1 + scale, shift), amax/127 and 127/amax by IEEE
// divisions, cvt.rni.sat.s8 of the rounded product); only the order of the
// statistics' sums differs from One (not bit-identical: codes may move by
// +-1 near ties, within the tests' bars).
// Runs 16-bit rows with dim a multiple of 512 whose team has <= 8 warps
// (S = 6 packs per lane and row at 1536 (1 warp), 4 at 5120 (5 warps), 4 at
// 4096 (4 warps), 6 at 3072 (2 warps)); elsewhere the one-row kernel.
// Counted per bf16 element at 1536 (S = 6): unpack 3 (one per pass), sum 1,
// centered square 2, y 3, |y| max 1, group max 0.4, product + cvt + PRMT
// 2.75, parameters (4 LDG.128 + 8 FADD per pack, for two rows) 0.75, x / q
// accesses 0.25, divisions and inverse shuffles ~1, per-row statistics and
// addresses ~1.5: ~16.5 (issue ~55% at 93% of copy; not the limit). L1
// wavefronts per 256 elements of a row: 8 parameters + 4 x + 2 codes = 14
// against 22 (-36%): ~63% of L1 at 93% of copy.
// The parameters are read as 4-column runs (lane (q, j): columns 128q +
// 32r + 4j, r < 4, of each 512-column block): a float4 per lane, 8 lanes =
// one whole 128-byte line, where 8 consecutive columns per lane (two float4
// at a 32-byte stride, as in the kernels above) touch every sector twice
// (the lean profile: 43% "excessive" sectors); x as 8-byte and codes as
// 4-byte accesses (whole 64- / 32-byte segments).
// Predicted (H200, bf16): 85-93% of copy at 32760x1536 (from 67.9% lean),
// 82-92% at 75600x5120 (from 56.6%).
// Measured (H200, 2026-11-30, bench_quant_rope, two runs): 73.5-74.3% /
// 61.6-61.8% of copy (lean 67.4-67.6% / 57.2-57.8%, One 58.6-59.5%). sm_90a
// SASS / Nsight Compute at 1536: 128 registers, no spills, 16 warps per SM,
// ~19.3 instructions per element (One: 34.6), issue 59%, L1 48% (lean 73%),
// DRAM 58%, L2 74%: nothing saturated, short of the 90% bar; at 5120 (5-warp
// teams, 128 registers, 32 bytes of spill) ~21.7 per element.
// 1-warp teams: one per 32-thread CTA. Measured on the H200 (2026-11-30) at
// 32760x1536: 76.3% / 77.2% of copy (pairs / pairs_reload) against 74.3% /
// 74.6% with 4 teams per 128-thread CTA (a CTA lives ~10 us; single-warp
// CTAs free their slot as soon as their rows are done, a finer tail).
constexpr int kPairTeamsPerCta = 1;
constexpr int kPairMaxWarps = 8;

// 4 elements of a 16-bit type (8 bytes) as fp32, through an empty asm that
// makes the words opaque, so that the compiler cannot keep one pass's
// unpacked floats for the next (it would hold 2 rows x 16P floats: 168-202
// registers at P = 3-4); each pass re-unpacks (1 instruction per element)
// from the packed rows.
template <typename T>
__device__ __forceinline__ void unpack4_opaque(uint2 w, float (&f)[4]) {
  asm volatile("" : "+r"(w.x), "+r"(w.y));
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    f[0] = bf16_lo(w.x), f[1] = bf16_hi(w.x), f[2] = bf16_lo(w.y), f[3] = bf16_hi(w.y);
  } else {
    f[0] = f16_lo(w.x), f[1] = f16_hi(w.x), f[2] = f16_lo(w.y), f[3] = f16_hi(w.y);
  }
}

// Codes of 4 values with multiplier inv, packed little-endian (PRMT).
__device__ __forceinline__ uint32_t quantize4_prmt(const float (&f)[4], float inv) {
  uint32_t c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = uint32_t(cvt_rn_sat_s8(__fmul_rn(f[i], inv)));  // low byte = the code
  return __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
}

// kReload (LnQuantTokenRows::PairRowsReload): the packed rows are dropped
// after the statistics and each 512-column block is loaded again (from L1,
// where the pair's 2 x 3 KB (1536) were just read, else L2) when its y is
// computed: the H200 profile of PairRows (1536: 128 registers, 16 warps per
// SM, issue 59%, L1 48%, no unit saturated) is latency-bound, and without
// the rows' 48 registers held through the y pass the kernel fits 85
// registers: 24 warps per SM, for 4 more L1 wavefronts per 256 elements
// (18 instead of 14; lean: ~38). Predicted 82-90% / 70-80% of copy.
// Measured (H200, 2026-11-30): 74.6% at 32760x1536 (80 registers, 24 bytes
// of spill, 21.4 warps per SM achieved, issue 60%, L1 63%, L2 75%, DRAM 58%:
// the extra warps did not help, so the pair kernel is not occupancy-bound),
// 65.2% at 75600x5120 (PairRows 61.6%): the best of the variants at both
// shapes, still short of issue 3's 90%.
template <typename T, int P, bool kMulti, bool kReload>
__global__ void __launch_bounds__(kMulti ? kPairMaxWarps * 32 : kPairTeamsPerCta * 32,
                                  kReload ? (kMulti ? 3 : 24 / kPairTeamsPerCta) : (kMulti ? 2 : 16 / kPairTeamsPerCta))
    ln_mod_quant_token128_pair_kernel(LnQuantArgs a, int team_warps) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  __shared__ float red[2][2][kPairMaxWarps];  // [statistic][row][warp]
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  const int tw = kMulti ? team_warps : 1;
  const int wt = kMulti ? warp : 0;  // warp within the team
  const int64_t r0 = kMulti ? 2 * int64_t(blockIdx.x) : 2 * (int64_t(blockIdx.x) * kPairTeamsPerCta + warp);
  if (r0 >= a.rows) return;  // a whole team (kMulti: never, the grid is ceil(rows / 2))
  const bool row1 = r0 + 1 < a.rows;
  // Lane (q, j) = (lane / 8, lane % 8) holds, of each 512-column block k of
  // its warp, the 4-column runs r = 0..3 at 128q + 32r + 4j: group 4k + q.
  const int q8 = lane >> 3, li = lane & 7;
  const int cw = wt * 512 * P;                // the warp's first column
  const int col = cw + 128 * q8 + 4 * li;     // this lane's first column
  const T* x0 = static_cast<const T*>(a.x) + r0 * a.ld_x + col;
  const T* x1 = row1 ? x0 + a.ld_x : x0;  // a missing second row reloads the first (nothing is stored)

  uint2 raw[2][P][4];
#pragma unroll
  for (int k = 0; k < P; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      raw[0][k][r] = *reinterpret_cast<const uint2*>(x0 + 512 * k + 32 * r);
      raw[1][k][r] = *reinterpret_cast<const uint2*>(x1 + 512 * k + 32 * r);
    }

  // The team's sums of v0 (row r0) and v1 (row r0 + 1): warp shuffles, then
  // (kMulti) the warps' partials through red[stat] (one barrier).
  auto team_sum2 = [&](int stat, float& v0, float& v1) {
    v0 = warp_sum(v0);
    v1 = warp_sum(v1);
    if constexpr (kMulti) {
      if (lane == 0) red[stat][0][warp] = v0, red[stat][1][warp] = v1;
      __syncthreads();
      v0 = 0.f, v1 = 0.f;
      for (int w = 0; w < tw; ++w) v0 += red[stat][0][w], v1 += red[stat][1][w];
    }
  };
  // fn(x of row r0, x of row r0 + 1) for every element this lane holds, in
  // the same order in each pass (the held rows unpacked again per pass).
  auto each_pair = [&](auto&& fn) {
#pragma unroll
    for (int k = 0; k < P; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float f[4], g[4];
        unpack4_opaque<T>(raw[0][k][r], f);
        unpack4_opaque<T>(raw[1][k][r], g);
#pragma unroll
        for (int e = 0; e < 4; ++e) fn(f[e], g[e]);
      }
  };
  // Statistics of both rows, interleaved (independent shuffle chains).
  float m0, m1;
  {
    float s0 = 0.f, s1 = 0.f;
    each_pair([&](float x0v, float x1v) { s0 += x0v, s1 += x1v; });
    team_sum2(0, s0, s1);
    m0 = s0 / float(a.dim);
    m1 = s1 / float(a.dim);
  }
  float rstd0, rstd1;
  {
    float c0 = 0.f, c1 = 0.f;
    each_pair([&](float x0v, float x1v) {
      const float d0 = x0v - m0, d1 = x1v - m1;
      c0 = fmaf(d0, d0, c0);
      c1 = fmaf(d1, d1, c1);
    });
    team_sum2(1, c0, c1);
    rstd0 = __fdiv_rn(1.f, __fsqrt_rn(c0 / float(a.dim) + a.eps));
    rstd1 = __fdiv_rn(1.f, __fsqrt_rn(c1 / float(a.dim) + a.eps));
  }

  // Samples: one division per row pair; the second row is in the next
  // sample only where the first is its sample's last.
  const int64_t b0 = lnq_sample_of(r0, a.rows_per_batch);
  const int64_t b1 = row1 && r0 + 1 - b0 * a.rows_per_batch == a.rows_per_batch ? b0 + 1 : b0;
  const float* sh0 = a.shift + b0 * a.ld_mod + col;
  const float* sc0 = a.scale + b0 * a.ld_mod + col;
  int8_t* q0 = a.q + r0 * a.ld_q + col;
  int8_t* q1 = q0 + a.ld_q;
  // Rows of one sample share each parameter load; a pair across a sample
  // boundary (rare) runs a second copy of the loop that loads per row, so
  // that neither copy holds two rows' parameters at once.
  auto finish = [&](auto same_tag) {
    constexpr bool kSame = decltype(same_tag)::value;
    const float* sh1 = kSame ? sh0 : a.shift + b1 * a.ld_mod + col;
    const float* sc1 = kSame ? sc0 : a.scale + b1 * a.ld_mod + col;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      // Keeps block k + 1's parameter loads and y below block k's stores:
      // interleaved, two blocks' y and parameters would be live at once.
      asm volatile("" ::: "memory");
      uint2 xk[2][4];  // block k of both rows
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (kReload) {
          xk[0][r] = *reinterpret_cast<const uint2*>(x0 + 512 * k + 32 * r);
          xk[1][r] = *reinterpret_cast<const uint2*>(x1 + 512 * k + 32 * r);
        } else {
          xk[0][r] = raw[0][k][r], xk[1][r] = raw[1][k][r];
        }
      }
      float y[2][4][4];
      float amax0 = 0.f, amax1 = 0.f;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int off = 512 * k + 32 * r;
        float4 sc = __ldg(reinterpret_cast<const float4*>(sc0 + off));
        float4 sh = __ldg(reinterpret_cast<const float4*>(sh0 + off));
        float f[4];
        unpack4_opaque<T>(xk[0][r], f);
        {
          const float a4[4] = {1.f + sc.x, 1.f + sc.y, 1.f + sc.z, 1.f + sc.w}, b4[4] = {sh.x, sh.y, sh.z, sh.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            y[0][r][e] = fmaf((f[e] - m0) * rstd0, a4[e], b4[e]);
            amax0 = fmaxf(amax0, fabsf(y[0][r][e]));
          }
          if constexpr (kSame) {
            unpack4_opaque<T>(xk[1][r], f);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              y[1][r][e] = fmaf((f[e] - m1) * rstd1, a4[e], b4[e]);
              amax1 = fmaxf(amax1, fabsf(y[1][r][e]));
            }
          }
        }
        if constexpr (!kSame) {
          sc = __ldg(reinterpret_cast<const float4*>(sc1 + off));
          sh = __ldg(reinterpret_cast<const float4*>(sh1 + off));
          const float a4[4] = {1.f + sc.x, 1.f + sc.y, 1.f + sc.z, 1.f + sc.w}, b4[4] = {sh.x, sh.y, sh.z, sh.w};
          unpack4_opaque<T>(xk[1][r], f);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            y[1][r][e] = fmaf((f[e] - m1) * rstd1, a4[e], b4[e]);
            amax1 = fmaxf(amax1, fabsf(y[1][r][e]));
          }
        }
      }
      amax0 = group_max<8>(amax0);  // every lane takes part
      amax1 = group_max<8>(amax1);
      const QuantParams qp = symmetric_params_dev(li == 0 ? amax0 : amax1);
      const float inv0 = __shfl_sync(0xffffffffu, qp.inv, lane & ~7);
      const float inv1 = __shfl_sync(0xffffffffu, qp.inv, (lane & ~7) | 1);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int off = 512 * k + 32 * r;
        *reinterpret_cast<uint32_t*>(q0 + off) = quantize4_prmt(y[0][r], inv0);
        if (row1) *reinterpret_cast<uint32_t*>(q1 + off) = quantize4_prmt(y[1][r], inv1);
      }
      if (li == 0 || (li == 1 && row1)) {
        const int g = (cw + 512 * k) / 128 + q8;
        a.scales[int64_t(g) * a.ld_scales + r0 + li] = qp.scale;
      }
    }
  };
  if (b0 == b1)  // uniform over the team
    finish(std::true_type{});
  else
    finish(std::false_type{});
}

// Launches the PairRows kernel where it applies (16-bit x, dim a multiple
// of 512, a team of <= 8 warps with S in {6, 4, 8, 2} packs per lane and
// row, preferred in that order: enough loads per lane, few warps per team);
// Unsupported otherwise (the caller runs the one-row kernel).
template <typename T>
Status launch_token128_pairs(const LnQuantArgs& a, bool reload, cudaStream_t s) {
  if constexpr (sizeof(T) != 2) {
    return Status::Unsupported;
  } else {
    if (a.dim % 512 != 0) return Status::Unsupported;
    const int pairs = a.dim / 512;  // 512-column blocks per row
    int P = 0, tw = 0;
    for (int blocks : {3, 2, 4, 1}) {
      if (pairs % blocks == 0 && pairs / blocks <= kPairMaxWarps) {
        P = blocks, tw = pairs / blocks;
        break;
      }
    }
    if (P == 0) return Status::Unsupported;
    auto go = [&](auto ptag) -> Status {
      constexpr int kP = decltype(ptag)::value;
      const int64_t rows_per_cta = 2 * kPairTeamsPerCta;
      const unsigned grid1 = unsigned((a.rows + rows_per_cta - 1) / rows_per_cta), grid2 = unsigned((a.rows + 1) / 2);
      if (tw == 1 && reload)
        ln_mod_quant_token128_pair_kernel<T, kP, false, true><<<grid1, kPairTeamsPerCta * 32, 0, s>>>(a, 1);
      else if (tw == 1)
        ln_mod_quant_token128_pair_kernel<T, kP, false, false><<<grid1, kPairTeamsPerCta * 32, 0, s>>>(a, 1);
      else if (reload)
        ln_mod_quant_token128_pair_kernel<T, kP, true, true><<<grid2, unsigned(tw * 32), 0, s>>>(a, tw);
      else
        ln_mod_quant_token128_pair_kernel<T, kP, true, false><<<grid2, unsigned(tw * 32), 0, s>>>(a, tw);
      return launch_status();
    };
    switch (P) {
      case 1: return go(std::integral_constant<int, 1>{});
      case 2: return go(std::integral_constant<int, 2>{});
      case 3: return go(std::integral_constant<int, 3>{});
      default: return go(std::integral_constant<int, 4>{});
    }
  }
}

// The token128 kernel that LnQuantTokenRows::Auto means:
// TURBODIFF_LNQ_TOKEN_ROWS=1|warps|warps_lean|pairs|pairs_reload|columns
// (read per call, for A/B in benchmarks), else Columns
// (layernorm_modulate_quant_columns.cu) where it takes the rows, then
// PairRowsReload, WarpRowsLean up to dim 2048 and the one-row kernel above
// (measured, below). The Two / Four rows-per-CTA
// kernels (45-53% of copy), the persistent WarpTeams kernel (47.8-58.7%)
// and WarpRowsPrefetch (64.6-65.8%), all slower than WarpRowsLean / One on
// the H200 (2026-11-30), were removed.
constexpr int kOneRow = 1;
constexpr int kWarpRows = -2;
constexpr int kWarpRowsLean = -4;  // WarpRowsLean (TURBODIFF_LNQ_TOKEN_ROWS=warps_lean)
constexpr int kPairRows = -5;      // PairRows (TURBODIFF_LNQ_TOKEN_ROWS=pairs)
constexpr int kPairRowsReload = -6;  // PairRowsReload (TURBODIFF_LNQ_TOKEN_ROWS=pairs_reload)
constexpr int kColumns = -7;         // Columns (TURBODIFF_LNQ_TOKEN_ROWS=columns)
int resolve_token_rows(LnQuantTokenRows v, int64_t dim) {
  switch (v) {
    case LnQuantTokenRows::One: return kOneRow;
    case LnQuantTokenRows::WarpRows: return kWarpRows;
    case LnQuantTokenRows::WarpRowsLean: return kWarpRowsLean;
    case LnQuantTokenRows::PairRows: return kPairRows;
    case LnQuantTokenRows::PairRowsReload: return kPairRowsReload;
    case LnQuantTokenRows::Columns: return kColumns;
    case LnQuantTokenRows::Auto: break;
  }
  if (const char* e = std::getenv("TURBODIFF_LNQ_TOKEN_ROWS")) {
    if (std::strcmp(e, "warps") == 0) return kWarpRows;
    if (std::strcmp(e, "warps_lean") == 0) return kWarpRowsLean;
    if (std::strcmp(e, "pairs") == 0) return kPairRows;
    if (std::strcmp(e, "pairs_reload") == 0) return kPairRowsReload;
    if (std::strcmp(e, "columns") == 0) return kColumns;
    if (std::strcmp(e, "1") == 0) return kOneRow;
  }
  // Measured on the H200 (2026-11-30, bench_quant_rope, fraction of a
  // same-traffic copy at 32760x1536 / 75600x5120, session 8): Columns
  // 94.9-98.5% / 85.8-87.1%, PairRowsReload 81.6-84.6% / 65.9-67.1%
  // (session 5, of the older copy reference: PairRowsReload 77.2% / 65.3%,
  // PairRows 76.3% / 61.4%, WarpRowsLean 67.6% / 57.8%, the one-row kernel
  // 59.3% / 59.7%). Rows Columns does not take go to PairRowsReload, and
  // rows that one does not take (fp32 x, dim % 512 != 0) to
  // auto_fallback_token_rows.
  return kColumns;
}
// Where Auto's pair kernel does not take the rows: WarpRowsLean up to dim
// 2048 (bit-identical to One), One above.
int auto_fallback_token_rows(int64_t dim) { return dim <= 2048 ? kWarpRowsLean : kOneRow; }

constexpr int kBlockCtaThreads = 512;
constexpr int kMaxTeams = 15;  // named barriers 1..15
constexpr int kMaxGroups = kMaxRowDim / kQuantGroup;

template <typename T, int V>
__global__ void __launch_bounds__(kBlockCtaThreads) ln_mod_quant_block128_kernel(LnQuantArgs a, int threads, int teams) {
  __shared__ float row_mean[kQuantGroup], row_rstd[kQuantGroup];
  __shared__ uint32_t group_amax[kMaxGroups];  // float bits of non-negative maxima
  __shared__ float group_inv[kMaxGroups];
  __shared__ float red[kMaxTeams][2][kMaxRowThreads / 32];
  const int team = int(threadIdx.x) / threads, t = int(threadIdx.x) % threads;
  const int first_warp = team * threads / 32;
  const int barrier = teams == 1 ? 0 : team + 1;
  const int packs = a.dim / 8, groups = (a.dim + kQuantGroup - 1) / kQuantGroup;
  const int64_t r0 = int64_t(blockIdx.x) * kQuantGroup;
  const int nrows = int(a.rows - r0 < kQuantGroup ? a.rows - r0 : kQuantGroup);
  const T* x = static_cast<const T*>(a.x);

  for (int g = int(threadIdx.x); g < groups; g += int(blockDim.x)) group_amax[g] = 0u;
  __syncthreads();

  // Pass 1: statistics and the |y| maxima of this thread's slots over its rows.
  float slot_amax[V];
#pragma unroll
  for (int j = 0; j < V; ++j) slot_amax[j] = 0.f;
  for (int i = team; i < nrows; i += teams) {
    const int64_t r = r0 + i;
    Pack8<T> raw[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int p = t + j * threads;
      raw[j] = p < packs ? load_pack(x + r * a.ld_x + p * 8) : zero_pack<T>();
    }
    float mean, rstd;
    row_stats<T, V>(raw, t, threads, packs, a.dim, a.eps, red[team][0], red[team][1], first_warp, barrier, mean,
                    rstd);
    if (t == 0) row_mean[i] = mean, row_rstd[i] = rstd;
    const int64_t b = r / a.rows_per_batch;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int p = t + j * threads;
      if (p < packs) {
        float y[8];
        modulate_pack(raw[j], mean, rstd, a.shift + b * a.ld_mod + p * 8, a.scale + b * a.ld_mod + p * 8, y);
        slot_amax[j] = fmaxf(slot_amax[j], absmax8(y));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = t + j * threads;
    const float m = group_max<16>(slot_amax[j]);
    if (p < packs && (t & 15) == 0) atomicMax(&group_amax[p >> 4], __float_as_uint(m));
  }
  __syncthreads();
  for (int g = int(threadIdx.x); g < groups; g += int(blockDim.x)) {
    const QuantParams qp = block128_params_dev(__uint_as_float(group_amax[g]));
    group_inv[g] = qp.inv;
    a.scales[int64_t(blockIdx.x) * groups + g] = qp.scale;
  }
  __syncthreads();

  // Pass 2: x again (L2 while the concurrent stripes fit), codes out.
  for (int i = team; i < nrows; i += teams) {
    const int64_t r = r0 + i;
    Pack8<T> raw[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int p = t + j * threads;
      raw[j] = p < packs ? load_pack(x + r * a.ld_x + p * 8) : zero_pack<T>();
    }
    const float mean = row_mean[i], rstd = row_rstd[i];
    const int64_t b = r / a.rows_per_batch;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int p = t + j * threads;
      if (p < packs) {
        float y[8];
        modulate_pack(raw[j], mean, rstd, a.shift + b * a.ld_mod + p * 8, a.scale + b * a.ld_mod + p * 8, y);
        store_codes(a.q + r * a.ld_q + p * 8, quantize8(y, group_inv[p >> 4]), 8, true);
      }
    }
  }
}

// Shape, stride and alignment checks shared by both entry points.
Status check_ln_args(const LnQuantArgs& a, ElemType x_type) {
  if (a.rows < 0 || a.dim < 0 || a.rows_per_batch < 1 || !(a.eps >= 0.f)) return Status::InvalidArgument;
  if (x_type != ElemType::F32 && x_type != ElemType::F16 && x_type != ElemType::BF16) return Status::InvalidArgument;
  if (a.dim % 8 != 0 || a.dim > kMaxRowDim) return Status::InvalidArgument;
  if (!a.x || !a.shift || !a.scale || !a.q || !a.scales) return Status::InvalidArgument;
  if (a.ld_x < a.dim || a.ld_q < a.dim || a.ld_mod < a.dim) return Status::InvalidArgument;
  if (a.ld_x % 8 != 0 || a.ld_q % 8 != 0 || a.ld_mod % 8 != 0) return Status::InvalidArgument;
  if (!aligned_to(a.x, 16) || !aligned_to(a.shift, 16) || !aligned_to(a.scale, 16) || !aligned_to(a.q, 8))
    return Status::InvalidArgument;
  return Status::Ok;
}

}  // namespace

size_t layernorm_modulate_quant_block128_workspace_bytes(int64_t rows) {
  return ln_mod_quant_block128_rowstats_workspace_bytes(rows);
}

Status layernorm_modulate_quant_token128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                              int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                              int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                              int64_t ld_q, float* scales, int64_t ld_scales, void* stream,
                                              LnQuantTokenRows rows_per_cta) {
  if (rows == 0 || dim == 0) return rows < 0 || dim < 0 ? Status::InvalidArgument : Status::Ok;
  if (dim > kMaxRowDim || dim < 0) return Status::InvalidArgument;
  const LnQuantArgs a{x, rows, int(dim), ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps, q, ld_q, scales, ld_scales};
  if (const Status st = check_ln_args(a, x_type); st != Status::Ok) return st;
  if (ld_scales < rows || rows > 0x7fffffff) return Status::InvalidArgument;
  const RowPlan plan = plan_row(dim / 8);
  if (plan.threads == 0) return Status::InvalidArgument;
  int R = resolve_token_rows(rows_per_cta, dim);
  auto s = static_cast<cudaStream_t>(stream);
  if (R == kColumns) {
    const Status st = ln_mod_quant_token128_columns_cuda(x_type, a, stream);
    if (st != Status::Unsupported) return st;
    // Rows it does not take (fp32, dim % 256 != 0, dim > 5120): Auto goes on
    // to the pair kernel (and its fallback), an explicit Columns to One.
    const bool from_auto = rows_per_cta == LnQuantTokenRows::Auto && std::getenv("TURBODIFF_LNQ_TOKEN_ROWS") == nullptr;
    R = from_auto ? kPairRowsReload : kOneRow;
  }
  if (R == kPairRows || R == kPairRowsReload) {
    const Status st = dispatch_act_type(x_type, [&](auto tag) {
      return launch_token128_pairs<typename decltype(tag)::type>(a, R == kPairRowsReload, s);
    });
    if (st != Status::Unsupported) return st;
    // fp32 rows, dims not a multiple of 512, teams of > 8 warps: an explicit
    // PairRows(Reload) runs the one-row kernel below, Auto its fallback.
    const bool from_auto = rows_per_cta == LnQuantTokenRows::Auto && std::getenv("TURBODIFF_LNQ_TOKEN_ROWS") == nullptr;
    R = from_auto ? auto_fallback_token_rows(dim) : kOneRow;
  }
  if (R == kWarpRows || R == kWarpRowsLean) {
    // The default's plan fixes the statistics' order (bit-identity); rows
    // whose plan has more than 5 warps or whose raw row would not fit the
    // registers (kWarpRowsMaxWords) run the one-row kernel below.
    const Status st = dispatch_act_type(x_type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      return dispatch_packs(plan.packs_per_thread, [&](auto v) {
        return launch_token128_warp_rows<T, decltype(v)::value>(a, plan.threads / 32, R == kWarpRowsLean, s);
      });
    });
    if (st != Status::Unsupported) return st;
  }
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_packs(plan.packs_per_thread, [&](auto v) {
      constexpr int V = decltype(v)::value;
      ln_mod_quant_token128_kernel<T, V><<<unsigned(rows), unsigned(plan.threads), 0, s>>>(a);
      return launch_status();
    });
  });
}

Status layernorm_modulate_quant_block128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                              int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                              int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                              int64_t ld_q, float* scales, LnQuantBlockPath path, void* stream,
                                              void* workspace, size_t workspace_bytes) {
  if (rows == 0 || dim == 0) return rows < 0 || dim < 0 ? Status::InvalidArgument : Status::Ok;
  if (dim > kMaxRowDim || dim < 0) return Status::InvalidArgument;
  const LnQuantArgs a{x, rows, int(dim), ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps, q, ld_q, scales, 0};
  if (const Status st = check_ln_args(a, x_type); st != Status::Ok) return st;
  const int64_t row_blocks = quant_groups(rows);
  if (row_blocks > 0x7fffffff) return Status::InvalidArgument;
  const RowPlan plan = plan_row(dim / 8);
  if (plan.threads == 0) return Status::InvalidArgument;
  auto s = static_cast<cudaStream_t>(stream);
  // Cluster (sm_90+, x read once) only when asked for: measured slower than
  // RowStats on the H200 (layernorm_modulate_quant.h).
  if (path == LnQuantBlockPath::Cluster) return ln_mod_quant_block128_cluster_cuda(x_type, a, stream);
  if (path == LnQuantBlockPath::RowStats ||
      (path == LnQuantBlockPath::Auto && workspace && dim <= kLnRowStatsMaxDim &&
       workspace_bytes >= ln_mod_quant_block128_rowstats_workspace_bytes(rows))) {
    const Status st = ln_mod_quant_block128_rowstats_cuda(x_type, a, workspace, workspace_bytes, stream);
    if (st != Status::Unsupported || path == LnQuantBlockPath::RowStats) return st;
  }
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_packs(plan.packs_per_thread, [&](auto v) {
      constexpr int V = decltype(v)::value;
      // Auto without a workspace (or RowStats refusing) takes the portable path.
      int teams = kBlockCtaThreads / plan.threads;
      teams = teams < 1 ? 1 : (teams > kMaxTeams ? kMaxTeams : teams);
      ln_mod_quant_block128_kernel<T, V>
          <<<unsigned(row_blocks), unsigned(teams * plan.threads), 0, s>>>(a, plan.threads, teams);
      return launch_status();
    });
  });
}

}  // namespace td::kernels
