// SLA linear branch on the GPU, with proj_l folded in and added onto o_s
// (kernels/sla/sla.h, sla_linear_add_cuda). Three kernels:
//
//   1. kv_partial: grid (token chunk, head, batch), 2·D threads (D/16 warps).
//      K and V stream through shared memory in tiles of 64 tokens (cp.async,
//      double-buffered, zero rows past the chunk). Each tile's K rows become
//      φ(K) in place (a warp per row: softmax over head_dim / elu+1 / relu,
//      rounded to bf16; rows past len are 0); then warp w accumulates feature
//      rows 16w..16w+15 of φ(K)ᵀV with mma.sync (A = φ(K)ᵀ by ldmatrix.trans,
//      B = V by ldmatrix.trans), fp32 in registers. Σφ(K) of the same rounded
//      values per lane, then over warps in a fixed order. Output: one fp32
//      partial [D, D] and [D] per chunk.
//   2. kv_project: grid (D/4 feature-row CTAs + fold CTAs, batch·head), D
//      threads: the partials summed over chunks in chunk order (deterministic), then rows
//      of M = (φ(K)ᵀV)·Wᵀ (proj_l folded in: proj_l(o_l) = φ(Q)·M / den +
//      bias), stored as bf16 for the tensor cores.
//   3. linear_apply: grid (128-token block, head, batch), 8 warps of 16 rows:
//      φ(Q) in place in shared memory, den = φ(Q)·Σφ(K) + 1e-5 per row, φ(Q)·M
//      with mma.sync, then o = o_s + acc / den + bias in the epilogue (the
//      Staged / persistent variants form φ(Q) in the mma's A fragments instead:
//      phi_q_times_m).
// The Staged kernels (the defaults of every fused path; kv_partial_staged,
// linear_apply_staged / _persist) differ from these in the ways their own
// comments list; since session 7 also: exp of the softmax feature map as one
// FFMA + ex2.approx (feature_map8), Σφ(K) as φ(K)ᵀ·ones on the tensor cores
// (one more mma per 16 tokens instead of a convert and an add per element and
// a reduction over warps), and den as a ninth 8-column block of the φ(Q)·M mma
// against Σφ(K) split into bf16 hi + lo columns (stage_den_columns / phi_q_times_m:
// ~16 significant bits, fp32 accumulation) instead of a per-element FMA chain.
// The K/V pass's sage statistics (kStats) from the same fragments: Σ raw K as
// Kᵀ·ones before φ, max |V| over V's B fragments in bf16 pairs.
// Measured (H200, 2026-11-30, bench_sla, SageSLA's fused path at topk 0.1):
// K/V prepare 0.180 -> 0.167 ms at 1x12x32760, 0.919 -> 0.829 at 1x40x75600
// (the statistics from the fragments: 0.167-0.171 -> 0.157 at 1x12x32760);
// the Staged apply 0.152 -> 0.134 and 1.055 -> 0.900 ms. Staged against the
// Warp kernels onto the same o_s: rel L2 1e-5 - 2e-5 (bar 2e-3,
// SlaGpu.LinearBranchStagedKernelsMatchTheReference).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/pdl.cuh"
#include "kernels/sla/sla.h"
#include "kernels/sla/sla_device.cuh"

namespace td::kernels {
namespace {

using namespace sla_device;

constexpr int kTile = 64;        // tokens per K/V tile in kv_partial
constexpr int kApplyRows = 128;  // tokens per CTA in linear_apply
constexpr int kApplyThreads = 256;
// kv_partial's chunking model: the CTAs that run at once (132 SMs x 2 on the
// H200: 96 KB of shared memory and 256 threads x 128 registers each) and a
// CTA's fixed cost (its first loads, its 64 KB of partials) in 64-token tiles.
constexpr int64_t kKvSlots = 264;
constexpr int64_t kKvCtaOverheadTiles = 3;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Chunking of the token axis: depends on the problem only (not the device), so
// the summation order, hence the bits, are the same everywhere. The number of
// chunks per head minimises waves x (tiles per chunk + a CTA's fixed cost)
// for kKvSlots concurrent CTAs: whole waves, few partials. Measured on the
// H200 (2026-11-30, bench_sla `sagesla_fused_kv_prepare`): at 1x12x32760 22
// chunks (264 CTAs, one wave) 0.133-0.146 ms against 0.152-0.160 for the
// earlier rule's 86 chunks (~1024 CTAs, 3.9 waves); 7 chunks at 1x40x75600
// (280 CTAs: a second wave of 16) 1.03-1.08 ms against 0.74-0.82 for 26.
// TD_SLA_KV_CTAS=N (A/B knob) aims at N CTAs instead, as the earlier rule
// did at 1024.
struct Chunking {
  int64_t chunk_len, n_chunks;
};
Chunking chunking(const SlaProblem& p) {
  const int64_t bh = p.batch * p.heads, tiles = (p.len + kTile - 1) / kTile;
  int64_t n = 1;
  if (const char* e = std::getenv("TD_SLA_KV_CTAS"); e && std::atoll(e) > 0) {
    n = (std::atoll(e) + bh - 1) / bh;
  } else {
    int64_t best_cost = -1;
    for (int64_t c = 1; c <= tiles && bh * c <= 64 * kKvSlots; ++c) {
      const int64_t per = (tiles + c - 1) / c, used = (tiles + per - 1) / per;
      const int64_t waves = (bh * used + kKvSlots - 1) / kKvSlots;
      const int64_t cost = waves * (per + kKvCtaOverheadTiles);
      if (best_cost < 0 || cost < best_cost) best_cost = cost, n = c;
    }
  }
  n = n < 1 ? 1 : n > tiles ? tiles : n;
  const int64_t chunk_len = ((tiles + n - 1) / n) * kTile;
  return {chunk_len, (p.len + chunk_len - 1) / chunk_len};
}

struct Workspace {
  float* part;      // [BH, n_chunks, D, D]
  float* part_ks;   // [BH, n_chunks, D]
  __nv_bfloat16* m; // [BH, D, D]
  float* ksum;      // [BH, D]
  float* bias;      // [D]
  float* part_kraw; // [BH, n_chunks, D] Σ raw K per chunk (Staged with sage statistics only)
  float* part_vmax; // [BH, n_chunks, D] max |V| per chunk (likewise)
  size_t bytes;
};
Workspace carve(const SlaProblem& p, void* base) {
  const Chunking c = chunking(p);
  const size_t bh = size_t(p.batch * p.heads), d = size_t(p.head_dim), n = size_t(c.n_chunks);
  char* at = static_cast<char*>(base);
  Workspace w;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* r = at ? at + off : nullptr;
    off += align256(bytes);
    return r;
  };
  w.part = reinterpret_cast<float*>(take(bh * n * d * d * 4));
  w.part_ks = reinterpret_cast<float*>(take(bh * n * d * 4));
  w.m = reinterpret_cast<__nv_bfloat16*>(take(bh * d * d * 2));
  w.ksum = reinterpret_cast<float*>(take(bh * d * 4));
  w.bias = reinterpret_cast<float*>(take(d * 4));
  w.part_kraw = reinterpret_cast<float*>(take(bh * n * d * 4));
  w.part_vmax = reinterpret_cast<float*>(take(bh * n * d * 4));
  w.bytes = off;
  return w;
}

struct LinParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* o;
  AttnStrides qs, ks, vs, os;
  const void* proj_w;
  const void* proj_b;
  int heads, len, chunk_len, n_chunks;
  Workspace ws;
  SlaSageStats stats;  // all null unless the K/V pass also makes the sage statistics
};

// One head_dim row of a swizzled bf16 tile, E = D / 32 values per lane
// (channels lane·E .. lane·E + E - 1, all in one 16-byte chunk).
template <int D>
__device__ __forceinline__ uint32_t row_addr(uint32_t base, int row, int lane) {
  constexpr int E = D / 32;
  return base + swizzle<D / 8>(row, (lane * E) / 8) + uint32_t(((lane * E) % 8) * 2);
}
template <int D>
__device__ __forceinline__ void read_row(uint32_t addr, float (&x)[D / 32]) {
#pragma unroll
  for (int i = 0; i < D / 64; ++i) {
    uint32_t w;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(addr + 4 * i));
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&w);
    x[2 * i] = __low2float(v);
    x[2 * i + 1] = __high2float(v);
  }
}
// Rounds x to bf16 (x keeps the rounded values) and stores it.
template <int D>
__device__ __forceinline__ void round_write_row(uint32_t addr, float (&x)[D / 32]) {
#pragma unroll
  for (int i = 0; i < D / 64; ++i) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    x[2 * i] = __low2float(v);
    x[2 * i + 1] = __high2float(v);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr + 4 * i), "r"(*reinterpret_cast<const uint32_t*>(&v))
                 : "memory");
  }
}

template <int E>
__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// φ over one row held E values per lane by a whole warp. FM: 0 softmax, 1 elu+1, 2 relu.
template <int E, int FM>
__device__ __forceinline__ void feature_map(float (&x)[E]) {
  if constexpr (FM == 0) {
    float m = x[0];
#pragma unroll
    for (int e = 1; e < E; ++e) m = fmaxf(m, x[e]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s += (x[e] = __expf(x[e] - m));
    const float inv = 1.f / warp_sum<E>(s);
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] *= inv;
  } else if constexpr (FM == 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = x[e] > 0.f ? x[e] + 1.f : __expf(x[e]);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = fmaxf(x[e], 0.f);
  }
}

template <int D>
struct KvTraits {
  static constexpr int kThreads = 2 * D;  // D / 16 warps, one per 16 feature rows
  static constexpr int kTileBytes = kTile * D * 2;
  static constexpr int kSmemBytes = 2 * 2 * kTileBytes;  // two stages of K and V
};

template <int D, int FM>
__global__ void __launch_bounds__(KvTraits<D>::kThreads) kv_partial_kernel(const LinParams p) {
  using T = KvTraits<D>;
  constexpr int kThreads = T::kThreads, kWarps = kThreads / 32, E = D / 32, kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem));
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t_begin = chunk * p.chunk_len, t_end = min(p.len, t_begin + p.chunk_len);
  const int n_tiles = (t_end - t_begin + kTile - 1) / kTile;
  const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;

  auto issue = [&](int j) {
    const uint32_t stage = s0 + (j & 1) * 2 * T::kTileBytes;
    const int t0 = t_begin + j * kTile, valid = t_end - t0;
    load_tile<D, kTile, kThreads>(stage, kg + int64_t(t0) * p.ks.token, p.ks.token, valid, tid);
    load_tile<D, kTile, kThreads>(stage + T::kTileBytes, vg + int64_t(t0) * p.vs.token, p.vs.token, valid, tid);
  };
  issue(0);
  cp_async_commit();

  float acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  float ks[E];
#pragma unroll
  for (int e = 0; e < E; ++e) ks[e] = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j landed everywhere; tile j-1's stage is free
    if (j + 1 < n_tiles) issue(j + 1);
    cp_async_commit();
    const uint32_t sk = s0 + (j & 1) * 2 * T::kTileBytes, sv = sk + T::kTileBytes;
    const int valid = t_end - (t_begin + j * kTile);

    for (int r = warp; r < kTile; r += kWarps) {
      float x[E];
      const uint32_t addr = row_addr<D>(sk, r, lane);
      read_row<D>(addr, x);
      feature_map<E, FM>(x);
      if (r >= valid) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] = 0.f;
      }
      round_write_row<D>(addr, x);
#pragma unroll
      for (int e = 0; e < E; ++e) ks[e] += x[e];
    }
    __syncthreads();  // φ(K) rows of every warp written

#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4];
      {
        const int tok = kk * 16 + (lane & 7) + (lane >> 4) * 8;
        const int ch = warp * 2 + ((lane >> 3) & 1);
        ldmatrix_x4_trans(a, sk + swizzle<kChunks>(tok, ch));
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int tok = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int ch = dp * 2 + (lane >> 4);
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sv + swizzle<kChunks>(tok, ch));
        mma_bf16(acc[2 * dp], a, vb[0], vb[1]);
        mma_bf16(acc[2 * dp + 1], a, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();

  const int64_t slot = (int64_t(b) * p.heads + h) * p.n_chunks + chunk;
  float* part = p.ws.part + slot * D * D;
  const int f0 = warp * 16 + lane / 4;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    const int col = t * 8 + (lane & 3) * 2;
    *reinterpret_cast<float2*>(part + int64_t(f0) * D + col) = make_float2(acc[t][0], acc[t][1]);
    *reinterpret_cast<float2*>(part + int64_t(f0 + 8) * D + col) = make_float2(acc[t][2], acc[t][3]);
  }
  // Σφ(K): lanes' values through shared memory, warps summed in order.
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [kWarps, D]
#pragma unroll
  for (int e = 0; e < E; ++e) red[warp * D + lane * E + e] = ks[e];
  __syncthreads();
  if (tid < D) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += red[w * D + tid];
    p.ws.part_ks[slot * D + tid] = s;
  }
}

// Folds load(0), load(1), ... load(n - 1) into an accumulator in that order
// (the same bits as a plain loop) with kBatch loads in flight instead of
// one. The chunk partials of the K/V pass come from L2 or HBM; folded one
// load at a time, a thread's n_chunks (86 at 1x12x32760) loads run back to
// back at full latency.
template <int kBatch, typename Load, typename Fold>
__device__ __forceinline__ void fold_in_order(int n, Load load, Fold fold) {
  for (int ch0 = 0; ch0 < n; ch0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (ch0 + u < n) v[u] = load(ch0 + u);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (ch0 + u < n) fold(v[u]);
  }
}
constexpr int kFoldBatch = 16;

