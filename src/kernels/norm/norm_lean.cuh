// NormRowsKernel::Lean / AdaLnRows::Lean: the row engine's layout (one row per
// warp at 1536 in 32-thread CTAs, 160 threads per row at 5120, one row per
// CTA) with far fewer instructions per element. Variant beside the default,
// chosen per call (TURBODIFF_NORM_KERNEL=lean, TURBODIFF_ADALN_ROWS=lean).
//
// Why (issue 3): the default kernel at 32760 x 1536 bf16 runs ~1150 warp
// instructions per row (~24 per element: its SASS has a 32-bit division for
// the valid-chunk count, 64-bit address arithmetic per chunk and parameter,
// per-chunk predicates and branches on every parameter pointer). Nsight
// showed issue slots 69% at 3.32 TB/s: the schedulers, not HBM, set the pace
// (4 schedulers x 0.69 / 1150 instructions per row ~ the measured 53 us).
// This kernel (~600 warp instructions per 1536-wide row with weight and
// bias, ~12.5 per element, counted from its SASS):
//   - takes the columns' layout as template arguments at Wan's widths
//     (1536 = 32 threads x 6 chunks, 5120 = 160 x 4, rows exactly covered):
//     every address is one base register plus an immediate offset, no
//     predicates; other widths take a generic instance with a per-chunk
//     compare (no division);
//   - keeps the row packed (24 registers at 1536) and unpacks it per pass
//     with one shift or mask per element (unpack_opaque says why opaque);
//   - branches once per row on which parameters exist (weight / bias /
//     scale / shift), not per chunk;
//   - LayerNorm rows wider than a warp (5120: 5 warps) take one CTA barrier
//     instead of two: each warp computes exact two-pass statistics of its
//     own elements with shuffles (sum, then squared deviations from the
//     warp's mean), and the warps' (sum, M2) pairs are merged after a single
//     barrier (Chan et al.: M2 = sum_w M2_w + n_w (mean_w - mean)^2). The
//     mean is the default's bit for bit; the variance differs from the
//     default's by fp32 rounding only (both are exact two-pass sums).
//   - reads x with plain 16-byte loads. (Loads with ld.global.L1::no_allocate,
//     meant to keep the parameter vectors in L1, measured on the H200 on
//     2026-11-30 with rms_norm at 5120 at 92.9% of copy against the default's
//     97.2%, LayerNorm 93.0% against 89.5%.)
// Same arithmetic, in the same order, as the row engine for rows of <= 32
// threads and for RMS norm: bit-identical there (tested); LayerNorm and
// adaln rows wider than a warp differ only in the variance merge.
//
// Prediction (H200, bench_norm, fraction of the copy bandwidth of the same
// run), from ~24 -> ~12.5 instructions per element (issue ~69% -> ~35%: the
// kernel becomes memory-bound with 32 resident warps x 3 KB = 96 KB of loads
// per SM available, Little's law needs ~30 KB) and one barrier per row at 5120:
//   layer_norm      84.7% -> 94% (1536),  89.2% -> 96% (5120)
//   adaln_modulate  83.2% -> 93% (1536),  85.6% -> 95% (5120)
//   rms_norm        88.6% -> 94% (1536),  97.3% -> 97-98% (5120)
// (Caveat at 1536: the copy reference moves twice the bytes of a norm, so
// fixed launch / ramp / tail costs weigh twice as much on the norm; the
// simplest 4-byte-per-element kernels measured 91-93% there.)
// Registers (ptxas, sm_90a, bf16 -> bf16): 64 at 1536 (32 warps per SM;
// stack 0 / 8 / 16 bytes for layer / rms / adaln), 48 at 5120 (40 warps per
// SM; stack 8 / 8 / 40 bytes).
//
// Measured (H200, 2026-11-30, fraction of copy, two bench_norm runs each):
//   with ld.global.L1::no_allocate loads of x (first build): 1536: layer_norm
//   85.6 / 86.0% (default 85.3 / 85.6%), adaln 84.4 / 84.3% (84.0 / 83.5%), rms
//   88.8 / 88.8% (89.2 / 89.5%); 5120: layer_norm 93.0 / 92.7%, adaln 82.1 /
//   82.0%, rms 92.9 / 92.6% (default 97.2 / 96.9%).
//   with plain loads (this version, adaln 5120 still under 48 registers):
//   1536: layer_norm 88.4 / 87.7% (default 84.2 / 86.3%), adaln 87.4 / 86.4%
//   (82.9 / 85.2%), rms 90.0 / 90.9% (89.1 / 90.1%); 5120: layer_norm 96.3 /
//   96.0% (89.4 / 89.6%), adaln 82.7 / 82.2% (86.1 / 83.8%), rms 96.6 / 96.0%
//   (97.5 / 97.3%). LeanFma: layer_norm 88.1 / 85.9% and 95.9 / 95.7%, adaln
//   87.2 / 85.2% and 84.8 / 84.2%.
//   with adaln at 5120 in 56 registers (16 bytes of stack instead of 40;
//   this version), third run: 5120: adaln 96.7 / 96.4% (default 86.2 /
//   85.8%), layer_norm 96.3 / 95.6% (89.7 / 89.5%), rms 96.8 / 96.1% (97.8 /
//   97.4%); 1536: layer_norm 86.9 / 87.6% (86.1 / 86.4%), adaln 86.1 / 86.6%
//   (85.1 / 84.6%), rms 89.9 / 90.5% (90.3 / 89.4%).
// So: the bar (>= 93%) is met at 5120 by layer_norm and adaln (and rms,
// 1% under the default); at 1536 Lean gains 0-4% but stays at 86-91% (the
// simplest 4-byte-per-element kernels measured 90-95% there in the same
// runs): not issue-bound there; the limit at 1536 is still open.
#pragma once

