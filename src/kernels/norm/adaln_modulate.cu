// CUDA adaln_modulate (contract in adaln_modulate.h; fp32 reference in
// adaln_modulate_cpu.cpp): LN without affine, then * (1 + scale[b]) + shift[b].
//
// Design (shared row engine, norm_rows.cuh): as layer_norm, with the
// per-sample scale/shift row (b = row / rows_per_batch: skipped for a single
// sample, else a 32-bit division after the row's loads are issued; a 64-bit
// one up front measured 5% slower) read as fp32 through the read-only cache; all rows of a sample
// share it, so it costs L1/L2 traffic, not HBM. One pass: read x once with
// 16-byte loads into registers, two-pass statistics on the registers, one
// 16-byte store per chunk. Replaces PyTorch's eager fp32 sequence (upcast,
// layer_norm, mul, add, downcast: 5 kernels and ~10 passes over memory).
//
// Bytes moved (bf16 in and out): read x + write y = 4 bytes per element.
// Predicted at 4.0 TB/s:
//   32760 x 1536: 201.3 MB -> 50.3 us   (PyTorch eager fp32 648 us: 12.9x)
//   75600 x 5120: 1548.3 MB -> 387.1 us (PyTorch eager fp32 4883 us: 12.6x)
// Measured (H200, bench_norm, one run): 59.3 us = 85% of copy bandwidth; 426 us = 86%.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/norm_rows.cuh"

