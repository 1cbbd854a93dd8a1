// LnQuantBlockPath::RowStats: the block128 fused LayerNorm + AdaLN modulation
// + INT8 quantization as two streaming kernels.
//
// Why: a 128x128 block's scale is the amax of y over 128 rows, and y needs
// each row's statistics, so a stripe must be seen whole before any of its
// codes is written; x has to be read twice or held on chip. Holding it
// failed on the H200: the cluster kernels that keep a stripe in shared memory
// (three designs, sessions 4-9) and a persistent "relay" kernel handing
// statistics and quantization tasks to CTAs in ticket order so that the
// second read hits L2 (session 10: 41-50% of a same-traffic copy) are bound
// by their per-task chains (loads, barriers, cross-CTA waits), as is the
// portable one-CTA-per-stripe kernel (39-45%). Two kernels without any
// dependency inside either one run at the speed of the standalone quantizer:
//
//  1. row statistics: a warp per row, the row in registers (all of a lane's
//     16-byte loads issued first), the exact two-pass mean and centred sum of
//     squares by warp shuffles, (mean, rstd) to the workspace. Reads 2 bytes
//     per element.
//  2. block quantizer: a CTA of 256 threads per 128x128 block, as
//     quantize_block128 (thread t: columns 8 (t % 16).. of rows t / 16 + 16 i,
//     i < 8, all loads first, here cp.async into shared memory), y = fma(fma(x, rstd, -mean * rstd), 1 +
//     scale, shift) from the row statistics and the thread's 8 modulation
//     columns (loaded once when the stripe lies in one sample), the block
//     amax (shuffles, one shared exchange), the scale and its inverse by
//     block128_params_dev (IEEE, as the reference), codes as the low byte of
//     min(bits(fma(y, inv, 1.5 * 2^23)), bits(1.5 * 2^23 + 127)): y * inv
//     rounded half to even and saturated at 127 (|y * inv| <= 128 by
//     construction), packed by PRMT, 8-byte stores. The stripes run last to
//     first, so the first ones it reads are the rows kernel 1 read last and
//     L2 still holds (~50 MB on the H200: a third of x at 32760 x 1536).
//
// HBM traffic: 5 bytes per element against the 3 of one read (x twice, the
// codes once), less what L2 serves: predicted ~60% of a same-traffic copy;
// measured on the H200 56-57% at 32760 x 1536 and 75600 x 5120 (75 / 497 us;
// the portable kernel 44% / 39%), docs/benchmarks.md, session 10.
// Against the reference (fp64 statistics, (x - mean) * rstd, the fp32 product
// rounded, then the code) codes differ by +-1 near rounding ties.
#include "kernels/quant/layernorm_modulate_quant_rowstats.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>

#include "kernels/cp_async.cuh"
#include "kernels/pdl.cuh"
#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;

constexpr int kThreads = 256;
constexpr int kRowsPerCta = kThreads / 32;           // statistics: a warp per row
constexpr int kRowsPerPass = kThreads / 16;          // quantizer: 16 rows per pass of the CTA
constexpr int kPacksPerThread = kQuantGroup / kRowsPerPass;  // 8
constexpr uint32_t kMagicBits = 0x4B400000u;         // bits of 1.5 * 2^23 (ulp 1 from 2^23 to 2^24)

// Kernel 1: (mean, rstd) of rows blockIdx.x * 8 + warp. VPL packs per lane:
// pack p = lane + 32 j of the row.
template <typename T, int VPL>
__global__ void __launch_bounds__(kThreads) ln_row_stats_kernel(LnQuantArgs a, float2* stats) {
  // The quantizer may launch as this grid's CTAs retire (programmatic
  // dependent launch, pdl.cuh): its x loads overlap this kernel's tail, and it
  // waits for this grid's completion before reading the statistics.
  pdl_launch_dependents();
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31u);
  const int64_t r = int64_t(blockIdx.x) * kRowsPerCta + warp;
  if (r >= a.rows) return;
  const int packs = a.dim / 8;
  const T* x = static_cast<const T*>(a.x) + r * a.ld_x;
  Pack8<T> raw[VPL];
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int p = lane + 32 * j;
    raw[j] = p < packs ? load_pack(x + int64_t(p) * 8) : zero_pack<T>();
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    float f[8];
    unpack(raw[j], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) s += f[e];
  }
  const float mean = warp_sum(s) / float(a.dim);
  const float var = warp_sum(centered_square_sum<T, VPL>(raw, lane, 32, packs, mean)) / float(a.dim);
  if (lane == 0) stats[r] = make_float2(mean, __fdiv_rn(1.f, __fsqrt_rn(var + a.eps)));
}