// kv_project: grid (D / 4 row CTAs + fold CTAs, batch·head), D threads.
// Row CTA x sums feature rows 4x .. 4x + 3 of the chunk partials over the
// chunks in chunk order (deterministic: the same additions in the same
// order for every element, so the same bits whatever the CTA shape), thread
// c owning column c of the 4 rows, 16 chunks' loads in flight (64 per
// thread, coalesced across the warp); then thread c forms M[f][c] =
// Σ_i S[f][i]·W[c][i] for its 4 rows, i in order (W's row c through L1).
// The fold CTAs (x = D / 4 ..): Σφ(K) over the chunks and the bias; with
// kStats two more, the sage statistics from the per-chunk Σ K / max |V|
// (km = Σ K / len, vscale = amax / 448, vinv = 448 / amax, 0 for an all-zero
// channel: the formulas of the sage pre-pass's finalize), each fold its own
// CTA so the three latency chains run side by side.
// Why this shape: the 16-row form (D / 16 CTAs of 256 threads per head, CTA
// 0 also running the three folds one after another) took 47 us at 1x12x32760
// (ncu, H200, 2026-11-30: 96 CTAs on 132 SMs, ~15 GB/s each, 55 MB of
// partials): too few loads in flight for L2/HBM latency. 4 rows x D / 4 CTAs
// per head and 16 chunks in flight per thread put ~4x more bytes in flight.
// Predicted: ~12-18 us at 1x12x32760 (384 + 36 CTAs).
constexpr int kProjRows = 4, kProjChunkBatch = 16;
__device__ __forceinline__ int lane_id() { return int(threadIdx.x) & 31; }
constexpr int proj_fold_ctas(bool stats) { return stats ? 3 : 1; }
// Role r of head-batch blockIdx.y: the rows 4r .. 4r + 3 of M, or fold r - D / 4.
template <int D, typename WT, bool kStats>
__device__ __forceinline__ void kv_project_role(const LinParams& p, int role) {
  __shared__ float rows[kProjRows][D];
  const int c = threadIdx.x;
  const int64_t bh = blockIdx.y;
  constexpr int kRowCtas = D / kProjRows;
  if (role >= kRowCtas) {  // a fold CTA: one fold per CTA, thread c = channel c
    const int fold = role - kRowCtas;
    if (fold == 0) {
      const float* pk = p.ws.part_ks + bh * p.n_chunks * D + c;
      float ks = 0.f;
      fold_in_order<kFoldBatch>(p.n_chunks, [&](int ch) { return pk[int64_t(ch) * D]; }, [&](float x) { ks += x; });
      p.ws.ksum[bh * D + c] = ks;
      if (bh == 0) p.ws.bias[c] = float(static_cast<const WT*>(p.proj_b)[c]);
    }
    if constexpr (kStats) {
      if (fold == 1) {
        const float* kr = p.ws.part_kraw + bh * p.n_chunks * D + c;
        float s = 0.f;
        fold_in_order<kFoldBatch>(p.n_chunks, [&](int ch) { return kr[int64_t(ch) * D]; }, [&](float x) { s += x; });
        p.stats.km[bh * D + c] = s / float(p.len);
      } else if (fold == 2) {
        const float* vm = p.ws.part_vmax + bh * p.n_chunks * D + c;
        float m = 0.f;
        fold_in_order<kFoldBatch>(p.n_chunks, [&](int ch) { return vm[int64_t(ch) * D]; },
                                  [&](float x) { m = fmaxf(m, x); });
        p.stats.vscale[bh * D + c] = m / 448.f;
        p.stats.vinv[bh * D + c] = m > 0.f ? 448.f / m : 0.f;
      }
    }
    return;
  }
  const int f0 = role * kProjRows;
  const float* part = p.ws.part + bh * p.n_chunks * D * D + int64_t(f0) * D + c;
  float s[kProjRows];
#pragma unroll
  for (int r = 0; r < kProjRows; ++r) s[r] = 0.f;
  for (int ch0 = 0; ch0 < p.n_chunks; ch0 += kProjChunkBatch) {
    float v[kProjChunkBatch][kProjRows];
#pragma unroll
    for (int u = 0; u < kProjChunkBatch; ++u)
      if (ch0 + u < p.n_chunks) {
        const float* pc = part + int64_t(ch0 + u) * D * D;
#pragma unroll
        for (int r = 0; r < kProjRows; ++r) v[u][r] = pc[r * D];
      }
#pragma unroll
    for (int u = 0; u < kProjChunkBatch; ++u)
      if (ch0 + u < p.n_chunks) {
#pragma unroll
        for (int r = 0; r < kProjRows; ++r) s[r] += v[u][r];
      }
  }
#pragma unroll
  for (int r = 0; r < kProjRows; ++r) rows[r][c] = s[r];
  __syncthreads();
  // M[f][c] = Σ_i S[f][i]·W[c][i] for the CTA's rows f, by warps: warp w owns
  // the columns c = 32w .. 32w + 31; lane l takes i = l, l + 32, ... (W's row c
  // read by the warp in contiguous 128-byte pieces), then the warp's sum, one
  // c at a time (lane c % 32 keeps it). Why: with a thread per c, every load
  // of W hit 32 rows 512 bytes apart and the FMAs waited on them: 45 us of
  // issue-starved kernel at 1x12x32760 (ncu, H200, 2026-11-30: 68% of the
  // warp samples on those FMAs and loads, 4.8% issue slots).
  constexpr int kPerLane = D / 32, kCGroup = 8;
  float sv[kProjRows][kPerLane];
#pragma unroll
  for (int r = 0; r < kProjRows; ++r)
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) sv[r][k] = rows[r][lane_id() + 32 * k];
  float m[kProjRows];
#pragma unroll
  for (int r = 0; r < kProjRows; ++r) m[r] = 0.f;
  const int warp_c0 = (c / 32) * 32;
  const WT* wrow = static_cast<const WT*>(p.proj_w) + int64_t(warp_c0) * D + lane_id();
  for (int cg = 0; cg < 32; cg += kCGroup) {
    float wv[kCGroup][kPerLane];
#pragma unroll
    for (int u = 0; u < kCGroup; ++u)
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) wv[u][k] = float(wrow[int64_t(cg + u) * D + 32 * k]);
#pragma unroll
    for (int u = 0; u < kCGroup; ++u) {
#pragma unroll
      for (int r = 0; r < kProjRows; ++r) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) t = fmaf(sv[r][k], wv[u][k], t);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
        if (lane_id() == cg + u) m[r] = t;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kProjRows; ++r) p.ws.m[(bh * D + f0 + r) * D + c] = __float2bfloat16_rn(m[r]);
}

// CTA x runs role role0 + x: all roles in one launch, or a subset (SageSLA's
// fused path runs the statistics folds right after the K/V pass and the M
// rows with Σφ(K) after the block-sparse kernel, in the SMs its last wave
// leaves idle: kPhasePartialStatsFolds / kPhaseChainTail below). late_wait: the kernel before this one in the
// stream wrote nothing this one reads (the partials come from an earlier
// one), so it works first and waits at the end (pdl.cuh's rules); it lets its
// dependent (the apply, which waits for it before reading M) launch at once.
template <int D, typename WT, bool kStats = false>
__global__ void __launch_bounds__(D) kv_project_rows_kernel(const LinParams p, int role0, bool late_wait) {
  if (!late_wait) pdl_wait();
  pdl_launch_dependents();
  kv_project_role<D, WT, kStats>(p, role0 + int(blockIdx.x));
  if (late_wait) pdl_wait();
}

// acc += A · M[16·ks .. 16·ks + 15, :] for a warp's 16 rows: A the rows'
// k-step ks in mma fragments, M (bf16 [D, D], swizzled) at sm.
template <int D>
__device__ __forceinline__ void mma_rows_times_m(float (&acc)[D / 8][4], const uint32_t (&a)[4], uint32_t sm, int ks,
                                                 int lane) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    const int f = ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
    uint32_t mb[4];
    ldmatrix_x4_trans(mb, sm + swizzle<kChunks>(f, dp * 2 + (lane >> 4)));
    mma_bf16(acc[2 * dp], a, mb[0], mb[1]);
    mma_bf16(acc[2 * dp + 1], a, mb[2], mb[3]);
  }
}

template <int D>
struct ApplyTraits {
  static constexpr int kQBytes = kApplyRows * D * 2;
  static constexpr int kMBytes = D * D * 2;
  static constexpr int kSmemBytes = kQBytes + kMBytes + 2 * D * 4 + kApplyRows * 4;
};

template <int D, int FM>
__global__ void __launch_bounds__(kApplyThreads) linear_apply_kernel(const LinParams p) {
  using T = ApplyTraits<D>;
  constexpr int E = D / 32, kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t sm = sq + T::kQBytes;
  float* ksum_s = reinterpret_cast<float*>(smem + T::kQBytes + T::kMBytes);
  float* bias_s = ksum_s + D;
  float* den_s = bias_s + D;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kApplyRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int valid = p.len - q0;

  load_tile<D, kApplyRows, kApplyThreads>(
      sq, p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + int64_t(q0) * p.qs.token, p.qs.token, valid, tid);
  load_tile<D, D, kApplyThreads>(sm, p.ws.m + bh * D * D, D, D, tid);
  cp_async_commit();
  for (int c = tid; c < D; c += kApplyThreads) {
    ksum_s[c] = p.ws.ksum[bh * D + c];
    bias_s[c] = p.ws.bias[c];
  }
  cp_async_wait<0>();
  __syncthreads();

  // φ(Q) in place for the warp's 16 rows, and each row's denominator.
  for (int r = warp * 16; r < warp * 16 + 16; ++r) {
    float x[E];
    const uint32_t addr = row_addr<D>(sq, r, lane);
    read_row<D>(addr, x);
    feature_map<E, FM>(x);
    round_write_row<D>(addr, x);
    float d = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) d = fmaf(x[e], ksum_s[lane * E + e], d);
    d = warp_sum<E>(d);
    if (lane == 0) den_s[r] = d + 1e-5f;
  }
  __syncwarp();

  float acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    {
      const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldmatrix_x4(a, sq + swizzle<kChunks>(row, ks * 2 + (lane >> 4)));
    }
    mma_rows_times_m<D>(acc, a, sm, ks, lane);
  }

  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
  const float inv0 = 1.f / den_s[r0], inv1 = 1.f / den_s[r1];
  __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    const int col = t * 8 + (lane & 3) * 2;
    if (r0 < valid) {
      auto* ptr = reinterpret_cast<__nv_bfloat162*>(og + int64_t(q0 + r0) * p.os.token + col);
      const float2 old = __bfloat1622float2(*ptr);
      *ptr = __floats2bfloat162_rn(old.x + fmaf(acc[t][0], inv0, bias_s[col]),
                                   old.y + fmaf(acc[t][1], inv0, bias_s[col + 1]));
    }
    if (r1 < valid) {
      auto* ptr = reinterpret_cast<__nv_bfloat162*>(og + int64_t(q0 + r1) * p.os.token + col);
      const float2 old = __bfloat1622float2(*ptr);
      *ptr = __floats2bfloat162_rn(old.x + fmaf(acc[t][2], inv1, bias_s[col]),
                                   old.y + fmaf(acc[t][3], inv1, bias_s[col + 1]));
    }
  }
}

// The Staged variant of linear_apply (SlaLinearKernels::Staged). Same CTA shape
// (128 rows, 8 warps of 16 rows) and the same mma part; what changes:
//   - the o tile (128 x D bf16) is fetched by cp.async in a second group right
//     after Q and M, so its read overlaps φ and the mma instead of following them;
//   - φ(Q): 8 lanes per row (D/8 channels each, whole 16-byte chunks), 4 rows of
//     the warp at once, 3 + 3 shuffles within the 8 lanes (den: the mma, session 7) instead of
//     a warp per row with 5 + 5 (+ 5) shuffles, 16 rows in 4 steps instead of 16;
//   - epilogue: o_s + acc / den + bias formed in the shared o tile (the mma
//     fragment layout, conflict-free in the swizzle), then each warp stores its
//     16 rows as 16-byte chunks (whole 32-byte sectors; the Warp variant's 4-byte
//     read-modify-write of fragments touches each sector twice).
// Shared memory: Q 32 KB + M 32 KB + o 32 KB (D = 128) -> 2 CTAs per SM, as the
// Warp variant's 101 registers already allow.
// Predicted (H200, 1x12x32760, D 128): Q 100 MB + o 100 MB read, o 100 MB
// written, M re-read from L2 (3072 CTAs x 32 KB); at ~3.3 TB/s ~0.09-0.11 ms
// (the Warp variant: 0.27 ms measured).
template <int D>
struct StagedApplyTraits {
  static constexpr int kQBytes = kApplyRows * D * 2;
  static constexpr int kMBytes = D * D * 2;
  static constexpr int kOBytes = kApplyRows * D * 2;
  static constexpr int kSmemBytes = kQBytes + kMBytes + kOBytes + 2 * D * 4 + kApplyRows * 4;
};

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// The den operand of the Q half's mma (den = φ(Q)·Σφ(K) as a ninth 8-column
// block of the φ(Q)·M product, so the φ loop no longer forms it element by
// element): Σφ(K) split into two bf16 columns hi + lo (lo = the rounding error
// of hi: ~16 significant bits between them, fp32 accumulation in the mma).
// hi2 / lo2: D / 2 packed pairs each, in the 4·D bytes `dst` points at.
template <int D>
__device__ __forceinline__ void stage_den_columns(uint32_t* dst, const float* ksum, int tid, int threads) {
  for (int c2 = tid; c2 < D / 2; c2 += threads) {
    const float k0 = ksum[2 * c2], k1 = ksum[2 * c2 + 1];
    const __nv_bfloat162 hi = __floats2bfloat162_rn(k0, k1);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(k0 - __low2float(hi), k1 - __high2float(hi));
    dst[c2] = *reinterpret_cast<const uint32_t*>(&hi);
    dst[D / 2 + c2] = *reinterpret_cast<const uint32_t*>(&lo);
  }
}

// φ over one row held kPer = D/8 values per lane by 8 lanes (a lane group of a
// warp; xor shuffles 1, 2, 4 stay inside the group). FM: 0 softmax, 1 elu+1, 2 relu.
template <int kPer, int FM>
__device__ __forceinline__ void feature_map8(float (&x)[kPer]) {
  if constexpr (FM == 0) {
    float m = x[0];
#pragma unroll
    for (int e = 1; e < kPer; ++e) m = fmaxf(m, x[e]);
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    // exp(x - m) as 2^(x·log2 e - m·log2 e): one FFMA and MUFU.EX2 per element
    // (__expf(x - m) is an FADD, an FMUL and the same MUFU.EX2).
    constexpr float kLog2e = 1.4426950408889634f;
    const float ml = m * kLog2e;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) s += (x[e] = ex2_approx(fmaf(x[e], kLog2e, -ml)));
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float inv = 1.f / s;
#pragma unroll
    for (int e = 0; e < kPer; ++e) x[e] *= inv;
  } else if constexpr (FM == 1) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) x[e] = x[e] > 0.f ? x[e] + 1.f : __expf(x[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kPer; ++e) x[e] = fmaxf(x[e], 0.f);
  }
}