namespace td::kernels {
namespace {

// AdaLnRows::Two (variant beside the row engine's kernel, same arithmetic in
// the same order): each thread holds the same chunks of 2 consecutive rows
// (the plan's threads per row and rows per block, each "row slot" now
// owning 2 rows), issues all their loads first, and reads each chunk's fp32
// scale and shift (16 bytes of parameters per 8 elements: 2-4x the L1
// traffic of the bf16 row itself in the one-row kernel) once for both rows
// while they belong to the same sample. Vector path only; the rows must fit
// in 64 registers per thread (bf16/fp16 rows up to 8 chunks per thread,
// fp32 up to 4), else the default kernel runs.
// Predicted: adaln_modulate 83-84% -> ~90% of copy bandwidth (the parameter
// L1 traffic halves and the bytes in flight per thread double).
template <typename XT, typename OutT, int kVPT>
__global__ void __launch_bounds__(gpu::kMaxRowThreads) adaln_two_rows_kernel(const gpu::NormRowsArgs a) {
  using namespace gpu;
  constexpr int R = 2;
  using XIO = ChunkIO<XT, 8>;
  using OIO = ChunkIO<OutT, 8>;
  __shared__ float partials[2 * R * 32];
  const int tpr = int(blockDim.x), lane = int(threadIdx.x);
  const int64_t row0 = (int64_t(blockIdx.x) * blockDim.y + threadIdx.y) * R;
  const int nchunks = a.dim / 8;

  typename XIO::Raw x[R][kVPT];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const bool ok = row0 + i < a.rows;
    const XT* xr = static_cast<const XT*>(a.x) + (ok ? row0 + i : 0) * a.x_stride;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      const int c = lane + k * tpr;
      if (ok && c < nchunks) {
        x[i][k] = XIO::load(xr + c * 8);
      } else {
#pragma unroll
        for (int w = 0; w < XIO::kWords; ++w) x[i][k].w[w] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  // Statistics per row as the row engine computes them (valid chunks only,
  // two passes, row_sum with a distinct partials array per call).
  float mean[R], rstd[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (lane + k * tpr < nchunks) {
        float f[8];
        XIO::unpack(x[i][k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[j];
      }
    mean[i] = row_sum(s, partials + (2 * i) * 32) / float(a.dim);
    float s2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
      if (lane + k * tpr < nchunks) {
        float f[8];
        XIO::unpack(x[i][k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float d = f[j] - mean[i];
          s2 += d * d;
        }
      }
    rstd[i] = rsqrtf(row_sum(s2, partials + (2 * i + 1) * 32) / float(a.dim) + a.eps);
  }
  int64_t mod_off[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t r = row0 + i < a.rows ? row0 + i : a.rows - 1;
    int64_t b = 0;
    if (a.rows_per_batch < a.rows)
      b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
              ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
              : r / a.rows_per_batch;
    mod_off[i] = b * a.mod_stride;
  }
#pragma unroll
  for (int k = 0; k < kVPT; ++k) {
    const int c = lane + k * tpr;
    if (c >= nchunks) continue;
    float sc[8], sh[8];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (row0 + i >= a.rows) continue;
      if (i == 0 || mod_off[i] != mod_off[i - 1]) {
        load_params<8>(a.scale + mod_off[i] + c * 8, sc);
        load_params<8>(a.shift + mod_off[i] + c * 8, sh);
      }
      float o[8];
      XIO::unpack(x[i][k], o);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = (o[j] - mean[i]) * rstd[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] *= 1.f + sc[j];
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] += sh[j];
      OIO::store(static_cast<OutT*>(a.out) + (row0 + i) * a.out_stride + c * 8, OIO::pack(o));
    }
  }
}

// AdaLnRows::Teams (variant beside the two above): the persistent warp-team
// layout of layernorm_modulate_quant's WarpTeams kernel applied to the bf16
// output. The profile of the default (H200, 32760 x 1536) shows 32-thread
// CTAs, ~22 instructions per element, occupancy capped by the 32 resident
// CTAs per SM, and the fp32 scale/shift re-read through L1 for every row.
// Here:
//  * 256-thread CTAs, one wave of them (SMs x resident CTAs), each over a
//    contiguous run of rows; a row belongs to a team of 1, 2 or 4 warps
//    (1536: 1 warp x 6 chunks per lane; 4096: 2 x 8 -> 4 x 4; 5120: 4 x 5),
//    so 2 CTAs = 16 warps per SM regardless of the per-SM CTA limit;
//  * the CTA's sample's (1 + scale) and shift staged once in shared memory
//    (zero past the row; rows of another sample, only in a CTA whose run
//    crosses a sample boundary, read them from global memory);
//  * statistics by shuffles (multi-warp teams: each warp's (sum, M2)
//    combined once through shared memory by Chan's formula, one named
//    barrier per row instead of two __syncthreads).
// Per element the same operations as the row engine: (x - mean) * rstd,
// then * (1 + scale), then + shift, rstd = rsqrtf(var + eps); only the
// statistics' summation order differs (ulp-level in mean/rstd, so an output
// may differ from the default's by one bf16 ulp; the tests' bars hold).
// Vector path, x and y of the same type, dim <= 6144 (staged parameters <=
// 48 KB); otherwise the default kernel runs.
// Counted per bf16 element: unpack 1, sum 1, centered square 2, normalise 2,
// modulate 2, pack 0.5, LDS 0.5, LDG/STG 0.25, per-row ~1: ~10 against ~35
// available at 4 TB/s (4 bytes per element): issue well below the HBM
// limit, and the in-flight bytes (16 warps x 3 KB) cover the latency.
// Predicted: 90-94% of copy at both Wan shapes (from 84-86%), if the
// default's gap is the per-CTA overhead and L1 parameter traffic, as the
// profile suggests (issue 62%, DRAM 68% of peak, L1 hit 66%).
constexpr int kTeamCtaThreads = 256;
constexpr int kTeamMaxWarps = 4;
constexpr int kTeamMaxDim = 6144;
constexpr int kTeamSmemOptIn = 64 * 1024;

__device__ __forceinline__ int team_chunks_of_warp(int w, int threads, int nchunks, int vpt) {
  int n = 0;
  for (int k = 0; k < vpt; ++k) {
    const int left = nchunks - (w * 32 + k * threads);
    n += left <= 0 ? 0 : (left > 32 ? 32 : left);
  }
  return n;
}

__device__ __forceinline__ float team_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 3 CTAs (24 warps, ~72 KB of loads in flight at 1536) per SM where the
// registers allow it without spills (16-bit rows of <= 6 chunks per lane in
// one warp: 85 registers), else 2.
template <typename T, int kVPT, bool kMultiWarp>
__global__ void __launch_bounds__(kTeamCtaThreads, (!kMultiWarp && sizeof(T) == 2 && kVPT <= 6) ? 3 : 2)
    adaln_team_kernel(const gpu::NormRowsArgs a, int team_warps_arg, int64_t rows_per_cta) {
  using IO = gpu::ChunkIO<T, 8>;
  const int team_warps = kMultiWarp ? team_warps_arg : 1;
  const int slots = 32 * team_warps * kVPT;  // chunk slots of a team; parameters zero-padded to slots * 8
  extern __shared__ float4 adaln_param_words[];
  float* const sc1_s = reinterpret_cast<float*>(adaln_param_words);  // 1 + scale (1 without scale)
  float* const sh_s = sc1_s + slots * 8;                              // shift (0 without shift)
  __shared__ float2 partials[2][kTeamCtaThreads / 32];                // (sum, M2) per warp, by row parity
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31u);
  const int threads = team_warps * 32, teams = kTeamCtaThreads / threads;
  const int team = warp / team_warps, wt = warp % team_warps, t = wt * 32 + lane;
  const int first_warp = team * team_warps;
  const int nchunks = a.dim / 8;
  const int64_t r_begin = int64_t(blockIdx.x) * rows_per_cta;
  if (r_begin >= a.rows) return;  // uniform over the CTA, before any barrier
  const int64_t r_end = a.rows - r_begin < rows_per_cta ? a.rows : r_begin + rows_per_cta;
  auto param_offset = [&](int64_t r) -> int64_t {
    if (a.rows_per_batch >= a.rows) return 0;
    const int64_t b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
                          ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
                          : r / a.rows_per_batch;
    return b * a.mod_stride;  // mod_stride 0: one row for all samples
  };
  const int64_t cta_off = param_offset(r_begin);
  for (int i = int(threadIdx.x); i < slots * 2; i += kTeamCtaThreads) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f), h = s;
    if (i < a.dim / 4) {
      s = a.scale ? __ldg(reinterpret_cast<const float4*>(a.scale + cta_off) + i) : s;
      s.x = 1.f + s.x, s.y = 1.f + s.y, s.z = 1.f + s.z, s.w = 1.f + s.w;  // the engine's 1.f + s
      if (a.shift) h = __ldg(reinterpret_cast<const float4*>(a.shift + cta_off) + i);
    }
    reinterpret_cast<float4*>(sc1_s)[i] = s;
    reinterpret_cast<float4*>(sh_s)[i] = h;
  }
  __syncthreads();
  const int my_elems = 8 * team_chunks_of_warp(wt, threads, nchunks, kVPT);
  const T* const x = static_cast<const T*>(a.x);
  T* const out = static_cast<T*>(a.out);

