// Block-scaled W8A8 GEMM for Hopper (sm_90a): TurboDiffusion's semantics (the
// int32 partial sums of every 128-deep K block promoted to fp32 with that
// block's activation and weight scales) on TMA + wgmma.
//
// CUTLASS 4.2's sm90 blockwise-scaling mainloop is FP8-only (its scale type is
// the accumulator type, and the builder asserts FP8 inputs), so this kernel is
// our own, written with CuTe's TMA and GMMA atoms:
//   - 512 threads: warpgroup 0 is the producer (one thread issues TMA loads,
//     warp 1 copies each K block's scales into the stage with cp.async; the
//     group gives registers away with setmaxnreg), warpgroups 1-3 are
//     consumers, each owning 64 rows of the 192 x 128 CTA tile.
//   - K step = 128 = one scale block, so a shared-memory stage holds exactly
//     the operands and scales of one promotion: per stage each consumer
//     issues 4 wgmma m64n128k32 (the first overwrites its int32 accumulators,
//     the rest add), reads its rows' scales from the stage, waits, releases
//     the stage and promotes: facc += float(acc) * sa * sw. One accumulator
//     set per consumer: while one warpgroup waits and promotes, the other
//     two keep the tensor cores busy.
//   - 4 stages of 40 KB (A 24 + B 16) beside the epilogue's staging;
//     persistent CTAs (one per SM) walk the tiles in groups of 8 M-tiles, so
//     the producer prefetches the next tile's stages while the consumers
//     run the epilogue.
//   - Epilogue, two forms with the same arithmetic (the same bits):
//     inline (calls with a gated residual): each consumer warpgroup through
//       shared memory (fp32, 64 columns at a time): bias, GELU-tanh, gated
//       residual in fp32, 16-byte coalesced output stores and residual
//       loads, while the tensor cores wait;
//     deferred (every other call, session 17): the consumers add the bias,
//       apply GELU, round to bf16 and store the tile in shared memory (two
//       128-byte-swizzled halves of 192 x 64 bf16, 48 KB beside 4 pipeline
//       stages), then go on to the next tile, while warp 2 of the producer
//       warpgroup (idle before) stores it by TMA (session 18; before, two
//       warps copied it out row by row, beside 3 stages); named barriers
//       "staged" / "drained" between them, setmaxnreg 40 / 152.
//     TURBODIFF_GEMM_SM90_BLOCK_EPI=inline runs every call inline.
// Ragged M, N and K come free: TMA fills out-of-bounds boxes with zeros and
// the epilogue stores only rows < M, columns < N.
//
// Measured on the H200 (2026-11-30, bench_gemm, GEMM alone vs cuBLAS BF16 in
// the same process): 1.06 / 1.18 / 1.06x at Wan-1.3B ffn1 / ffn2 / qkv and
// 1.25 / 1.31 / 1.12x at 14B; with the fused epilogues 0.71-1.20x. The
// profile at 1.3B qkv: tensor pipe 41% busy, 29% of warp samples waiting on
// their own wgmmas (the three consumers wait on the same stage and promote
// together). Earlier designs, measured side by side and removed (figures in
// docs/benchmarks.md): a 128 x 128 tile on two consumers with the
// promotion after the wait (0.79-1.26x), the int32 -> fp32 conversion by the
// 1.5 * 2^23 magic-number trick instead of I2FP (no gain), two accumulator
// sets with the promotion of K block kt under the wgmmas of kt + 1
// (0.74-1.00x), its staged-epilogue and staged-scales forms (up to 1.19x),
// and three consumers with per-thread scale loads, the magic-number
// conversion, or their wgmma issue forced into turns (all slower).
// (Tried and dropped: issuing the next tile's first K block before the
// epilogue; ptxas serializes every wgmma of such a kernel, C7514, even with
// nothing in flight across the tile loop's back-edge. Session 18: each K
// block as two m64n64k32 groups, one per 64-column half, half 0 promoted
// while half 1's wgmmas run: with half 1 still in flight across the K loop's
// back-edge ptxas serialized every wgmma (C7514); without that, correct but
// slower, 1.3B ffn1 1.00-1.15 against 0.94-0.96 ms, 14B ffn1 12.1 against
// 11.3, the 1.3B forward 176.3-176.7 against 170.9-171.2 ms, same binary:
// each wgmma then reads A again for half the columns. Also session 18: the
// deferred kernel on two consumers (128 x 128 tiles, 5 stages) with two
// int32 accumulator sets, K blocks in pairs and kt promoted while the wgmmas
// of kt + 1 run (both retired inside the pair, no C7514): correct, slower,
// 1.3B ffn1 0.95-1.14 against 0.90-0.91 ms, the 1.3B forward 177.9-178.2
// against 169.2-169.6 ms, 14B 3105 against 2996 ms, same binary.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "kernels/gemm/int8_gemm.h"

