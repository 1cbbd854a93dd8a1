// LnQuantTokenRows::Columns: the token128 fused LayerNorm + AdaLN modulation
// + INT8 quantization with threads that own columns rather than rows.
//
// Why: every row-owner kernel of layernorm_modulate_quant.cu (a row per CTA,
// per warp, per warp pair, with or without a shared-memory ring) stops at
// 60-84% of a same-traffic copy on the H200, with no unit saturated; an L2
// prefetch of the rows ahead (cp.async.bulk.prefetch, 2026-11-30) did not
// move them, so they are not waiting on HBM but on their own dependent
// chains: per row and warp two shuffle trees for the statistics, a shuffle
// tree and an IEEE division pair per 128-group, the fp32 shift / scale of
// every column loaded again for every row (or row pair), ~19-22
// instructions per element.
//
// Design: a CTA of dim / (8 V) threads processes R rows at a time (a "row
// block"); thread t owns packs t + j * threads (j < V; 8 columns each) of
// every row of the block (Wan: 1536 columns -> 96 threads x 2 packs x 4
// rows; 5120 -> 160 threads x 4 packs x 2 rows; kConfigs). So:
//  * x arrives through a ring of S row blocks in shared memory filled by
//    cp.async: each thread copies exactly the 16-byte packs it later reads
//    itself (no barrier for the data), S - 1 blocks ahead, so loads stay in
//    flight while a block is computed; the CTAs are persistent (as many as
//    fit), striding over the row blocks;
//  * statistics, two-pass as the reference (row sums, then sums of squares
//    about the row means): each thread's partial of each of its R rows, a
//    transposed butterfly over the warp (at each halving step a lane keeps
//    half of its rows and receives its partner's partials of that half:
//    R - 1 + log2(32 / R) shuffles for R rows instead of 5 R), the warps'
//    partials through shared memory (one barrier per statistic and block),
//    then every warp adds them in the same fixed order (identical results
//    in all warps, no second barrier);
//  * y = fma(fma(x, rstd, -mean * rstd), 1 + scale, shift), rstd by
//    MUFU.RSQ: the shift / scale of a thread's columns are loaded once per
//    row block (R rows), not once per row;
//  * a 128-column group is 16 consecutive threads of one pack slot; the
//    group maxima of the R x V (row, slot) pairs are one transposed
//    butterfly over the 16 lanes, after which each lane holds one (row,
//    group) maximum and derives its scale (a product by 1/127) and inverse
//    (an approximate quotient, within 2 ulp), one shuffle per (row, slot)
//    brings the inverses back;
//  * codes: fma(y, inv, 1.5 * 2^23) rounds y * inv to the nearest integer
//    (ties to even) in the low bits of the sum, which PRMT packs: one FFMA
//    per code instead of a product and a conversion (F2I.S8 runs at 16 per
//    SM and clock on the H200). The exact product is rounded once here,
//    where the reference rounds the fp32 product and then the code.
// Per bf16 element: unpack 1, sum 1, centered square 2, y 2, |y| max 1,
// codes 1.75, plus the per-row and per-block work (shuffles, barriers,
// copies' and stores' addresses) over R x V x 8 = 64 elements per thread;
// the sm_90a SASS of an R = 8, V = 1 build counted ~19 instructions per
// element on the main path (the pair kernels: 19-22), so the gain is less
// the count than the independence: R rows' chains interleaved, loads
// decoupled from the compute by the ring.
// Not bit-identical to the other kernels (y's and the codes' rounding,
// rstd, inverses within 2 ulp): codes within +-1 near ties and scales
// within the tests' 2e-5, as for the pair kernels.
#include "kernels/quant/layernorm_modulate_quant_columns.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kernels/cp_async.cuh"
#include "kernels/quant/ln_quant_columns_reduce.cuh"
#include "kernels/quant/quant_device.cuh"

namespace td::kernels {
namespace {

using namespace qdev;
using namespace lnq;

constexpr int kMaxThreads = int(kLnColumnsMaxDim / 8);  // 640
constexpr int kMaxWarps = kMaxThreads / 32;

template <typename T, int R, int V, int S, int kThreadsBound, int kMinBlocks>
__global__ void __launch_bounds__(kThreadsBound, kMinBlocks) ln_mod_quant_token128_columns_kernel(LnQuantArgs a) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  static_assert(R >= 1 && R <= 8 && (R & (R - 1)) == 0, "R a power of two <= 8");
  static_assert((V == 1 || V == 2 || V == 4) && R * V <= 16, "1, 2 or 4 packs per thread and row");
  constexpr int RV = R * V;
  extern __shared__ uint4 ring[];                // [S][R][V][threads] packs
  __shared__ float part[4][R][kMaxWarps];        // warp partials: [statistic + 2 * (block parity)]
  const int t = int(threadIdx.x), threads = int(blockDim.x);
  const int lane = t & 31, nwarps = threads >> 5;
  const int64_t grid = gridDim.x;
  const bool one_sample = a.rows_per_batch >= a.rows;
  const float inv_dim = 1.f / float(a.dim);  // mean and variance by a product (within an ulp of the quotient)