#include <type_traits>

#include "kernels/norm/norm_rows.cuh"

namespace td::kernels::gpu {

// Which op a lean kernel computes: which parameter vectors can be present.
enum class LeanOp { Rms, Layer, AdaLn };

// Parameter presence, one bit each, decided once per row.
enum : int { kLeanWeight = 1, kLeanBias = 2, kLeanScale = 4, kLeanShift = 8 };

// ChunkIO<T, 8>::unpack (the same values), through volatile instructions for
// bf16 so that the compiler cannot merge the unpacks of successive passes
// over a packed row into one set of fp32 registers (see norm_lean_kernel).
template <typename T>
__device__ __forceinline__ void unpack_opaque(const typename ChunkIO<T, 8>::Raw& r, float (&f)[8]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t lo, hi;
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(lo) : "r"(w[i]));
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(hi) : "r"(w[i]));
      f[2 * i] = __uint_as_float(lo);
      f[2 * i + 1] = __uint_as_float(hi);
    }
  } else {
    ChunkIO<T, 8>::unpack(r, f);
  }
}

// The normalised chunk `o` (already (x - mean) * rstd) of columns [c, c + 8)
// times the parameters present (kParams bits), in the row engine's order,
// stored to `dst`. mod_off: the row's offset into the per-sample rows.
// Each product and sum rounded on its own (no FMA contraction), as the row
// engine's separate per-parameter branches compile: the same bits. (One FFMA
// for o * w + b and o * (1 + scale) + shift, LeanFma, measured -0.1 to -1.8%
// of copy against this on the H200 on 2026-11-30 and was removed.)
template <int kParams, typename OutT>
__device__ __forceinline__ void lean_finish_chunk(float (&o)[8], const NormRowsArgs& a, int64_t mod_off, int c,
                                                  OutT* dst) {
  if constexpr ((kParams & kLeanWeight) != 0) {
    float p[8];
    load_params<8>(a.weight + c, p);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __fmul_rn(o[j], p[j]);
  }
  if constexpr ((kParams & kLeanBias) != 0) {
    float p[8];
    load_params<8>(a.bias + c, p);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __fadd_rn(o[j], p[j]);
  }
  if constexpr ((kParams & kLeanScale) != 0) {
    float p[8];
    load_params<8>(a.scale + mod_off + c, p);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __fmul_rn(o[j], __fadd_rn(1.f, p[j]));
  }
  if constexpr ((kParams & kLeanShift) != 0) {
    float p[8];
    load_params<8>(a.shift + mod_off + c, p);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __fadd_rn(o[j], p[j]);
  }
  ChunkIO<OutT, 8>::store(dst, ChunkIO<OutT, 8>::pack(o));
}