namespace td::kernels {
namespace {

using namespace cute;

constexpr int kBN = 128, kBK = 128;

using SmemAtom = GMMA::Layout_K_SW128_Atom<int8_t>;  // 8 rows x 128 bytes, 128-byte swizzle
// The global tensors the TMA descriptors are built from: [rows, K] int8 with a
// runtime row stride.
using GmemLayout = Layout<Shape<int, int>, Stride<int64_t, _1>>;

// Row stride (floats) of the staged epilogues' fp32 buffers: 64 columns + 4,
// 16-byte rows, 2 wavefronts per float2 warp store.
constexpr int kEpiLd = 68;

// The CTA shape: kWGs consumer warpgroups of 64 rows each stacked along M
// (tile 64 kWGs x 128), plus the producer warpgroup, and kStagesT pipeline
// stages (3 consumers: 4 stages of 40 KB beside the staged epilogue's 3 x 17
// KB, under the 227 KB opt-in limit).
template <int kWGs, int kStagesT>
struct TileConfig {
  static constexpr int kBM = 64 * kWGs;
  static constexpr int kStages = kStagesT;
  static constexpr int kThreads = 128 * (kWGs + 1);
  static constexpr int kConsumerWarps = 4 * kWGs;
  static constexpr uint32_t kStageTxBytes = (kBM + kBN) * kBK;  // int8: bytes = elements
  using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<kBM>{}, Int<kBK>{}, Int<kStages>{})));
  using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<kBN>{}, Int<kBK>{}, Int<kStages>{})));
  // the warpgroups stacked along M: kBM x 128 per K step of 32
  using TiledMma =
      decltype(make_tiled_mma(SM90::GMMA::MMA_64x128x32_S32S8S8_SS_TN{}, Layout<Shape<Int<kWGs>, _1, _1>>{}));
  using TmaA = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                     make_tensor(make_gmem_ptr(static_cast<const int8_t*>(nullptr)), GmemLayout{}),
                                     SmemLayoutA{}(_, _, 0)));
  using TmaB = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                     make_tensor(make_gmem_ptr(static_cast<const int8_t*>(nullptr)), GmemLayout{}),
                                     SmemLayoutB{}(_, _, 0)));
  struct Storage {
    alignas(1024) int8_t a[cosize_v<SmemLayoutA>];
    alignas(1024) int8_t b[cosize_v<SmemLayoutB>];
    alignas(8) uint64_t full[kStages];   // TMA bytes and the scale copies landed
    alignas(8) uint64_t empty[kStages];  // consumers done reading
  };
  // Staged scales: per stage the K block's activation scale of each tile row
  // ([0, kBM)) and the weight scale of the tile's 128 columns ([kBM]), copied
  // by a producer warp beside the TMA of the same stage.
  struct StorageScales : Storage {
    alignas(16) float scales[kStages][kBM + 4];
  };
  // + the fp32 staging of half a tile row block (64 x 64) per consumer
  // warpgroup for the coalesced epilogue
  struct StorageScalesEpi : StorageScales {
    alignas(16) float epi[kWGs][64][kEpiLd];
  };
};
using Cfg = TileConfig<3, 4>;
static_assert(sizeof(Cfg::StorageScalesEpi) <= 232448, "over the sm_90 shared-memory limit");