  int parity = 0;
#pragma unroll 1  // one row at a time (registers)
  for (int64_t r = r_begin + team; r < r_end; r += teams, parity ^= 1) {
    typename IO::Raw raw[kVPT];
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      const int c = t + k * threads;
      if (c < nchunks) {
        raw[k] = IO::load(x + r * a.x_stride + c * 8);
      } else {
#pragma unroll
        for (int w = 0; w < IO::kWords; ++w) raw[k].w[w] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    float f[kVPT][8];
#pragma unroll
    for (int k = 0; k < kVPT; ++k) IO::unpack(raw[k], f[k]);

    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k)
#pragma unroll
      for (int j = 0; j < 8; ++j) s += f[k][j];
    s = team_warp_sum(s);
    const float warp_mean = my_elems > 0 ? s / float(my_elems) : 0.f;
    float m2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      float pm = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = f[k][j] - warp_mean;
        pm += d * d;
      }
      m2 += t + k * threads < nchunks ? pm : 0.f;  // one select per chunk, not a branch
    }
    m2 = team_warp_sum(m2);
    float mean, var;
    if (!kMultiWarp) {
      mean = warp_mean;  // the warp holds the whole row
      var = m2 / float(a.dim);
    } else {
      if (lane == 0) partials[parity][warp] = make_float2(s, m2);
      asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "r"(threads) : "memory");
      float2 pw[kTeamMaxWarps];
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kTeamMaxWarps; ++w)
        if (w < team_warps) pw[w] = partials[parity][first_warp + w], total += pw[w].x;
      mean = total / float(a.dim);
      float m2_all = 0.f;