// The Q half's product for the warp's 16 rows of a swizzled Q tile at sq:
// acc = φ(Q)·M (M at sm), d0 / d1 = the denominators of rows lane / 4 and
// lane / 4 + 8 (φ(Q)·Σφ(K) + 1e-5), to every lane of the quad.
// φ(Q) is formed in the mma's A fragments themselves: Q comes from shared
// memory by ldmatrix in the fragment layout (a quad holds a row: 32 values a
// lane), the row max by two quad shuffles, and each k-step's exponentials
// are packed to bf16 right before its mma, so φ(Q) never goes back to shared
// memory (the Staged kernels' former path: ld.shared, φ by 8-lane groups,
// st.shared, ldmatrix; 16.7 K warp instructions per 128-row tile, 29% of the
// warp samples on short-scoreboard stalls, ncu on the H200, session 12).
// Softmax: the 1/Σ of φ cancels between numerator and denominator, so the
// mma takes e = exp(q - max q) unnormalised (rounded to bf16, the row's
// largest 1.0) and s = Σ e (the same rounded values, a ones column of the den
// mma): φ(Q)·M / (φ(Q)·Σφ(K) + 1e-5) = e·M / (e·Σφ(K) + 1e-5·s).
// The shared body: den_b(ks, b0, b1) gives the den mma's B words of k-step ks
// for this lane (column lane / 4 of [hi lo ones 0 ...]); the callers differ
// only in where those words come from.
template <int D, int FM, typename DenB>
__device__ __forceinline__ void phi_q_times_m_with(uint32_t sq, uint32_t sm, int warp, int lane, float (&acc)[D / 8][4],
                                                   float& d0, float& d1, const DenB& den_b) {
  constexpr int kChunks = D / 8, kSteps = D / 16;
  constexpr float kLog2e = 1.4426950408889634f;
  uint32_t qa[kSteps][4];
  {
    const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) ldmatrix_x4(qa[ks], sq + swizzle<kChunks>(row, ks * 2 + (lane >> 4)));
  }
  float ml0 = 0.f, ml1 = 0.f;  // softmax: max · log2 e of rows lane / 4 (a0, a2) and lane / 4 + 8 (a1, a3)
  if constexpr (FM == 0) {
    __nv_bfloat162 h0 = *reinterpret_cast<const __nv_bfloat162*>(&qa[0][0]);
    __nv_bfloat162 h1 = *reinterpret_cast<const __nv_bfloat162*>(&qa[0][1]);
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      if (ks > 0) {
        h0 = __hmax2(h0, *reinterpret_cast<const __nv_bfloat162*>(&qa[ks][0]));
        h1 = __hmax2(h1, *reinterpret_cast<const __nv_bfloat162*>(&qa[ks][1]));
      }
      h0 = __hmax2(h0, *reinterpret_cast<const __nv_bfloat162*>(&qa[ks][2]));
      h1 = __hmax2(h1, *reinterpret_cast<const __nv_bfloat162*>(&qa[ks][3]));
    }
    float m0 = fmaxf(__low2float(h0), __high2float(h0)), m1 = fmaxf(__low2float(h1), __high2float(h1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    ml0 = m0 * kLog2e;
    ml1 = m1 * kLog2e;
  }
  auto phi = [&](float x, float ml) {
    if constexpr (FM == 0) return ex2_approx(fmaf(x, kLog2e, -ml));
    else if constexpr (FM == 1) return x > 0.f ? x + 1.f : __expf(x);
    else return fmaxf(x, 0.f);
  };
  float den[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int t = 0; t < D / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      // bf16 -> f32 is exact (the top half of the float): the shift / mask
      // __bfloat1622float2 compiles to.
      const float ml = (r & 1) ? ml1 : ml0;
      const __nv_bfloat162 e = __floats2bfloat162_rn(phi(__uint_as_float(qa[ks][r] << 16), ml),
                                                     phi(__uint_as_float(qa[ks][r] & 0xffff0000u), ml));
      a[r] = *reinterpret_cast<const uint32_t*>(&e);
    }
    mma_rows_times_m<D>(acc, a, sm, ks, lane);
    uint32_t b0, b1;
    den_b(ks, b0, b1);
    mma_bf16(den, a, b0, b1);
  }
  // Rows lane / 4 (c0, c1) and lane / 4 + 8 (c2, c3): hi + lo in the quad's lane 0, s in lane 1 (column 2).
  const int q0 = lane & ~3;
  d0 = __shfl_sync(0xffffffffu, den[0] + den[1], q0);
  d1 = __shfl_sync(0xffffffffu, den[2] + den[3], q0);
  if constexpr (FM == 0) {
    d0 = fmaf(1e-5f, __shfl_sync(0xffffffffu, den[0], q0 | 1), d0);
    d1 = fmaf(1e-5f, __shfl_sync(0xffffffffu, den[2], q0 | 1), d1);
  } else {
    d0 += 1e-5f;
    d1 += 1e-5f;
  }
}

template <int D, int FM>
__device__ __forceinline__ void phi_q_times_m(uint32_t sq, uint32_t sm, const uint32_t* den_cols, int warp, int lane,
                                              float (&acc)[D / 8][4], float& d0, float& d1) {
  // The den mma's B fragment: column lane / 4 of [hi lo ones 0 ...] (ones for the softmax only).
  const int n = lane >> 2;
  const uint32_t* den_src = n == 0 ? den_cols : den_cols + D / 2;
  constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 1.0 pair
  phi_q_times_m_with<D, FM>(sq, sm, warp, lane, acc, d0, d1, [&](int ks, uint32_t& b0, uint32_t& b1) {
    const int k2 = ks * 8 + (lane & 3);  // pair index of features 16·ks + 2·(lane & 3)
    b0 = n < 2 ? den_src[k2] : (FM == 0 && n == 2) ? kOnes : 0u;
    b1 = n < 2 ? den_src[k2 + 4] : (FM == 0 && n == 2) ? kOnes : 0u;
  });
}

template <int D, int FM>
__global__ void __launch_bounds__(kApplyThreads, 2) linear_apply_staged_kernel(const LinParams p) {
  using T = StagedApplyTraits<D>;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t sm = sq + T::kQBytes;
  const uint32_t so = sm + T::kMBytes;
  uint32_t* den_cols = reinterpret_cast<uint32_t*>(smem + T::kQBytes + T::kMBytes + T::kOBytes);  // hi2, lo2
  float* bias_s = reinterpret_cast<float*>(den_cols + D);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kApplyRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int valid = p.len - q0;
  __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head + int64_t(q0) * p.os.token;

  // Q is the layer's input, written before SageSLA's launch chain began: it
  // loads before the wait (pdl.cuh), beside the tail of the kernel before
  // this one; M, Σφ(K), the bias and o come from the chain.
  load_tile<D, kApplyRows, kApplyThreads>(
      sq, p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + int64_t(q0) * p.qs.token, p.qs.token, valid, tid);
  pdl_wait();
  pdl_launch_dependents();
  load_tile<D, D, kApplyThreads>(sm, p.ws.m + bh * D * D, D, D, tid);
  cp_async_commit();
  load_tile<D, kApplyRows, kApplyThreads>(so, og, p.os.token, valid, tid);
  cp_async_commit();
  for (int c = tid; c < D; c += kApplyThreads) bias_s[c] = p.ws.bias[c];
  stage_den_columns<D>(den_cols, p.ws.ksum + bh * D, tid, kApplyThreads);
  cp_async_wait<1>();  // Q and M landed; o may still be in flight
  __syncthreads();

  float acc[D / 8][4], d0, d1;
  phi_q_times_m<D, FM>(sq, sm, den_cols, warp, lane, acc, d0, d1);

  cp_async_wait<0>();
  __syncthreads();  // the o tile landed (every thread's copies)
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
  const float inv0 = 1.f / d0, inv1 = 1.f / d1;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    const int col = t * 8 + (lane & 3) * 2;
    const uint32_t cb = uint32_t((lane & 3) * 4);
    const uint32_t a0 = so + swizzle<kChunks>(r0, t) + cb, a1 = so + swizzle<kChunks>(r1, t) + cb;
    uint32_t w0, w1;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w0) : "r"(a0));
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w1) : "r"(a1));
    const float2 o0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w0));
    const float2 o1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w1));
    const __nv_bfloat162 n0 = __floats2bfloat162_rn(o0.x + fmaf(acc[t][0], inv0, bias_s[col]),
                                                    o0.y + fmaf(acc[t][1], inv0, bias_s[col + 1]));
    const __nv_bfloat162 n1 = __floats2bfloat162_rn(o1.x + fmaf(acc[t][2], inv1, bias_s[col]),
                                                    o1.y + fmaf(acc[t][3], inv1, bias_s[col + 1]));
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(*reinterpret_cast<const uint32_t*>(&n0)) : "memory");
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1), "r"(*reinterpret_cast<const uint32_t*>(&n1)) : "memory");
  }
  __syncwarp();  // the warp's 16 rows are complete in shared memory
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int idx = i * 32 + lane, rr = idx / kChunks, chunk = idx % kChunks;
    const int row = warp * 16 + rr;
    if (row < valid) {
      uint4 w;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                   : "r"(so + swizzle<kChunks>(row, chunk)));
      *reinterpret_cast<uint4*>(og + int64_t(row) * p.os.token + chunk * 8) = w;
    }
  }
}

// The Staged apply, leaner (linear_apply_warp_copy_kernel, the default of the
// chained and the plain Staged launch since session 14;
// TD_SLA_APPLY=staged128 runs linear_apply_staged_kernel instead, read per
// call). Same CTA (128 rows, 8 warps of 16 rows, 2 CTAs per SM by 98 KB of
// shared memory and <= 128 registers), same bits: every mma takes the same
// operands in the same k-order, the epilogue the same fmaf / add / rounding
// per element; what changes is where the data waits and how many
// instructions move it. ncu of the Staged apply at 1x12x32760 (H200,
// session 14): 104 us, DRAM 56% of peak, issue slots 47% busy, achieved
// occupancy 24%, 1817 warp instructions per warp: the copy prologue 442
// (a 64-bit row multiply and zero-fill selects per 16-byte copy), the den
// operand's loads ~100 (a branch per k-step), the epilogue 622 (4-byte shared
// loads / stores per fragment element); 31% of the stall samples before the
// first barrier (Q / M from DRAM; the bias / Σφ(K) plain loads issued after
// all copies, their STS 6.5% alone).
//   - The tiles of the CTA pf later in launch order (pf = the CTAs the device
//     holds at once, one wave: 264 on the H200) are asked of the L2 after
//     this CTA's own copies: 4 warps its Q rows, 4 its o rows, 32 bytes a
//     lane (prefetch.global.L2, 8 per lane at D 128; the bulk prefetch would
//     take a warp-uniform address, a row per instruction). That CTA starts
//     about when this one ends, so its Q / o come from the L2 while DRAM
//     streams the next wave's under this wave's φ·M and epilogue: with 2
//     CTAs per SM, each load -> compute -> store in turn, DRAM otherwise idles
//     between loads. L2 held for it: a wave of Q + o tiles, 264 x 64 KB =
//     17 MB of 50 MB. A head's last (partial) tile is not prefetched.
//     Measured slower on the H200 (apply_prefetch_ctas): off by default,
//     TD_SLA_APPLY_PF=N or =wave turns it on (read per call).
//   - Q and o copied by warp (each warp its own 16 rows: the o tile waits for
//     a __syncwarp, not a CTA barrier), M by the CTA at constant offsets; row
//     pointers advance by a stride, shared offsets repeat every 8 rows, and
//     full tiles (all but a head's last) skip the row checks.
//   - bias and Σφ(K) as float4 by 2 warps right after the wait, before the
//     copies are issued, so their latency hides behind the issue.
//   - den's B operand from a 4-row table [hi; lo; ones (softmax) or 0; 0],
//     rows 8 words apart in banks (no conflicts): 2 shared loads a k-step,
//     no branch (phi_q_times_m_tab).
//   - epilogue: o by ldmatrix (an x4 = 2 column blocks of the warp's 2 row
//     halves, the accumulators' layout) and the result back by stmatrix at
//     the same addresses: an ldmatrix + an stmatrix per 2 blocks where 4
//     loads + 4 stores were; bf16 -> f32 by a shift or a mask (as exact as cvt).
// Not done: a 64-row tile (3-4 CTAs per SM) reads M (32 KB) once per 64 rows,
// twice the L2 reads of M (200 MB at 1x12x32760, 1.5 GB at 1x40x75600).
// sm_90a, D 128, softmax: 126 registers, no spills (the Staged kernel: 127);
// the elu / relu instances 128 / 127, no spills (Staged: 32 / 12 bytes).
// Warp instructions per warp on the common path (a full tile, SASS): 1249 =
// prologue 330 + φ·M 512 + epilogue 407 (the Staged kernel: 1817 measured).
// Predicted (H200): issue 3072 x 8 x 1249 / (132 SMs x 4 schedulers) = 58 K
// cycles per scheduler = 33 us at 1.76 GHz (48 us before), no longer close to
// the DRAM time: Q 100 MB + o 100 MB read + o 100 MB written = 302 MB, at
// 3.3-3.6 TB/s 0.084-0.092 ms at 1x12x32760 (0.104 under ncu, 0.10-0.12 in
// SageSLA's chain); 2.32 GB at 1x40x75600 (23640 CTAs, 90 waves): 0.65-0.70
// ms (issue 0.25 ms).
template <int D>
struct WarpCopyApplyTraits {
  static constexpr int kQBytes = kApplyRows * D * 2;
  static constexpr int kMBytes = D * D * 2;
  static constexpr int kOBytes = kApplyRows * D * 2;
  static constexpr int kDenStride = D / 2 + 8;  // words per row of the den table
  static constexpr int kDenBytes = 4 * kDenStride * 4;
  static constexpr int kSmemBytes = kQBytes + kMBytes + kOBytes + kDenBytes + D * 4;
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ldmatrix_x4's inverse at the same lane addresses (lanes 8j..8j+7: the rows
// of matrix j; r[j]: the lane's pair of matrix j, row lane / 4, columns
// 2·(lane % 4)). Below sm_90: the same stores one word at a time.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4], int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  (void)lane;
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#else
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t row = __shfl_sync(0xffffffffu, addr, 8 * j + lane / 4) + uint32_t((lane & 3) * 4);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row), "r"(r[j]) : "memory");
  }
#endif
}