  // Copies of row block rb into ring slot s: this thread's packs of each row
  // (pointer steps, 32-bit shared addresses: the copies' addressing is per row).
  const T* xt = static_cast<const T*>(a.x) + 8 * t;
  const uint32_t ring_t = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + 16u * uint32_t(t);
  const uint32_t pack_row_bytes = 16u * uint32_t(threads);  // one slot j of one row
  auto issue = [&](int64_t rb, int s) {
    const int64_t r0 = rb * R;
    if (r0 < a.rows) {
      const T* src = xt + r0 * a.ld_x;
      uint32_t dst = ring_t + uint32_t(s) * pack_row_bytes * RV;
      const int left = a.rows - r0 < R ? int(a.rows - r0) : R;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i < left) {
#pragma unroll
          for (int j = 0; j < V; ++j) cp_async_16(dst + j * pack_row_bytes, src + j * 8 * threads);
        }
        dst += V * pack_row_bytes;
        src += a.ld_x;
      }
    }
    cp_async_commit();  // empty groups too: the wait below counts groups
  };
#pragma unroll
  for (int k = 0; k < S - 1; ++k) issue(blockIdx.x + k * grid, k);

  int s = 0, parity = 0;
  for (int64_t rb = blockIdx.x; rb * R < a.rows; rb += grid) {
    issue(rb + (S - 1) * grid, s == 0 ? S - 1 : s - 1);  // the slot read in the previous block
    cp_async_wait<S - 1>();                              // this block's group has landed
    const uint4* slot = ring + s * RV * threads + t;
    float v[R][V][8];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < V; ++j) {
        Pack8<T> p;
        p.w[0] = slot[(i * V + j) * threads];
        unpack(p, v[i][j]);
      }
    s = s + 1 == S ? 0 : s + 1;

    // Two-pass statistics (the reference's algorithm): row sums, then the
    // sums of squares about the row means.
    float acc[R];
    row_pack_sums<R, V>(v, acc);
    const float mean_l = cta_row_sum<R>(acc, part[2 * parity], nwarps) * inv_dim;  // of row lane % R
    float mean[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      mean[i] = __shfl_sync(0xffffffffu, mean_l, i);
      float c = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = v[i][j][e] - mean[i];
          c = fmaf(d, d, c);
        }
      acc[i] = c;
    }
    const float var_l = cta_row_sum<R>(acc, part[2 * parity + 1], nwarps) * inv_dim;
    const float rstd_l = rsqrtf(var_l + a.eps);  // MUFU.RSQ: within 2 ulp of 1 / sqrt
    parity ^= 1;

    // y in place of x: fma(fma(x, rstd, -mean * rstd), 1 + scale, shift),
    // and each (row, pack) |y| maximum over this thread's 8 columns.
    const int64_t r0 = rb * R;
    const int left = int(a.rows - r0 < R ? a.rows - r0 : R);
    float rs[R], bs[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      rs[i] = __shfl_sync(0xffffffffu, rstd_l, i);
      bs[i] = -mean[i] * rs[i];
    }
    float am[RV];
    auto modulate = [&](int i, int j, const float* sh_row, const float* sc_row) {
      float sh[8], sc[8];
      load_params8(sh_row + 8 * (t + j * threads), sh);
      load_params8(sc_row + 8 * (t + j * threads), sc);
      float m = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[i][j][e] = fmaf(fmaf(v[i][j][e], rs[i], bs[i]), 1.f + sc[e], sh[e]);
        m = fmaxf(m, fabsf(v[i][j][e]));
      }
      am[i * V + j] = m;
    };
    if (one_sample) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        // One slot's 16 parameters live at a time (hoisted, V slots' would
        // take 16 V registers).
        asm volatile("" ::: "memory");
#pragma unroll
        for (int i = 0; i < R; ++i) modulate(i, j, a.shift, a.scale);
      }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int64_t b = lnq_sample_of(i < left ? r0 + i : r0, a.rows_per_batch);
