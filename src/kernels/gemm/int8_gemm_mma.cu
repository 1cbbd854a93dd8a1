// Portable W8A8 GEMM (sm_80 and newer: Ampere, Ada, Hopper, Blackwell), both
// scale schemes of int8_gemm.h, built for every arch in the list.
//
// CTA tile 128x128, K step 64, 4 cp.async stages (64 KB of shared memory: fits
// the 99 KB per-block limit of sm_86/89/120), 8 warps as 2 (M) x 4 (N), each
// warp 64x32 = 4x4 mma.sync.m16n8k32 s8 tiles with int32 accumulators.
// Operands go global -> shared by 16-byte cp.async with zero fill outside the
// matrix (ragged M, N and K need no special path), and shared -> registers by
// ldmatrix.x4 from an XOR-swizzled layout (64-byte rows: 16-byte chunk c of
// row r lives at c ^ ((r >> 1) & 3), so each 8-row ldmatrix phase hits all 32
// banks once).
//
// Block-scaled: every 128-deep K block (two K steps) the int32 accumulators
// are promoted, facc += float(acc) * (sa(m, kb) * sw(n/128, kb)), and cleared.
// A CTA's 128 columns are one weight-scale block (n0 is a multiple of 128), so
// sw is one value per K block; sa is one per row (1x128 groups) or per CTA
// (128x128 blocks). Post-scale: one conversion at the end.
//
// Epilogue straight from the accumulator registers: each thread owns pairs of
// adjacent columns, so bias / w_scale / gate are read as float2, the residual
// as bf16x2, and the output is written as bf16x2.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "kernels/gemm/int8_gemm.h"

namespace td::kernels {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 4, kThreads = 256;
constexpr int kStageBytesA = kBM * kBK, kStageBytesB = kBN * kBK;
constexpr int kSmemBytes = kStages * (kStageBytesA + kStageBytesB);
constexpr int kScaleBlock = 128;

struct MmaParams {
  const int8_t* a;
  const int8_t* w;
  int64_t lda, ldw;
  int M, N, K;
  const float* a_scale;  // post-scale: [M]; block-scaled: see a_scale_block
  const float* w_scale;  // post-scale: [N]; block-scaled: [(n/128) * ld_w_scale + kb]
  int64_t ld_a_scale, ld_w_scale;
  int a_scale_block;  // block-scaled: 0 = 1x128 groups, 1 = 128x128 blocks
  __nv_bfloat16* out;
  int64_t ldo;
  const float* bias;
  const __nv_bfloat16* residual;
  int64_t ld_residual;
  const float* gate;
  int64_t ld_gate;
  int rows_per_batch;
  int gelu;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a 64-byte-row tile.
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ ((row >> 1) & 3)) << 4); }

__device__ __forceinline__ float gelu_tanh(float x) {
  // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)): the same function without the
  // cancellation in 1 + tanh(u) for u << 0 (tiny outputs keep their accuracy)
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  // ex2.approx and a fast divide: ~1e-6 relative, far below bf16's 4e-3
  return __fdividef(x, 1.f + __expf(-2.f * u));
}

// Loads K step `kt` of the A and B tiles into stage `stage` (zero fill outside).
__device__ __forceinline__ void load_stage(const MmaParams& p, uint8_t* smem, int stage, int kt, int m0, int n0,
                                           int tid) {
  const uint32_t sa = smem_addr(smem + stage * (kStageBytesA + kStageBytesB));
  const uint32_t sb = sa + kStageBytesA;
  const int k0 = kt * kBK;
#pragma unroll
  for (int i = 0; i < (kBM * kBK / 16) / kThreads; ++i) {
    const int id = tid + i * kThreads;
    const int row = id >> 2, chunk = id & 3;
    const int k = k0 + chunk * 16;
    const bool ok = (m0 + row < p.M) && (k < p.K);
    const int8_t* src = ok ? p.a + int64_t(m0 + row) * p.lda + k : p.a;
    cp_async_16(sa + swz(row, chunk), src, ok ? 16 : 0);
  }
#pragma unroll
  for (int i = 0; i < (kBN * kBK / 16) / kThreads; ++i) {
    const int id = tid + i * kThreads;
    const int row = id >> 2, chunk = id & 3;
    const int k = k0 + chunk * 16;
    const bool ok = (n0 + row < p.N) && (k < p.K);
    const int8_t* src = ok ? p.w + int64_t(n0 + row) * p.ldw + k : p.w;
    cp_async_16(sb + swz(row, chunk), src, ok ? 16 : 0);
  }
}