// Launch bounds: the full-row instances cap their registers at what keeps the
// SM full: 1536 (one-warp CTAs, at most 32 CTAs per SM): 64 registers for 32
// warps; 5120 (160-thread CTAs): 8 CTAs = 40 warps, as the row engine's 46
// registers give (ptxas: 48, 8 bytes of stack for layer / rms). adaln at
// 5120 spilled 40 bytes under 48 registers and measured 82-85% of copy
// against layer_norm's 96% (H200, 2026-11-30): 7 CTAs (56 registers) for it.
template <int kTPR>
constexpr int lean_max_threads() { return kTPR > 0 ? kTPR : kMaxRowThreads; }
template <int kTPR, LeanOp kOp>
constexpr int lean_min_blocks() { return kTPR == 32 ? 32 : kTPR == 160 ? (kOp == LeanOp::AdaLn ? 7 : 8) : 1; }

// One row of a lean kernel's thread: its packed chunks and statistics.
// Rows of `dim` elements as kVPT chunks of 8 per thread, chunk c of a row in
// thread c % tpr. kTPR > 0: the threads per row are known (blockDim.x ==
// kTPR) and, with kFull, every chunk slot holds a chunk (dim == kTPR * kVPT *
// 8). kTPR == 0: tpr = blockDim.x, chunk slots past the row are predicated.
template <LeanOp kOp, typename XT, int kVPT, int kTPR, bool kFull>
struct LeanRow {
  using XIO = ChunkIO<XT, 8>;
  typename XIO::Raw raw[kVPT];
  int64_t r = 0;        // the row (clamped to the last one past the end)
  bool live = false;    // whether it exists (else computed on, never stored)
  int64_t mod_off = 0;  // adaln: offset of its per-sample rows
  float mean = 0.f, rstd = 0.f;

  __device__ __forceinline__ static int tpr() { return kTPR > 0 ? kTPR : int(blockDim.x); }
  __device__ __forceinline__ static bool valid(const NormRowsArgs& a, int k) {
    return kFull || int(threadIdx.x) + k * tpr() < (a.dim >> 3);
  }
  // The row stays packed (24 registers at 1536 bf16) and is unpacked in each
  // pass: a shift or a mask per element. Unpacked once to fp32 (48
  // registers: what the compiler makes of three identical unpacks) it
  // spilled under the 64-register cap, so the statistics passes unpack
  // through opaque instructions (unpack_opaque). Invalid slots hold zeros
  // (adding them changes no sum).
  __device__ __forceinline__ void unpack(int k, float (&f)[8]) const { unpack_opaque<XT>(raw[k], f); }

  // Issues every load of row `row`: kVPT x 16 bytes (16-bit types) per thread.
  __device__ __forceinline__ void load(const NormRowsArgs& a, int64_t row) {
    live = row < a.rows;
    r = live ? row : a.rows - 1;
    const XT* xr = static_cast<const XT*>(a.x) + r * a.x_stride + int(threadIdx.x) * 8;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      if (valid(a, k)) {
        raw[k] = XIO::load(xr + k * tpr() * 8);
      } else {
#pragma unroll
        for (int i = 0; i < XIO::kWords; ++i) raw[k].w[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    // Per-sample modulation row (adaln): a 32-bit division at most, while the loads fly.
    if constexpr (kOp == LeanOp::AdaLn) {
      if (a.rows_per_batch < a.rows) {
        const int64_t b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
                              ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
                              : r / a.rows_per_batch;
        mod_off = b * a.mod_stride;
      }
    }
  }

  // This thread's part of the row sum (LayerNorm) or sum of squares (RMS).
  __device__ __forceinline__ float partial_sum(bool squares) const {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      float f[8];
      unpack(k, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (squares) s += f[j] * f[j];
        else s += f[j];
      }
    }
    return s;
  }
  // This thread's sum of squared deviations from m over its valid chunks.
  __device__ __forceinline__ float partial_m2(const NormRowsArgs& a, float m) const {
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      if (!valid(a, k)) continue;
      float f[8];
      unpack(k, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = f[j] - m;
        s2 += d * d;
      }
    }
    return s2;
  }