// The deferred epilogue (calls without a residual): the consumers stage each
// finished bf16 tile (bias, GELU and the rounding done) as two 64-column
// halves of 192 rows x 128 bytes with the 128-byte swizzle (the 16-byte chunk
// c of row r at chunk c ^ (r % 8): the consumers' 4-byte stores of a row
// group hit 32 different banks), and one lane of producer warp 2 stores each
// half by TMA (rows >= M and columns >= N clipped by the tensor map). The 48
// KB of staging leave room for kDefStages pipeline stages.
template <int kDefStages>
struct StorageDeferred : TileConfig<3, kDefStages>::StorageScales {
  alignas(1024) uint8_t tile[2 * 192 * 128];  // 1 KB aligned: the 128-byte swizzle's atoms
};
using SmemLayoutD = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<cutlass::bfloat16_t>{},
                                           make_shape(Int<192>{}, Int<64>{}, Int<2>{})));
using TmaD = decltype(make_tma_copy(SM90_TMA_STORE{},
                                    make_tensor(make_gmem_ptr(static_cast<cutlass::bfloat16_t*>(nullptr)), GmemLayout{}),
                                    SmemLayoutD{}(_, _, 0)));
constexpr int kDeferredStages = 4;  // (measured against 3 below)
static_assert(cosize_v<SmemLayoutD> * 2 == sizeof(StorageDeferred<kDeferredStages>::tile), "the staging holds the swizzled tile");
static_assert(sizeof(StorageDeferred<kDeferredStages>) <= 232448, "over the sm_90 shared-memory limit");
// Which epilogue runs: the deferred one for calls without a residual (unless
// TURBODIFF_GEMM_SM90_BLOCK_EPI=inline), the inline one for the gated
// residual. Measured on the H200 (2026-12-01, session 17), inline ->
// deferred: with fp32 staging and two warps doing the epilogue from it, the
// deferred epilogue lost at K = 1536 (1.3B forward 182-183 -> 215 ms: the two
// warps reading 96 KB of staged fp32 per tile beside the consumers' wgmmas
// fell behind) and won from K = 4096 (14B forward 3104-3112 -> 3038-3041 ms),
// and the gated residual stayed slower deferred at every measured shape; with
// bf16 staging copied by the two warps 1.3B ffn1 / ffn2 / qkv 1.115 / 1.019 /
// 0.204 -> 1.089 / 0.962 / 0.201 ms (GEMM alone). Session 18: the TMA store
// instead of the copy (1.3B ffn1 / qkv 1.085-1.113 / 0.204 -> 0.982-1.042 /
// 0.185-0.186 ms, ffn2 and the 14B shapes unchanged; the 1.3B forward
// 177.5-178.0 -> 172.5-173.3 ms, same binary). With only the bf16 staging
// in shared memory the deferred kernel has 4 stages instead of 3: measured
// side by side (same binary, two runs each), 1.3B ffn1 / ffn2 / qkv
// 1.034-0.942 / 0.875-0.914 / 0.178-0.180 ms against 1.025-0.951 /
// 1.042-0.930 / 0.179, the 1.3B forward 171.5-171.6 against 170.7-171.9 ms:
// the same (the loads are not what the mainloop waits for); 4 kept
// (kDeferredStages).
inline bool deferred_epilogue(const Int8GemmOperands& op) {
  if (op.epilogue.residual) return false;
  const char* e = std::getenv("TURBODIFF_GEMM_SM90_BLOCK_EPI");  // read per call: A/B and tests
  return !(e && std::strcmp(e, "inline") == 0);
}
// setmaxnreg budgets: 128 x (producer + 3 consumers) <= 65536 registers
// (inline: 32 + 3 x 160 = 512; deferred: 40 + 3 x 152 = 496, the producer
// group's warp 2 only issuing TMA stores)
constexpr int kProducerRegs = 32, kConsumerRegs = 160;
constexpr int kDefProducerRegs = 40, kDefConsumerRegs = 152;
// Named barriers between the consumers (384 threads) and the epilogue warp
// (32) of the deferred epilogue: the tile is in shared memory / the TMA has
// read it.
constexpr int kBarStaged = 4, kBarDrained = 5, kDefBarThreads = 3 * 128 + 32;