template <bool kBlockScaled>
__global__ void __launch_bounds__(kThreads, kBlockScaled ? 1 : 2) int8_gemm_mma_kernel(const MmaParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, warp tile 64 x 32
  const int g = lane >> 2, t = lane & 3;   // mma fragment coordinates

  // Grouped rasterization: 8 M-tiles share each sweep over N, so a group's A
  // rows and the sweep's weight columns stay in L2 together.
  const int tiles_m = (p.M + kBM - 1) / kBM, tiles_n = (p.N + kBN - 1) / kBN;
  const int bid = blockIdx.x;
  constexpr int kGroup = 8;
  const int group = bid / (kGroup * tiles_n);
  const int first_m = group * kGroup;
  const int group_rows = min(tiles_m - first_m, kGroup);
  const int tile_m = first_m + (bid % (kGroup * tiles_n)) % group_rows;
  const int tile_n = (bid % (kGroup * tiles_n)) / group_rows;
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;

  const int ktiles = (p.K + kBK - 1) / kBK;

  int acc[4][4][4];
  float facc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        acc[i][j][r] = 0;
        facc[i][j][r] = 0.f;
      }

  // Per-row activation scales and the weight scale of the current K block
  // (block-scaled), loaded at the block's first K step and used at its last.
  float sa_rows[4][2];
  float sw_blk = 0.f;
  auto load_block_scales = [&](int kb) {
    sw_blk = __ldg(p.w_scale + int64_t(n0 / kScaleBlock) * p.ld_w_scale + kb);
    if (p.a_scale_block) {
      const float s = __ldg(p.a_scale + int64_t(m0 / kScaleBlock) * p.ld_a_scale + kb);
#pragma unroll
      for (int i = 0; i < 4; ++i) sa_rows[i][0] = sa_rows[i][1] = s;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = m0 + wm * 64 + i * 16 + g + h * 8;
          sa_rows[i][h] = m < p.M ? __ldg(p.a_scale + int64_t(kb) * p.ld_a_scale + m) : 0.f;
        }
    }
  };
  if constexpr (kBlockScaled) load_block_scales(0);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(p, smem, s, s, m0, n0, tid);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible to all; stage kt-1 is free for reuse
    {
      const int next = kt + kStages - 1;
      if (next < ktiles) load_stage(p, smem, next % kStages, next, m0, n0, tid);
      cp_async_commit();
    }
    const uint8_t* sA = smem + (kt % kStages) * (kStageBytesA + kStageBytesB);
    const uint32_t sa_base = smem_addr(sA), sb_base = sa_base + kStageBytesA;
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = wm * 64 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int chunk = ks * 2 + (lane >> 4);
        ldmatrix_x4(sa_base + swz(row, chunk), af[i][0], af[i][1], af[i][2], af[i][3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = wn * 32 + j * 16 + (lane & 7) + (lane >> 4) * 8;
        const int chunk = ks * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(sb_base + swz(row, chunk), bf[2 * j][0], bf[2 * j][1], bf[2 * j + 1][0], bf[2 * j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_s8(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
    if constexpr (kBlockScaled) {
      const bool block_end = ((kt + 1) * kBK) % kScaleBlock == 0 || kt + 1 == ktiles;
      if (block_end) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              facc[i][j][r] += float(acc[i][j][r]) * (sa_rows[i][r >> 1] * sw_blk);
              acc[i][j][r] = 0;
            }
        const int next_kb = ((kt + 1) * kBK) / kScaleBlock;
        if (kt + 1 < ktiles) load_block_scales(next_kb);
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue ----
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = n0 + wn * 32 + j * 8 + 2 * t;
    if (n >= p.N) continue;  // N % 8 == 0: n < N implies n + 1 < N
    float2 sw2 = make_float2(1.f, 1.f), bias2 = make_float2(0.f, 0.f);
    if constexpr (!kBlockScaled) sw2 = __ldg(reinterpret_cast<const float2*>(p.w_scale + n));
    if (p.bias) bias2 = __ldg(reinterpret_cast<const float2*>(p.bias + n));
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * 64 + i * 16 + g + h * 8;
        if (m >= p.M) continue;
        float y0, y1;
        if constexpr (kBlockScaled) {
          y0 = facc[i][j][2 * h];
          y1 = facc[i][j][2 * h + 1];
        } else {
          const float sa = __ldg(p.a_scale + m);
          y0 = float(acc[i][j][2 * h]) * sa * sw2.x;
          y1 = float(acc[i][j][2 * h + 1]) * sa * sw2.y;
        }
        y0 += bias2.x;
        y1 += bias2.y;
        if (p.gelu) {
          y0 = gelu_tanh(y0);
          y1 = gelu_tanh(y1);
        }
        if (p.residual) {
          const float2 r = __bfloat1622float2(
              *reinterpret_cast<const __nv_bfloat162*>(p.residual + int64_t(m) * p.ld_residual + n));
          float2 gt = make_float2(1.f, 1.f);
          if (p.gate) gt = __ldg(reinterpret_cast<const float2*>(p.gate + int64_t(m / p.rows_per_batch) * p.ld_gate + n));
          y0 = r.x + gt.x * y0;
          y1 = r.y + gt.y * y1;
        }
        *reinterpret_cast<__nv_bfloat162*>(p.out + int64_t(m) * p.ldo + n) = __floats2bfloat162_rn(y0, y1);
      }
  }
}

int device_cc(int device) {
  static std::mutex mu;
  static int cc[64] = {};
  if (device < 0 || device >= 64) return 0;
  std::lock_guard<std::mutex> lock(mu);
  if (cc[device] == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
      return 0;
    cc[device] = major * 10 + minor;
  }
  return cc[device];
}

template <bool kBlockScaled>
Status launch(const MmaParams& p, void* stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::LaunchFailed;
  if (device_cc(device) < 80) return Status::Unsupported;
  // The >48 KB dynamic shared memory opt-in, once per device and variant.
  static std::mutex mu;
  static bool configured[64] = {};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (device >= 64) return Status::Unsupported;
    if (!configured[device]) {
      if (cudaFuncSetAttribute(int8_gemm_mma_kernel<kBlockScaled>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kSmemBytes) != cudaSuccess)
        return Status::LaunchFailed;
      configured[device] = true;
    }
  }
  const int64_t tiles = int64_t((p.M + kBM - 1) / kBM) * ((p.N + kBN - 1) / kBN);
  if (tiles > 0x7fffffff) return Status::Unsupported;
  int8_gemm_mma_kernel<kBlockScaled>
      <<<dim3(unsigned(tiles)), dim3(kThreads), kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaPeekAtLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

MmaParams common_params(const Int8GemmOperands& op) {
  MmaParams p{};
  p.a = op.a;
  p.w = op.w;
  p.lda = op.lda;
  p.ldw = op.ldw;
  p.M = int(op.M);
  p.N = int(op.N);
  p.K = int(op.K);
  p.out = static_cast<__nv_bfloat16*>(op.out);
  p.ldo = op.ldo;
  const Int8GemmEpilogue& e = op.epilogue;
  p.bias = e.bias;
  p.residual = reinterpret_cast<const __nv_bfloat16*>(e.residual);
  p.ld_residual = e.ld_residual;
  p.gate = e.gate;
  p.ld_gate = e.ld_gate;
  p.rows_per_batch = e.gate ? int(e.rows_per_batch) : 1;
  p.gelu = e.activation == GemmActivation::GeluTanh ? 1 : 0;
  return p;
}

bool fits_int32(const Int8GemmOperands& op) {
  return op.M < (int64_t(1) << 31) - kBM && op.N < (int64_t(1) << 31) - kBN &&
         op.epilogue.rows_per_batch < (int64_t(1) << 31);
}

}  // namespace

Status int8_gemm_post_scale_mma(const Int8GemmPostScaleArgs& args, void* stream) {
  if (Status s = int8_gemm_post_scale_check(args); s != Status::Ok) return s;
  if (args.op.M == 0 || args.op.N == 0) return Status::Ok;
  if (int8_gemm_cuda_supported(args.op, args.a_scale, args.w_scale) != Status::Ok || !fits_int32(args.op))
    return Status::Unsupported;
  MmaParams p = common_params(args.op);
  p.a_scale = args.a_scale;
  p.w_scale = args.w_scale;
  return launch<false>(p, stream);
}

Status int8_gemm_block_scaled_mma(const Int8GemmBlockScaledArgs& args, void* stream) {
  if (Status s = int8_gemm_block_scaled_check(args); s != Status::Ok) return s;
  if (args.op.M == 0 || args.op.N == 0) return Status::Ok;
  if (int8_gemm_cuda_supported(args.op, args.a_scale, args.w_scale) != Status::Ok || !fits_int32(args.op))
    return Status::Unsupported;
  MmaParams p = common_params(args.op);
  p.a_scale = args.a_scale;
  p.w_scale = args.w_scale;
  p.ld_a_scale = args.ld_a_scale;
  p.ld_w_scale = args.ld_w_scale;
  p.a_scale_block = args.a_scale_kind == ActScale::Block128 ? 1 : 0;
  return launch<true>(p, stream);
}

}  // namespace td::kernels