// A whole tile's 128 rows (row r at src + r·stride) asked of the L2, 32
// bytes a lane: warp w (of 4) the rows 32w .. 32w + 31, an instruction
// D / 16 sectors of each of 512 / D whole rows. prefetch.global.L2, one
// instruction for 32 sectors: sm_90's bulk prefetch takes a warp-uniform
// address (a row an instruction, in a loop over the lanes' distinct
// addresses: ~300 instructions a warp).
template <int D>
__device__ __forceinline__ void prefetch_tile_l2(const __nv_bfloat16* src, int64_t stride, int warp4, int lane) {
  constexpr int kSectors = D * 2 / 32, kRowsPerOp = 32 / kSectors;
  const char* g =
      reinterpret_cast<const char*>(src + int64_t(warp4 * 32 + lane / kSectors) * stride) + (lane % kSectors) * 32;
  const int64_t gstep = int64_t(kRowsPerOp) * stride * 2;
#pragma unroll
  for (int i = 0; i < 32 / kRowsPerOp; ++i) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(g)));
    g += gstep;
  }
}

// A warp's 16 rows (16·warp ..) of a 128-row swizzled tile, a lane's 16-byte
// chunk `chunk` of rows r, r + kStep, ...: whole 256-byte rows a copy
// instruction (D 128). Rows 8 apart share the swizzle, so the shared
// addresses are kPeriod offsets plus constants.
template <int D>
struct WarpRows {
  static constexpr int kChunks = D / 8, kStep = 32 / kChunks, kSteps = 16 / kStep, kPeriod = 8 / kStep;
  int chunk, r;
  uint32_t s[kPeriod];  // shared offsets (in the tile) of rows r + j·kStep, j < kPeriod
  __device__ __forceinline__ WarpRows(int warp, int lane) : chunk(lane % kChunks), r(warp * 16 + lane / kChunks) {
#pragma unroll
    for (int j = 0; j < kPeriod; ++j) s[j] = swizzle<kChunks>(r + j * kStep, chunk);
  }
  __device__ __forceinline__ uint32_t at(int i) const {  // copy i's offset
    return s[i % kPeriod] + uint32_t((i / kPeriod) * 8 * kChunks * 16);
  }
};

// The warp's rows of a tile from src (row r at src + r·stride); rows at or
// past `valid` zero-filled (their source: row 0). kFull: all 128 rows valid
// (every tile but a head's last), no checks.
template <int D, bool kFull>
__device__ __forceinline__ void load_warp_rows(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid,
                                               const WarpRows<D>& w) {
  using W = WarpRows<D>;
  const __nv_bfloat16* g = src + int64_t(w.r) * stride + w.chunk * 8;
  const int64_t gstep = int64_t(W::kStep) * stride;
#pragma unroll
  for (int i = 0; i < W::kSteps; ++i) {
    const bool ok = kFull || w.r + i * W::kStep < valid;
    cp_async_16(tile + w.at(i), ok ? g : src, ok);
    g += gstep;
  }
}
template <int D>
__device__ __forceinline__ void load_warp_rows(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid,
                                               const WarpRows<D>& w) {
  if (valid >= kApplyRows) load_warp_rows<D, true>(tile, src, stride, valid, w);
  else load_warp_rows<D, false>(tile, src, stride, valid, w);
}

// The inverse: the warp's rows of the tile to dst (rows at or past `valid` not written).
template <int D, bool kFull>
__device__ __forceinline__ void store_warp_rows(uint32_t tile, __nv_bfloat16* dst, int64_t stride, int valid,
                                                const WarpRows<D>& w) {
  using W = WarpRows<D>;
  __nv_bfloat16* g = dst + int64_t(w.r) * stride + w.chunk * 8;
  const int64_t gstep = int64_t(W::kStep) * stride;
#pragma unroll
  for (int i = 0; i < W::kSteps; ++i) {
    if (kFull || w.r + i * W::kStep < valid) {
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(tile + w.at(i)));
      *reinterpret_cast<uint4*>(g) = v;
    }
    g += gstep;
  }
}

// M (bf16 [D, D], rows of D) into a swizzled tile by the whole CTA: a
// thread's rows are 8-aligned apart, so its copies differ by constants.
template <int D>
__device__ __forceinline__ void load_m_tile(uint32_t dst, const __nv_bfloat16* m, int tid) {
  constexpr int kChunks = D / 8, kRowsPerPass = kApplyThreads / kChunks;
  static_assert(kRowsPerPass % 8 == 0 && D % kRowsPerPass == 0, "M copies must keep the swizzle phase");
  const int chunk = tid % kChunks, r = tid / kChunks;
  const uint32_t s = dst + swizzle<kChunks>(r, chunk);
  const __nv_bfloat16* g = m + r * D + chunk * 8;
#pragma unroll
  for (int i = 0; i < D / kRowsPerPass; ++i)
    cp_async_16(s + uint32_t(i * kRowsPerPass * kChunks * 16), g + i * kRowsPerPass * D, true);
}

// phi_q_times_m with the den operand from the 4-row table (den_row: the
// shared address of this lane's row, min(lane / 4, 3), at its column
// lane % 4): b0 / b1 are the words phi_q_times_m selects (hi, lo, ones or 0),
// loaded without a branch, in their k-step (volatile: not hoisted into
// registers the accumulators need). The same mma operands, the same order.
template <int D, int FM>
__device__ __forceinline__ void phi_q_times_m_tab(uint32_t sq, uint32_t sm, uint32_t den_row, int warp, int lane,
                                                  float (&acc)[D / 8][4], float& d0, float& d1) {
  phi_q_times_m_with<D, FM>(sq, sm, warp, lane, acc, d0, d1, [&](int ks, uint32_t& b0, uint32_t& b1) {
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(b0) : "r"(den_row + ks * 32));
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(b1) : "r"(den_row + ks * 32 + 16));
  });
}

// The CTA whose tiles a CTA prefetches, pf CTAs later in launch order, as
// offsets of its grid coordinates: pf = (db·gridDim.y + dh)·gridDim.x + dx,
// dx < gridDim.x, dh < gridDim.y (host-side, so no division here); db < 0: none.
struct ApplyAhead {
  int dx, dh, db;
};

template <int D, int FM>
__global__ void __launch_bounds__(kApplyThreads, 2)
    linear_apply_warp_copy_kernel(const LinParams p, const ApplyAhead pf) {
  using T = WarpCopyApplyTraits<D>;
  constexpr int kChunks = D / 8;
  static_assert(kApplyThreads == 256 && kApplyRows == 128, "the prefetch: 4 warps a tile of 128 rows");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t sm = sq + T::kQBytes;
  const uint32_t so = sm + T::kMBytes;
  uint32_t* den_tab = reinterpret_cast<uint32_t*>(smem + T::kQBytes + T::kMBytes + T::kOBytes);
  float* bias_s = reinterpret_cast<float*>(smem + T::kQBytes + T::kMBytes + T::kOBytes + T::kDenBytes);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kApplyRows, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = int64_t(b) * p.heads + h;
  const int valid = p.len - q0;
  __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head + int64_t(q0) * p.os.token;

  // Q (the layer's input) before the wait, as linear_apply_staged_kernel; the rest after it.
  const WarpRows<D> rows(warp, lane);
  load_warp_rows<D>(sq, p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + int64_t(q0) * p.qs.token,
                    p.qs.token, valid, rows);
  cp_async_commit();
  pdl_wait();
  pdl_launch_dependents();
  const bool stager = warp < 2 && lane < D / 4;  // warp 0: the bias, warp 1: Σφ(K), a float4 a lane
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (stager) v = reinterpret_cast<const float4*>(warp == 0 ? p.ws.bias : p.ws.ksum + bh * D)[lane];
  load_m_tile<D>(sm, p.ws.m + bh * D * D, tid);
  cp_async_commit();
  load_warp_rows<D>(so, og, p.os.token, valid, rows);
  cp_async_commit();
  if (pf.db >= 0) {  // the tiles of the CTA pf later: warps 0-3 its Q rows, warps 4-7 its o rows
    int x = int(blockIdx.x) + pf.dx, hh = h + pf.dh, bb = b + pf.db;
    if (x >= int(gridDim.x)) x -= int(gridDim.x), ++hh;
    if (hh >= int(gridDim.y)) hh -= int(gridDim.y), ++bb;
    const int row0 = x * kApplyRows;
    if (bb < int(gridDim.z) && row0 + kApplyRows <= p.len) {  // a head's last (partial) tile: none
      const bool is_o = warp >= 4;
      const AttnStrides& s = is_o ? p.os : p.qs;
      prefetch_tile_l2<D>((is_o ? p.o : p.q) + int64_t(bb) * s.batch + int64_t(hh) * s.head + int64_t(row0) * s.token,
                          s.token, warp & 3, lane);
    }
  }
  if (stager && warp == 0) {
    reinterpret_cast<float4*>(bias_s)[lane] = v;
  } else if (stager) {  // pairs 2·lane, 2·lane + 1 as stage_den_columns forms them
    const __nv_bfloat162 hi0 = __floats2bfloat162_rn(v.x, v.y), hi1 = __floats2bfloat162_rn(v.z, v.w);
    const __nv_bfloat162 lo0 = __floats2bfloat162_rn(v.x - __low2float(hi0), v.y - __high2float(hi0));
    const __nv_bfloat162 lo1 = __floats2bfloat162_rn(v.z - __low2float(hi1), v.w - __high2float(hi1));
    constexpr uint32_t kFill = FM == 0 ? 0x3F803F80u : 0u;  // row 2: bf16 1.0 pairs for the softmax's s
    auto* row = reinterpret_cast<uint2*>(den_tab) + lane;
    row[0] = make_uint2(*reinterpret_cast<const uint32_t*>(&hi0), *reinterpret_cast<const uint32_t*>(&hi1));
    row[T::kDenStride / 2] =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo0), *reinterpret_cast<const uint32_t*>(&lo1));
    row[T::kDenStride] = make_uint2(kFill, kFill);
    row[3 * T::kDenStride / 2] = make_uint2(0u, 0u);
  }
  cp_async_wait<1>();  // Q and M landed; o may still be in flight
  __syncthreads();

  float acc[D / 8][4], d0, d1;
  const uint32_t den_row = so + T::kOBytes + uint32_t((min(lane >> 2, 3) * T::kDenStride + (lane & 3)) * 4);
  phi_q_times_m_tab<D, FM>(sq, sm, den_row, warp, lane, acc, d0, d1);

  cp_async_wait<0>();
  __syncwarp();  // the warp's 16 o rows landed (its own copies)
  const float inv0 = 1.f / d0, inv1 = 1.f / d1;
  // The thread index afresh (%tid.x): with tid the compiler keeps the Q
  // ldmatrix's swizzled offsets (the same ones) and the copies' row offsets
  // alive through the mma loop, in spilled registers; recomputed here they
  // cost an instruction or two each.
  int etid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(etid));
  const int ewarp = etid / 32, elane = etid % 32;
  {
    const int row = ewarp * 16 + (elane & 7) + ((elane >> 3) & 1) * 8;  // as phi_q_times_m_tab's ldmatrix of Q
    const float* bias_l = bias_s + (elane & 3) * 2;
#pragma unroll
    for (int tp = 0; tp < D / 16; ++tp) {
      // w / n: (row lane/4, block 2tp), (lane/4 + 8, 2tp), (lane/4, 2tp + 1), (lane/4 + 8, 2tp + 1).
      const uint32_t addr = so + swizzle<kChunks>(row, 2 * tp + (elane >> 4));
      uint32_t w[4], n[4];
      ldmatrix_x4(w, addr);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int t = 2 * tp + j;
        const float2 bv = *reinterpret_cast<const float2*>(bias_l + t * 8);
        n[2 * j] = pack_bf16(bf16_lo(w[2 * j]) + fmaf(acc[t][0], inv0, bv.x),
                             bf16_hi(w[2 * j]) + fmaf(acc[t][1], inv0, bv.y));
        n[2 * j + 1] = pack_bf16(bf16_lo(w[2 * j + 1]) + fmaf(acc[t][2], inv1, bv.x),
                                 bf16_hi(w[2 * j + 1]) + fmaf(acc[t][3], inv1, bv.y));
      }
      stmatrix_x4(addr, n, elane);
    }
  }
  __syncwarp();  // the warp's 16 rows are complete in shared memory
  const WarpRows<D> erows(ewarp, elane);
  if (valid >= kApplyRows) store_warp_rows<D, true>(so, og, p.os.token, valid, erows);
  else store_warp_rows<D, false>(so, og, p.os.token, valid, erows);
}

// The persistent variant of linear_apply (SlaLinearKernels::StagedPersist; the
// K/V half is Staged's). Why: the Staged apply runs 2 CTAs of 8 warps per SM
// (96 KB of shared memory each), and each CTA loads Q, M and o, waits, computes,
// stores, exits: an SM's memory pipe idles during φ / mma / the epilogue except
// for what the other CTA has in flight (24% occupancy, short-scoreboard-bound,
// 1.88 TB/s measured at 1x12x32760), and M (32 KB) is fetched again by every CTA
// (23640 CTAs x 32 KB = 775 MB of L2 reads at 1x40x75600). Here one CTA per SM
// walks a contiguous range of 128-row tiles (flat over (b, h, tile): M, Σ φ(K)
// and the bias are loaded once per head in the range), with Q and o of tile i+1
// in flight (cp.async, second stage) while tile i computes. The per-tile work is
// Staged's, operation for operation: the same bits (GPU test
// SlaGpu.LinearApplyPersistEqualsStagedBitForBit).
// Shared memory (D 128): M 32 KB + 2 x (Q 32 KB + o 32 KB) + 1.5 KB = 161.5 KB.
// Predicted (H200 ~3.5 TB/s; Q read, o read + written): 1x12x32760: 302 MB ->
// ~0.09-0.10 ms (Staged 0.154); 1x40x75600: 2.32 GB -> ~0.70-0.75 ms (Staged 1.048).
template <int D>
struct PersistApplyTraits {
  static constexpr int kQBytes = kApplyRows * D * 2;
  static constexpr int kMBytes = D * D * 2;
  static constexpr int kOBytes = kApplyRows * D * 2;
  static constexpr int kStageBytes = kQBytes + kOBytes;
  static constexpr int kSmemBytes = kMBytes + 2 * kStageBytes + 2 * D * 4 + kApplyRows * 4;
};