#pragma unroll
      for (int w = 0; w < kTeamMaxWarps; ++w) {
        if (w < team_warps) {
          const int n = 8 * team_chunks_of_warp(w, threads, nchunks, kVPT);
          if (n > 0) {
            const float d = pw[w].x / float(n) - mean;
            m2_all += fmaf(float(n) * d, d, pw[w].y);
          }
        }
      }
      var = m2_all / float(a.dim);
    }
    const float rstd = rsqrtf(var + a.eps);

    const int64_t off = param_offset(r);
    T* const orow = out + r * a.out_stride;
    if (off == cta_off) {
#pragma unroll
      for (int k = 0; k < kVPT; ++k) {
        const int c = t + k * threads;
        const float4* s4 = reinterpret_cast<const float4*>(sc1_s + c * 8);
        const float4* h4 = reinterpret_cast<const float4*>(sh_s + c * 8);
        const float4 s0 = s4[0], s1 = s4[1], h0 = h4[0], h1 = h4[1];
        const float sc1[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
        const float sh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        float o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = (f[k][j] - mean) * rstd * sc1[j] + sh[j];  // as the engine: contracted to an FMA
        if (c < nchunks) IO::store(orow + c * 8, IO::pack(o));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVPT; ++k) {
        const int c = t + k * threads;
        if (c < nchunks) {
          float sc1[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f}, sh[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          if (a.scale) {
            gpu::load_params<8>(a.scale + off + c * 8, sc1);
#pragma unroll
            for (int j = 0; j < 8; ++j) sc1[j] = 1.f + sc1[j];
          }
          if (a.shift) gpu::load_params<8>(a.shift + off + c * 8, sh);
          float o[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) o[j] = (f[k][j] - mean) * rstd * sc1[j] + sh[j];  // as the engine: contracted to an FMA
          IO::store(orow + c * 8, IO::pack(o));
        }
      }
    }
  }
}

// Team shape for rows of `nchunks` 8-element chunks: team_warps in {1, 2, 4},
// chunks per lane in {4, 5, 6, 8} (5: 5120 = 4 warps x 5 with no idle lane;
// fp32 at most 4, 8 registers per chunk), fewest idle slots first, then
// fewer warps (no barrier). vpt 0 where no team fits.
gpu::RowPlan plan_adaln_team(int nchunks, bool f32) {
  static constexpr int kVpts[] = {4, 5, 6, 8};
  gpu::RowPlan best;
  best.vpt = 0;
  int best_idle = -1;
  for (int tw : {1, 2, 4}) {
    for (int v : kVpts) {
      if (f32 && v > 4) continue;
      const int slots = 32 * tw * v;
      if (slots < nchunks) continue;
      const int idle = slots - nchunks;
      if (best_idle < 0 || idle < best_idle) best_idle = idle, best.vpt = v, best.tpr = 32 * tw;
      break;
    }
  }
  return best;
}

// Resident CTAs per SM x SMs (one whole wave), cached per (device, kernel,
// shared memory): a launch must not pay for the query.
int adaln_team_grid_limit(const void* kernel, size_t smem) {
  struct Entry {
    const void* kernel;
    int dev;
    size_t smem;
    int ctas;
  };
  static std::mutex mu;
  static Entry cache[32];
  static int used = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < used; ++i)
    if (cache[i].kernel == kernel && cache[i].dev == dev && cache[i].smem == smem) return cache[i].ctas;
  int sms = 0, per_sm = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTeamSmemOptIn) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTeamCtaThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int ctas = sms * (per_sm < 1 ? 1 : per_sm);
  if (used < int(sizeof(cache) / sizeof(cache[0]))) cache[used++] = Entry{kernel, dev, smem, ctas};
  return ctas;
}

template <typename T, int kVPT>
Status launch_adaln_team(const gpu::NormRowsArgs& a, int team_warps, cudaStream_t stream) {
  auto kernel = team_warps > 1 ? adaln_team_kernel<T, kVPT, true> : adaln_team_kernel<T, kVPT, false>;
  const size_t smem = size_t(2) * size_t(32 * team_warps * kVPT * 8) * sizeof(float);
  const int limit = adaln_team_grid_limit(reinterpret_cast<const void*>(kernel), smem);
  if (limit <= 0) return Status::LaunchFailed;
  const int64_t teams = kTeamCtaThreads / (32 * team_warps);
  int64_t ctas = (a.rows + teams - 1) / teams;
  if (ctas > limit) ctas = limit;
  const int64_t rows_per_cta = (a.rows + ctas - 1) / ctas;
  ctas = (a.rows + rows_per_cta - 1) / rows_per_cta;
  kernel<<<unsigned(ctas), kTeamCtaThreads, smem, stream>>>(a, team_warps, rows_per_cta);
  return gpu::launch_status();
}