#pragma unroll
        for (int j = 0; j < V; ++j) modulate(i, j, a.shift + b * a.ld_mod, a.scale + b * a.ld_mod);
      }
    }

    // Group maxima over the 16 lanes of each 128-column group (a pack slot's
    // 16 consecutive threads); the lane holding (row, slot) derives its scale
    // and inverse and stores the scale.
    const int k = transposed_reduce<RV, 16>(am, [](float x, float y) { return fmaxf(x, y); });
    // amax / 127 and 127 / amax by a product and an approximate quotient
    // (within 2 ulp of the IEEE ones; the codes' one rounding is looser);
    // a group below 2^-100 is a zero group, as in symmetric_params_dev.
    const bool zero_group = !(am[0] >= kSymAmaxMin);
    const QuantParams qp{zero_group ? 0.f : am[0] * (1.f / kSymQuantRange),
                         zero_group ? 0.f : __fdividef(kSymQuantRange, am[0])};
    {
      const int ki = k / V, kj = k % V;
      if ((lane & (16 / RV - 1)) == 0 && ki < left)
        a.scales[int64_t((t + kj * threads) >> 4) * a.ld_scales + r0 + ki] = qp.scale;
    }

    // Codes: the low byte of fma(y, inv, 1.5 * 2^23) is round(y * inv) in
    // two's complement (|y * inv| <= 127 by construction).
    int8_t* qrow = a.q + r0 * a.ld_q + 8 * t;
#pragma unroll
    for (int i = 0; i < R; ++i, qrow += a.ld_q) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float inv = __shfl_sync(0xffffffffu, qp.inv, (lane & 16) | lane_of_row<RV, 16>(i * V + j));
        uint32_t c[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) c[e] = __float_as_uint(fmaf(v[i][j][e], inv, 12582912.f));
        const uint2 codes =
            make_uint2(__byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410),
                       __byte_perm(__byte_perm(c[4], c[5], 0x0040), __byte_perm(c[6], c[7], 0x0040), 0x5410));
        if (i < left) *reinterpret_cast<uint2*>(qrow + 8 * j * threads) = codes;
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the CTA
}

// A compiled configuration: rows per block R, packs per thread and row V,
// ring depth S, the threads per CTA and CTAs per SM that the register budget
// is set for (__launch_bounds__). Measured on the H200 (2026-11-30,
// bench_quant_rope, fraction of a same-traffic copy; sweeps over
// TURBODIFF_LNQ_COLUMNS_CFG, each configuration in 1-3 runs):
//   32760 x 1536: (4, 2, 2) 94.9-98.5% (96 threads, 167 registers);
//                 (8, 1, 2) 93.2-93.8%; (8, 1, 3) 91.3%; (4, 1, 3) 81.7-82.8%.
//   75600 x 5120: (2, 4, 2) 85.8-87.1% (160 threads, 128 registers, 3 CTAs
//                 per SM); (4, 1, 3) 79.2-84.2%; (4, 2, 2) 83.5-83.8%;
//                 (4, 1, 4) 79.2-82.2%; (2, 4, 3) and (2, 4, 4) at 2 CTAs
//                 per SM 74-79%; (2, 2, 3/4) 76%; (1, 4, 3/4) 60-65%;
//                 (2, 4, 2) bounded to 4 CTAs per SM (spills) 68%.
// Measured and dropped: a variant that read x again from the ring in each
// pass instead of holding it in registers (64-112 registers, up to 5 CTAs
// per SM): 58.6-65.4% at 5120.
// The pair kernels (PairRowsReload) ran 81.6-84.6% / 65.9-67.1% in the same
// runs.
struct Config {
  int rows, packs, stages, threads_bound, min_blocks;
};
constexpr Config kConfigs[] = {{4, 2, 2, 320, 1}, {2, 4, 2, 160, 3}, {8, 1, 2, 256, 2}, {4, 1, 3, 640, 1}};
constexpr int kNumConfigs = int(sizeof(kConfigs) / sizeof(kConfigs[0]));

template <typename T, int I>
auto kernel_of() {
  constexpr Config c = kConfigs[I];
  return ln_mod_quant_token128_columns_kernel<T, c.rows, c.packs, c.stages, c.threads_bound, c.min_blocks>;
}

// Whether configuration c takes rows of `dim` columns: dim / (8 packs)
// threads, a multiple of 32, within the register budget's bound.
bool config_takes(const Config& c, int64_t dim) {
  const int64_t per_thread = 8 * int64_t(c.packs);
  return dim % (32 * per_thread) == 0 && dim / per_thread <= c.threads_bound;
}