template <int D, int FM>
__global__ void __launch_bounds__(kApplyThreads, 1) linear_apply_persist_kernel(const LinParams p, int64_t tiles_per_bh,
                                                                                int64_t total_tiles) {
  using T = PersistApplyTraits<D>;
  constexpr int kChunks = D / 8;
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sm = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t stage0 = sm + T::kMBytes;
  uint32_t* den_cols = reinterpret_cast<uint32_t*>(smem + T::kMBytes + 2 * T::kStageBytes);  // hi2, lo2
  float* bias_s = reinterpret_cast<float*>(den_cols + D);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t t_begin = int64_t(blockIdx.x) * total_tiles / gridDim.x;
  const int64_t t_end = int64_t(blockIdx.x + 1) * total_tiles / gridDim.x;

  // Q and o of flat tile `flat` into stage s (one commit group).
  auto issue = [&](int64_t flat, int s) {
    const int64_t bh = flat / tiles_per_bh;
    const int b = int(bh / p.heads), h = int(bh % p.heads), q0 = int(flat % tiles_per_bh) * kApplyRows;
    const uint32_t sq = stage0 + uint32_t(s) * T::kStageBytes;
    load_tile<D, kApplyRows, kApplyThreads>(
        sq, p.q + int64_t(b) * p.qs.batch + int64_t(h) * p.qs.head + int64_t(q0) * p.qs.token, p.qs.token, p.len - q0,
        tid);
    load_tile<D, kApplyRows, kApplyThreads>(
        sq + T::kQBytes, p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head + int64_t(q0) * p.os.token,
        p.os.token, p.len - q0, tid);
  };
  if (t_begin < t_end) issue(t_begin, 0);
  cp_async_commit();
  int64_t cur_bh = -1;
  for (int64_t flat = t_begin; flat < t_end; ++flat) {
    const int s = int((flat - t_begin) & 1);
    const int64_t bh = flat / tiles_per_bh;
    const int b = int(bh / p.heads), h = int(bh % p.heads), q0 = int(flat % tiles_per_bh) * kApplyRows;
    const int valid = p.len - q0;
    if (bh != cur_bh) {  // a new head: its M, Σ φ(K), bias (the last barrier freed them)
      load_tile<D, D, kApplyThreads>(sm, p.ws.m + bh * D * D, D, D, tid);
      for (int c = tid; c < D; c += kApplyThreads) bias_s[c] = p.ws.bias[c];
      stage_den_columns<D>(den_cols, p.ws.ksum + bh * D, tid, kApplyThreads);
      cur_bh = bh;
    }
    cp_async_commit();
    if (flat + 1 < t_end) issue(flat + 1, s ^ 1);  // the stage tile i-1 used, freed by the last barrier
    cp_async_commit();
    cp_async_wait<1>();  // tile i's Q and o (and M) landed
    __syncthreads();
    const uint32_t sq = stage0 + uint32_t(s) * T::kStageBytes, so = sq + T::kQBytes;
    __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head + int64_t(q0) * p.os.token;

    // From here to the store: linear_apply_staged_kernel's tile, unchanged.
    float acc[D / 8][4], d0, d1;
    phi_q_times_m<D, FM>(sq, sm, den_cols, warp, lane, acc, d0, d1);
    const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
    const float inv0 = 1.f / d0, inv1 = 1.f / d1;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      const int col = t * 8 + (lane & 3) * 2;
      const uint32_t cb = uint32_t((lane & 3) * 4);
      const uint32_t a0 = so + swizzle<kChunks>(r0, t) + cb, a1 = so + swizzle<kChunks>(r1, t) + cb;
      uint32_t w0, w1;
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w0) : "r"(a0));
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w1) : "r"(a1));
      const float2 o0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w0));
      const float2 o1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w1));
      const __nv_bfloat162 n0 = __floats2bfloat162_rn(o0.x + fmaf(acc[t][0], inv0, bias_s[col]),
                                                      o0.y + fmaf(acc[t][1], inv0, bias_s[col + 1]));
      const __nv_bfloat162 n1 = __floats2bfloat162_rn(o1.x + fmaf(acc[t][2], inv1, bias_s[col]),
                                                      o1.y + fmaf(acc[t][3], inv1, bias_s[col + 1]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0), "r"(*reinterpret_cast<const uint32_t*>(&n0)) : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1), "r"(*reinterpret_cast<const uint32_t*>(&n1)) : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * kChunks / 32; ++i) {
      const int idx = i * 32 + lane, rr = idx / kChunks, chunk = idx % kChunks;
      const int row = warp * 16 + rr;
      if (row < valid) {
        uint4 w;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                     : "r"(so + swizzle<kChunks>(row, chunk)));
        *reinterpret_cast<uint4*>(og + int64_t(row) * p.os.token + chunk * 8) = w;
      }
    }
    __syncthreads();  // stage s (and M, the den columns and the bias, if the next tile changes head) free again
  }
}

// The Staged variant of kv_partial (SlaLinearKernels::Staged): the same
// chunks, the same mma part and outputs; what changes:
//   - three K/V stages instead of two (tile j+2 loads while j is used: 96 KB of
//     shared memory for D = 128, 2 CTAs per SM as the 128 registers allow anyway);
//   - φ(K) by 8-lane row groups, 4 rows of the warp at once (2 steps per 64-row
//     tile for D = 128 instead of 8 warp-wide rows one after the other, each with
//     10 dependent shuffles); Σφ(K) by one more mma per 16 tokens against ones
//     (session 7; per lane and reduced over the warps before).
// φ's row sums in another order than kv_partial's: last-place differences.
// Predicted (H200, 1x12x32760, D 128): K + V 201 MB read + 1032 x 64 KB of fp32
// partials written (67 MB, re-read by kv_project): ~0.08-0.09 ms at ~3.3 TB/s
// if the φ phase no longer bounds it (kv_partial + kv_project: 0.27 ms measured).
template <int D>
struct StagedKvTraits {
  static constexpr int kThreads = 2 * D;
  static constexpr int kStages = 3;
  static constexpr int kTileBytes = kTile * D * 2;
  static constexpr int kSmemBytes = kStages * 2 * kTileBytes;
};

// kStats: the same pass also makes the SageAttention statistics for SageSLA's
// fused path (sla_linear_prepare_stats_cuda): per chunk Σ raw K and max |V| per
// channel (thread: a channel pair, a quarter of the tile's rows, bf16x2 shared
// loads before φ overwrites K), into part_kraw / part_vmax; kv_project's kStats
// instantiation reduces them into the K mean and the V scales.
//
// kv_partial_staged_row16_kernel: the kernel as it was up to session 13 (warp w:
// feature rows 16w .. 16w + 15 x all D channels), kept for the A/B knob
// TD_SLA_KV_MMA=row16 and SlaGpu.KvPartialPartitionsEqualBitForBit;
// kv_partial_staged_kernel below is the default.
template <int D, int FM, bool kStats = false>
__global__ void __launch_bounds__(StagedKvTraits<D>::kThreads, 2) kv_partial_staged_row16_kernel(const LinParams p) {
  using T = StagedKvTraits<D>;
  constexpr int kThreads = T::kThreads, kWarps = kThreads / 32, kChunks = D / 8;
  constexpr int kPer = D / 8, kLaneChunks = kPer / 8, kRowsPerWarp = kTile / kWarps;
  static_assert(kRowsPerWarp % 4 == 0, "4 rows per warp step");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem));
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 8, sub = lane % 8;
  const int t_begin = chunk * p.chunk_len, t_end = min(p.len, t_begin + p.chunk_len);
  const int n_tiles = (t_end - t_begin + kTile - 1) / kTile;
  const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;
  // Launched plainly (the first kernel of SageSLA's chain); lets the next one launch early.
  pdl_wait();
  pdl_launch_dependents();

  auto stage_of = [&](int j) { return s0 + uint32_t(j % T::kStages) * 2 * T::kTileBytes; };
  auto issue = [&](int j) {
    const uint32_t stage = stage_of(j);
    const int t0 = t_begin + j * kTile, valid = t_end - t0;
    load_tile<D, kTile, kThreads>(stage, kg + int64_t(t0) * p.ks.token, p.ks.token, valid, tid);
    load_tile<D, kTile, kThreads>(stage + T::kTileBytes, vg + int64_t(t0) * p.vs.token, p.vs.token, valid, tid);
  };
  issue(0);
  cp_async_commit();
  if (n_tiles > 1) issue(1);
  cp_async_commit();

  float acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  // Σφ(K) per feature row on the tensor cores: φ(K)ᵀ · ones, one more mma per
  // 16 tokens (the rounded bf16 φ, as the φ(K)ᵀV mma sees them, fp32 sums).
  float ks_acc[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr uint32_t kOnes = 0x3F803F80u;  // bf16 1.0 pair
  // kStats, per warp w and channels 16w .. 16w + 15, from the tile's mma
  // fragments: Σ raw K = Kᵀ·ones on the tensor cores (rows lane / 4 and
  // lane / 4 + 8 of the fragment, as Σφ(K) below), max |V| over the B
  // fragments of V in bf16 pairs (exact: a max of bf16 values; channels
  // 16w + lane / 4 and + 8, reduced over the quad at the end).
  float kraw_acc[4] = {0.f, 0.f, 0.f, 0.f};
  __nv_bfloat162 vmax_lo = __float2bfloat162_rn(0.f), vmax_hi = vmax_lo;

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<1>();  // tile j landed (j + 1 may still be in flight)
    __syncthreads();     // everywhere; and tile j-1's stage, the one j+2 goes to, is free
    if (j + 2 < n_tiles) issue(j + 2);
    cp_async_commit();
    const uint32_t sk = stage_of(j), sv = sk + T::kTileBytes;
    const int valid = t_end - (t_begin + j * kTile);
    if constexpr (kStats) {  // rows past `valid` were zero-filled: they add 0 and max with 0
      constexpr uint32_t kOnes2 = 0x3F803F80u;  // bf16 1.0 pair
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[4], vb[4];
        // raw Kᵀ of channels 16w .. 16w + 15 (the φ(K)ᵀ fragment below, before φ)
        ldmatrix_x4_trans(a, sk + swizzle<kChunks>(kk * 16 + (lane & 7) + (lane >> 4) * 8, warp * 2 + ((lane >> 3) & 1)));
        mma_bf16(kraw_acc, a, kOnes2, kOnes2);
        // V of the same channels (the B fragments of the φ(K)ᵀV mma)
        ldmatrix_x4_trans(vb, sv + swizzle<kChunks>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), warp * 2 + (lane >> 4)));
        vmax_lo = __hmax2(vmax_lo, __hmax2(__habs2(*reinterpret_cast<const __nv_bfloat162*>(&vb[0])),
                                           __habs2(*reinterpret_cast<const __nv_bfloat162*>(&vb[1]))));
        vmax_hi = __hmax2(vmax_hi, __hmax2(__habs2(*reinterpret_cast<const __nv_bfloat162*>(&vb[2])),
                                           __habs2(*reinterpret_cast<const __nv_bfloat162*>(&vb[3]))));
      }
      __syncthreads();  // raw K read everywhere before φ overwrites it
    }

#pragma unroll
    for (int step = 0; step < kRowsPerWarp / 4; ++step) {
      const int r = warp * kRowsPerWarp + step * 4 + g;
      float x[kPer];
#pragma unroll
      for (int u = 0; u < kLaneChunks; ++u) {
        uint4 w;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                     : "r"(sk + swizzle<kChunks>(r, sub * kLaneChunks + u)));
        const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x[u * 8 + 2 * i] = __low2float(v[i]);
          x[u * 8 + 2 * i + 1] = __high2float(v[i]);
        }
      }
      feature_map8<kPer, FM>(x);
      if (r >= valid) {
#pragma unroll
        for (int e = 0; e < kPer; ++e) x[e] = 0.f;
      }
#pragma unroll
      for (int u = 0; u < kLaneChunks; ++u) {
        uint4 w;
        uint32_t* wp = reinterpret_cast<uint32_t*>(&w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(x[u * 8 + 2 * i], x[u * 8 + 2 * i + 1]);
          wp[i] = *reinterpret_cast<const uint32_t*>(&v);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(sk + swizzle<kChunks>(r, sub * kLaneChunks + u)),
                     "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                     : "memory");
      }
    }
    __syncthreads();  // φ(K) rows of every warp written

#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4];
      {
        const int tok = kk * 16 + (lane & 7) + (lane >> 4) * 8;
        const int ch = warp * 2 + ((lane >> 3) & 1);
        ldmatrix_x4_trans(a, sk + swizzle<kChunks>(tok, ch));
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        const int tok = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int ch = dp * 2 + (lane >> 4);
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sv + swizzle<kChunks>(tok, ch));
        mma_bf16(acc[2 * dp], a, vb[0], vb[1]);
        mma_bf16(acc[2 * dp + 1], a, vb[2], vb[3]);
      }
      mma_bf16(ks_acc, a, kOnes, kOnes);
    }
  }
  cp_async_wait<0>();

  const int64_t slot = (int64_t(b) * p.heads + h) * p.n_chunks + chunk;
  float* part = p.ws.part + slot * D * D;
  const int f0 = warp * 16 + lane / 4;
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    const int col = t * 8 + (lane & 3) * 2;
    *reinterpret_cast<float2*>(part + int64_t(f0) * D + col) = make_float2(acc[t][0], acc[t][1]);
    *reinterpret_cast<float2*>(part + int64_t(f0 + 8) * D + col) = make_float2(acc[t][2], acc[t][3]);
  }
  // Σφ(K): every column of ks_acc holds the row sums; lane 4r has rows r, r + 8.
  if ((lane & 3) == 0) {
    p.ws.part_ks[slot * D + f0] = ks_acc[0];
    p.ws.part_ks[slot * D + f0 + 8] = ks_acc[2];
  }
  if constexpr (kStats) {
    // max |V|: a B-fragment register holds 2 tokens of channel lane / 4 (lo) or
    // lane / 4 + 8 (hi); fold the pair, then the 4 lanes of the quad.
    float vm_lo = fmaxf(__low2float(vmax_lo), __high2float(vmax_lo));
    float vm_hi = fmaxf(__low2float(vmax_hi), __high2float(vmax_hi));
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      vm_lo = fmaxf(vm_lo, __shfl_xor_sync(0xffffffffu, vm_lo, off));
      vm_hi = fmaxf(vm_hi, __shfl_xor_sync(0xffffffffu, vm_hi, off));
    }
    if ((lane & 3) == 0) {
      p.ws.part_kraw[slot * D + f0] = kraw_acc[0];
      p.ws.part_kraw[slot * D + f0 + 8] = kraw_acc[2];
      p.ws.part_vmax[slot * D + f0] = vm_lo;
      p.ws.part_vmax[slot * D + f0 + 8] = vm_hi;
    }
  }
}

