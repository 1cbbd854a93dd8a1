// LnQuantBlockPath::Cluster: the block128 fused LayerNorm + AdaLN modulation
// + INT8 quantization with x read once, each 128-row stripe resident in the
// shared memory of a thread-block cluster (sm_90+).
//
// Why: a 128x128 block's scale is the amax of y over 128 rows and y needs
// each row's statistics, so a stripe must be seen whole before any of its
// codes is written. RowStats reads x twice (5 bytes per element against 3:
// 56% of a same-traffic copy on the H200). The earlier cluster kernel kept
// the stripe on chip but ran at ~32%: teams of threads walked their rows one
// by one (a load into registers, two CTA-wide reductions with barriers, the
// modulation) so every row was a latency-bound chain, and loads never
// overlapped compute. This kernel keeps the idea and changes the execution:
//
//  * A cluster of C CTAs owns a stripe; CTA rank r owns R = 128 / C rows x
//    the whole row (R = 16, C = 8 where 16 rows fit twice per SM; else R = 8,
//    C = 16, a non-portable cluster size). Wan's shapes: 1536 bf16 -> 16 rows
//    = 2 x 48 KB per CTA, 192 threads, 2 CTAs per SM; 5120 bf16 -> 8 rows =
//    2 x 80 KB, 320 threads, 1 CTA per SM.
//  * Persistent clusters (as many as are resident at once) walk the
//    stripes with two stripe buffers: every thread issues cp.async (16 B,
//    L2-only) copies of all its packs of the next stripe's R rows, one
//    commit group per chunk of rows, before computing this stripe, so a
//    whole stripe share is always in flight, and chunk k is computed while
//    chunks > k still land. A thread
//    copies exactly the packs it later reads, so no barrier guards the data
//    (cp.async.wait_group orders the thread's own copies).
//  * Threads own columns, as the token128 Columns kernel does (95-98% of
//    copy at 32760x1536): thread t owns packs (8 columns, 16 bytes of bf16)
//    t + j * threads, j < V, of every row of the CTA (V = 1 up to 2048
//    columns, 2 up to 5120, 4 beyond: <= 512 threads). Rows are
//    handled in chunks of RC = 8 / V rows held as fp32 in registers (64
//    values per thread): each thread's partial sums of the chunk's rows are
//    reduced by a transposed butterfly (R - 1 + log2(32 / R) shuffles for R
//    rows instead of 5 per row), the warps' partials meet in shared memory
//    behind one barrier per statistic and chunk, and every warp adds them in
//    the same fixed order (identical results everywhere, no second barrier).
//    Exact two-pass statistics as the reference: the mean, then the centred
//    sum of squares from the registers; rstd = 1 / sqrt(var + eps) with IEEE
//    operations (as RowStats; one per lane per chunk, not per element).
//  * y = fma(fma(x, rstd, -mean * rstd), 1 + scale, shift) with the fp32
//    shift / scale of a thread's columns loaded once per chunk (RC rows)
//    when the CTA's rows lie in one sample, per row otherwise; the thread's
//    |y| maxima per pack slot accumulate over all its rows, then 4 xor
//    shuffles over the 16 lanes of a 128-column group (a group is 16
//    consecutive threads of one slot: threads is a multiple of 32).
//  * Cluster exchange: lane l < C of each group's half-warp writes the
//    group's maximum into CTA l's array [rank][group] through distributed
//    shared memory (st.shared::cluster), then one cluster barrier
//    (arrive.release / wait.acquire); each CTA reads its own C x groups
//    array. A relaxed arrive at entry, waited on just before those remote
//    stores (when the loads and statistics are long done), guarantees that
//    every peer has started (DSMEM rule) at no cost; no remote access
//    follows the exchange barrier, so a CTA may exit right after it.
//  * Scale and inverse by block128_params_dev (IEEE, the reference's
//    formula), rank 0 stores the stripe's scales; codes from y recomputed
//    out of shared memory with the same operands (the same bits as the amax
//    pass), as the low byte of min(bits(fma(y, inv, 1.5 * 2^23)),
//    bits(1.5 * 2^23 + 127)) (RowStats' rounding: y * inv half to even,
//    saturated at 127; |y * inv| <= 128 by construction), PRMT-packed,
//    8-byte stores (a warp writes 256 contiguous bytes of a row).
// Shared memory holds x unpadded as [row][word][pack] 16-byte words, so a
// warp's 16-byte reads are contiguous (no bank conflicts) and fp32 rows
// (two words per pack) cost exactly twice the bytes.
// Ragged shapes: rows past `rows` are neither copied nor stored and add
// nothing to the maxima (a CTA with none still takes part in the barriers);
// packs past the row (dim % (8 V threads)) are idle lanes; a last group of
// < 128 columns has fewer lanes; samples changing inside a CTA's rows take
// the per-row parameter loads.
// Per bf16 element on the main path: unpack 1, sum 1, centred square 2, y
// and |y| max 3, then in the code pass unpack 1, y 2, code FFMA + IMNMX 2,
// PRMT 0.75, plus 16-byte shared loads (2 per 8 elements) and copies: ~14
// by count against ~19 for Columns.
// MEASURED (H200, 2026-12-01, bench_quant_rope twice, bf16; docs/benchmarks.md,
// session 15): NOT at the bar, and slower than RowStats and the portable
// kernel. 32760x1536: 102.3-102.5 us, 42% of a same-traffic copy (RowStats
// 76.4-76.7 us, 56%; portable 96.6-97.7 us; the previous cluster kernel 126
// us); 75600x5120: 929-934 us, 30% (RowStats 498-500 us, portable 719 us,
// the previous cluster kernel ~940 us). Both the one-shot form (a cluster
// per stripe) and this persistent double-buffered form gave the same times
// in the helper's own driver: ~11 us per stripe and CTA at both shapes, with
// 30 clusters of 8 (1536: 240 CTAs, 2 per SM) or only 7 clusters of 16
// (5120: 112 CTAs at 1 per SM, 169 KB each) resident. So neither load
// latency nor launches bound it: each CTA's per-stripe chain (chunks -> 2
// CTA barriers each -> cluster barrier -> code pass) at 6-10 warps per SM
// is. Next steps (not tried): more warps per SM (fewer registers per
// thread, or the rows held as raw bf16), and at 5120 a split of columns
// instead of rows (the 16-CTA cluster leaves 20 SMs idle).
// Correct at every shape tested (all dtypes, ragged rows and dims, samples
// changing inside a CTA, 16-row and 8-row configurations).
#include "kernels/quant/layernorm_modulate_quant_cluster.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cp_async.cuh"
#include "kernels/quant/ln_quant_columns_reduce.cuh"
#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;
using namespace lnq;