struct KernelParams {
  int M, N, K;
  int tiles_m, tiles_n, ktiles;
  const float* a_scale;
  int64_t ld_a_scale;
  int a_scale_block;  // 0: 1x128 groups [kb * ld + m]; 1: 128x128 blocks [(m/128) * ld + kb]
  const float* w_scale;
  int64_t ld_w_scale;
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

__device__ __forceinline__ float gelu_tanh(float x) {
  // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)): the same function without the
  // cancellation in 1 + tanh(u) for u << 0 (tiny outputs keep their accuracy)
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  // ex2.approx and a fast divide: ~1e-6 relative, far below bf16's 4e-3
  return __fdividef(x, 1.f + __expf(-2.f * u));
}

// Tile index -> (tile_m, tile_n), 8 M-tiles per sweep over N.
__device__ __forceinline__ void tile_coords(const KernelParams& p, int tile, int& tile_m, int& tile_n) {
  constexpr int kGroup = 8;
  const int per_group = kGroup * p.tiles_n;
  const int group = tile / per_group;
  const int first_m = group * kGroup;
  const int rows = min(p.tiles_m - first_m, kGroup);
  const int idx = tile - group * per_group;
  tile_m = first_m + idx % rows;
  tile_n = idx / rows;
}

// One 4-byte cp.async (L1-allocating), zero-filled when !valid (then src is
// not read); its completion is tracked by cp.async.mbarrier.arrive.
__device__ __forceinline__ void cp_async_f32(float* smem_dst, const float* src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// The inline epilogue of 8 columns [n, n + 8) of row m from fp32 values y
// (bias, GELU, gated residual, one rounding to bf16, a 16-byte store).
__device__ __forceinline__ void epilogue_cols(const KernelParams& p, int m, int n, float (&y)[8]) {
  if (p.bias) {
    CUTE_UNROLL
    for (int j = 0; j < 8; j += 4) {
      const float4 b = __ldg(reinterpret_cast<const float4*>(p.bias + n + j));
      y[j] += b.x, y[j + 1] += b.y, y[j + 2] += b.z, y[j + 3] += b.w;
    }
  }
  if (p.gelu) {
    CUTE_UNROLL
    for (int j = 0; j < 8; ++j) y[j] = gelu_tanh(y[j]);
  }
  if (p.residual) {
    const uint4 rv = *reinterpret_cast<const uint4*>(p.residual + int64_t(m) * p.ld_residual + n);
    const uint32_t rw[4] = {rv.x, rv.y, rv.z, rv.w};
    float g[8];
    CUTE_UNROLL
    for (int j = 0; j < 8; ++j) g[j] = 1.f;
    if (p.gate) {
      const float* gp = p.gate + int64_t(m / p.rows_per_batch) * p.ld_gate + n;
      CUTE_UNROLL
      for (int j = 0; j < 8; j += 4) {
        const float4 g4 = __ldg(reinterpret_cast<const float4*>(gp + j));
        g[j] = g4.x, g[j + 1] = g4.y, g[j + 2] = g4.z, g[j + 3] = g4.w;
      }
    }
    CUTE_UNROLL
    for (int j = 0; j < 4; ++j) {
      // bf16 -> fp32 is exact: the bits in the upper half
      y[2 * j] = __uint_as_float(rw[j] << 16) + g[2 * j] * y[2 * j];
      y[2 * j + 1] = __uint_as_float(rw[j] & 0xffff0000u) + g[2 * j + 1] * y[2 * j + 1];
    }
  }
  uint32_t ow[4];
  CUTE_UNROLL
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 o = __floats2bfloat162_rn(y[2 * j], y[2 * j + 1]);
    ow[j] = uint32_t(__bfloat16_as_ushort(o.x)) | (uint32_t(__bfloat16_as_ushort(o.y)) << 16);
  }
  *reinterpret_cast<uint4*>(p.out + int64_t(m) * p.ldo + n) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
}

// The kernel: kDefStages = 0, the inline epilogue (configuration Cfg);
// otherwise the deferred one with kDefStages pipeline stages (the file header
// describes both).
template <int kDefStages>
using CfgOf = std::conditional_t<kDefStages == 0, Cfg, TileConfig<3, (kDefStages > 0 ? kDefStages : 1)>>;

template <int kDefStages>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    int8_gemm_block_scaled_sm90_kernel(const __grid_constant__ KernelParams p,
                                       const __grid_constant__ typename CfgOf<kDefStages>::TmaA tma_a,
                                       const __grid_constant__ typename CfgOf<kDefStages>::TmaB tma_b,
                                       const __grid_constant__ TmaD tma_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kDeferred = kDefStages > 0;
  using C = CfgOf<kDefStages>;
  constexpr int kBM = C::kBM, kStages = C::kStages;
  using Storage = std::conditional_t<kDeferred, StorageDeferred<kDefStages>, Cfg::StorageScalesEpi>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const int warp_group = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int num_tiles = p.tiles_m * p.tiles_n;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // the TMA thread's arrival + the 32 cp.async arrivals (noinc) of the scale warp
      cutlass::arch::ClusterTransactionBarrier::init(&smem.full[s], 1 + 32);
      cutlass::arch::ClusterBarrier::init(&smem.empty[s], C::kConsumerWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  if (warp == 0 && lane == 0) {
    cute::prefetch_tma_descriptor(tma_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_b.get_tma_descriptor());
  }
  __syncthreads();

  Tensor sA = make_tensor(make_smem_ptr(smem.a), typename C::SmemLayoutA{});  // (BM, BK, stages)
  Tensor sB = make_tensor(make_smem_ptr(smem.b), typename C::SmemLayoutB{});  // (BN, BK, stages)

  if (warp_group == 0) {
    // ---------------- producer ----------------
    // (Deferred: the epilogue warps below need more registers than the
    // producer's 32: 56 for this warpgroup, 152 for each consumer one.)
    if constexpr (kDeferred)
      cutlass::arch::warpgroup_reg_dealloc<kDefProducerRegs>();
    else
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (warp == 0 && cute::elect_one_sync()) {
      Tensor mA = tma_a.get_tma_tensor(make_shape(p.M, p.K));
      Tensor mB = tma_b.get_tma_tensor(make_shape(p.N, p.K));
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        int tile_m, tile_n;
        tile_coords(p, tile, tile_m, tile_n);
        Tensor gA = local_tile(mA, make_shape(Int<kBM>{}, Int<kBK>{}), make_coord(tile_m, _));  // (BM, BK, k)
        Tensor gB = local_tile(mB, make_shape(Int<kBN>{}, Int<kBK>{}), make_coord(tile_n, _));
        auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
        auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
        for (int kt = 0; kt < p.ktiles; ++kt) {
          // a fresh barrier's "previous phase" counts as complete: the first
          // pass over the stages does not wait
          cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase ^ 1);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.full[stage], C::kStageTxBytes);
          copy(tma_a.with(smem.full[stage]), tAgA(_, kt), tAsA(_, stage));
          copy(tma_b.with(smem.full[stage]), tBgB(_, kt), tBsB(_, stage));
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    if (warp == 1) {
      // The scale warp: walks the same tiles and stages as the TMA thread;
      // per stage each lane copies kBM / 32 activation scales (token128: a
      // column [kb][m0, m0 + kBM), contiguous but only 4-byte aligned when
      // ld_a_scale % 4 != 0, hence 4-byte cp.async rather than one bulk copy;
      // block128: the row block's scale per row) and lane 0 the weight
      // scale, then arrives on the stage's full barrier when its copies land.
      // Rows >= M get 0 (zero fill) and read nothing.
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        int tile_m, tile_n;
        tile_coords(p, tile, tile_m, tile_n);
        const int m0 = tile_m * kBM;
        const float* sw_col = p.w_scale + int64_t(tile_n) * p.ld_w_scale;
        for (int kt = 0; kt < p.ktiles; ++kt) {
          cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase ^ 1);
          float* dst = smem.scales[stage];
          CUTE_UNROLL
          for (int r = lane; r < kBM; r += 32) {
            const int m = min(m0 + r, p.M - 1);
            const float* src = p.a_scale_block ? p.a_scale + int64_t(m / 128) * p.ld_a_scale + kt
                                               : p.a_scale + int64_t(kt) * p.ld_a_scale + m;
            cp_async_f32(dst + r, src, m0 + r < p.M);
          }
          if (lane == 0) cp_async_f32(dst + kBM, sw_col + kt, true);
          cutlass::arch::cpasync_barrier_arrive_noinc(&smem.full[stage]);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
      cute::cp_async_wait<0>();
    }
    if constexpr (kDeferred) {
      if (warp == 2) {
        // The epilogue warp: each tile the consumers stage, lane 0 stores
        // its two halves by TMA (a half past N is skipped) and waits until
        // the TMA has read them before the tile counts as drained.
        Tensor mD = tma_d.get_tma_tensor(make_shape(p.M, p.N));
        Tensor gD = local_tile(mD, make_shape(Int<kBM>{}, Int<64>{}), make_coord(_, _));  // (BM, 64, m, n / 64)
        Tensor sD = make_tensor(make_smem_ptr(reinterpret_cast<cutlass::bfloat16_t*>(smem.tile)), SmemLayoutD{});
        auto [tDgD, tDsD] = tma_partition(tma_d, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sD), group_modes<0, 2>(gD));
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
          int tile_m, tile_n;
          tile_coords(p, tile, tile_m, tile_n);
          asm volatile("bar.sync %0, %1;\n" ::"r"(kBarStaged), "r"(kDefBarThreads) : "memory");
          if (lane == 0) {
            copy(tma_d, tDsD(_, 0), tDgD(_, tile_m, 2 * tile_n));
            if (tile_n * kBN + 64 < p.N) copy(tma_d, tDsD(_, 1), tDgD(_, tile_m, 2 * tile_n + 1));
            tma_store_arrive();
            tma_store_wait<0>();  // read: the consumers may stage the next tile
          }
          __syncwarp();
          asm volatile("bar.arrive %0, %1;\n" ::"r"(kBarDrained), "r"(kDefBarThreads) : "memory");
        }
        // the stores complete (the global writes, not only the reads) before the CTA exits
        if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      }
    }
  } else {
    // ---------------- consumers ----------------
    if constexpr (kDeferred)
      cutlass::arch::warpgroup_reg_alloc<kDefConsumerRegs>();
    else
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    const int ctid = threadIdx.x - 128;  // 0 .. 383 over the three consumer warpgroups
    typename C::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(ctid);
    Tensor tCsA = thr_mma.partition_A(sA);  // (MMA, MMA_M, MMA_K, stages)
    Tensor tCsB = thr_mma.partition_B(sB);
    Tensor tCrA = thr_mma.make_fragment_A(tCsA);  // smem descriptors
    Tensor tCrB = thr_mma.make_fragment_B(tCsB);
    Tensor acc = partition_fragment_C(tiled_mma, make_shape(Int<kBM>{}, Int<kBN>{}));  // int32
    Tensor facc = make_tensor<float>(acc.layout());
    // (row, col) within the tile of each accumulator element of this thread
    Tensor tCcC = thr_mma.partition_C(make_identity_tensor(make_shape(Int<kBM>{}, Int<kBN>{})));
    // This thread's two rows: r_lo (bit 3 clear) and r_lo + 8, as in every
    // m64nNk32 accumulator fragment.
    const int r_lo = int(get<0>(tCcC(0))) & ~8;
    const int c0 = int(get<1>(tCcC(0)));  // this thread's first column (2 * (lane % 4))

    int stage = 0;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      int tile_m, tile_n;
      tile_coords(p, tile, tile_m, tile_n);
      const int m0 = tile_m * kBM, n0 = tile_n * kBN;
      // this K block's scales of this thread's rows from the stage's slot
      auto stage_scales = [&](auto& sm, int st, float& s_lo, float& s_hi) {
        const float* sc = sm.scales[st];
        const float sw = sc[kBM];
        s_lo = sc[r_lo] * sw;
        s_hi = sc[r_lo + 8] * sw;
      };
      float s_lo = 0.f, s_hi = 0.f;
      CUTE_UNROLL
      for (int i = 0; i < size(facc); ++i) facc(i) = 0.f;

      for (int kt = 0; kt < p.ktiles; ++kt) {
        cutlass::arch::ClusterTransactionBarrier::wait(&smem.full[stage], phase);
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tCrA); ++kk) {
          cute::gemm(tiled_mma, tCrA(_, _, kk, stage), tCrB(_, _, kk, stage), acc);
          tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        stage_scales(smem, stage, s_lo, s_hi);  // shared-memory latency under the wgmmas
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc);
        __syncwarp();
        if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
        // value i of an m64nNk32 accumulator fragment: row r_lo + 8 * ((i >> 1) & 1),
        // column c0 + 8 * (i >> 2) + (i & 1) (the row half known at compile time)
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) facc(i) += float(acc(i)) * ((i & 2) ? s_hi : s_lo);
      }

      if constexpr (kDeferred) {
        // ---- deferred epilogue: the finished bf16 tile to shared memory
        // (once the TMA has read the previous one), then on to the next
        // tile; the epilogue warp stores this one under its mainloop.
        if (tile != int(blockIdx.x))
          asm volatile("bar.sync %0, %1;\n" ::"r"(kBarDrained), "r"(kDefBarThreads) : "memory");
        {
          // bias, GELU and the rounding (the inline epilogue's arithmetic, so
          // the same bits); the pairs into the swizzled halves: row r's
          // 16-byte chunk j at j ^ (r % 8), where r % 8 is this thread's
          // lane / 4 for both of its rows
          uint8_t* base8 = smem.tile + r_lo * 128 + 2 * c0;
          const int sw = r_lo & 7;
          CUTE_UNROLL
          for (int i = 0; i < size(facc); i += 2) {
            const int j = i >> 2;  // 8-column group 0..15: half j / 8, chunk j % 8
            const int n = n0 + c0 + 8 * j;
            float y0 = facc(i), y1 = facc(i + 1);
            if (p.bias && n < p.N) {  // N % 8 == 0: n + 1 < N too
              const float2 b = __ldg(reinterpret_cast<const float2*>(p.bias + n));
              y0 += b.x;
              y1 += b.y;
            }
            if (p.gelu) {
              y0 = gelu_tanh(y0);
              y1 = gelu_tanh(y1);
            }
            const __nv_bfloat162 o = __floats2bfloat162_rn(y0, y1);
            *reinterpret_cast<uint32_t*>(base8 + (j >> 3) * (kBM * 128) + ((i >> 1) & 1) * 8 * 128 +
                                         (((j & 7) ^ sw) << 4)) =
                uint32_t(__bfloat16_as_ushort(o.x)) | (uint32_t(__bfloat16_as_ushort(o.y)) << 16);
          }
          cutlass::arch::fence_view_async_shared();  // visible to the TMA (async proxy) after the barrier
        }
        asm volatile("bar.arrive %0, %1;\n" ::"r"(kBarStaged), "r"(kDefBarThreads) : "memory");
        continue;
      } else {
        // ---- epilogue through shared memory, in two halves of 64 columns:
        // each warpgroup writes its 64 x 64 fp32 half-tile, then every thread
        // takes 8 consecutive columns of one row: 16-byte residual loads and
        // output stores, float4 bias/gate loads (all 16-byte aligned: N % 8,
        // ld % 8, 16-byte bases), one rounding to bf16 as in the other path.
        const int wg = warp_group - 1;  // 0..kWGs - 1: rows [64 wg, 64 wg + 64) of the tile
        const int wtid = threadIdx.x % 128;
        float(*buf)[kEpiLd] = smem.epi[wg];
        CUTE_UNROLL
        for (int half = 0; half < 2; ++half) {
          // previous readers of buf (the last half or tile) are done
          asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));
          CUTE_UNROLL
          for (int i = half * 32; i < half * 32 + 32; i += 2) {  // values i < 32: columns 0..63
            const int r = int(get<0>(tCcC(i))) - 64 * wg, c = int(get<1>(tCcC(i))) - 64 * half;
            *reinterpret_cast<float2*>(&buf[r][c]) = make_float2(facc(i), facc(i + 1));
          }
          asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg));
          CUTE_UNROLL
          for (int pass = 0; pass < 4; ++pass) {
            const int r = pass * 16 + wtid / 8, c = (wtid % 8) * 8;
            const int m = m0 + 64 * wg + r, n = n0 + 64 * half + c;
            if (m >= p.M || n >= p.N) continue;  // N % 8 == 0: the 8 columns are all in or all out
            const float4 lo = *reinterpret_cast<const float4*>(&buf[r][c]);
            const float4 hi = *reinterpret_cast<const float4*>(&buf[r][c + 4]);
            float y[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            epilogue_cols(p, m, n, y);
          }
        }
      }
    }
    // the epilogue warps have read the last tile (every CTA has one)
    if constexpr (kDeferred) asm volatile("bar.sync %0, %1;\n" ::"r"(kBarDrained), "r"(kDefBarThreads) : "memory");
  }