// The K/V pass's φ(K) of two rows per 8-lane group: rows r and r + 4 of
// kv_partial_staged_row16_kernel's two steps at once (two independent
// dependency chains of shuffles, ex2 and the serial row sums per lane instead
// of one, then the other). In: the rows' bf16 pairs as loaded (kPer / 2 per
// lane and row); out: φ rounded to bf16 pairs as stored, 0 for rows that are
// not `live` (past the tile's valid rows). The same values as feature_map8 +
// the zeroing + the rounding: each lane sums its kPer values in channel order,
// then the row's 8 lanes combine by xor 1, 2 and kX3 (the lane bit that holds
// the third bit of the lane's channel group: 4 as in feature_map8, or 8 where
// the caller spreads a row's lanes for the bank layout: the same tree of
// additions); the max is taken over the bf16 pairs before the conversion (a
// max is exact in any order, and ±0 or NaN differences in it cannot change
// exp(x - max), see below); the softmax's rows past `valid` are zero-filled K
// rows, so their φ is finite (1/D) and times 0 gives the 0 the select gave.
template <int kPer, int FM, int kX3>
__device__ __forceinline__ void kv_phi_rows2(const uint32_t (&w)[2][kPer / 2], const bool (&live)[2],
                                             uint32_t (&out)[2][kPer / 2]) {
  constexpr int kW = kPer / 2;
  auto lo = [](uint32_t u) { return __uint_as_float(u << 16); };         // exact: a bf16 is its float's top half
  auto hi = [](uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); };
  auto pack = [](float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  if constexpr (FM == 0) {
    constexpr float kLog2e = 1.4426950408889634f;
    constexpr int kOff[3] = {1, 2, kX3};
    float m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      __nv_bfloat162 h2 = *reinterpret_cast<const __nv_bfloat162*>(&w[r][0]);
#pragma unroll
      for (int k = 1; k < kW; ++k) h2 = __hmax2(h2, *reinterpret_cast<const __nv_bfloat162*>(&w[r][k]));
      m[r] = fmaxf(__low2float(h2), __high2float(h2));
    }
#pragma unroll
    for (int o = 0; o < 3; ++o)
#pragma unroll
      for (int r = 0; r < 2; ++r) m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], kOff[o]));
    // m = ±0 (or another max of equal value) changes nothing: ml = ±0 only
    // decides the sign of a zero fmaf result, and ex2(±0) = 1.
    float x[2][kPer], s[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float ml = m[r] * kLog2e;
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        s[r] += (x[r][2 * k] = ex2_approx(fmaf(lo(w[r][k]), kLog2e, -ml)));
        s[r] += (x[r][2 * k + 1] = ex2_approx(fmaf(hi(w[r][k]), kLog2e, -ml)));
      }
    }
#pragma unroll
    for (int o = 0; o < 3; ++o)
#pragma unroll
      for (int r = 0; r < 2; ++r) s[r] += __shfl_xor_sync(0xffffffffu, s[r], kOff[o]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = 1.f / s[r] * (live[r] ? 1.f : 0.f);  // exact: 1/s or 0 (no branch around the division)
#pragma unroll
      for (int k = 0; k < kW; ++k) out[r][k] = pack(x[r][2 * k] * inv, x[r][2 * k + 1] * inv);
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x[kPer];
#pragma unroll
      for (int k = 0; k < kW; ++k) x[2 * k] = lo(w[r][k]), x[2 * k + 1] = hi(w[r][k]);
      feature_map8<kPer, FM>(x);
#pragma unroll
      for (int k = 0; k < kW; ++k) out[r][k] = live[r] ? pack(x[2 * k], x[2 * k + 1]) : 0u;
    }
  }
}

// 16 bytes from global (cp_async_16) if ok, else 16 zero bytes by a shared
// store; the address math before it stays unconditional (uniform where it can).
__device__ __forceinline__ void kv_copy_or_zero16(uint32_t dst, const void* src, bool ok) {
  if (ok)
    cp_async_16(dst, src, true);
  else
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u) : "memory");
}

// m = max(m, |a|, |b|) on bf16 pairs: __hmax2 / __habs2's instructions
// (max.bf16x2, abs.bf16x2), as volatile asm so the compiler neither sinks them
// to the loop's end nor keeps the fragments live until there.
__device__ __forceinline__ void kv_absmax_acc(uint32_t& m, uint32_t a, uint32_t b) {
  asm volatile(
      "{\n"
      ".reg .b32 x, y;\n"
      "abs.bf16x2 x, %1;\n"
      "abs.bf16x2 y, %2;\n"
      "max.bf16x2 x, x, y;\n"
      "max.bf16x2 %0, %0, x;\n"
      "}\n"
      : "+r"(m)
      : "r"(a), "r"(b));
}

// base + off as one 64-bit add of a zero-extended 32-bit offset (asm: the
// compiler otherwise folds the offset into 64-bit multiply-adds and keeps it
// as a register pair).
__device__ __forceinline__ const void* kv_at(const char* base, uint32_t off) {
  const void* r;
  asm("{\n"
      ".reg .u64 t;\n"
      "cvt.u64.u32 t, %2;\n"
      "add.u64 %0, %1, t;\n"
      "}\n"
      : "=l"(r)
      : "l"(base), "r"(off));
  return r;
}

// kv_partial_staged_kernel (session 14; the default Staged K/V pass): the
// row16 kernel's work with every mma fed the same fragments in the same k
// order (each element of φ(K)ᵀV, Σφ(K) and Σ K sees k-steps 0-3 of tile 0,
// then of tile 1, ..., each m16n8k16 with the same A and B values; max |V| is
// a max), so the same partials bit for bit (SlaGpu.KvPartialPartitionsEqualBitForBit
// against TD_SLA_KV_MMA=row16). ncu of the row16 kernel on the H200 (session
// 13, 1x12x32760, kStats: 22 chunks x 12 heads = 264 CTAs, 2 per SM): 86.9 µs,
// 2.36 TB/s (49%), 40% of the issue slots, stalls short_scoreboard 37.5% (mma on
// ldmatrix, φ on its shuffles and ex2), wait 19.7%: dependency latency bounds
// it, not DRAM or issue. What changes, and why:
//   - φ(K)ᵀV over a kRG x 2 grid of warps (D = 128: 4 x 2, 32 feature rows x 64
//     channels; D = 64: 2 x 2, 32 x 32) instead of 8 x 1 (16 rows x all D):
//     per 16-token k-step a warp loads 2 A + 4 B fragments instead of 1 + 8
//     (every warp re-read all of V: 8x V traffic), all of them before its 16
//     mma, and ptxas loads the next k-step's while these run. The same 64 fp32
//     accumulators per thread. The ones-mma (Σφ(K)) takes local m-block 0 =
//     2·rg + cg: every m-block once over the warps, one per warp and k-step.
//   - φ of a lane group's two rows r, r + 4 at once (kv_phi_rows2): two
//     independent chains of max, shuffles, 16 ex2, serial row sum and 1/Σ; the
//     row16 kernel's two steps ran one after the other (the first step's
//     st.shared, a memory clobber, kept the second's loads behind it). A row's
//     8 lanes are lanes 0-3 and 8-11 (+4, +16): a quarter warp's 16-byte
//     accesses cover 2 rows of opposite parity, all 32 banks (ncu: the row16
//     layout's LDS.128 / STS.128 took 8 wavefronts for 4: chunks c, c + 8 of a
//     row share banks); the row sum's tree is unchanged (xor 1, 2, then 8 for 4).
//   - the sage statistics from the pass's own work: max |V| from the B
//     fragment of channels 16w (warp w's pair 0) in the mma loop, Σ K's
//     Kᵀ·ones mma (4 ldmatrix + 4 mma per warp and tile) before φ's loads. No
//     separate pass: the barrier it needed moves between φ's arithmetic and its
//     stores (Kᵀ read everywhere before φ overwrites K), so it waits less.
//   - the copies: whole tiles from the row's uniform address + one 32-bit
//     offset per thread, without predicates (the row16 kernel formed 8 64-bit
//     addresses with clamps every tile: 130 of its 653 instructions); rows past
//     the chunk's end zeroed by st.shared (only the last tile of a head).
//   - Σφ(K) / Σ K kept as c0, c2 of their mma (2 registers each, see below):
//     the kStats instance fits 128 registers unspilled.
// Shared memory per 64-token tile and CTA (D = 128; 128-byte wavefronts):
// row16: copies 256 + statistics ldmatrix 8 warps x 8 x 4 = 256 + φ 2 x 16 KB at
// 2x = 512 + mma ldmatrix 8 x 36 x 4 = 1152 = 2176 (272 KB); now 256 + Kᵀ
// 8 x 4 x 4 = 128 + φ 256 + mma 8 x 24 x 4 = 768 = 1408 (176 KB, -35%): 2816
// of the SM's wavefront cycles per tile of each of its two CTAs, was 4352.
// Instructions per warp and whole tile (sm_90a SASS of <128, 0, true>):
// 653 -> 528 (loop + copies 150 -> 67, statistics pass 40 -> 0, φ 331 -> 326 with
// the Kᵀ mma, two chains at once and some address arithmetic ptxas now
// recomputes instead of holding in registers, mma 132 -> 135 with max |V|'s
// 24 and 24 ldmatrix instead of 36); <128, 0, false>: 479. 128 registers,
// no spills, for both (ptxas -v).
// Predicted (H200, 1x12x32760, kStats): from the row16 profile's shares, φ
// 40% at ~0.6 (two chains; ex2 throughput, 34 per warp and tile, bounds it),
// mma 37% at ~0.8, copies / statistics / loop 17% at ~0.4, the rest 6% as it
// is: ~0.67 x 86.9 = ~58 µs of work, so DRAM-bound near its floor (201 MB at
// ~3.3-3.5 TB/s: 57-61 µs): ~60-66 µs, was 86.9.
template <int D, int FM, bool kStats = false>
__global__ void __launch_bounds__(StagedKvTraits<D>::kThreads, 2) kv_partial_staged_kernel(const LinParams p) {
  using T = StagedKvTraits<D>;
  constexpr int kThreads = T::kThreads, kWarps = kThreads / 32, kChunks = D / 8, kRowBytes = D * 2;
  constexpr int kPer = D / 8, kLaneChunks = kPer / 8, kRowsPerWarp = kTile / kWarps;
  constexpr int kRG = kWarps / 2, kNP = kRG;  // warp grid kRG x 2: 32 feature rows x D/2 channels (kNP pairs of n8)
  constexpr int kPassRows = kThreads / kChunks, kPasses = kTile / kPassRows;  // load_tile's rows per pass
  constexpr int kKStep = 16 * kRowBytes;  // bytes per 16-token k-step
  static_assert(kRowsPerWarp % 8 == 0, "two 4-row steps at once");
  static_assert(kNP * 32 == D && kRG * 2 == kWarps, "warp grid");
  // 1024-byte aligned (declared, so guaranteed): the fragment and φ addresses
  // below are formed as (stage base + offset) ^ mask with masks in bits 4-7.
  extern __shared__ __align__(1024) unsigned char kv_smem[];
  const uint32_t s0 = uint32_t(__cvta_generic_to_shared(kv_smem));
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rg = warp % kRG, cg = warp / kRG;
  const int t_begin = chunk * p.chunk_len, t_end = min(p.len, t_begin + p.chunk_len);
  const int n_tiles = (t_end - t_begin + kTile - 1) / kTile;
  const __nv_bfloat16* kg = p.k + int64_t(b) * p.ks.batch + int64_t(h) * p.ks.head;
  const __nv_bfloat16* vg = p.v + int64_t(b) * p.vs.batch + int64_t(h) * p.vs.head;
  // Launched plainly (the first kernel of SageSLA's chain); lets the next one launch early.
  pdl_wait();
  pdl_launch_dependents();

  // cp.async: load_tile's rows and chunks (row lrow + kPassRows·i, chunk
  // lchunk: the same bytes to the same places), each source the pass's
  // (uniform) address + a 32-bit offset per thread (the launch keeps the token
  // strides below 2^26 elements for this kernel); rows past the chunk's end
  // are zeroed by a shared store instead of a zero-filling copy (no global
  // address is read for them, none is clamped).
  const int lrow = tid / kChunks, lchunk = tid % kChunks;
  const uint32_t ldst = swizzle<kChunks>(lrow, lchunk);
  const uint32_t koff = uint32_t(lrow) * uint32_t(p.ks.token) * 2u + uint32_t(lchunk) * 16u;
  const uint32_t voff = uint32_t(lrow) * uint32_t(p.vs.token) * 2u + uint32_t(lchunk) * 16u;
  auto stage_of = [&](int j) { return s0 + uint32_t(j % T::kStages) * 2 * T::kTileBytes; };
  const int64_t kpass = int64_t(kPassRows) * p.ks.token * 2, vpass = int64_t(kPassRows) * p.vs.token * 2;
  auto issue = [&](int j) {
    const uint32_t stage = stage_of(j) + ldst;
    const int t0 = t_begin + j * kTile, valid = t_end - t0;
    const char* kt = reinterpret_cast<const char*>(kg) + int64_t(t0) * p.ks.token * 2;
    const char* vt = reinterpret_cast<const char*>(vg) + int64_t(t0) * p.vs.token * 2;
    if (valid >= kTile) {  // whole tile: 2·kPasses copies back to back
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
        cp_async_16(stage + i * kPassRows * kRowBytes, kv_at(kt + i * kpass, koff), true);
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
        cp_async_16(stage + T::kTileBytes + i * kPassRows * kRowBytes, kv_at(vt + i * vpass, voff), true);
    } else {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const bool ok = lrow < valid - i * kPassRows;
        kv_copy_or_zero16(stage + i * kPassRows * kRowBytes, kv_at(kt + i * kpass, koff), ok);
        kv_copy_or_zero16(stage + T::kTileBytes + i * kPassRows * kRowBytes, kv_at(vt + i * vpass, voff), ok);
      }
    }
  };
  issue(0);
  cp_async_commit();
  if (n_tiles > 1) issue(1);
  cp_async_commit();

  // φ's lanes: 8 per row (sub: channels kPer·sub ..), 4 rows per step (rsel).
  // D = 128: a row's lanes are 0-3 and 8-11 (+4, +16 for the other rows), so
  // each quarter warp's 16-byte accesses hit two rows of opposite parity: 8
  // distinct bank groups (lanes 0-7 on one row: chunks c and c + 8 share
  // banks, 2 wavefronts per quarter warp).
  constexpr int kX3 = kLaneChunks == 2 ? 8 : 4;
  const int sub = kLaneChunks == 2 ? (lane & 3) | ((lane >> 1) & 4) : lane & 7;
  const int rsel = kLaneChunks == 2 ? ((lane >> 2) & 1) | ((lane >> 3) & 2) : lane >> 3;
  // Row r0 = warp·kRowsPerWarp + 8·pp + rsel (and r0 + 4), chunk kLaneChunks·sub + u:
  // r0 & 7 = rsel < 4, so swizzle(r0 + 4t, kLaneChunks·sub + u) =
  // (phi_off + 8·pp·kRowBytes + 4t·kRowBytes) ^ (u << 4) ^ (t << 6).
  const uint32_t phi_off = swizzle<kChunks>(warp * kRowsPerWarp + rsel, sub * kLaneChunks);
  // The mma fragments: a_base + (xor) 32·m-block is the ldmatrix.trans address
  // of m-block m's A (φ(K)ᵀ, or raw Kᵀ) at k-step 0, b_base ^ 32·pair that of
  // V's B for channels 16·pair .. (the chunk index 2·m + lane bit lies in
  // bits 4-7). Warp (rg, cg): A of local m-block i = 2·rg + (i ^ cg) (the
  // ones-mma takes i = 0: every m-block once over the warps); B of local pair
  // q = kNP·cg + (q ^ rg) (q = 0: channels 16·warp, kStats's max |V|).
  const uint32_t a_base = swizzle<kChunks>((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
  const uint32_t b_base = T::kTileBytes + swizzle<kChunks>(((lane >> 3) & 1) * 8 + (lane & 7), lane >> 4);

  float acc[2][2 * kNP][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int t = 0; t < 2 * kNP; ++t) acc[i][t][0] = acc[i][t][1] = acc[i][t][2] = acc[i][t][3] = 0.f;
  // Σφ(K) and Σ K as c0 and c2 of their ones-mma only (rows lane / 4 and
  // lane / 4 + 8; every column holds the same sums): two long-lived registers
  // each instead of four. A tile's four mma run on a 4-register copy
  // {c0, c0, c2, c2}; an mma's c0 / c2 depend on the C values c0 / c2 alone,
  // so the chain of each is the one a 4-register accumulator would carry.
  float ks_acc[2] = {0.f, 0.f};
  float kraw_acc[2] = {0.f, 0.f};
  constexpr uint32_t kOnes4 = 0x3F803F80u;  // bf16 1.0 pair
  uint32_t vmax_lo = 0u, vmax_hi = 0u;  // bf16 pairs, +0

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<1>();  // tile j landed (j + 1 may still be in flight)
    __syncthreads();     // everywhere; and tile j-1's stage, the one j+2 goes to, is free
    if (j + 2 < n_tiles) issue(j + 2);
    cp_async_commit();
    const uint32_t sk = stage_of(j);
    const int valid = t_end - (t_begin + j * kTile);

    if constexpr (kStats) {  // Σ raw K = Kᵀ·ones of channels 16·warp before φ overwrites K (rows past valid: 0)
      const uint32_t kr = (sk + a_base) ^ uint32_t(warp << 5);
      float c4[4] = {kraw_acc[0], kraw_acc[0], kraw_acc[1], kraw_acc[1]};
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, kr + kk * kKStep);
        mma_bf16(c4, a, kOnes4, kOnes4);
      }
      kraw_acc[0] = c4[0];
      kraw_acc[1] = c4[2];
    }