// Codes of 8 values: low bytes of the magic sums, saturated at 127.
__device__ __forceinline__ uint2 codes8(const float (&y)[8], float inv) {
  uint32_t c[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) c[e] = min(__float_as_uint(fmaf(y[e], inv, 12582912.f)), kMagicBits + 127u);
  return make_uint2(__byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410),
                    __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410));
}

// Kernel 2, the work of one block once x is in shared memory and the
// stripe's statistics in s_rs. kFull: all 128 rows and columns of the block
// exist and the stripe lies in one sample (every block but those on a
// ragged edge or across a sample boundary): no per-pack checks, the 8
// rows' statistics and the 8 columns' modulation in registers. (A first
// version with the checks everywhere ran 22.6 instructions per element,
// issue-bound: 67% of issue slots, 50 us at 32760 x 1536.)
template <typename T, bool kFull>
__device__ __forceinline__ void apply_block(const LnQuantArgs& a, const Pack8<T>* s_x, const float2* s_rs,
                                            float* warp_amax, int64_t row_block, int64_t r0, int col,
                                            int64_t rows_left, bool one_sample, int64_t b0) {
  const int tid = int(threadIdx.x);
  auto valid = [&](int i) { return kFull || int64_t(i) * kRowsPerPass < rows_left; };
  float sh[8], sc1[8], rstd[kPacksPerThread], nmr[kPacksPerThread];
  if constexpr (kFull) {
    load_params8(a.shift + b0 * a.ld_mod + col, sh);
    load_params8(a.scale + b0 * a.ld_mod + col, sc1);
#pragma unroll
    for (int e = 0; e < 8; ++e) sc1[e] += 1.f;
#pragma unroll
    for (int i = 0; i < kPacksPerThread; ++i) {
      const float2 rs = s_rs[(tid >> 4) + i * kRowsPerPass];
      rstd[i] = rs.x, nmr[i] = rs.y;
    }
  }
  // y of pack i (row r0 + 16 i).
  auto modulate = [&](int i, float (&y)[8]) {
    float f[8];
    unpack(s_x[i * kThreads + tid], f);
    if constexpr (kFull) {
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = fmaf(fmaf(f[e], rstd[i], nmr[i]), sc1[e], sh[e]);
    } else {
      const float2 rs = s_rs[(tid >> 4) + i * kRowsPerPass];
      const int64_t b = one_sample ? b0 : lnq_sample_of(r0 + i * kRowsPerPass, a.rows_per_batch);
      float s8[8], c8[8];
      load_params8(a.shift + b * a.ld_mod + col, s8);
      load_params8(a.scale + b * a.ld_mod + col, c8);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = fmaf(fmaf(f[e], rs.x, rs.y), 1.f + c8[e], s8[e]);
    }
  };

  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPacksPerThread; ++i) {
    if (valid(i)) {
      float y[8];
      modulate(i, y);
      amax = fmaxf(amax, absmax8(y));
    }
  }
  amax = group_max<32>(amax);
  if ((tid & 31) == 0) warp_amax[tid >> 5] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_amax[w]);
  const QuantParams qp = block128_params_dev(amax);

  int8_t* dst = a.q + r0 * a.ld_q + col;
  const int64_t dst_step = int64_t(kRowsPerPass) * a.ld_q;
#pragma unroll
  for (int i = 0; i < kPacksPerThread; ++i) {
    if (valid(i)) {
      float y[8];
      modulate(i, y);
      *reinterpret_cast<uint2*>(dst + i * dst_step) = codes8(y, qp.inv);
    }
  }
  if (tid == 0) a.scales[row_block * gridDim.x + blockIdx.x] = qp.scale;
}