constexpr int kMaxCluster = 16;  // CTAs per cluster (R = 8 rows each)
constexpr int kMaxDim = 16384;   // V = 4 packs per thread x 512 threads x 8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kMaxWarps = 16;  // <= 512 threads per CTA
constexpr uint32_t kMagicBits = 0x4B400000u;  // bits of 1.5 * 2^23 (ulp 1 from 2^23 to 2^24)

// ---- sm_90 cluster primitives (PTX) ---------------------------------------
// Defined only in the sm_90+ device pass: the kernel body that uses them is
// compiled for sm_90+ alone (the sm_80 build gets an empty kernel, which the
// host never launches there).

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n = 1;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
// "This CTA is running": no ordering of memory (nothing to publish yet).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// Publishes this thread's earlier writes (shared::cluster included) to the
// threads that pass the matching wait.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// *p = v in CTA `rank`'s copy of this shared variable.
__device__ __forceinline__ void store_remote_f32(float* p, uint32_t rank, float v) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}

// cp.async.wait_group with a count known only after unrolling.
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    case 8: cp_async_wait<8>(); break;
    case 9: cp_async_wait<9>(); break;
    case 10: cp_async_wait<10>(); break;
    case 11: cp_async_wait<11>(); break;
    case 12: cp_async_wait<12>(); break;
    case 13: cp_async_wait<13>(); break;
    case 14: cp_async_wait<14>(); break;
    default: cp_async_wait<15>(); break;
  }
}
#endif  // __CUDA_ARCH__ >= 900