// The variant AdaLnRows::Auto means: TURBODIFF_ADALN_ROWS=2|teams (read per
// call, for A/B in benchmarks), else the one-row default.
AdaLnRows resolve_rows(AdaLnRows v) {
  if (v != AdaLnRows::Auto) return v;
  const char* e = std::getenv("TURBODIFF_ADALN_ROWS");
  if (e != nullptr && std::strcmp(e, "2") == 0) return AdaLnRows::Two;
  if (e != nullptr && std::strcmp(e, "teams") == 0) return AdaLnRows::Teams;
  return AdaLnRows::One;
}

template <typename XT, typename OutT>
Status launch_two_rows(const gpu::NormRowsArgs& a, const gpu::RowPlan& plan, cudaStream_t stream) {
  using namespace gpu;
  constexpr int kWords = ChunkIO<XT, 8>::kWords;
  const int64_t rows_per_block = int64_t(plan.rpb) * 2;
  const int64_t blocks = (a.rows + rows_per_block - 1) / rows_per_block;
  if (blocks > int64_t(INT32_MAX)) return Status::InvalidArgument;
  const dim3 grid{unsigned(blocks)};
  const dim3 block{unsigned(plan.tpr), unsigned(plan.rpb)};
  auto go = [&](auto vpt) -> Status {
    constexpr int V = decltype(vpt)::value;
    if constexpr (2 * V * kWords <= 16) {
      adaln_two_rows_kernel<XT, OutT, V><<<grid, block, 0, stream>>>(a);
      return launch_status();
    } else {
      return launch_norm_rows<NormKind::Layer, false, XT, XT, OutT>(a, plan, stream);
    }
  };
  if (plan.vpt == 4) return go(std::integral_constant<int, 4>{});
  if (plan.vpt == 6) return go(std::integral_constant<int, 6>{});
  if (plan.vpt == 8) return go(std::integral_constant<int, 8>{});
  return launch_norm_rows<NormKind::Layer, false, XT, XT, OutT>(a, plan, stream);
}

}  // namespace

Status adaln_modulate_cuda(const void* x, ElemType x_type, int64_t x_stride,
                           void* y, ElemType y_type, int64_t y_stride,
                           const float* scale, const float* shift, int64_t mod_stride, int64_t rows_per_batch,
                           int64_t rows, int64_t dim, float eps, void* stream, AdaLnRows rows_per_thread) {
  if (Status s = adaln_modulate_check(x, x_type, x_stride, y, y_type, y_stride, mod_stride, rows_per_batch,
                                      rows, dim, eps);
      s != Status::Ok)
    return s;
  if (rows == 0) return Status::Ok;
  using namespace gpu;
  const bool vectorized = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && mod_stride % 4 == 0 &&
                          aligned16(x) && aligned16(y) && aligned16(scale) && aligned16(shift);
  RowPlan plan;
  if (!plan_rows(dim, vectorized, &plan)) return Status::Unsupported;
  NormRowsArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.out = y;
  a.out_stride = y_stride;
  a.scale = scale;
  a.shift = shift;
  a.mod_stride = mod_stride;
  a.rows_per_batch = rows_per_batch;
  a.rows = rows;
  a.dim = int(dim);
  a.eps = eps;
  const auto cs = static_cast<cudaStream_t>(stream);
  const AdaLnRows variant = resolve_rows(rows_per_thread);
  const bool two_rows = plan.chunk == 8 && variant == AdaLnRows::Two;
  if (variant == AdaLnRows::Teams && plan.chunk == 8 && x_type == y_type && dim <= kTeamMaxDim) {
    const RowPlan team = plan_adaln_team(int(dim / 8), x_type == ElemType::F32);
    if (team.vpt > 0) {
      return act_type_dispatch(x_type, [&](auto xt) {
        using XT = typename decltype(xt)::type;
        const int tw = team.tpr / 32;
        if (team.vpt == 4) return launch_adaln_team<XT, 4>(a, tw, cs);
        if (team.vpt == 5) return launch_adaln_team<XT, 5>(a, tw, cs);
        if (team.vpt == 6) return launch_adaln_team<XT, 6>(a, tw, cs);
        return launch_adaln_team<XT, 8>(a, tw, cs);
      });
    }
  }  // other shapes and mixed types: the default kernel
  return act_type_dispatch(x_type, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    return act_type_dispatch(y_type, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      if (two_rows) return launch_two_rows<XT, YT>(a, plan, cs);
      return launch_norm_rows<NormKind::Layer, false, XT, XT, YT>(a, plan, cs);
    });
  });
}

}  // namespace td::kernels