#pragma unroll
    for (int pp = 0; pp < kRowsPerWarp / 8; ++pp) {
      const int r0 = warp * kRowsPerWarp + pp * 8 + rsel;  // and r0 + 4
      const uint32_t ra = sk + phi_off + pp * 8 * kRowBytes;
      auto row_addr = [&](int t, int u) { return (ra + t * 4 * kRowBytes) ^ uint32_t((u << 4) | (t << 6)); };
      uint32_t w[2][kPer / 2];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int u = 0; u < kLaneChunks; ++u)
          asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(w[t][4 * u]), "=r"(w[t][4 * u + 1]), "=r"(w[t][4 * u + 2]), "=r"(w[t][4 * u + 3])
                       : "r"(row_addr(t, u)));
      const bool live[2] = {r0 < valid, r0 + 4 < valid};
      uint32_t o[2][kPer / 2];
      kv_phi_rows2<kPer, FM, kX3>(w, live, o);
      if constexpr (kStats) {
        if (pp == 0) __syncthreads();  // every warp's raw Kᵀ read before any φ row is written
      }
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int u = 0; u < kLaneChunks; ++u)
          asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr(t, u)), "r"(o[t][4 * u]),
                       "r"(o[t][4 * u + 1]), "r"(o[t][4 * u + 2]), "r"(o[t][4 * u + 3])
                       : "memory");
    }
    __syncthreads();  // φ(K) rows of every warp written

    uint32_t aa[2], ba[kNP];
#pragma unroll
    for (int i = 0; i < 2; ++i) aa[i] = (sk + a_base) ^ uint32_t((2 * rg + (i ^ cg)) << 5);
#pragma unroll
    for (int q = 0; q < kNP; ++q) ba[q] = (sk + b_base) ^ uint32_t((kNP * cg + (q ^ rg)) << 5);
    float ks4[4] = {ks_acc[0], ks_acc[0], ks_acc[1], ks_acc[1]};
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[2][4], bq[kNP][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) ldmatrix_x4_trans(a[i], aa[i] + kk * kKStep);
#pragma unroll
      for (int q = 0; q < kNP; ++q) ldmatrix_x4_trans(bq[q], ba[q] + kk * kKStep);
#pragma unroll
      for (int q = 0; q < kNP; ++q)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_bf16(acc[i][2 * q], a[i], bq[q][0], bq[q][1]);
          mma_bf16(acc[i][2 * q + 1], a[i], bq[q][2], bq[q][3]);
        }
      mma_bf16(ks4, a[0], kOnes4, kOnes4);
      if constexpr (kStats) {  // max |V| of channels 16·warp (pair 0; tokens past valid are 0), as the fragments land
        kv_absmax_acc(vmax_lo, bq[0][0], bq[0][1]);
        kv_absmax_acc(vmax_hi, bq[0][2], bq[0][3]);
      }
    }
    ks_acc[0] = ks4[0];
    ks_acc[1] = ks4[2];
  }
  cp_async_wait<0>();

  uint32_t lane_e;  // the lane read again: nothing of it kept live (or spilled) through the loop
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_e));
  const int q4 = int(lane_e & 3);
  const int64_t slot = (int64_t(b) * p.heads + h) * p.n_chunks + chunk;
  float* part = p.ws.part + slot * D * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int f = 16 * (2 * rg + (i ^ cg)) + lane / 4;
#pragma unroll
    for (int q = 0; q < kNP; ++q)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int col = (2 * (kNP * cg + (q ^ rg)) + hh) * 8 + q4 * 2;
        float* dst = part + int64_t(f) * D + col;
        *reinterpret_cast<float2*>(dst) = make_float2(acc[i][2 * q + hh][0], acc[i][2 * q + hh][1]);
        *reinterpret_cast<float2*>(dst + 8 * D) = make_float2(acc[i][2 * q + hh][2], acc[i][2 * q + hh][3]);
      }
  }
  // Σφ(K) of m-block 2·rg + cg: lane 4r has rows r, r + 8.
  if (q4 == 0) {
    const int f = 16 * (2 * rg + cg) + lane / 4;
    p.ws.part_ks[slot * D + f] = ks_acc[0];
    p.ws.part_ks[slot * D + f + 8] = ks_acc[1];
  }
  if constexpr (kStats) {
    // max |V|: a B-fragment register holds 2 tokens of channel lane / 4 (lo) or
    // lane / 4 + 8 (hi); fold the pair, then the 4 lanes of the quad.
    const int f0 = warp * 16 + lane / 4;
    const __nv_bfloat162 lo2 = *reinterpret_cast<const __nv_bfloat162*>(&vmax_lo);
    const __nv_bfloat162 hi2 = *reinterpret_cast<const __nv_bfloat162*>(&vmax_hi);
    float vm_lo = fmaxf(__low2float(lo2), __high2float(lo2));
    float vm_hi = fmaxf(__low2float(hi2), __high2float(hi2));
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      vm_lo = fmaxf(vm_lo, __shfl_xor_sync(0xffffffffu, vm_lo, off));
      vm_hi = fmaxf(vm_hi, __shfl_xor_sync(0xffffffffu, vm_hi, off));
    }
    if (q4 == 0) {
      p.ws.part_kraw[slot * D + f0] = kraw_acc[0];
      p.ws.part_kraw[slot * D + f0 + 8] = kraw_acc[1];
      p.ws.part_vmax[slot * D + f0] = vm_lo;
      p.ws.part_vmax[slot * D + f0 + 8] = vm_hi;
    }
  }
}

// The Staged K/V pass by kv_partial_staged_row16_kernel (the same bits):
// with TD_SLA_KV_MMA=row16 (A/B knob, read per call), and where a token
// stride is outside the 32-bit per-thread offsets of kv_partial_staged_kernel
// (0 <= stride < 2^26 elements; any real layout is far inside).
bool use_kv_row16(const LinParams& p) {
  constexpr int64_t kMaxStride = int64_t(1) << 26;
  if (p.ks.token < 0 || p.ks.token >= kMaxStride || p.vs.token < 0 || p.vs.token >= kMaxStride) return true;
  const char* e = std::getenv("TD_SLA_KV_MMA");
  return e && std::strcmp(e, "row16") == 0;
}

Status launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::Ok;
  return detail::sla_fail(Status::LaunchFailed,
                          std::string("sla_linear_add_cuda: ") + what + " launch failed: " + cudaGetErrorString(e));
}
// The same for a launch that returned its error (launch_pdl).
Status launch_error(cudaError_t launched, const char* what) {
  if (launched == cudaSuccess) return launch_error(what);
  cudaGetLastError();
  return detail::sla_fail(Status::LaunchFailed, std::string("sla_linear_add_cuda: ") + what +
                                                    " launch failed: " + cudaGetErrorString(launched));
}

// What a linear_impl call launches. kPhasePrepare: kv_partial + kv_project
// (all roles); kPhaseApply: linear_apply. SageSLA's fused chain splits the
// projection by kv_project's roles: kPhasePartialStatsFolds (kv_partial with the sage
// statistics + the two statistics folds the quantize pass needs next), then,
// after the block-sparse kernel, kPhaseChainTail (kv_project's M rows and
// Σφ(K) with a late wait, then the apply with Q loaded before its wait; both
// launched as programmatic dependents, pdl.cuh).
constexpr int kPhasePrepare = 1, kPhaseApply = 2, kPhasePartialStatsFolds = 4, kPhaseChainTail = 8;

// SlaLinearKernels::Auto -> Staged (read per call, for A/B runs): 0.38 vs
// 0.54 ms for the whole linear branch at 1x12x32760 and 2.04 vs 3.33 ms at
// 1x40x75600 on the H200 (2026-11-30, bench_sla `linear_staged` vs `linear`,
// GPU tests passed). TD_SLA_LINEAR=warp or TD_SLA_FUSED=0 (the earlier
// pipeline) picks Warp.
bool use_staged_linear(const SlaProblem& p) {
  if (p.linear_kernels != SlaLinearKernels::Auto)
    return p.linear_kernels == SlaLinearKernels::Staged || p.linear_kernels == SlaLinearKernels::StagedPersist;
  const char* apply = std::getenv("TD_SLA_LINEAR");
  if (apply && (std::strcmp(apply, "staged") == 0 || std::strcmp(apply, "persist") == 0)) return true;
  if (apply && std::strcmp(apply, "warp") == 0) return false;
  const char* fused = std::getenv("TD_SLA_FUSED");
  return !(fused && std::strcmp(fused, "0") == 0);
}

// The persistent apply (StagedPersist, or Auto with TD_SLA_LINEAR=persist).
bool use_persist_apply(const SlaProblem& p) {
  if (p.linear_kernels != SlaLinearKernels::Auto) return p.linear_kernels == SlaLinearKernels::StagedPersist;
  const char* apply = std::getenv("TD_SLA_LINEAR");
  return apply && std::strcmp(apply, "persist") == 0;
}

// Which Staged apply (A/B knob, read per call): TD_SLA_APPLY=staged128 ->
// linear_apply_staged_kernel (the default until session 14), else
// linear_apply_warp_copy_kernel.
bool use_staged128_apply() {
  const char* e = std::getenv("TD_SLA_APPLY");
  return e && std::strcmp(e, "staged128") == 0;
}

// linear_apply_warp_copy_kernel's L2 prefetch distance in CTAs: none by
// default (measured on the H200, session 14, four pairs in one call: projection
// + apply 0.109-0.114 ms without against 0.120-0.123 with one wave ahead at
// 1x12x32760, 0.663 against 0.771 at 1x40x75600; the chain 1.177-1.186
// against 1.183-1.190); TD_SLA_APPLY_PF=N prefetches N CTAs ahead, =wave the
// CTAs the device holds at once (SMs x CTAs per SM). Read per call; only the
// timing depends on it.
int64_t apply_prefetch_ctas(const void* kernel, int smem) {
  const char* e = std::getenv("TD_SLA_APPLY_PF");
  if (!e || !*e) return 0;
  if (std::strcmp(e, "wave") != 0) return std::max<int64_t>(0, std::atoll(e));
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kApplyThreads, size_t(smem)) != cudaSuccess) {
    cudaGetLastError();  // not this call's failure to report: run without the prefetch
    return 0;
  }
  return int64_t(sms) * per_sm;
}