// ---- the kernel ------------------------------------------------------------

// V packs per thread and row, R rows per CTA (the cluster has 128 / R CTAs,
// set at launch). Persistent: cluster k of the grid's n handles stripes k,
// k + n, ..., with two stripe buffers, so the copies of the next stripe are
// in flight through this stripe's statistics, exchange and code pass (the
// one-shot version, a cluster per stripe, measured 41% / 30% of copy at
// 32760x1536 / 75600x5120 on the H200: every CTA a load -> compute ->
// barrier -> store chain with only 2 CTAs per SM to overlap them).
// Dynamic shared memory: x as 2 x [R][W words][packs] uint4, then the
// cluster's group maxima 2 x [C][groups] floats (by stripe parity: a peer
// can be at most one stripe ahead when it writes, since the next exchange
// barrier needs this CTA's arrival, which follows its reads).
template <typename T, int V, int R, int kBound, int kMinBlocks>
__global__ void __launch_bounds__(kBound, kMinBlocks) ln_mod_quant_block128_cluster_kernel(LnQuantArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int W = Pack8<T>::kWords;  // 16-byte words per pack: 1 (16-bit), 2 (fp32)
  constexpr int RC = 8 / V;            // rows per chunk: RC x V x 8 = 64 fp32 in registers
  constexpr int NCH = R / RC;          // chunks (<= 8: one commit group each)
  static_assert(RC >= 1 && R % RC == 0 && NCH <= 8, "chunking");
  extern __shared__ uint4 smem[];
  __shared__ float part[4][RC][kMaxWarps];  // statistics' warp partials, 4 in rotation
  __shared__ float2 row_rb[R];              // (rstd, -mean * rstd) of each row, for the code pass

  // Arrive now, wait before the first remote store: by then every peer has
  // started, so its shared memory exists (no cost: the wait comes late).
  cluster_arrive_relaxed();

  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const int lane = t & 31, l16 = lane & 15, nwarps = threads >> 5;
  const uint32_t rank = cluster_rank(), csize = cluster_size();
  const int packs = a.dim >> 3, groups = (packs + 15) >> 4;
  const int64_t stripes = (a.rows + kQuantGroup - 1) / kQuantGroup;
  const int64_t nclusters = int64_t(gridDim.x / csize);
  const int buf_words = R * W * packs;
  float* peer_amax = reinterpret_cast<float*>(smem + 2 * size_t(buf_words));  // [2][csize][groups]
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const T* x = static_cast<const T*>(a.x);

  int pk[V];
  bool pv[V];
#pragma unroll
  for (int j = 0; j < V; ++j) pk[j] = t + j * threads, pv[j] = pk[j] < packs;

  auto rows_of = [&](int64_t stripe) {
    const int64_t r0 = stripe * kQuantGroup + int64_t(rank) * R;
    return int(stripe >= stripes || a.rows - r0 <= 0 ? 0 : (a.rows - r0 < R ? a.rows - r0 : R));
  };
  // The copies of this CTA's rows of `stripe` into buffer `buf`, one commit
  // group per chunk (empty groups too: the waits count groups). The buffer
  // was last read by this same thread (each thread copies and reads only its
  // own packs), so no barrier guards the reuse.
  auto issue = [&](int64_t stripe, int buf) {
    const int n = rows_of(stripe);
    const int64_t r0 = stripe * kQuantGroup + int64_t(rank) * R;
    const uint32_t dst0 = sbase + 16u * uint32_t(buf * buf_words);
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
#pragma unroll
      for (int ii = 0; ii < RC; ++ii) {
        const int i = c * RC + ii;
        if (i < n) {
          const T* src = x + (r0 + i) * a.ld_x;
#pragma unroll
          for (int j = 0; j < V; ++j)
            if (pv[j]) {
#pragma unroll
              for (int k = 0; k < W; ++k)
                cp_async_16(dst0 + 16u * uint32_t((i * W + k) * packs + pk[j]), src + pk[j] * 8 + k * (8 / W));
            }
        }
      }
      cp_async_commit();
    }
  };

  int64_t stripe = int64_t(blockIdx.x / csize);
  issue(stripe, 0);
  for (int it = 0; stripe < stripes; ++it, stripe += nclusters) {
    const int buf = it & 1;
    issue(stripe + nclusters, buf ^ 1);  // NCH more groups in flight behind this stripe's
    const uint4* xs = smem + buf * buf_words;
    const int64_t r0 = stripe * kQuantGroup + int64_t(rank) * R;
    const int nrows = rows_of(stripe);
    float* amax_in = peer_amax + buf * int(csize) * groups;

    // The CTA's rows lie in one sample (all but the boundary CTAs): the
    // modulation of a thread's columns is loaded once per chunk, not per row.
    const int64_t b_first = lnq_sample_of(nrows > 0 ? r0 : 0, a.rows_per_batch);
    const bool one_sample = nrows > 0 && lnq_sample_of(r0 + nrows - 1, a.rows_per_batch) == b_first;
    const float* shift0 = a.shift + b_first * a.ld_mod;
    const float* scale0 = a.scale + b_first * a.ld_mod;

    float am[V];
#pragma unroll
    for (int j = 0; j < V; ++j) am[j] = 0.f;

#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      cp_async_wait_upto(2 * NCH - 1 - c);  // this chunk's copies (this thread's) have landed
      float v[RC][V][8];
#pragma unroll
      for (int ii = 0; ii < RC; ++ii)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int i = c * RC + ii;
          if (i < nrows && pv[j]) {
            Pack8<T> p;
#pragma unroll
            for (int k = 0; k < W; ++k) p.w[k] = xs[(i * W + k) * packs + pk[j]];
            unpack(p, v[ii][j]);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[ii][j][e] = 0.f;
          }
        }

      // Two-pass statistics of the chunk's rows.
      float acc[RC];
      row_pack_sums<RC, V>(v, acc);
      const float mean_l = cta_row_sum<RC>(acc, part[(2 * c) & 3], nwarps) / float(a.dim);  // row c*RC + lane % RC
      float mean[RC];