// The configuration for a row width: TURBODIFF_LNQ_COLUMNS_CFG="R,V,S" (read
// per call, for A/B in benchmarks) if it names a compiled one that takes the
// rows, else the default below.
int config_for(int64_t dim) {
  if (const char* e = std::getenv("TURBODIFF_LNQ_COLUMNS_CFG")) {
    int r = 0, v = 0, st = 0;
    if (std::sscanf(e, "%d,%d,%d", &r, &v, &st) == 3)
      for (int i = 0; i < kNumConfigs; ++i)
        if (kConfigs[i].rows == r && kConfigs[i].packs == v && kConfigs[i].stages == st && config_takes(kConfigs[i], dim))
          return i;
  }
  // (2, 4, 2) from 4096 columns (measured at 5120), (4, 2, 2) below it
  // (measured at 1536), then the configurations that take every multiple of
  // 256 up to 2048 / 5120 (dims not a multiple of 512 or 1024).
  if (dim >= 4096 && config_takes(kConfigs[1], dim)) return 1;
  for (int i : {0, 2, 3})
    if (config_takes(kConfigs[i], dim)) return i;
  return -1;
}

constexpr int kMaxDevices = 64;

// CTAs per SM of configuration I for a row width, asked once per (type,
// configuration, device, threads) and cached: a launch must not pay for
// the query. The kernel's shared-memory opt-in is set once, to what its
// widest row needs (capped by the device, less its static shared memory).
template <typename T, int I>
int resident_ctas(int dev, int threads, size_t smem, size_t smem_widest) {
  static std::mutex mu;
  static int cached[kMaxDevices][kMaxThreads / 32 + 1] = {};
  static size_t opted_in[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  int& c = cached[dev][threads / 32];
  if (c == 0) {
    c = -1;
    const auto kernel = kernel_of<T, I>();
    if (opted_in[dev] == 0) {
      int optin = 0;
      cudaFuncAttributes attr{};
      if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
          cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && size_t(optin) > attr.sharedSizeBytes) {
        const size_t want = std::min(smem_widest, size_t(optin) - attr.sharedSizeBytes);
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(want)) == cudaSuccess)
          opted_in[dev] = want;
      }
    }
    int n = 0;
    if (smem <= opted_in[dev] && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess &&
        n > 0)
      c = n;
    (void)cudaGetLastError();  // a refused configuration is not a launch error
  }
  return c;
}

template <typename T, int I>
Status launch_config(const LnQuantArgs& a, int sms, int dev, cudaStream_t stream) {
  constexpr Config c = kConfigs[I];
  if (!config_takes(c, a.dim)) return Status::Unsupported;
  const int threads = a.dim / (8 * c.packs);
  const size_t smem = size_t(c.stages) * size_t(c.rows) * size_t(a.dim) * sizeof(T);
  const size_t smem_widest = size_t(c.stages) * size_t(c.rows) * size_t(kLnColumnsMaxDim) * sizeof(T);
  const int per_sm = resident_ctas<T, I>(dev, threads, smem, smem_widest);
  if (per_sm < 1) return Status::Unsupported;
  const int64_t blocks = (a.rows + c.rows - 1) / c.rows;  // row blocks
  const int64_t grid = std::min<int64_t>(blocks, int64_t(sms) * per_sm);
  kernel_of<T, I>()<<<unsigned(grid), unsigned(threads), smem, stream>>>(a);
  return launch_status();
}

template <typename T>
Status launch(const LnQuantArgs& a, int config, cudaStream_t stream) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return Status::LaunchFailed;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return Status::LaunchFailed;
  switch (config) {
    case 0: return launch_config<T, 0>(a, sms, dev, stream);
    case 1: return launch_config<T, 1>(a, sms, dev, stream);
    case 2: return launch_config<T, 2>(a, sms, dev, stream);
    case 3: return launch_config<T, 3>(a, sms, dev, stream);
    default: return Status::Unsupported;
  }
}

}  // namespace

bool ln_mod_quant_token128_columns_takes(ElemType x_type, int64_t dim) {
  return (x_type == ElemType::BF16 || x_type == ElemType::F16) && dim > 0 && dim % 256 == 0 && dim <= kLnColumnsMaxDim;
}

Status ln_mod_quant_token128_columns_cuda(ElemType x_type, const LnQuantArgs& a, void* stream) {
  if (!ln_mod_quant_token128_columns_takes(x_type, a.dim)) return Status::Unsupported;
  if (a.rows == 0) return Status::Ok;
  const int config = config_for(a.dim);
  auto s = static_cast<cudaStream_t>(stream);
  if (x_type == ElemType::BF16) return launch<__nv_bfloat16>(a, config, s);
  return launch<__half>(a, config, s);
}

}  // namespace td::kernels
