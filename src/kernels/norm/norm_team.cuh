// The persistent warp-team row kernel (a variant beside norm_rows.cuh's
// engine, chosen per op: AdaLnRows::Teams, NormRowsKernel::Teams for
// layer_norm / rms_norm): 256-thread CTAs, one wave of them (SMs x resident
// CTAs), each over a contiguous run of rows; a row belongs to a team of 1, 2
// or 4 warps (1536: 1 warp x 6 chunks of 8 per lane; 3072: 2 x 6; 4096:
// 2 x 8; 5120: 4 x 5; 6144: 4 x 6), so a CTA holds 2-8 rows at once and the
// per-SM limit of 32 resident CTAs (which caps the engine's 32-thread CTAs at
// half occupancy) does not bind. The per-column multiplier and addend (1 +
// scale and shift of the CTA's sample for adaln_modulate, weight and bias
// for layer_norm, weight for rms_norm) are staged once per CTA in shared
// memory, zero-padded to the team's slots (so idle lanes need no tests), and
// read with 16-byte LDS instead of per-row __ldg through L1. Statistics: the
// exact two-pass variance inside a warp by shuffles; multi-warp teams combine
// their warps' (sum, M2) once through shared memory by Chan's formula (RMS:
// the sums of squares), one named barrier per row. Per element the engine's
// operations in the engine's order (((x - mean) * rstd) * m + a, contracted
// to an FMA as there; rstd = rsqrtf); only the statistics' summation order
// differs, so an output may differ from the engine's by one ulp of its type.
// Vector path with x and y of one type and dim <= 6144 (<= 48 KB of staged
// parameters); the callers run the engine otherwise.
#pragma once

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/norm/norm_variant.h"

#include "kernels/norm/norm_rows.cuh"