#pragma unroll
      for (int ii = 0; ii < RC; ++ii) {
        mean[ii] = __shfl_sync(0xffffffffu, mean_l, ii);
        float sq = 0.f;
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (pv[j]) {  // idle lanes' zeros are not x - mean = 0
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              const float d = v[ii][j][e] - mean[ii];
              sq = fmaf(d, d, sq);
            }
          }
        acc[ii] = sq;
      }
      const float var_l = cta_row_sum<RC>(acc, part[(2 * c + 1) & 3], nwarps) / float(a.dim);
      const float rstd_l = __fdiv_rn(1.f, __fsqrt_rn(var_l + a.eps));
      float rs[RC], bs[RC];
#pragma unroll
      for (int ii = 0; ii < RC; ++ii) {
        rs[ii] = __shfl_sync(0xffffffffu, rstd_l, ii);
        bs[ii] = -mean[ii] * rs[ii];
      }
      // Lane ii of warp 0 holds row c*RC + ii: its (rstd, -mean * rstd) are
      // the bits every lane used above (the code pass recomputes y with
      // them; read after the cluster barrier, which orders this CTA's
      // threads too; rewritten next stripe only after a CTA barrier that
      // every reader has passed).
      if (t < RC) row_rb[c * RC + t] = make_float2(rstd_l, -mean_l * rstd_l);

      // |y| maxima per slot over the chunk's valid rows.
      if (one_sample) {
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (pv[j]) {
            float sh[8], sc[8];
            load_params8(shift0 + pk[j] * 8, sh);
            load_params8(scale0 + pk[j] * 8, sc);
#pragma unroll
            for (int ii = 0; ii < RC; ++ii)
              if (c * RC + ii < nrows) {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                  am[j] = fmaxf(am[j], fabsf(fmaf(fmaf(v[ii][j][e], rs[ii], bs[ii]), 1.f + sc[e], sh[e])));
              }
          }
      } else {
#pragma unroll
        for (int ii = 0; ii < RC; ++ii) {
          const int i = c * RC + ii;
          if (i < nrows) {
            const int64_t b = lnq_sample_of(r0 + i, a.rows_per_batch);
#pragma unroll
            for (int j = 0; j < V; ++j)
              if (pv[j]) {
                float sh[8], sc[8];
                load_params8(a.shift + b * a.ld_mod + pk[j] * 8, sh);
                load_params8(a.scale + b * a.ld_mod + pk[j] * 8, sc);
#pragma unroll
                for (int e = 0; e < 8; ++e)
                  am[j] = fmaxf(am[j], fabsf(fmaf(fmaf(v[ii][j][e], rs[ii], bs[ii]), 1.f + sc[e], sh[e])));
              }
          }
        }
      }
    }

    // Group maxima over the 16 lanes of each group (every lane takes part).
    float gm[V];