// The Staged apply; chained: as a programmatic dependent in SageSLA's chain
// (it then loads Q before its wait, pdl.cuh), else an ordinary launch.
template <int D, int FM>
Status launch_apply_staged(const SlaProblem& sp, const LinParams& p, cudaStream_t st, bool chained) {
  const unsigned blocks = unsigned((sp.len + kApplyRows - 1) / kApplyRows);
  const dim3 grid(blocks, unsigned(sp.heads), unsigned(sp.batch));
  if (use_staged128_apply()) {
    auto kernel = linear_apply_staged_kernel<D, FM>;
    constexpr int smem = StagedApplyTraits<D>::kSmemBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return detail::sla_fail(Status::Unsupported,
                              "sla_linear_add_cuda: cannot raise shared memory to " + std::to_string(smem) + " bytes");
    return launch_error(launch_pdl(chained, kernel, grid, dim3(kApplyThreads), smem, st, p),
                        chained ? "linear_apply_staged (chained)" : "linear_apply_staged");
  }
  auto kernel = linear_apply_warp_copy_kernel<D, FM>;
  constexpr int smem = WarpCopyApplyTraits<D>::kSmemBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return detail::sla_fail(Status::Unsupported,
                            "sla_linear_add_cuda: cannot raise shared memory to " + std::to_string(smem) + " bytes");
  const int64_t total = int64_t(blocks) * sp.heads * sp.batch;
  const int64_t ahead = apply_prefetch_ctas(reinterpret_cast<const void*>(kernel), smem);
  ApplyAhead pf{0, 0, -1};  // none
  if (ahead > 0 && ahead < total) {
    pf.dx = int(ahead % blocks);
    pf.dh = int(ahead / blocks % sp.heads);
    pf.db = int(ahead / blocks / sp.heads);
  }
  return launch_error(launch_pdl(chained, kernel, grid, dim3(kApplyThreads), smem, st, p, pf),
                      chained ? "linear_apply_warp_copy (chained)" : "linear_apply_warp_copy");
}

template <int D, int FM>
Status run(const SlaProblem& sp, const LinParams& p, ElemType proj_type, cudaStream_t st, int phases) {
  const bool with_stats = p.stats.km != nullptr;
  if (phases & kPhaseChainTail) {
    // M rows, Σφ(K) and the bias (the instance without the statistics folds:
    // the same code for these roles), working before their wait; then the apply.
    const dim3 grid(unsigned(D / kProjRows + proj_fold_ctas(false)), unsigned(sp.batch * sp.heads));
    const cudaError_t e =
        proj_type == ElemType::F32
            ? launch_pdl(true, kv_project_rows_kernel<D, float>, grid, dim3(D), 0, st, p, 0, true)
            : launch_pdl(true, kv_project_rows_kernel<D, __nv_bfloat16>, grid, dim3(D), 0, st, p, 0, true);
    if (Status s = launch_error(e, "kv_project_rows (after the sparse kernel)"); s != Status::Ok) return s;
    return launch_apply_staged<D, FM>(sp, p, st, true);
  }
  const bool partial = phases & (kPhasePrepare | kPhasePartialStatsFolds);
  if (partial && (use_staged_linear(sp) || with_stats)) {
    auto kernel = with_stats ? kv_partial_staged_kernel<D, FM, true> : kv_partial_staged_kernel<D, FM>;
    if (use_kv_row16(p))
      kernel = with_stats ? kv_partial_staged_row16_kernel<D, FM, true> : kv_partial_staged_row16_kernel<D, FM>;
    constexpr int smem = StagedKvTraits<D>::kSmemBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return detail::sla_fail(Status::Unsupported, "sla_linear_add_cuda: cannot raise shared memory to " +
                                                       std::to_string(smem) + " bytes");
    kernel<<<dim3(unsigned(p.n_chunks), unsigned(sp.heads), unsigned(sp.batch)), StagedKvTraits<D>::kThreads, smem,
             st>>>(p);
    if (Status s = launch_error("kv_partial_staged"); s != Status::Ok) return s;
  } else if (partial) {
    auto kernel = kv_partial_kernel<D, FM>;
    constexpr int smem = KvTraits<D>::kSmemBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return detail::sla_fail(Status::Unsupported, "sla_linear_add_cuda: cannot raise shared memory to " +
                                                       std::to_string(smem) + " bytes");
    kernel<<<dim3(unsigned(p.n_chunks), unsigned(sp.heads), unsigned(sp.batch)), KvTraits<D>::kThreads, smem, st>>>(
        p);
    if (Status s = launch_error("kv_partial"); s != Status::Ok) return s;
  }
  if (phases & kPhasePartialStatsFolds) {  // with_stats (linear_impl checks): the statistics folds only
    const dim3 grid(unsigned(proj_fold_ctas(true) - proj_fold_ctas(false)), unsigned(sp.batch * sp.heads));
    constexpr int role0 = D / kProjRows + proj_fold_ctas(false);
    const cudaError_t e =
        proj_type == ElemType::F32
            ? launch_pdl(true, kv_project_rows_kernel<D, float, true>, grid, dim3(D), 0, st, p, role0, false)
            : launch_pdl(true, kv_project_rows_kernel<D, __nv_bfloat16, true>, grid, dim3(D), 0, st, p, role0, false);
    return launch_error(e, "kv_project_rows (statistics folds)");
  }
  // kv_project_rows_kernel reduces and projects the K/V partials in every
  // pipeline (it was StagedPersist's alone; the per-row kernel it replaced
  // formed the same sums in the same order: the same bits).
  if (phases & kPhasePrepare) {
    const unsigned bhs = unsigned(sp.batch * sp.heads);
    const dim3 pgrid_stats(unsigned(D / kProjRows + proj_fold_ctas(true)), bhs);
    const dim3 pgrid(unsigned(D / kProjRows + proj_fold_ctas(false)), bhs);
    if (with_stats) {
      if (proj_type == ElemType::F32)
        kv_project_rows_kernel<D, float, true><<<pgrid_stats, D, 0, st>>>(p, 0, false);
      else
        kv_project_rows_kernel<D, __nv_bfloat16, true><<<pgrid_stats, D, 0, st>>>(p, 0, false);
    } else if (proj_type == ElemType::F32) {
      kv_project_rows_kernel<D, float><<<pgrid, D, 0, st>>>(p, 0, false);
    } else {
      kv_project_rows_kernel<D, __nv_bfloat16><<<pgrid, D, 0, st>>>(p, 0, false);
    }
    if (Status s = launch_error("kv_project_rows"); s != Status::Ok) return s;
  }
  if (!(phases & kPhaseApply)) return Status::Ok;
  if (use_persist_apply(sp)) {
    auto kernel = linear_apply_persist_kernel<D, FM>;
    constexpr int smem = PersistApplyTraits<D>::kSmemBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return detail::sla_fail(Status::Unsupported, "sla_linear_add_cuda: cannot raise shared memory to " +
                                                       std::to_string(smem) + " bytes");
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const int64_t tiles_per_bh = (sp.len + kApplyRows - 1) / kApplyRows;
    const int64_t total = tiles_per_bh * sp.batch * sp.heads;
    // One CTA per SM (each tile's bits do not depend on which CTA runs it).
    const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(total, sms > 0 ? sms : 1)));
    kernel<<<grid, kApplyThreads, smem, st>>>(p, tiles_per_bh, total);
    return launch_error("linear_apply_persist");
  }
  if (use_staged_linear(sp)) return launch_apply_staged<D, FM>(sp, p, st, false);
  {
    auto kernel = linear_apply_kernel<D, FM>;
    constexpr int smem = ApplyTraits<D>::kSmemBytes;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
      return detail::sla_fail(Status::Unsupported, "sla_linear_add_cuda: cannot raise shared memory to " +
                                                       std::to_string(smem) + " bytes");
    const unsigned blocks = unsigned((sp.len + kApplyRows - 1) / kApplyRows);
    kernel<<<dim3(blocks, unsigned(sp.heads), unsigned(sp.batch)), kApplyThreads, smem, st>>>(p);
    return launch_error("linear_apply");
  }
}

template <int D>
Status run_fm(const SlaProblem& sp, const LinParams& p, ElemType proj_type, cudaStream_t st, int phases) {
  switch (sp.feature_map) {
    case SlaFeatureMap::Softmax: return run<D, 0>(sp, p, proj_type, st, phases);
    case SlaFeatureMap::Elu: return run<D, 1>(sp, p, proj_type, st, phases);
    case SlaFeatureMap::Relu: return run<D, 2>(sp, p, proj_type, st, phases);
  }
  return detail::sla_fail(Status::InvalidArgument, "sla_linear_add_cuda: unknown feature map");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

size_t sla_linear_workspace_size(const SlaProblem& p) { return carve(p, nullptr).bytes; }

namespace {
Status linear_impl(const SlaProblem& p, const void* q, const void* k, const void* v, const void* proj_weight,
                   const void* proj_bias, ElemType proj_type, void* o, void* workspace, size_t workspace_bytes,
                   void* stream, int phases, const SlaSageStats& stats = {}) {
  using detail::sla_fail;
  if (Status s = sla_check(p); s != Status::Ok) return s;
  if (p.head_dim != 64 && p.head_dim != 128)
    return sla_fail(Status::Unsupported,
                    "sla_linear_add_cuda: head_dim must be 64 or 128, got " + std::to_string(p.head_dim));
  if (proj_type != ElemType::F32 && proj_type != ElemType::BF16)
    return sla_fail(Status::Unsupported, "sla_linear_add_cuda: proj_l must be f32 or bf16");
  if ((phases & (kPhasePrepare | kPhasePartialStatsFolds)) && (!k || !v || !proj_weight || !proj_bias))
    return sla_fail(Status::InvalidArgument, "sla_linear_add_cuda: null K, V or proj_l pointer");
  if ((phases & kPhaseChainTail) && (!proj_weight || !proj_bias))
    return sla_fail(Status::InvalidArgument, "sla_linear_project_apply_cuda: null proj_l pointer");
  if ((phases & kPhasePartialStatsFolds) && !stats.km)
    return sla_fail(Status::InvalidArgument, "sla_linear_prepare_stats_cuda: null statistics pointer");
  if ((phases & (kPhaseApply | kPhaseChainTail)) && (!q || !o))
    return sla_fail(Status::InvalidArgument, "sla_linear_add_cuda: null Q or O pointer");
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(o))
    return sla_fail(Status::Unsupported, "sla_linear_add_cuda: Q, K, V and O must be 16-byte aligned");
  for (const AttnStrides* s : {&p.q, &p.k, &p.v, &p.o})
    if (s->batch % 8 || s->head % 8 || s->token % 8)
      return sla_fail(Status::Unsupported, "sla_linear_add_cuda: strides must be multiples of 8 elements");
  if (p.len > (int64_t(1) << 30) || p.heads > 65535 || p.batch > 65535)
    return sla_fail(Status::Unsupported, "sla_linear_add_cuda: len must be < 2^30 and batch, heads <= 65535");
  const Workspace ws = carve(p, workspace);
  if (!workspace || workspace_bytes < ws.bytes)
    return sla_fail(Status::InvalidArgument, "sla_linear_add_cuda: workspace of " + std::to_string(ws.bytes) +
                                                 " bytes needed, got " + std::to_string(workspace_bytes));
  const Chunking c = chunking(p);
  LinParams lp;
  lp.q = static_cast<const __nv_bfloat16*>(q);
  lp.k = static_cast<const __nv_bfloat16*>(k);
  lp.v = static_cast<const __nv_bfloat16*>(v);
  lp.o = static_cast<__nv_bfloat16*>(o);
  lp.qs = p.q;
  lp.ks = p.k;
  lp.vs = p.v;
  lp.os = p.o;
  lp.proj_w = proj_weight;
  lp.proj_b = proj_bias;
  lp.heads = int(p.heads);
  lp.len = int(p.len);
  lp.chunk_len = int(c.chunk_len);
  lp.n_chunks = int(c.n_chunks);
  lp.ws = ws;
  lp.stats = stats;
  if ((stats.km || stats.vscale || stats.vinv) && !(stats.km && stats.vscale && stats.vinv))
    return sla_fail(Status::InvalidArgument, "sla_linear_prepare_stats_cuda: km, vscale and vinv must all be given");
  const auto st = static_cast<cudaStream_t>(stream);
  return p.head_dim == 64 ? run_fm<64>(p, lp, proj_type, st, phases) : run_fm<128>(p, lp, proj_type, st, phases);
}
}  // namespace

Status sla_linear_add_cuda(const SlaProblem& p, const void* q, const void* k, const void* v, const void* proj_weight,
                           const void* proj_bias, ElemType proj_type, void* o, void* workspace,
                           size_t workspace_bytes, void* stream) {
  return linear_impl(p, q, k, v, proj_weight, proj_bias, proj_type, o, workspace, workspace_bytes, stream,
                     kPhasePrepare | kPhaseApply);
}

Status sla_linear_prepare_cuda(const SlaProblem& p, const void* k, const void* v, const void* proj_weight,
                               const void* proj_bias, ElemType proj_type, void* workspace, size_t workspace_bytes,
                               void* stream) {
  return linear_impl(p, nullptr, k, v, proj_weight, proj_bias, proj_type, nullptr, workspace, workspace_bytes, stream,
                     kPhasePrepare);
}

Status sla_linear_prepare_stats_cuda(const SlaProblem& p, const void* k, const void* v, const void* proj_weight,
                                     const void* proj_bias, ElemType proj_type, const SlaSageStats& stats,
                                     void* workspace, size_t workspace_bytes, void* stream) {
  if (!stats.km || !stats.vscale || !stats.vinv)
    return detail::sla_fail(Status::InvalidArgument, "sla_linear_prepare_stats_cuda: null statistics pointer");
  SlaProblem ps = p;
  // Staged's kv_partial either way (kv_project_rows follows in both).
  ps.linear_kernels = use_persist_apply(p) ? SlaLinearKernels::StagedPersist : SlaLinearKernels::Staged;
  return linear_impl(ps, nullptr, k, v, proj_weight, proj_bias, proj_type, nullptr, workspace, workspace_bytes, stream,
                     stats.defer_projection ? kPhasePartialStatsFolds : kPhasePrepare, stats);
}

Status sla_linear_project_apply_cuda(const SlaProblem& p, const void* q, void* o, const void* proj_weight,
                                     const void* proj_bias, ElemType proj_type, void* workspace,
                                     size_t workspace_bytes, void* stream) {
  return linear_impl(p, q, nullptr, nullptr, proj_weight, proj_bias, proj_type, o, workspace, workspace_bytes, stream,
                     kPhaseChainTail);
}

Status sla_linear_apply_cuda(const SlaProblem& p, const void* q, void* o, void* workspace, size_t workspace_bytes,
                             void* stream) {
  return linear_impl(p, q, nullptr, nullptr, nullptr, nullptr, ElemType::F32, o, workspace, workspace_bytes, stream,
                     kPhaseApply);
}

}  // namespace td::kernels