#endif
}

struct DeviceFacts {
  int sm_count = 0, cc = 0;
  bool configured[5] = {};  // each kernel's shared-memory size set (by kDefStages)
};

DeviceFacts* device_facts(int device) {
  static DeviceFacts facts[64];
  if (device < 0 || device >= 64) return nullptr;
  DeviceFacts& f = facts[device];
  if (f.sm_count == 0) {
    int major = 0, minor = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return nullptr;
    f.sm_count = sms;
    f.cc = major * 10 + minor;
  }
  return &f;
}

// Launches the kernel on checked arguments.
template <int kDefStages>
Status launch(const Int8GemmBlockScaledArgs& args, void* stream) {
  using C = CfgOf<kDefStages>;
  using Storage = std::conditional_t<(kDefStages > 0), StorageDeferred<kDefStages>, Cfg::StorageScalesEpi>;
  constexpr int kSmemBytes = int(sizeof(Storage));
  const Int8GemmOperands& op = args.op;
  if (op.M > (int64_t(1) << 31) - C::kBM || op.N > (int64_t(1) << 31) - kBN ||
      op.epilogue.rows_per_batch >= (int64_t(1) << 31))
    return Status::Unsupported;

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::LaunchFailed;
  static std::mutex mu;
  int sm_count = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    DeviceFacts* f = device_facts(device);
    if (!f) return Status::LaunchFailed;
    if (f->cc != 90) return Status::Unsupported;
    if (!f->configured[kDefStages]) {
      if (cudaFuncSetAttribute(int8_gemm_block_scaled_sm90_kernel<kDefStages>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess)
        return Status::LaunchFailed;
      f->configured[kDefStages] = true;
    }
    sm_count = f->sm_count;
  }

  KernelParams p{};
  p.M = int(op.M);
  p.N = int(op.N);
  p.K = int(op.K);
  p.tiles_m = (p.M + C::kBM - 1) / C::kBM;
  p.tiles_n = (p.N + kBN - 1) / kBN;
  p.ktiles = (p.K + kBK - 1) / kBK;
  p.a_scale = args.a_scale;
  p.ld_a_scale = args.ld_a_scale;
  p.a_scale_block = args.a_scale_kind == ActScale::Block128 ? 1 : 0;
  p.w_scale = args.w_scale;
  p.ld_w_scale = args.ld_w_scale;
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

  const GmemLayout layout_a = make_layout(make_shape(p.M, p.K), make_stride(op.lda, _1{}));
  const GmemLayout layout_b = make_layout(make_shape(p.N, p.K), make_stride(op.ldw, _1{}));
  const typename C::TmaA tma_a =
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(op.a), layout_a), typename C::SmemLayoutA{}(_, _, 0));
  const typename C::TmaB tma_b =
      make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(op.w), layout_b), typename C::SmemLayoutB{}(_, _, 0));
  const GmemLayout layout_d = make_layout(make_shape(p.M, p.N), make_stride(op.ldo, _1{}));
  const TmaD tma_d = make_tma_copy(SM90_TMA_STORE{},
                                   make_tensor(make_gmem_ptr(static_cast<cutlass::bfloat16_t*>(op.out)), layout_d),
                                   SmemLayoutD{}(_, _, 0));

  const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n;
  const int grid = int(tiles < sm_count ? tiles : sm_count);
  int8_gemm_block_scaled_sm90_kernel<kDefStages>
      <<<grid, C::kThreads, size_t(kSmemBytes), static_cast<cudaStream_t>(stream)>>>(p, tma_a, tma_b, tma_d);
  return cudaPeekAtLastError() == cudaSuccess ? Status::Ok : Status::LaunchFailed;
}

}  // namespace

Status int8_gemm_block_scaled_sm90(const Int8GemmBlockScaledArgs& args, void* stream) {
  if (Status s = int8_gemm_block_scaled_check(args); s != Status::Ok) return s;
  const Int8GemmOperands& op = args.op;
  if (op.M == 0 || op.N == 0) return Status::Ok;
  if (int8_gemm_cuda_supported(op, args.a_scale, args.w_scale) != Status::Ok) return Status::Unsupported;
  return deferred_epilogue(op) ? launch<kDeferredStages>(args, stream) : launch<0>(args, stream);
}

}  // namespace td::kernels