#pragma unroll
    for (int j = 0; j < V; ++j) gm[j] = group_max<16>(am[j]);

    // Exchange: lane l < C of a group's half-warp writes the group's maximum
    // into CTA l's [parity][rank][group]; one barrier publishes them.
    if (it == 0) cluster_wait_acquire();  // the entry arrive: every peer is running
    if (uint32_t(l16) < csize) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int pg = (t & ~15) + j * threads;  // the group's first pack
        if (pg < packs) store_remote_f32(amax_in + rank * groups + (pg >> 4), uint32_t(l16), gm[j]);
      }
    }
    cluster_arrive_release();
    cluster_wait_acquire();  // every peer's maxima for this stripe are in amax_in

    // Scales (rank 0 stores them) and inverses: the reference's formula.
    float inv[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      inv[j] = 0.f;
      if (pv[j]) {  // lane 0 of a group is valid whenever the group is
        const int g = pk[j] >> 4;
        float m = 0.f;
        for (uint32_t rk = 0; rk < csize; ++rk) m = fmaxf(m, amax_in[rk * groups + g]);
        const QuantParams qp = block128_params_dev(m);
        inv[j] = qp.inv;
        if (rank == 0 && l16 == 0) a.scales[stripe * groups + g] = qp.scale;
      }
    }

    // Codes from shared memory, y recomputed with the amax pass's operands.
    int8_t* q0 = a.q + r0 * a.ld_q;
    auto code_row = [&](int i, int j, const float (&sh)[8], const float (&sc)[8]) {
      const float2 rb = row_rb[i];
      Pack8<T> p;
#pragma unroll
      for (int k = 0; k < W; ++k) p.w[k] = xs[(i * W + k) * packs + pk[j]];
      float f[8];
      unpack(p, f);
      uint32_t cw[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float y = fmaf(fmaf(f[e], rb.x, rb.y), 1.f + sc[e], sh[e]);
        cw[e] = min(__float_as_uint(fmaf(y, inv[j], 12582912.f)), kMagicBits + 127u);
      }
      const uint2 codes =
          make_uint2(__byte_perm(__byte_perm(cw[0], cw[1], 0x0040), __byte_perm(cw[2], cw[3], 0x0040), 0x5410),
                     __byte_perm(__byte_perm(cw[4], cw[5], 0x0040), __byte_perm(cw[6], cw[7], 0x0040), 0x5410));
      *reinterpret_cast<uint2*>(q0 + int64_t(i) * a.ld_q + pk[j] * 8) = codes;
    };
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (!pv[j]) continue;
      if (one_sample) {
        float sh[8], sc[8];
        load_params8(shift0 + pk[j] * 8, sh);
        load_params8(scale0 + pk[j] * 8, sc);
#pragma unroll 4
        for (int i = 0; i < R; ++i)
          if (i < nrows) code_row(i, j, sh, sc);
      } else {
        for (int i = 0; i < nrows; ++i) {
          const int64_t b = lnq_sample_of(r0 + i, a.rows_per_batch);
          float sh[8], sc[8];
          load_params8(a.shift + b * a.ld_mod + pk[j] * 8, sh);
          load_params8(a.scale + b * a.ld_mod + pk[j] * 8, sc);
          code_row(i, j, sh, sc);
        }
      }
    }
  }
  // A cluster with no stripe at all never got here (the host launches at
  // most one cluster per stripe); every cluster waited on the entry arrive
  // in its first iteration. No copy outlives the CTA (the last issue was of
  // empty groups).
  cp_async_wait<0>();