  // Rows of <= 32 threads: the row engine's statistics in its order exactly
  // (xor shuffles within the row's lanes). No barrier.
  __device__ __forceinline__ void stats_in_warp(const NormRowsArgs& a) {
    const int t = tpr();
    if constexpr (kOp == LeanOp::Rms) {
      float s2 = partial_sum(true);
      for (int offset = t >> 1; offset > 0; offset >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, offset);
      rstd = rsqrtf(s2 / float(a.dim) + a.eps);
    } else {
      float s = partial_sum(false);
      for (int offset = t >> 1; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      mean = s / float(a.dim);
      float s2 = partial_m2(a, mean);
      for (int offset = t >> 1; offset > 0; offset >>= 1) s2 += __shfl_xor_sync(0xffffffffu, s2, offset);
      rstd = rsqrtf(s2 / float(a.dim) + a.eps);
    }
  }

  // Elements of warp w of the row: 32 lanes x kVPT x 8 when full.
  __device__ __forceinline__ static int warp_count(const NormRowsArgs& a, int w) {
    if constexpr (kFull) return 32 * kVPT * 8;
    int n = 0;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) n += 8 * min(32, max(0, (a.dim >> 3) - k * tpr() - w * 32));
    return n;
  }

  // Rows of several warps (one row per block), one barrier. RMS: the row
  // engine's row_sum. LayerNorm: exact two-pass statistics per warp with
  // shuffles, then Chan's merge of the warps' (sum, M2): the mean is the row
  // engine's bit for bit, the variance equal up to fp32 rounding.
  __device__ __forceinline__ void stats_across_warps(const NormRowsArgs& a, float* partials) {
    if constexpr (kOp == LeanOp::Rms) {
      rstd = rsqrtf(row_sum(partial_sum(true), partials) / float(a.dim) + a.eps);
    } else {
      float s = partial_sum(false);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      const int lane = int(threadIdx.x), warp = lane >> 5, nwarps = tpr() >> 5;
      const int n_w = warp_count(a, warp);
      float m2 = partial_m2(a, n_w > 0 ? s / float(n_w) : 0.f);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) m2 += __shfl_xor_sync(0xffffffffu, m2, offset);
      if ((lane & 31) == 0) {
        partials[warp] = s;
        partials[32 + warp] = m2;
      }
      __syncthreads();
      float total = 0.f;
      for (int i = 0; i < nwarps; ++i) total += partials[i];
      mean = total / float(a.dim);
      float m2_row = 0.f;
      for (int i = 0; i < nwarps; ++i) {
        const int n_i = warp_count(a, i);
        const float dm = n_i > 0 ? partials[i] / float(n_i) - mean : 0.f;
        m2_row += partials[32 + i] + float(n_i) * dm * dm;
      }
      rstd = rsqrtf(m2_row / float(a.dim) + a.eps);
    }
  }

  // Normalises, applies the parameters present and stores the row (live rows only).
  template <typename OutT>
  __device__ __forceinline__ void write(const NormRowsArgs& a) const {
    if (!live) return;
    const int lane = int(threadIdx.x);
    OutT* out = static_cast<OutT*>(a.out) + r * a.out_stride + lane * 8;
    auto each_chunk = [&](auto params_tag) {
      constexpr int kParams = decltype(params_tag)::value;
#pragma unroll
      for (int k = 0; k < kVPT; ++k) {
        if (!valid(a, k)) continue;
        float o[8];
        XIO::unpack(raw[k], o);
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = (o[j] - mean) * rstd;
        lean_finish_chunk<kParams, OutT>(o, a, mod_off, lane * 8 + k * tpr() * 8, out + k * tpr() * 8);
      }
    };
    // One branch per row on the parameters present; each case its own unrolled loop.
    if constexpr (kOp == LeanOp::Rms) {
      if (a.weight) each_chunk(std::integral_constant<int, kLeanWeight>{});
      else each_chunk(std::integral_constant<int, 0>{});
    } else if constexpr (kOp == LeanOp::Layer) {
      if (a.weight && a.bias) each_chunk(std::integral_constant<int, kLeanWeight | kLeanBias>{});
      else if (a.weight) each_chunk(std::integral_constant<int, kLeanWeight>{});
      else if (a.bias) each_chunk(std::integral_constant<int, kLeanBias>{});
      else each_chunk(std::integral_constant<int, 0>{});
    } else {
      if (a.scale && a.shift) each_chunk(std::integral_constant<int, kLeanScale | kLeanShift>{});
      else if (a.scale) each_chunk(std::integral_constant<int, kLeanScale>{});
      else if (a.shift) each_chunk(std::integral_constant<int, kLeanShift>{});
      else each_chunk(std::integral_constant<int, 0>{});
    }
  }
};