namespace td::kernels::gpu {

// NormRowsKernel::Auto -> TURBODIFF_NORM_KERNEL=teams|cta64|cta128 (read per
// call, for A/B in benchmarks), else Rows.
inline NormRowsKernel resolve_norm_rows_kernel(NormRowsKernel k) {
  if (k != NormRowsKernel::Auto) return k;
  const char* e = std::getenv("TURBODIFF_NORM_KERNEL");
  if (e == nullptr) return NormRowsKernel::Rows;
  if (std::strcmp(e, "teams") == 0) return NormRowsKernel::Teams;
  if (std::strcmp(e, "cta64") == 0) return NormRowsKernel::Cta64;
  if (std::strcmp(e, "cta128") == 0) return NormRowsKernel::Cta128;
  return NormRowsKernel::Rows;
}

// The row engine's CTA size for a resolved variant (Cta64 / Cta128: several
// one-warp rows per CTA; everything else the engine's default).
inline int engine_block_threads(NormRowsKernel k) {
  return k == NormRowsKernel::Cta64 ? 64 : k == NormRowsKernel::Cta128 ? 128 : kRowBlockThreads;
}

// What the staged vectors hold.
enum class TeamParams {
  Modulation,  // adaln_modulate: m = 1 + scale[b], a = shift[b] (per sample; rows of another sample read global)
  LayerAffine, // layer_norm: m = weight, a = bias
  RmsWeight,   // rms_norm: m = weight, no mean
};

inline constexpr int kTeamCtaThreads = 256;
inline constexpr int kTeamMaxWarps = 4;
inline constexpr int kTeamMaxDim = 6144;
inline constexpr int kTeamSmemOptIn = 64 * 1024;

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

// Resident CTAs per SM asked of the compiler, the most without spills
// (ptxas -v, sm_90a): 16-bit rows of <= 6 chunks per lane in one warp fit
// 64 registers for RMS (4 CTAs = 32 warps, as many rows in flight per SM as
// the engine's 32 one-warp CTAs, ~96 KB of loads at 1536) and 80 for
// LayerNorm / modulation (3 CTAs, 24 warps: at 64 they spill 56 / 92 bytes;
// the compiler keeps the unpacked row in registers across the passes);
// multi-warp teams and fp32 rows: 2 (<= 128 registers).
template <TeamParams kParams, typename T, int kVPT, bool kMultiWarp>
constexpr int team_min_ctas() {
  if (kMultiWarp || sizeof(T) != 2 || kVPT > 6) return 2;
  return kParams == TeamParams::RmsWeight ? 4 : 3;
}

template <TeamParams kParams, typename T, int kVPT, bool kMultiWarp>
__global__ void __launch_bounds__(kTeamCtaThreads, team_min_ctas<kParams, T, kVPT, kMultiWarp>())
    norm_team_kernel(const NormRowsArgs a, int team_warps_arg, int64_t rows_per_cta) {
  constexpr bool kRms = kParams == TeamParams::RmsWeight;
  constexpr bool kModulate = kParams == TeamParams::Modulation;
  using IO = ChunkIO<T, 8>;
  const int team_warps = kMultiWarp ? team_warps_arg : 1;
  const int slots = 32 * team_warps * kVPT;  // chunk slots of a team; parameters zero-padded to slots * 8
  extern __shared__ float4 team_param_words[];
  float* const sc1_s = reinterpret_cast<float*>(team_param_words);  // multiplier: 1 + scale, or weight (1 without)
  float* const sh_s = sc1_s + slots * 8;                              // addend: shift, or bias (0 without)
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
    if (!kModulate || a.rows_per_batch >= a.rows) return 0;  // weight / bias: one row for all
    const int64_t b = (r <= int64_t(UINT32_MAX) && a.rows_per_batch <= int64_t(UINT32_MAX))
                          ? int64_t(uint32_t(r) / uint32_t(a.rows_per_batch))
                          : r / a.rows_per_batch;
    return b * a.mod_stride;  // mod_stride 0: one row for all samples
  };
  const int64_t cta_off = param_offset(r_begin);
  for (int i = int(threadIdx.x); i < slots * 2; i += kTeamCtaThreads) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f), h = s;
    if (i < a.dim / 4) {
      if constexpr (kModulate) {
        s = a.scale ? __ldg(reinterpret_cast<const float4*>(a.scale + cta_off) + i) : s;
        s.x = 1.f + s.x, s.y = 1.f + s.y, s.z = 1.f + s.z, s.w = 1.f + s.w;  // the engine's 1.f + s
        if (a.shift) h = __ldg(reinterpret_cast<const float4*>(a.shift + cta_off) + i);
      } else {
        s = a.weight ? __ldg(reinterpret_cast<const float4*>(a.weight) + i) : make_float4(1.f, 1.f, 1.f, 1.f);
        if (!kRms && a.bias) h = __ldg(reinterpret_cast<const float4*>(a.bias) + i);
      }
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
    // The row as loaded; each pass unpacks it (the compiler may keep the
    // unpacked values instead, see team_min_ctas).
    auto f = [&](int k, int j) {
      float v[8];
      IO::unpack(raw[k], v);
      return v[j];
    };

    float s = 0.f;
    if constexpr (!kRms) {
#pragma unroll
      for (int k = 0; k < kVPT; ++k)
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f(k, j);
      s = team_warp_sum(s);
    }
    // RMS: no mean (the squares of the raw values; invalid chunks are zeros).
    const float warp_mean = !kRms && my_elems > 0 ? s / float(my_elems) : 0.f;
    float m2 = 0.f;
#pragma unroll
    for (int k = 0; k < kVPT; ++k) {
      float pm = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float d = f(k, j) - warp_mean;
        pm += d * d;
      }
      m2 += t + k * threads < nchunks ? pm : 0.f;  // one select per chunk, not a branch
    }
    m2 = team_warp_sum(m2);
    float mean, var;
    if (!kMultiWarp) {
      mean = warp_mean;  // the warp holds the whole row
      var = m2 / float(a.dim);
    } else if (kRms) {
      if (lane == 0) partials[parity][warp] = make_float2(0.f, m2);
      asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "r"(threads) : "memory");
      float total = 0.f;
      for (int w = 0; w < team_warps; ++w) total += partials[parity][first_warp + w].y;
      mean = 0.f;
      var = total / float(a.dim);
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
        for (int j = 0; j < 8; ++j) o[j] = (f(k, j) - mean) * rstd * sc1[j] + sh[j];  // as the engine: contracted to an FMA
        if (c < nchunks) IO::store(orow + c * 8, IO::pack(o));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVPT; ++k) {
        const int c = t + k * threads;
        if (c < nchunks) {  // modulation of another sample than the staged one (kModulate only)
          float sc1[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f}, sh[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          if (a.scale) {
            load_params<8>(a.scale + off + c * 8, sc1);
#pragma unroll
            for (int j = 0; j < 8; ++j) sc1[j] = 1.f + sc1[j];
          }
          if (a.shift) load_params<8>(a.shift + off + c * 8, sh);
          float o[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) o[j] = (f(k, j) - mean) * rstd * sc1[j] + sh[j];  // as the engine: contracted to an FMA
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
inline RowPlan plan_team_rows(int nchunks, bool f32) {
  static constexpr int kVpts[] = {4, 5, 6, 8};
  RowPlan best;
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
inline int team_grid_limit(const void* kernel, size_t smem) {
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

template <TeamParams kParams, typename T, int kVPT>
Status launch_norm_team(const NormRowsArgs& a, int team_warps, cudaStream_t stream) {
  auto kernel = team_warps > 1 ? norm_team_kernel<kParams, T, kVPT, true> : norm_team_kernel<kParams, T, kVPT, false>;
  const size_t smem = size_t(2) * size_t(32 * team_warps * kVPT * 8) * sizeof(float);
  const int limit = team_grid_limit(reinterpret_cast<const void*>(kernel), smem);
  if (limit <= 0) return Status::LaunchFailed;
  const int64_t teams = kTeamCtaThreads / (32 * team_warps);
  int64_t ctas = (a.rows + teams - 1) / teams;
  if (ctas > limit) ctas = limit;
  const int64_t rows_per_cta = (a.rows + ctas - 1) / ctas;
  ctas = (a.rows + rows_per_cta - 1) / rows_per_cta;
  kernel<<<unsigned(ctas), kTeamCtaThreads, smem, stream>>>(a, team_warps, rows_per_cta);
  return launch_status();
}

}  // namespace td::kernels::gpu