#else
  (void)a;  // launched only on sm_90+ (the host refuses below)
#endif
}

// ---- host --------------------------------------------------------------------

// Packs per thread by row width: threads = packs / V rounded up to a warp
// multiple stays <= 256 / 320 / 512 (V = 1 / 2 / 4), so 1536 -> 192 threads,
// 4096 -> 256, 5120 -> 320 (one CTA per SM there: two 80 KB buffers).
int packs_per_thread(int packs) { return packs <= 256 ? 1 : packs <= 640 ? 2 : packs <= 2048 ? 4 : 0; }

// __launch_bounds__ per V: the thread bound above and the CTAs per SM the
// registers are budgeted for (V = 1: 2 CTAs of <= 256 threads, 128
// registers; V = 2, 4: one CTA, as shared memory allows no more).
template <int V>
struct Bounds;
template <>
struct Bounds<1> {
  static constexpr int kThreads = 256, kMinBlocks = 2;
};
template <>
struct Bounds<2> {
  static constexpr int kThreads = 320, kMinBlocks = 1;
};
template <>
struct Bounds<4> {
  static constexpr int kThreads = 512, kMinBlocks = 1;
};

template <typename T, int V, int R>
auto kernel_of() {
  return ln_mod_quant_block128_cluster_kernel<T, V, R, Bounds<V>::kThreads, Bounds<V>::kMinBlocks>;
}

// A cluster configuration: R rows per CTA (128 / R CTAs per cluster) and the
// shared memory the rows may take.
struct Config {
  int rows;
  size_t smem_limit;
};
constexpr size_t kSmemFor2PerSm = 100 * 1024;  // two CTAs per SM (228 KB per SM on H100 / H200)
constexpr size_t kSmemAny = 0;                 // whatever the device allows one CTA
// In order of preference: 16 rows (a portable cluster of 8) if two CTAs fit
// per SM, else 8 rows (16 CTAs, non-portable) if two fit, else 16 rows at
// one CTA per SM, else 8. TD_LNQ_CLUSTER_ROWS=8|16 (read per call, for A/B)
// puts that row count first.
constexpr Config kConfigs[] = {{16, kSmemFor2PerSm}, {8, kSmemFor2PerSm}, {16, kSmemAny}, {8, kSmemAny}};

int forced_rows() {
  if (const char* e = std::getenv("TD_LNQ_CLUSTER_ROWS")) {
    if (std::strcmp(e, "8") == 0) return 8;
    if (std::strcmp(e, "16") == 0) return 16;
  }
  return 0;
}

void fill_launch(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, int64_t ctas, int threads, int csize,
                 size_t smem, cudaStream_t s) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3{unsigned(ctas), 1u, 1u};
  cfg.blockDim = dim3{unsigned(threads), 1u, 1u};
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(csize);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
}