// Kernel 2: block (row block row_blocks - 1 - blockIdx.y, column block
// blockIdx.x). x goes through shared memory (cp.async, each thread copying
// the 8 packs it later reads, so no barrier for them): the registers hold
// the statistics and modulation instead, 4 CTAs per SM for 16-bit x (64 KB
// of loads in flight per SM at once, then the codes).
template <typename T>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 4 ? 2 : 4)
    ln_quant_block128_apply_kernel(LnQuantArgs a, const float2* __restrict__ stats) {
  extern __shared__ uint4 apply_smem[];  // the packs of x: [i * kThreads + tid]
  Pack8<T>* s_x = reinterpret_cast<Pack8<T>*>(apply_smem);
  __shared__ float2 s_rs[kQuantGroup];
  __shared__ float warp_amax[kThreads / 32];
  const int tid = int(threadIdx.x), l = tid & 15;
  const int64_t row_block = int64_t(gridDim.y) - 1 - blockIdx.y;
  const int64_t r0 = row_block * kQuantGroup + (tid >> 4);  // this thread's first row
  const int col = int(blockIdx.x) * kQuantGroup + l * 8;
  const bool col_ok = col < a.dim;  // dim % 8 == 0: a pack is whole or absent
  const int64_t rows_left = col_ok ? a.rows - r0 : 0;  // pack i valid while 16 i < rows_left
  {
    const T* src = static_cast<const T*>(a.x) + r0 * a.ld_x + col;
    const int64_t src_step = int64_t(kRowsPerPass) * a.ld_x;
#pragma unroll
    for (int i = 0; i < kPacksPerThread; ++i) {
      if (int64_t(i) * kRowsPerPass < rows_left) {
        const uint32_t dst = uint32_t(__cvta_generic_to_shared(s_x + i * kThreads + tid));
        const uint4* g = reinterpret_cast<const uint4*>(src + i * src_step);
#pragma unroll
        for (int k = 0; k < Pack8<T>::kWords; ++k) cp_async_16(dst + 16 * k, g + k);
      }
    }
    cp_async_commit();
  }
  // The stripe's row statistics as (rstd, -mean * rstd), in shared memory
  // (a row's 16 threads read the same entry), once the statistics kernel
  // has completed (a no-op unless launched as its programmatic dependent).
  pdl_wait();
  if (tid < kQuantGroup) {
    const int64_t r = row_block * kQuantGroup + tid;
    const float2 st = r < a.rows ? __ldg(stats + r) : make_float2(0.f, 0.f);
    s_rs[tid] = make_float2(st.y, -st.x * st.y);
  }
  const int64_t stripe_first = row_block * kQuantGroup;
  const int64_t stripe_last = (stripe_first + kQuantGroup < a.rows ? stripe_first + kQuantGroup : a.rows) - 1;
  const int64_t b0 = lnq_sample_of(stripe_first, a.rows_per_batch);
  const bool one_sample = lnq_sample_of(stripe_last, a.rows_per_batch) == b0;
  const bool full = one_sample && stripe_first + kQuantGroup <= a.rows &&
                    (int64_t(blockIdx.x) + 1) * kQuantGroup <= int64_t(a.dim);  // the same in every thread
  cp_async_wait<0>();  // this thread's packs have landed
  __syncthreads();     // s_rs complete
  if (full)
    apply_block<T, true>(a, s_x, s_rs, warp_amax, row_block, r0, col, rows_left, one_sample, b0);
  else
    apply_block<T, false>(a, s_x, s_rs, warp_amax, row_block, r0, col, rows_left, one_sample, b0);
}

// Packs per lane compiled for the statistics kernel (16-bit 1536 -> 6, 2048
// -> 8, 3072 -> 12, 4096 -> 16, 5120 -> 20); a row takes the smallest that
// holds it.
constexpr int kVplChoices[] = {2, 4, 6, 8, 12, 16, 20};

template <typename T, int VPL>
Status launch_stats(const LnQuantArgs& a, float2* stats, cudaStream_t s) {
  const int64_t ctas = (a.rows + kRowsPerCta - 1) / kRowsPerCta;
  ln_row_stats_kernel<T, VPL><<<unsigned(ctas), kThreads, 0, s>>>(a, stats);
  return launch_status();
}