// Block: tpr x rows-per-block threads as in the row engine (rows wider than a
// warp: one row per block). Vector path only (16-byte aligned rows/params).
// (Two rows per warp at 1536, both rows' loads first and their statistics as
// independent chains in 80 registers, measured worse on the H200 on
// 2026-11-30: 76.8-87.4% of copy against Lean's 84.4-88.8%; removed.)
template <LeanOp kOp, typename XT, typename OutT, int kVPT, int kTPR, bool kFull>
__global__ void __launch_bounds__(lean_max_threads<kTPR>(), (lean_min_blocks<kTPR, kOp>()))
    norm_lean_kernel(const NormRowsArgs a) {
  static_assert(kTPR > 0 || !kFull, "a full-row instance needs the threads per row");
  using Row = LeanRow<kOp, XT, kVPT, kTPR, kFull>;
  __shared__ float partials[2 * 32];
  Row row;
  row.load(a, int64_t(blockIdx.x) * blockDim.y + threadIdx.y);
  // Every thread reaches the shuffles and the barrier: rows past the end
  // (last block only) are computed on the last row and not stored.
  if (Row::tpr() <= 32) {
    row.stats_in_warp(a);
  } else {
    row.stats_across_warps(a, partials);
  }
  row.template write<OutT>(a);
}

// Launches the lean kernel for a plan of the vector path; any other plan
// (the scalar path: misaligned or dim % 8 != 0) runs the row engine's kernel.
// Wan's widths get full-row instances (1536: 32 x 6, 5120: 160 x 4).
template <LeanOp kOp, typename XT, typename OutT>
Status launch_norm_lean(const NormRowsArgs& a, const RowPlan& plan, cudaStream_t stream) {
  constexpr NormKind kKind = kOp == LeanOp::Rms ? NormKind::Rms : NormKind::Layer;
  if (a.rows == 0) return Status::Ok;
  if (plan.chunk != 8) return launch_norm_rows<kKind, false, XT, XT, OutT>(a, plan, stream);
  const int64_t blocks = (a.rows + plan.rpb - 1) / plan.rpb;
  if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
  const dim3 grid{unsigned(blocks)};
  const dim3 block{unsigned(plan.tpr), unsigned(plan.rpb)};
  const int64_t slots = int64_t(plan.tpr) * plan.vpt * 8;
  if (plan.tpr == 32 && plan.vpt == 6 && a.dim == slots) {
    norm_lean_kernel<kOp, XT, OutT, 6, 32, true><<<grid, block, 0, stream>>>(a);
  } else if (plan.tpr == 160 && plan.vpt == 4 && a.dim == slots) {
    norm_lean_kernel<kOp, XT, OutT, 4, 160, true><<<grid, block, 0, stream>>>(a);
  } else if (plan.vpt == 4) {
    norm_lean_kernel<kOp, XT, OutT, 4, 0, false><<<grid, block, 0, stream>>>(a);
  } else if (plan.vpt == 6) {
    norm_lean_kernel<kOp, XT, OutT, 6, 0, false><<<grid, block, 0, stream>>>(a);
  } else if (plan.vpt == 8) {
    norm_lean_kernel<kOp, XT, OutT, 8, 0, false><<<grid, block, 0, stream>>>(a);
  } else {
    return Status::InvalidArgument;  // a plan plan_rows never makes
  }
  return launch_status();
}

}  // namespace td::kernels::gpu