// Clusters of this kernel that can be resident at once on device `dev` with
// `threads` threads and `smem` bytes (0: none fits). Asked once per (kernel,
// device, threads, smem) and cached: a launch must not pay for the query.
// The kernel's opt-ins (shared memory up to the device's limit, the
// non-portable cluster size of 16) are set on the first query.
template <typename T, int V, int R>
int active_clusters(int dev, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, size_t>, int> cache;
  static std::map<int, size_t> opted_in;  // device -> dynamic shared memory allowed
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, threads, smem);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int clusters = 0;
  const auto kernel = kernel_of<T, V, R>();
  auto oi = opted_in.find(dev);
  if (oi == opted_in.end()) {
    size_t allowed = 0;
    int optin = 0;
    cudaFuncAttributes fa{};
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
        cudaFuncGetAttributes(&fa, kernel) == cudaSuccess && size_t(optin) > fa.sharedSizeBytes &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(size_t(optin) - fa.sharedSizeBytes)) == cudaSuccess)
      allowed = size_t(optin) - fa.sharedSizeBytes;
    if (kQuantGroup / R > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      allowed = 0;
    oi = opted_in.emplace(dev, allowed).first;
  }
  if (smem <= oi->second) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr;
    fill_launch(cfg, attr, kQuantGroup / R, threads, kQuantGroup / R, smem, nullptr);
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) clusters = 0;
  }
  (void)cudaGetLastError();  // a refused configuration is not a launch error
  cache.emplace(key, clusters);
  return clusters;
}

template <typename T, int V, int R>
Status launch(const LnQuantArgs& a, int threads, size_t smem, int64_t clusters, cudaStream_t s) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  const int csize = kQuantGroup / R;
  fill_launch(cfg, attr, clusters * csize, threads, csize, smem, s);
  if (cudaLaunchKernelEx(&cfg, kernel_of<T, V, R>(), a) != cudaSuccess) return Status::LaunchFailed;
  return launch_status();
}

bool device_has_clusters(int dev) {
  static std::mutex mu;
  static std::map<int, bool> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(dev); it != cache.end()) return it->second;
  int major = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  (void)cudaGetLastError();
  cache.emplace(dev, ok);
  return ok;
}

template <typename T, int V>
Status run(const LnQuantArgs& a, cudaStream_t s) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::LaunchFailed;
  if (!device_has_clusters(dev)) return Status::Unsupported;
  const int packs = a.dim / 8, groups = (packs + 15) / 16;
  const int threads = ((packs + V - 1) / V + 31) / 32 * 32;
  const int64_t stripes = quant_groups(a.rows);
  if (stripes * kMaxCluster > 0x7fffffff) return Status::InvalidArgument;
  const int forced = forced_rows();
  auto try_config = [&](const Config& c, Status& st) {
    const int csize = kQuantGroup / c.rows;
    // Two stripe buffers and two parity copies of the group maxima.
    const size_t smem = 2 * (size_t(c.rows) * size_t(a.dim) * sizeof(T) + size_t(csize) * size_t(groups) * 4);
    if (c.smem_limit != kSmemAny && smem > c.smem_limit) return false;
    const int clusters = c.rows == 16 ? active_clusters<T, V, 16>(dev, threads, smem)
                                      : active_clusters<T, V, 8>(dev, threads, smem);
    if (clusters < 1) return false;
    // Persistent: as many clusters as can be resident at once, at most one per stripe.
    const int64_t grid_clusters = stripes < clusters ? stripes : clusters;
    st = c.rows == 16 ? launch<T, V, 16>(a, threads, smem, grid_clusters, s)
                      : launch<T, V, 8>(a, threads, smem, grid_clusters, s);
    return true;
  };
  Status st = Status::Unsupported;
  if (forced != 0) {
    for (const Config& c : kConfigs)
      if (c.rows == forced && try_config(c, st)) return st;
  }
  for (const Config& c : kConfigs)
    if (try_config(c, st)) return st;
  return Status::Unsupported;
}

}  // namespace

Status ln_mod_quant_block128_cluster_cuda(ElemType x_type, const LnQuantArgs& a, void* stream) {
  if (a.rows == 0 || a.dim == 0) return Status::Ok;
  if (a.dim > kMaxDim) return Status::Unsupported;
  const int V = packs_per_thread(a.dim / 8);
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (V) {
      case 1: return run<T, 1>(a, s);
      case 2: return run<T, 2>(a, s);
      case 4: return run<T, 4>(a, s);
      default: return Status::Unsupported;
    }
  });
}

}  // namespace td::kernels