template <typename T>
constexpr size_t apply_smem_bytes() {
  return size_t(kPacksPerThread) * kThreads * sizeof(Pack8<T>);  // 32 KB (16-bit), 64 KB (fp32)
}

constexpr int kMaxDevices = 64;

// The apply kernel's shared-memory opt-in (above 48 KB for fp32 x), set
// once per device.
template <typename T>
bool apply_smem_ready() {
  if constexpr (apply_smem_bytes<T>() <= 48 * 1024) {
    return true;
  } else {
    static std::mutex mu;
    static bool done[kMaxDevices] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    std::lock_guard<std::mutex> lock(mu);
    if (!done[dev])
      done[dev] = cudaFuncSetAttribute(ln_quant_block128_apply_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(apply_smem_bytes<T>())) == cudaSuccess;
    return done[dev];
  }
}

template <typename T>
Status launch(const LnQuantArgs& a, float2* stats, cudaStream_t s) {
  const int vpl_needed = (a.dim / 8 + 31) / 32;
  Status st = Status::Unsupported;
  switch (vpl_needed) {
    case 1: case 2: st = launch_stats<T, 2>(a, stats, s); break;
    case 3: case 4: st = launch_stats<T, 4>(a, stats, s); break;
    case 5: case 6: st = launch_stats<T, 6>(a, stats, s); break;
    case 7: case 8: st = launch_stats<T, 8>(a, stats, s); break;
    case 9: case 10: case 11: case 12: st = launch_stats<T, 12>(a, stats, s); break;
    case 13: case 14: case 15: case 16: st = launch_stats<T, 16>(a, stats, s); break;
    case 17: case 18: case 19: case 20: st = launch_stats<T, 20>(a, stats, s); break;
    default: return Status::Unsupported;
  }
  if (st != Status::Ok) return st;
  const int64_t row_blocks = quant_groups(a.rows), col_blocks = quant_groups(a.dim);
  const dim3 grid{unsigned(col_blocks), unsigned(row_blocks), 1u};
  if (!apply_smem_ready<T>()) return Status::LaunchFailed;
  // sm_90+: overlap with the statistics kernel's tail (TURBODIFF_LNQ_ROWSTATS_PDL=0,
  // or TURBODIFF_PDL=0, launches it plainly, for A/B).
  const char* pdl_env = std::getenv("TURBODIFF_LNQ_ROWSTATS_PDL");
  if (launch_pdl(!(pdl_env && pdl_env[0] == '0'), ln_quant_block128_apply_kernel<T>, grid, dim3(kThreads),
                 apply_smem_bytes<T>(), s, a, static_cast<const float2*>(stats)) != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::LaunchFailed;
  }
  return launch_status();
}

}  // namespace

size_t ln_mod_quant_block128_rowstats_workspace_bytes(int64_t rows) {
  return rows > 0 ? size_t(rows) * sizeof(float2) : 0;
}

Status ln_mod_quant_block128_rowstats_cuda(ElemType x_type, const LnQuantArgs& a, void* workspace,
                                           size_t workspace_bytes, void* stream) {
  static_assert(kVplChoices[sizeof(kVplChoices) / sizeof(kVplChoices[0]) - 1] * 32 * 8 == kLnRowStatsMaxDim);
  if (a.dim > kLnRowStatsMaxDim) return Status::Unsupported;
  if (a.rows == 0) return Status::Ok;
  if (quant_groups(a.rows) > 65535) return Status::Unsupported;  // grid.y
  if (!workspace || !aligned_to(workspace, 16) || workspace_bytes < ln_mod_quant_block128_rowstats_workspace_bytes(a.rows))
    return Status::InvalidArgument;
  auto* stats = static_cast<float2*>(workspace);
  auto s = static_cast<cudaStream_t>(stream);
  switch (x_type) {
    case ElemType::BF16: return launch<__nv_bfloat16>(a, stats, s);
    case ElemType::F16: return launch<__half>(a, stats, s);
    case ElemType::F32: return launch<float>(a, stats, s);
    default: return Status::InvalidArgument;
  }
}

}  // namespace td::kernels
