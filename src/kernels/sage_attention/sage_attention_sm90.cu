// SageAttention on Hopper (sm_90a): INT8 wgmma for Q·Kᵀ, FP8-e4m3 wgmma for
// P̃·V with P̃ from registers, TMA loads, warp-specialized, two-level fp32
// accumulation of P̃·V. Quantization (sage_attention.cu's pre-pass) writes Q
// and K as INT8 rows and V as e4m3 Vᵀ [B·H, D, Lk_pad] with the keys of every
// 32-key group permuted, so that the S accumulator registers are the A
// fragment of P̃·V without any shuffle (see perm in sage_attention.cu).
//
// CTA: warpgroup 0 is the producer (one elected thread per pipe issues TMA;
// the group gives its registers away with setmaxnreg), warpgroups 1 and 2 are
// consumers, each owning 64 query rows.
//   dense   one K/V pipe shared by both consumers (128 query rows per CTA), 5 stages (4 when Lk < 4096)
//   sparse  one pipe per consumer (each 64-row query block has its own LUT row), 3 stages each,
//           two Q slots per consumer, and one stream of tiles across the consumer's units
//           (the next unit's first Q·Kᵀ goes with the last P̃·V of the unit before it, whose
//           epilogue then runs beside the next Q·Kᵀ)
// The producer hands each stage's K scales and tile index over in shared
// memory; each consumer overlaps P̃·V of tile j with the row max of j+1, then
// folds it beside the exp2 of j+1.
// Per 128-key tile and consumer:
//   S = Q·Kᵀ      wgmma m64n128k32 s8 (D/32 of them), INT32 in registers
//   dequant       float(S)·(sq·scale·log2 e)·sk (sk per 64 keys)
//   softmax       running max m; P̃ = exp2(S - m + log2 448) in [0, 448]; row sums in fp32
//   O_tmp = P̃·V   wgmma m64nDk32 e4m3 (4 of them) into a fresh fp32 buffer
//   O = O·α + O_tmp  on the CUDA cores (the second accumulation level)
// Epilogue: O·sv/l to BF16 with 4-byte stores, LSE with the K-smoothing correction.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "kernels/pdl.cuh"
#include "kernels/sage_attention/sage_attention_internal.h"

namespace td::kernels::sage {
namespace {

using namespace cute;

constexpr int kBQ = 64;    // query rows per consumer warpgroup
constexpr int kBK = 128;   // keys per tile
constexpr int kThreads = 384;

template <int D>
struct Sm90Traits {
  using QKAtom = std::conditional_t<D == 128, GMMA::Layout_K_SW128_Atom<int8_t>, GMMA::Layout_K_SW64_Atom<int8_t>>;
  using VAtom = GMMA::Layout_K_SW128_Atom<float_e4m3_t>;  // Vᵀ rows are 128 keys = 128 bytes
  using SmemQ = decltype(tile_to_shape(QKAtom{}, make_shape(Int<kBQ>{}, Int<D>{}, Int<2>{})));
  template <int S>
  using SmemK = decltype(tile_to_shape(QKAtom{}, make_shape(Int<kBK>{}, Int<D>{}, Int<S>{})));
  template <int S>
  using SmemV = decltype(tile_to_shape(VAtom{}, make_shape(Int<D>{}, Int<kBK>{}, Int<S>{})));
  using MmaQK = decltype(make_tiled_mma(SM90::GMMA::MMA_64x128x32_S32S8S8_SS_TN{}));
  using MmaPV = decltype(make_tiled_mma(std::conditional_t<D == 128, SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>,
                                                           SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>>{}));
  // kTcSum: the row sums Σ P̃ as P̃·1 on the tensor cores, 8 identical columns
  // (n8: the smallest wgmma N) against a constant tile of e4m3 1.0. The A
  // operand (P̃ in registers) has the same fragment layout for every N.
  using MmaSum = decltype(make_tiled_mma(SM90::GMMA::MMA_64x8x32_F32E4M3E4M3_RS_TN<>{}));
  using SmemOnes = decltype(tile_to_shape(VAtom{}, make_shape(Int<8>{}, Int<kBK>{})));  // one 1 KB swizzle atom
  using GmemLayout = cute::Layout<Shape<int, int>, Stride<int64_t, _1>>;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const int8_t*>(nullptr)), GmemLayout{}),
                                      SmemQ{}(_, _, 0)));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const int8_t*>(nullptr)), GmemLayout{}),
                                      SmemK<1>{}(_, _, 0)));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                      make_tensor(make_gmem_ptr(static_cast<const float_e4m3_t*>(nullptr)), GmemLayout{}),
                                      SmemV<1>{}(_, _, 0)));
};

// Shared memory of Sm90Config::Shared besides the operands. meta: per stage,
// written by the producer before it arrives on the stage's full barrier
// (mbarrier.arrive releases, the consumers' wait acquires): the tile's two K
// scales and its index (sparse: the LUT entry; n_ktiles, i.e. no valid key,
// for one outside [0, KB)), so no consumer waits on an L2 load inside the
// softmax. vscale / qkm: the epilogue's per-channel V scales and per-row LSE
// corrections, written by each consumer in its epilogue.
template <int D, int kAllStages>
struct MetaShared {
  float4 meta[kAllStages];  // x, y: K scales of the tile's two 64-key halves; z: tile index (int bits)
  float vscale[2][D];       // per consumer warpgroup
  float qkm[2][kBQ];
};
// kTcSum's constant B operand (a 128-byte-swizzle atom is 8 rows x 128 bytes
// and its descriptor assumes 1 KB alignment; every byte is 1.0, so the swizzle
// permutes equal bytes). Written once before the CTA's first barrier and
// shared by both consumers, so its address is a constant of the kernel.
constexpr size_t kOnesBytes = 8 * kBK;
constexpr uint32_t kE4m3One4 = 0x38383838u;  // four e4m3 1.0

// kPipes = 1: dense (both consumers read every stage); 2: sparse (one pipe per
// consumer). kStages_: stages per pipe (dense 5, 4 for short keys; sparse 3: 32 KB Q (two
// slots per consumer) + 6 x 32 KB K/V = 224 KB at head_dim 128, with the meta and the
// ones tile exactly the 227 KB a CTA can have).
template <int D, int kPipes, int kStages_>
struct Sm90Config {
  using T = Sm90Traits<D>;
  static constexpr int kStages = kStages_;
  static constexpr int kAllStages = kStages * kPipes;
  // Q slots per consumer warpgroup: sparse 2 (the CTA's k-th unit in slot
  // kQSlots·c + k % kQSlots, so a unit's Q loads while the one before it
  // runs and the consumer's tile stream goes on across units); dense 1.
  static constexpr int kQSlots = kPipes == 2 ? 2 : 1;
  using SmemQ = decltype(tile_to_shape(typename T::QKAtom{}, make_shape(Int<kBQ>{}, Int<D>{}, Int<2 * kQSlots>{})));
  using SmemK = typename T::template SmemK<kAllStages>;
  using SmemV = typename T::template SmemV<kAllStages>;
  struct Shared {
    alignas(1024) int8_t q[cosize_v<SmemQ>];
    alignas(1024) int8_t k[cosize_v<SmemK>];
    alignas(1024) float_e4m3_t v[cosize_v<SmemV>];
    alignas(1024) uint8_t ones[kOnesBytes];  // kTcSum's B operand (1 KB aligned: one swizzle atom)
    MetaShared<D, kAllStages> meta;
    alignas(8) uint64_t q_full[2 * kQSlots];   // per Q slot
    alignas(8) uint64_t q_empty[2 * kQSlots];  // released by the 4 warps of the slot's consumer
    alignas(8) uint64_t full[kAllStages];
    alignas(8) uint64_t empty[kAllStages];
  };
  static constexpr uint32_t kQBytes = kBQ * D;
  static constexpr uint32_t kStageBytes = 2 * kBK * D;  // K (INT8) and Vᵀ (e4m3)
};

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Two floats to two e4m3 bytes (RN, saturating to ±448): lo in the low byte.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ void st_shared_f4(const void* ptr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(uint32_t(__cvta_generic_to_shared(ptr))), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float4 ld_shared_f4(const void* ptr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(uint32_t(__cvta_generic_to_shared(ptr)))
               : "memory");
  return v;
}

// One CTA: warpgroup 0 produces, warpgroups 1 and 2 consume (64 query rows each).
// Persistent: CTA i runs the units (a head's 128-row query tile) i, i + grid,
// i + 2·grid, ... (unit u: tile u % qtiles of head-batch u / qtiles, the
// order of the former one-CTA-per-unit grid, so concurrently running units
// share K/V in L2 as before). The K/V stage ring runs on across units and Q
// has its own slots (two per consumer for sparse), so a unit's Q and first
// K/V tiles load while the previous unit's last tiles and epilogue run: the
// per-unit start-up (Q and LUT latency, pipe fill) that a fresh CTA pays is
// hidden. Sparse consumers also keep their tensor-core chain going across
// units (see the tile stream below): with 25 tiles per unit at topk 0.1 the
// unit boundary was a visible share of the kernel (0.855-0.865 -> 0.832-0.855
// ms at 1x12x32760, 15.22 -> 14.95 ms at 1x40x75600 on the H200, session 12).
// kTcSum (sparse calls without an LSE): the row sums come from the tensor
// cores: P̃·1 (MmaSum) is issued with P̃·V of the same tile into a 4-register
// fp32 accumulator and folded into l like O (l = l·α + Σ), so the softmax
// keeps max / exp2 / pack: 64 FADD fewer per tile and thread, no quad
// shuffles of l in the epilogue. l is then Σ of the e4m3-rounded P̃ that
// multiplies V, accumulated like P̃·V in the FP8 wgmma's reduced-precision
// adds: numerator and denominator from the same weights (sage_attention.h's
// contract, modelled by sage_attention_cpu). Not with an LSE: the wgmma's
// truncating adds move log l by up to ~1e-2 on peaked rows (measured in
// session 5 against the simulation), beyond the LSE's bar.
template <int D, int kPipes, int kStagesPerPipe, bool kTcSum = false>
__global__ void __launch_bounds__(kThreads, 1)
    sage_sm90_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ typename Sm90Traits<D>::TmaQ tma_q,
                     const __grid_constant__ typename Sm90Traits<D>::TmaK tma_k,
                     const __grid_constant__ typename Sm90Traits<D>::TmaV tma_v, int n_bh) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Sm90Traits<D>;
  using C = Sm90Config<D, kPipes, kStagesPerPipe>;
  constexpr int kStages = C::kStages;
  constexpr bool kSparse = kPipes == 2;
  // The softmax's max phase (see row_max below): 0, the scores converted to
  // fp32 before a float row max; 1, the row max over the INT32 scores
  // (VIMNMX3) and the conversion inside the exp phase. Measured side by side
  // on the H200 (docs/benchmarks.md, session 5): 1 is 4-5% slower on the
  // dense kernel (7.94 vs 8.32 ms at 1x12x32760x128) and 4% faster on the
  // sparse one (1.147 vs 1.193 ms at topk 0.1, 17.5 vs 18.4 ms at 1x40x75600).
  constexpr int kSoftmax = kSparse ? 1 : 0;
  static_assert(!kTcSum || kSparse, "kTcSum: the sparse kernel's row sums");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  typename C::Shared& sh = *reinterpret_cast<typename C::Shared*>(smem_raw);
  auto& ms = sh.meta;
  // wg through a shuffle: the compiler then knows it is warp-uniform and keeps
  // what derives from it (the consumer's Q descriptors) in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_ktiles = (p.len_kv + kBK - 1) / kBK;
  const int qtiles = p.lq_pad / (2 * kBQ);
  const int n_units = n_bh * qtiles;
  // Unit u: head-batch bh = u / qtiles; consumer c's query block (64 rows),
  // whether it exists; the tiles of pipe `pipe` for it: count and the j-th
  // tile (-1: none, e.g. a bad LUT entry).
  auto bh_of = [&](int u) { return u / qtiles; };
  auto qblock_of = [&](int u, int c) { return 2 * (u % qtiles) + c; };
  auto qblock_valid = [&](int u, int c) { return qblock_of(u, c) * kBQ < p.len_q; };
  auto n_tiles_of = [&](int u, int pipe) { return kSparse ? (qblock_valid(u, pipe) ? p.n_sel : 0) : n_ktiles; };
  auto tile_at = [&](int u, int pipe, int j) -> int {
    if constexpr (!kSparse) {
      return j;
    } else {
      const int t = __ldg(p.lut + (int64_t(bh_of(u)) * p.n_qblocks + qblock_of(u, pipe)) * p.n_sel + j);
      return (t < 0 || t >= n_ktiles) ? -1 : t;
    }
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < 2 * C::kQSlots; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&sh.q_full[s], 1);
      cutlass::arch::ClusterBarrier::init(&sh.q_empty[s], 4);  // the 4 warps of consumer s / kQSlots
    }
    for (int s = 0; s < C::kAllStages; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&sh.full[s], 1);
      cutlass::arch::ClusterBarrier::init(&sh.empty[s], kSparse ? 4 : 8);  // consumer warps reading the stage
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (kTcSum) {
    // The ones tile (8 bytes per thread), made visible to the async proxy
    // (the wgmma operand reads) before the barrier below.
    if (threadIdx.x < kOnesBytes / 8) {
      *reinterpret_cast<uint2*>(sh.ones + threadIdx.x * 8) = make_uint2(kE4m3One4, kE4m3One4);
      cutlass::arch::fence_view_async_shared();
    }
  }
  if (warp == 0 && lane == 0) {
    cute::prefetch_tma_descriptor(tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_v.get_tma_descriptor());
  }
  __syncthreads();
  // Launched as a programmatic dependent (pdl.cuh): the set-up above ran
  // beside the previous kernel's tail; everything below reads its outputs.
  pdl_wait();
  pdl_launch_dependents();

  Tensor sQ = make_tensor(make_smem_ptr(sh.q), typename C::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(sh.k), typename C::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(sh.v), typename C::SmemV{});

  if (wg == 0) {
    // ---------------- producer ----------------
    // The whole warp of each pipe runs the loop: every 32 tiles each lane
    // loads one tile's LUT entry and its two K scales (one batch of L2 round
    // trips instead of one per tile on the way to the TMA issue, which made
    // the first stages of a short sparse row wait one after another); lane 0
    // writes the stage's meta, arrives and issues the TMA.
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (warp < kPipes) {
      const int pipe = warp;
      Tensor mQ = tma_q.get_tma_tensor(make_shape(n_bh * p.lq_pad, D));
      Tensor mK = tma_k.get_tma_tensor(make_shape(n_bh * p.lk_pad, D));
      Tensor mV = tma_v.get_tma_tensor(make_shape(n_bh * D, p.lk_pad));
      Tensor gQ = local_tile(mQ, make_shape(Int<kBQ>{}, Int<D>{}), make_coord(_, 0));  // (64, D, q-tiles)
      Tensor gK = local_tile(mK, make_shape(Int<kBK>{}, Int<D>{}), make_coord(_, 0));  // (128, D, k-tiles)
      Tensor gV = local_tile(mV, make_shape(Int<D>{}, Int<kBK>{}), make_coord(_, _));  // (D, 128, bh, k-tiles)
      auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, cute::Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, cute::Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, cute::Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      int stage = 0;
      uint32_t phase = 0;
      // Unit k of this CTA: u = blockIdx.x + k·gridDim.x; the Q barriers'
      // phase is k & 1 (every unit loads Q, also a sparse query block past
      // len_q: its rows are the pre-pass's zero padding, and its consumer
      // only waits and releases it).
      for (int k = 0, u = int(blockIdx.x); u < n_units; ++k, u += int(gridDim.x)) {
        const int bh = bh_of(u);
        // Q of the consumer(s) this pipe feeds, into slot kQSlots·c + k %
        // kQSlots once the consumer has released that slot's previous unit
        // (its last Q·Kᵀ done).
        if (lane == 0) {
          for (int c = kSparse ? pipe : 0; c < (kSparse ? pipe + 1 : 2); ++c) {
            const int slot = C::kQSlots * c + k % C::kQSlots;
            cutlass::arch::ClusterBarrier::wait(&sh.q_empty[slot], uint32_t((k / C::kQSlots) & 1) ^ 1u);
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sh.q_full[slot], C::kQBytes);
            copy(tma_q.with(sh.q_full[slot]), tQg(_, bh * (p.lq_pad / kBQ) + qblock_of(u, c)), tQs(_, slot));
          }
        }
        const float* kscale = p.kscale + int64_t(bh) * (p.lk_pad / 64);
        const int n = n_tiles_of(u, pipe);
        int t_lane = -1;
        float2 ks_lane = make_float2(0.f, 0.f);
        for (int j = 0; j < n; ++j) {
          if ((j & 31) == 0) {
            t_lane = j + lane < n ? tile_at(u, pipe, j + lane) : -1;
            ks_lane = t_lane >= 0 ? __ldg(reinterpret_cast<const float2*>(kscale + 2 * t_lane)) : make_float2(0.f, 0.f);
          }
          const int t = __shfl_sync(0xffffffffu, t_lane, j & 31);
          const float ks0 = __shfl_sync(0xffffffffu, ks_lane.x, j & 31), ks1 = __shfl_sync(0xffffffffu, ks_lane.y, j & 31);
          const int s = pipe * kStages + stage;
          cutlass::arch::ClusterBarrier::wait(&sh.empty[s], phase ^ 1);
          if (lane == 0) {
            // Meta first: the arrive below releases it to the consumers. A LUT
            // entry outside [0, KB) goes as tile n_ktiles (no valid key) and
            // loads tile 0: the consumer ignores its scores, but P̃·V (with
            // P̃ = 0) must read finite values.
            st_shared_f4(&ms.meta[s], make_float4(ks0, ks1, __int_as_float(t >= 0 ? t : n_ktiles), 0.f));
            const int tl = t >= 0 ? t : 0;
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sh.full[s], C::kStageBytes);
            copy(tma_k.with(sh.full[s]), tKg(_, bh * (p.lk_pad / kBK) + tl), tKs(_, s));
            copy(tma_v.with(sh.full[s]), tVg(_, bh, tl), tVs(_, s));
          }
          __syncwarp();
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    // ---------------- consumers ----------------
    cutlass::arch::warpgroup_reg_alloc<240>();
    const int c = wg - 1;
    const int pipe = kSparse ? c : 0;
    const int tid = threadIdx.x - 128 * wg;  // 0..127 within the warpgroup
    typename T::MmaQK mma_qk;
    typename T::MmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ));  // descriptors (.., .., k, 2)
    Tensor tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK));  // (.., .., k, stages)
    Tensor tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV));
    Tensor acc_s = partition_fragment_C(mma_qk, make_shape(Int<kBQ>{}, Int<kBK>{}));  // int32 ((2,2,16),1,1)
    Tensor acc_o = partition_fragment_C(mma_pv, make_shape(Int<kBQ>{}, Int<D>{}));    // fp32 ((2,2,D/8),1,1)
    Tensor acc_t = partition_fragment_C(mma_pv, make_shape(Int<kBQ>{}, Int<D>{}));
    auto p_layout = make_tensor(make_smem_ptr(static_cast<float_e4m3_t*>(nullptr)), cute::Layout<Shape<Int<kBQ>, Int<kBK>>>{});
    Tensor tOrP = thr_pv.partition_fragment_A(p_layout);
    static_assert(size(tOrP) == kBK * kBQ / 128, "P fragment: 64 e4m3 values per thread");
    uint32_t* preg = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
    // kTcSum (unused otherwise): the ones tile, its B descriptor and the P̃·1
    // accumulator ((2,2,1): rows g, g+8, two equal columns each).
    typename T::MmaSum mma_sum;
    auto thr_sum = mma_sum.get_thread_slice(tid);
    Tensor sOnes = make_tensor(
        make_smem_ptr(reinterpret_cast<float_e4m3_t*>(sh.ones)),
        typename T::SmemOnes{});
    Tensor tLrOnes = thr_sum.make_fragment_B(thr_sum.partition_B(sOnes));  // (.., .., k); k-step 0 serves all
    Tensor acc_l = partition_fragment_C(mma_sum, make_shape(Int<kBQ>{}, Int<8>{}));
    static_assert(size(acc_l) == 4, "P̃·1: 4 fp32 per thread");

    // This thread's rows: g and g + 8 of its warp's 16; columns 8j + 2t (+1).
    const int wrow = (tid / 32) * 16 + (lane >> 2), tq = lane & 3;
    constexpr float kLog2_448 = 8.807354922057604f;
    // The consumer's units: the CTA's k-th unit is u = blockIdx.x + k·gridDim.x;
    // its Q is in slot kQSlots·c + k % kQSlots, whose barriers are in phase
    // (k / kQSlots) & 1.
    auto has_unit = [&](int kk) { return blockIdx.x + unsigned(kk) * gridDim.x < unsigned(n_units); };
    auto unit_of = [&](int kk) { return int(blockIdx.x + unsigned(kk) * gridDim.x); };
    auto q_slot_of = [&](int kk) { return C::kQSlots * c + kk % C::kQSlots; };
    auto wait_q = [&](int kk) {
      cutlass::arch::ClusterTransactionBarrier::wait(&sh.q_full[q_slot_of(kk)], uint32_t((kk / C::kQSlots) & 1));
    };
    // Q goes back to the producer as soon as the unit's last Q·Kᵀ is complete.
    auto release_q = [&](int kk) {
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&sh.q_empty[q_slot_of(kk)]);
    };
    // Sparse: a query block past len_q (odd count) has no LUT row; its pipe
    // loads no K/V for it (Q only, released at once). Dense: both consumers
    // share the pipe's barriers, so both run every unit (rows past len_q are
    // zero padding and are not stored). Returns the first unit from kk on
    // that this consumer computes.
    auto skip_invalid = [&](int kk) {
      if constexpr (kSparse) {
        while (has_unit(kk) && !qblock_valid(unit_of(kk), c)) {
          wait_q(kk);
          release_q(kk);
          ++kk;
        }
      }
      return kk;
    };
    // A unit's Q scales (this thread's two rows) and, for its epilogue, the
    // V scale of channel tid and the LSE correction of row tid.
    struct UnitScales {
      float qs_lo, qs_hi, vs, qkm;
    };
    auto load_scales = [&](int u) {
      const int bh = bh_of(u), q0 = qblock_of(u, c) * kBQ;
      const int64_t row_lo = int64_t(bh) * p.lq_pad + q0 + wrow;
      UnitScales s;
      s.qs_lo = __ldg(p.qscale + row_lo);
      s.qs_hi = __ldg(p.qscale + row_lo + 8);
      s.vs = tid < D ? __ldg(p.vscale + int64_t(bh) * D + tid) : 0.f;
      // kTcSum runs only without an LSE (run_d): no LSE correction to carry
      // (fewer live registers across the unit boundary, where the stream spills).
      s.qkm = !kTcSum && p.lse != nullptr && tid < kBQ ? __ldg(p.qkm + int64_t(bh) * p.lq_pad + q0 + tid) : 0.f;
      return s;
    };

    float qs_lo = 0.f, qs_hi = 0.f;  // the Q scales of the unit whose tiles the softmax works on
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) = 0.f;

    auto stage_of = [&](int g) { return pipe * kStages + g % kStages; };
    auto phase_of = [&](int g) { return uint32_t((g / kStages) & 1); };
    // A tile's place in the stage ring: its stage (among all pipes') and the
    // phase of that stage's barriers. The sparse stream advances it tile by
    // tile (ring_next) instead of dividing the tile index by kStages (3) twice
    // per tile on the way to the first Q·Kᵀ issue.
    struct Ring {
      int stage;
      uint32_t phase;
    };
    auto ring_of = [&](int g) { return Ring{stage_of(g), phase_of(g)}; };
    auto ring_next = [&](Ring r) {
      return r.stage + 1 == (pipe + 1) * kStages ? Ring{pipe * kStages, r.phase ^ 1u} : Ring{r.stage + 1, r.phase};
    };

    // The meta (K scales, tile) of the tile whose Q·Kᵀ was issued last, read
    // from shared memory right after its full barrier, used by its softmax.
    float4 meta_next = make_float4(0.f, 0.f, 0.f, 0.f);
    // S = Q·Kᵀ of the j-th tile into acc_s with the Q of slot q_slot (issued, not waited for).
    auto issue_qk = [&](Ring r, int q_slot) {
      cutlass::arch::ClusterTransactionBarrier::wait(&sh.full[r.stage], r.phase);
      meta_next = ld_shared_f4(&ms.meta[r.stage]);
      warpgroup_fence_operand(acc_s);
      warpgroup_arrive();
      mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
        cute::gemm(mma_qk, tSrQ(_, _, kk, q_slot), tSrK(_, _, kk, r.stage), acc_s);
        mma_qk.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };

    // The online softmax of the tile in acc_s, from its meta (K scales and
    // tile index from shared memory: no global load), in two phases so that
    // the wait for P̃·V of the previous tile and its fold (64 FFMA) sit
    // between them:
    //   max phase    the tile's row maxima (kSoftmax, set above):
    //                0 (dense)  scores_and_max: the scores to fp32 in sf
    //                           (I2F), then 2 interleaved chains of 8 FMNMX
    //                           per row and 64-key half;
    //                1 (sparse) row_max: from the INT32 scores in place
    //                           (c ≥ 0, so max(c·x) = c·max(x), and
    //                           float(max x) = max float(x)), 16 values a tree
    //                           of 8 VIMNMX3 (Hopper's 3-way integer max, DPX);
    //                           the I2Fs wait for the exp phase;
    //   exp_phase    the fold of the previous tile, (1: the scores to fp32,)
    //                running max, α, P̃ = exp2, row sums, P̃ to e4m3.
    // ptxas hoists a WARPGROUP.DEPBAR to the top of its basic block: the
    // wait for P̃·V sits between the two phases (the max phase ends in a
    // branch merge, full / partial tile), and the fold's FFMAs (and, for 1,
    // the I2Fs) land in the exp phase's basic block with the MUFU-bound exp2
    // (for 1, exp_phase is instantiated in both the full- and the
    // partial-tile branch for that reason).
    // Each row sum is 4 chains of 8 FADD combined as a tree (only the fp32
    // rounding order changes). Wider trees were tried: their temporaries
    // (8 per row half beside the 64 live scores) made ptxas spill.
    // Partial tile: 0 puts masked columns at -inf and applies the scale in
    // the max phase (c = 1 after it); 1 counts them as INT_MIN in the max
    // (below any INT8 dot product; a row half with none valid gives -inf)
    // and does the same in exp_phase. A LUT entry outside [0, KB) comes as
    // tile n_ktiles (see the producer): no valid column, so every score is
    // -inf, P̃ = 0, and the running max unchanged; the guard below keeps a
    // row that has seen no key yet (m = -inf) free of inf - inf.
    float sf[kBK / 2];
    // The scale of score i: lo / hi by row half (i & 2), 0 / 1 by 64-key half (i / 32).
    struct TileScale {
      float lo0, lo1, hi0, hi1;
    };
    // A partial tile's scores to fp32 in sf: masked columns at -inf, the
    // scale c applied here (the caller goes on with c = 1).
    auto partial_scores = [&](const TileScale& c, int valid) {
      CUTE_UNROLL
      for (int i = 0; i < kBK / 2; ++i) {
        const int jn = i / 4, col = jn * 8 + 2 * tq + (i & 1);
        const float cc = (i & 2) ? (jn < 8 ? c.hi0 : c.hi1) : (jn < 8 ? c.lo0 : c.lo1);
        sf[i] = col >= valid ? -INFINITY : float(acc_s(i)) * cc;
      }
    };
    // kSoftmax 0: the row max over the fp32 scores in sf.
    auto row_max_f = [&](const TileScale& c, float& mx_lo, float& mx_hi) {
      // Value i: column chunk jn = i / 4 (half jn / 8), row hi = i & 2, element i & 1.
      float a[4][2];  // [lo0, hi0, lo1, hi1][chain]
      CUTE_UNROLL
      for (int g = 0; g < 4; ++g) {
        const int b = 32 * (g / 2) + 2 * (g % 2);
        a[g][0] = fmaxf(sf[b], sf[b + 4]);
        a[g][1] = fmaxf(sf[b + 1], sf[b + 5]);
      }
      CUTE_UNROLL
      for (int jn = 2; jn < 8; ++jn) {
        CUTE_UNROLL
        for (int g = 0; g < 4; ++g) {
          const int b = 32 * (g / 2) + 2 * (g % 2) + 4 * jn;
          a[g][0] = fmaxf(a[g][0], sf[b]);
          a[g][1] = fmaxf(a[g][1], sf[b + 1]);
        }
      }
      // c >= 0, so the row max of c·x is c times the max of x per half; a -inf
      // half (partial tile) has c = 1.
      mx_lo = fmaxf(fmaxf(a[0][0], a[0][1]) * c.lo0, fmaxf(a[2][0], a[2][1]) * c.lo1);
      mx_hi = fmaxf(fmaxf(a[1][0], a[1][1]) * c.hi0, fmaxf(a[3][0], a[3][1]) * c.hi1);
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    };
    // Phase 1: scores of the tile in acc_s to fp32 (sf) and the tile's row
    // maxima; c: the scale each score still needs (1 on a partial tile, whose
    // masked columns are -inf and whose scale is applied here).
    auto scores_and_max = [&](float4 meta, TileScale& c, float& mx_lo, float& mx_hi) {
      const int t = __float_as_int(meta.z);
      const int valid = p.len_kv - t * kBK;
      c = TileScale{qs_lo * meta.x, qs_lo * meta.y, qs_hi * meta.x, qs_hi * meta.y};
      if (valid >= kBK) {
        CUTE_UNROLL
        for (int i = 0; i < kBK / 2; ++i) sf[i] = float(acc_s(i));
        row_max_f(c, mx_lo, mx_hi);
        return;
      }
      partial_scores(c, valid);
      c = TileScale{1.f, 1.f, 1.f, 1.f};
      row_max_f(c, mx_lo, mx_hi);
    };
    // Max of the 16 values of group g (0..3: lo0, hi0, lo1, hi1; value i has
    // column chunk i / 4, row half i & 2, element i & 1) of v(i).
    auto group_max = [&](int g, auto v) {
      const int b = 32 * (g / 2) + 2 * (g % 2);
      auto at = [&](int k) { return v(b + 4 * (k / 2) + (k & 1)); };  // k-th of the group's 16
      const int m0 = __vimax3_s32(at(0), at(1), at(2)), m1 = __vimax3_s32(at(3), at(4), at(5));
      const int m2 = __vimax3_s32(at(6), at(7), at(8)), m3 = __vimax3_s32(at(9), at(10), at(11));
      const int m4 = __vimax3_s32(at(12), at(13), at(14));
      return max(__vimax3_s32(m0, m1, m2), __vimax3_s32(m3, m4, at(15)));
    };
    auto row_max = [&](float4 meta, TileScale& c, int& valid, float& mx_lo, float& mx_hi) {
      const int t = __float_as_int(meta.z);
      valid = p.len_kv - t * kBK;
      c = TileScale{qs_lo * meta.x, qs_lo * meta.y, qs_hi * meta.x, qs_hi * meta.y};
      int a[4];
      if (valid >= kBK) {
        CUTE_UNROLL
        for (int g = 0; g < 4; ++g) a[g] = group_max(g, [&](int i) { return int(acc_s(i)); });
      } else {
        CUTE_UNROLL
        for (int g = 0; g < 4; ++g)
          a[g] = group_max(g, [&](int i) {
            const int col = (i / 4) * 8 + 2 * tq + (i & 1);
            return col >= valid ? INT_MIN : int(acc_s(i));
          });
      }
      auto scaled = [](int x, float cc) { return x == INT_MIN ? -INFINITY : float(x) * cc; };
      mx_lo = fmaxf(scaled(a[0], c.lo0), scaled(a[2], c.lo1));
      mx_hi = fmaxf(scaled(a[1], c.hi0), scaled(a[3], c.hi1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    };
    // Running max, α, P̃ = exp2(x·c - (m - log2 448)) in place in sf, row sums.
    auto exp_and_sum = [&](const TileScale& c, float mx_lo, float mx_hi, float& alpha_lo, float& alpha_hi) {
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      // Sparse: m stays -inf through LUT entries outside [0, KB) at the start
      // of a row; 0 stands in for it there (α = 0 on O = 0, P̃ = exp2(-inf) = 0).
      const float ms_lo = kSparse && mn_lo == -INFINITY ? 0.f : mn_lo;
      const float ms_hi = kSparse && mn_hi == -INFINITY ? 0.f : mn_hi;
      alpha_lo = fast_exp2(m_lo - ms_lo);
      alpha_hi = fast_exp2(m_hi - ms_hi);
      m_lo = mn_lo;
      m_hi = mn_hi;
      // exp2 argument = x·c - (m - log2 448), one FFMA.
      const float o_lo = ms_lo - kLog2_448, o_hi = ms_hi - kLog2_448;
      float part[2][2][2];  // row sums: [column half][lo, hi][element], 8 values each (not kTcSum)
      CUTE_UNROLL
      for (int i = 0; i < kBK / 2; i += 4) {
        const int hf = i / (kBK / 4);
        const float cl = hf == 0 ? c.lo0 : c.lo1, ch = hf == 0 ? c.hi0 : c.hi1;
        sf[i] = fast_exp2(fmaf(sf[i], cl, -o_lo));
        sf[i + 2] = fast_exp2(fmaf(sf[i + 2], ch, -o_hi));
        sf[i + 1] = fast_exp2(fmaf(sf[i + 1], cl, -o_lo));
        sf[i + 3] = fast_exp2(fmaf(sf[i + 3], ch, -o_hi));
        if constexpr (!kTcSum) {
          const bool first = i % (kBK / 4) == 0;
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            CUTE_UNROLL
            for (int e = 0; e < 2; ++e) part[hf][r][e] = first ? sf[i + 2 * r + e] : part[hf][r][e] + sf[i + 2 * r + e];
          }
        }
      }
      if constexpr (!kTcSum) {  // kTcSum: l is updated in finish_tile from P̃·1
        const float sum_lo = (part[0][0][0] + part[0][0][1]) + (part[1][0][0] + part[1][0][1]);
        const float sum_hi = (part[0][1][0] + part[0][1][1]) + (part[1][1][0] + part[1][1][1]);
        l_lo = fmaf(l_lo, alpha_lo, sum_lo);
        l_hi = fmaf(l_hi, alpha_hi, sum_hi);
      }
    };

    // P̃ (in sf) to e4m3 in the A-fragment order: k-step ks covers n-chunks
    // 4ks .. 4ks+3; a0 = row g of chunks 4ks, 4ks+1; a1 = row g+8 of them;
    // a2, a3 = chunks 4ks+2, 4ks+3.
    auto pack_to = [&](uint32_t* dst) {
      CUTE_UNROLL
      for (int ks = 0; ks < kBK / 32; ++ks) {
        const int b0 = 16 * ks;  // first value of chunk 4ks
        dst[4 * ks + 0] = e4m3x2(sf[b0 + 0], sf[b0 + 1]) | (e4m3x2(sf[b0 + 4], sf[b0 + 5]) << 16);
        dst[4 * ks + 1] = e4m3x2(sf[b0 + 2], sf[b0 + 3]) | (e4m3x2(sf[b0 + 6], sf[b0 + 7]) << 16);
        dst[4 * ks + 2] = e4m3x2(sf[b0 + 8], sf[b0 + 9]) | (e4m3x2(sf[b0 + 12], sf[b0 + 13]) << 16);
        dst[4 * ks + 3] = e4m3x2(sf[b0 + 10], sf[b0 + 11]) | (e4m3x2(sf[b0 + 14], sf[b0 + 15]) << 16);
      }
    };
    // O_tmp = P̃·V of tile j into a fresh buffer (issued, not waited for).
    auto issue_pv = [&](Ring r) {
      warpgroup_fence_operand(acc_t);
      warpgroup_arrive();
      mma_pv.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int kk = 0; kk < size<2>(tOrP); ++kk) {
        cute::gemm(mma_pv, tOrP(_, _, kk), tOrV(_, _, kk, r.stage), acc_t);
        mma_pv.accumulate_ = GMMA::ScaleOut::One;
      }
      if constexpr (kTcSum) {
        // Σ P̃ per row: the same A registers against the ones tile, in the
        // same commit group (one wait covers both). Every k-step reads the
        // tile's first 32 keys (all 1.0 like the rest): one descriptor.
        warpgroup_fence_operand(acc_l);
        mma_sum.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tOrP); ++kk) {
          cute::gemm(mma_sum, tOrP(_, _, kk), tLrOnes(_, _, 0), acc_l);
          mma_sum.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
    };
    // After P̃·V of tile j completed: the second accumulation level,
    // O = O·α + O_tmp in fp32 on the CUDA cores; K and V of tile j are released.
    auto finish_tile = [&](Ring r, float a_lo, float a_hi) {
      warpgroup_fence_operand(acc_t);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) = fmaf(acc_o(i), (i & 2) ? a_hi : a_lo, acc_t(i));
      if constexpr (kTcSum) {
        warpgroup_fence_operand(acc_l);
        l_lo = fmaf(l_lo, a_lo, acc_l(0));
        l_hi = fmaf(l_hi, a_hi, acc_l(2));
      }
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&sh.empty[r.stage]);
    };

    // Phase 2 of the softmax of the tile in acc_s (row_max done, P̃·V of the
    // previous tile complete): fold the previous tile (fold_prev), scores to
    // fp32 (a partial tile's masked columns at -inf and its scale applied
    // here, c = 1), exp2 and sums, P̃ packed straight into the wgmma operand
    // registers (no P̃·V is in flight by then).
    auto exp_phase = [&](Ring r_prev, bool fold_prev, TileScale c, int valid, float mx_lo, float mx_hi, float& alpha_lo,
                         float& alpha_hi) {
      if constexpr (kSoftmax == 0) {  // scores already in sf
        if (fold_prev) finish_tile(r_prev, alpha_lo, alpha_hi);
        exp_and_sum(c, mx_lo, mx_hi, alpha_lo, alpha_hi);
        pack_to(preg);
        return;
      }
      if (valid >= kBK) {
        if (fold_prev) finish_tile(r_prev, alpha_lo, alpha_hi);
        CUTE_UNROLL
        for (int i = 0; i < kBK / 2; ++i) sf[i] = float(acc_s(i));
        exp_and_sum(c, mx_lo, mx_hi, alpha_lo, alpha_hi);
        pack_to(preg);
        return;
      }
      if (fold_prev) finish_tile(r_prev, alpha_lo, alpha_hi);
      partial_scores(c, valid);
      exp_and_sum(TileScale{1.f, 1.f, 1.f, 1.f}, mx_lo, mx_hi, alpha_lo, alpha_hi);
      pack_to(preg);
    };

    auto max_phase = [&](float4 meta, TileScale& c, int& valid, float& mx_lo, float& mx_hi) {
      if constexpr (kSoftmax == 0) {
        valid = kBK;
        scores_and_max(meta, c, mx_lo, mx_hi);
      } else {
        row_max(meta, c, valid, mx_lo, mx_hi);
      }
    };

    // A finished unit's output: O·sv/l to BF16 (and the LSE). The V scales
    // and LSE corrections go through shared memory (ms.vscale / ms.qkm, this
    // consumer's half), written here between two named barriers (3 + c): the
    // first keeps them until every warp has read the previous unit's.
    auto epilogue = [&](int u_end, float el_lo, float el_hi, float em_lo, float em_hi, float vs_mine,
                        float qkm_mine) {
      if constexpr (!kTcSum) {  // kTcSum: P̃·1 summed all of the row's columns already
        el_lo += __shfl_xor_sync(0xffffffffu, el_lo, 1);
        el_lo += __shfl_xor_sync(0xffffffffu, el_lo, 2);
        el_hi += __shfl_xor_sync(0xffffffffu, el_hi, 1);
        el_hi += __shfl_xor_sync(0xffffffffu, el_hi, 2);
      }
      const float inv_lo = el_lo > 0.f ? 1.f / el_lo : 0.f, inv_hi = el_hi > 0.f ? 1.f / el_hi : 0.f;
      asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory");
      if (tid < D) ms.vscale[c][tid] = vs_mine;
      if (tid < kBQ) ms.qkm[c][tid] = qkm_mine;
      asm volatile("bar.sync %0, 128;\n" ::"r"(3 + c) : "memory");
      const int bh = bh_of(u_end), b = bh / p.heads, h = bh - b * p.heads;
      const int q0 = qblock_of(u_end, c) * kBQ;
      const int r_lo = q0 + wrow, r_hi = r_lo + 8;
      __nv_bfloat16* og = p.o + int64_t(b) * p.os.batch + int64_t(h) * p.os.head;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); i += 2) {
        const int col = (i / 4) * 8 + 2 * tq;
        const bool hi = (i & 2) != 0;
        const int row = hi ? r_hi : r_lo;
        if (row >= p.len_q) continue;
        const float inv = hi ? inv_hi : inv_lo;
        const float2 vs = *reinterpret_cast<const float2*>(&ms.vscale[c][col]);
        *reinterpret_cast<__nv_bfloat162*>(og + int64_t(row) * p.os.token + col) =
            __floats2bfloat162_rn(acc_o(i) * inv * vs.x, acc_o(i + 1) * inv * vs.y);
      }
      if (!kTcSum && p.lse != nullptr && tq == 0) {
        // P̃ = 448·2^(s - m): log2 Σ 2^s = m + log2 l - log2 448.
        constexpr float kLn2 = 0.69314718055994531f;
        float* lse = p.lse + int64_t(bh) * p.len_q;
        if (r_lo < p.len_q) lse[r_lo] = (em_lo + __log2f(el_lo) - kLog2_448) * kLn2 + ms.qkm[c][wrow];
        if (r_hi < p.len_q) lse[r_hi] = (em_hi + __log2f(el_hi) - kLog2_448) * kLn2 + ms.qkm[c][wrow + 8];
      }
    };

    if constexpr (!kSparse) {
      // Dense: unit by unit (one unit per CTA for long keys, where the
      // cross-unit stream below has nothing to overlap; for short keys it
      // measured no faster on the H200, docs/benchmarks.md, session 12).
      int tiles_done = 0;  // the stage ring's position
      for (int k = 0; has_unit(k); ++k) {
        const int u = unit_of(k);
        const UnitScales cur = load_scales(u);
        qs_lo = cur.qs_lo;
        qs_hi = cur.qs_hi;
        wait_q(k);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_o); ++i) acc_o(i) = 0.f;
        m_lo = m_hi = -INFINITY;
        l_lo = l_hi = 0.f;
        const int g0 = tiles_done;
        tiles_done += n_ktiles;
        const int g_last = tiles_done - 1;
        float alpha_lo, alpha_hi;
        issue_qk(ring_of(g0), q_slot_of(k));
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_s);
        if (g0 == g_last) release_q(k);
        {
          TileScale tc;
          int valid;
          float mx_lo, mx_hi;
          max_phase(meta_next, tc, valid, mx_lo, mx_hi);
          exp_phase(ring_of(g0), false, tc, valid, mx_lo, mx_hi, alpha_lo, alpha_hi);
        }
        // P̃·V of tile j runs on the tensor cores while the row max of j+1
        // is computed; its wait and fold then run beside the exp2 of j+1.
        // (The sparse stream's step_within below is the same sequence; one
        // shared lambda changed the SASS of every instance, dense included,
        // and was not measured, so the dense loop stays written out.)
        for (int j = g0; j < g_last; ++j) {
          issue_qk(ring_of(j + 1), q_slot_of(k));
          issue_pv(ring_of(j));
          warpgroup_wait<1>();  // Q·Kᵀ of j+1 (groups complete in order)
          warpgroup_fence_operand(acc_s);
          if (j + 1 == g_last) release_q(k);
          TileScale tc;
          int valid;
          float mx_lo, mx_hi;
          max_phase(meta_next, tc, valid, mx_lo, mx_hi);
          warpgroup_wait<0>();  // P̃·V of j
          exp_phase(ring_of(j), true, tc, valid, mx_lo, mx_hi, alpha_lo, alpha_hi);
        }
        issue_pv(ring_of(g_last));
        warpgroup_wait<0>();
        finish_tile(ring_of(g_last), alpha_lo, alpha_hi);
        epilogue(u, l_lo, l_hi, m_lo, m_hi, cur.vs, cur.qkm);
      }
    } else {
    // Sparse: one stream of tiles across the consumer's units (tile j: the
    // stage ring's position j). Within a unit, P̃·V of tile j runs on the tensor
    // cores while the row max of j+1 is computed; its wait and fold then run
    // beside the exp2 of j+1. Across units the stream does not stop: at a
    // unit's last tile the next unit's first Q·Kᵀ is issued with its P̃·V,
    // and the finished unit's epilogue runs in the next step, while that
    // unit's second Q·Kᵀ is on the tensor cores (O of the finished unit is
    // still in acc_o then: the new unit's first fold has α = 0, m being
    // -inf, and only then overwrites it). So neither a unit's first Q·Kᵀ
    // nor its epilogue leaves this consumer's tensor-core chain empty.
    // ptxas -v (head_dim 128, the row-sum instance): no C7514 (wgmma
    // serialization); the steady-state loop 1180 SASS instructions with 6
    // spill stores and 6 loads per tile (1176, 6 / 6 before the stream);
    // the unit-boundary code spills more (180 / 292 bytes in all since the
    // row-sum instance carries no LSE state, session 13; 224 / 424 before). The epilogue
    // sits between the Q·Kᵀ and P̃·V issues, where acc_t is not yet in flight
    // (64 live registers fewer than after the P̃·V issue; that placement was
    // not measured).
    // Tried and dropped (figures in docs/benchmarks.md): issuing Q·Kᵀ of j+2
    // before the exp2 of j+1, after the fold of j (the fold then runs before
    // the exp phase; 3% slower on the H200); issuing it before the fold
    // (ptxas serialized every wgmma or spilled ~600 bytes); folding P̃·V of
    // two tiles at a time behind a lazily moved running max (a
    // warpgroup-wide vote per tile, bar.red.or): 7% slower.
    int k = skip_invalid(0);
    if (has_unit(k)) {
      int u = unit_of(k);
      UnitScales cur = load_scales(u);
      qs_lo = cur.qs_lo;
      qs_hi = cur.qs_hi;
      int g_last = n_tiles_of(u, pipe) - 1;
      float alpha_lo = 0.f, alpha_hi = 0.f;
      wait_q(k);
      Ring rj = ring_of(0), rj1 = ring_of(1);  // the ring places of tiles j and j + 1 (below)
      issue_qk(rj, q_slot_of(k));
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      if (g_last == 0) release_q(k);
      {
        TileScale tc;
        int valid;
        float mx_lo, mx_hi;
        max_phase(meta_next, tc, valid, mx_lo, mx_hi);
        exp_phase(rj, false, tc, valid, mx_lo, mx_hi, alpha_lo, alpha_hi);
      }
      // The finished unit whose epilogue is still to run.
      bool pending = false;
      int ep_u = 0;
      float ep_l_lo = 0.f, ep_l_hi = 0.f, ep_m_lo = 0.f, ep_m_hi = 0.f, ep_vs = 0.f, ep_qkm = 0.f;
      // One step of the stream with tile j's P̃ packed and Q·Kᵀ of j+1 in the
      // same unit: P̃·V of j beside the row max of j+1, then fold j beside
      // the exp2 of j+1. with_epilogue: the unit's first step, which also
      // runs the previous unit's epilogue while Q·Kᵀ of j+1 is in flight.
      // (with_epilogue a std::bool_constant: two instantiations, each called
      // once, so both are inlined.)
      auto step_within = [&](int j, Ring r, Ring r1, auto with_epilogue) __attribute__((always_inline)) {
        issue_qk(r1, q_slot_of(k));
        if constexpr (decltype(with_epilogue)::value) epilogue(ep_u, ep_l_lo, ep_l_hi, ep_m_lo, ep_m_hi, ep_vs, ep_qkm);
        issue_pv(r);
        warpgroup_wait<1>();  // Q·Kᵀ of j+1 (groups complete in order)
        warpgroup_fence_operand(acc_s);
        if (j + 1 == g_last) release_q(k);
        TileScale tc;
        int valid;
        float mx_lo, mx_hi;
        max_phase(meta_next, tc, valid, mx_lo, mx_hi);
        warpgroup_wait<0>();  // P̃·V of j
        exp_phase(r, true, tc, valid, mx_lo, mx_hi, alpha_lo, alpha_hi);
      };
      int j = 0;
      for (;;) {
        // The unit's tiles j .. g_last; the first step carries the pending epilogue.
        if (j < g_last) {
          if (pending) {
            step_within(j, rj, rj1, std::true_type{});
            pending = false;
            ++j;
            rj = rj1;
            rj1 = ring_next(rj1);
          }
          // The steady state: the same loop as without the cross-unit stream.
          for (; j < g_last; ++j) {
            step_within(j, rj, rj1, std::false_type{});
            rj = rj1;
            rj1 = ring_next(rj1);
          }
        }
        // j == g_last: the unit's last tile; the next unit's first Q·Kᵀ goes with its P̃·V.
        const int nk = skip_invalid(k + 1);
        if (!has_unit(nk)) break;
        const int nu = unit_of(nk);
        const UnitScales nxt = load_scales(nu);
        const int n_last = j + n_tiles_of(nu, pipe);
        wait_q(nk);
        issue_qk(rj1, q_slot_of(nk));
        if (pending) epilogue(ep_u, ep_l_lo, ep_l_hi, ep_m_lo, ep_m_hi, ep_vs, ep_qkm);  // a one-tile unit
        issue_pv(rj);
        warpgroup_wait<1>();  // Q·Kᵀ of the next unit's first tile
        warpgroup_fence_operand(acc_s);
        if (j + 1 == n_last) release_q(nk);
        qs_lo = nxt.qs_lo;
        qs_hi = nxt.qs_hi;
        TileScale tc;
        int valid;
        float mx_lo, mx_hi;
        max_phase(meta_next, tc, valid, mx_lo, mx_hi);
        warpgroup_wait<0>();  // P̃·V of j, the finished unit's last
        finish_tile(rj, alpha_lo, alpha_hi);
        pending = true;
        ep_u = u;
        ep_l_lo = l_lo;
        ep_l_hi = l_hi;
        ep_m_lo = m_lo;
        ep_m_hi = m_hi;
        ep_vs = cur.vs;
        ep_qkm = cur.qkm;
        m_lo = m_hi = -INFINITY;
        l_lo = l_hi = 0.f;
        k = nk;
        u = nu;
        cur = nxt;
        g_last = n_last;
        ++j;
        rj = rj1;
        rj1 = ring_next(rj1);
        exp_phase(rj, false, tc, valid, mx_lo, mx_hi, alpha_lo, alpha_hi);
      }
      // j: the consumer's last tile.
      if (pending) epilogue(ep_u, ep_l_lo, ep_l_hi, ep_m_lo, ep_m_hi, ep_vs, ep_qkm);
      issue_pv(rj);
      warpgroup_wait<0>();
      finish_tile(rj, alpha_lo, alpha_hi);
      epilogue(u, l_lo, l_hi, m_lo, m_hi, cur.vs, cur.qkm);
    }
    }  // sparse
  }
#endif
}

template <int D, int kPipes, int kStagesPerPipe, bool kTcSum = false>
Status launch(const AttnParams& ap, const AttnProblem& pr, cudaStream_t stream) {
  using T = Sm90Traits<D>;
  using C = Sm90Config<D, kPipes, kStagesPerPipe>;
  using GL = typename T::GmemLayout;
  const int BH = int(pr.batch * pr.heads);
  const GL lq(make_shape(BH * int(ap.lq_pad), D), make_stride(int64_t(D), _1{}));
  const GL lk(make_shape(BH * int(ap.lk_pad), D), make_stride(int64_t(D), _1{}));
  const GL lv(make_shape(BH * D, int(ap.lk_pad)), make_stride(int64_t(ap.lk_pad), _1{}));
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(reinterpret_cast<const int8_t*>(ap.qi8)), lq),
                             typename T::SmemQ{}(_, _, 0));
  auto tma_k = make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(reinterpret_cast<const int8_t*>(ap.ki8)), lk),
                             typename T::template SmemK<1>{}(_, _, 0));
  auto tma_v = make_tma_copy(SM90_TMA_LOAD{},
                             make_tensor(make_gmem_ptr(reinterpret_cast<const float_e4m3_t*>(ap.v8)), lv),
                             typename T::template SmemV<1>{}(_, _, 0));
  auto kernel = sage_sm90_kernel<D, kPipes, kStagesPerPipe, kTcSum>;
  static_assert(sizeof(typename C::Shared) <= 227 * 1024, "shared memory above the 227 KB an sm_90 CTA can have");
  const int smem = int(sizeof(typename C::Shared));
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("sage_attention (sm90): cannot raise shared memory to ") +
                                                       std::to_string(smem) + " bytes: " + cudaGetErrorString(e));
  // Persistent (one CTA per SM, 1 fits, each looping over units) where a
  // unit has at most 128 key tiles: sparse rows and short keys (cross-
  // attention), whose per-unit start-up it hides; one CTA per unit for long
  // dense rows, where the hardware's dynamic CTA scheduling balances the
  // tail better than the static unit order. Measured on the H200
  // (2026-11-30, session 6, same run, persistent against one CTA per unit):
  // sparse topk 0.05 / 0.1 at 1x12x32760 0.693 / 1.106 against 0.733 / 1.144
  // ms; cross-attention 0.281 against 0.312 ms (1x12x32760x512) and 1.893
  // against 2.158 (1x40x75600x512); dense self-attention 7.81 / 26.25 /
  // 137.2 against 7.81 / 26.16 / 136.2 ms. TURBODIFF_SAGE_SM90_PERSIST=0 / 1
  // forces either (A/B; the results are the same bits).
  const int64_t units = int64_t(BH) * (ap.lq_pad / (2 * kBQ));
  const int tiles_per_unit = ap.lut ? ap.n_sel : int((ap.len_kv + kBK - 1) / kBK);
  int64_t ctas = units;
  const char* persist = std::getenv("TURBODIFF_SAGE_SM90_PERSIST");
  const bool persistent = persist ? persist[0] != '0' : tiles_per_unit <= 128;
  if (persistent) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        sms > 0)
      ctas = std::min<int64_t>(units, sms);
    // TURBODIFF_SAGE_SM90_CTAS=N caps the persistent grid below one CTA per
    // SM (read per call; an experiment knob: how the kernel scales with SMs).
    if (const char* cap = std::getenv("TURBODIFF_SAGE_SM90_CTAS"); cap && std::atoi(cap) > 0)
      ctas = std::min<int64_t>(ctas, std::atoi(cap));
  }
  e = launch_pdl(true, kernel, dim3(unsigned(ctas)), dim3(kThreads), size_t(smem), stream, ap, tma_q, tma_k, tma_v, BH);
  if (e == cudaSuccess) e = cudaGetLastError();
  else cudaGetLastError();
  if (e != cudaSuccess)
    return detail::attn_fail(Status::LaunchFailed, std::string("sage_attention (sm90): launch failed: ") + cudaGetErrorString(e));
  return Status::Ok;
}

}  // namespace

bool sm90_available() { return true; }

Status sm90_supports(const AttnProblem& p, const SageSparse* sp) {
  if (sp && (sp->block_q != 64 || sp->block_k != 128))
    return detail::attn_fail(Status::Unsupported, "sage_attention (sm90): block-sparse mode takes 64x128 (q x k) blocks, got " +
                                                      std::to_string(sp->block_q) + "x" + std::to_string(sp->block_k));
  if (p.batch * p.heads * ((p.len_kv + 127) / 128 * 128) > (int64_t(1) << 31) - 1 ||
      p.batch * p.heads * ((p.len_q + 127) / 128 * 128) > (int64_t(1) << 31) - 1)
    return detail::attn_fail(Status::Unsupported, "sage_attention (sm90): B·H·L must stay below 2^31 (TMA coordinates)");
  return Status::Ok;
}

template <int D>
Status run_d(const AttnParams& ap, const AttnProblem& p, const SageSparse* sp, cudaStream_t stream) {
  if (sp) {
    // Without an LSE the row sums come from the tensor cores (kTcSum):
    // 0.843-0.865 ms against 0.900 at 1x12x32760, topk 0.1, on the H200
    // (2026-11-30, bench_sla `sagesla_fused_attend`, the final build,
    // TURBODIFF_SAGE_SM90_ROWSUM=0 for the second). That switch is for A/B
    // only: the simulation, sage_attention_cpu, models the default.
    const char* rowsum = std::getenv("TURBODIFF_SAGE_SM90_ROWSUM");
    const bool tc_sum = ap.lse == nullptr && !(rowsum && rowsum[0] == '0');
    return tc_sum ? launch<D, 2, 3, true>(ap, p, stream) : launch<D, 2, 3>(ap, p, stream);
  }
  // Dense: 5 K/V stages for long key sequences, 4 for short ones. Measured
  // side by side on the H200 (2026-11-30, session 5, bench_attention, three
  // runs of 5 against three of 4): 5 stages 0.5-1.5% faster at every self-
  // attention shape (7.72-7.77 against 7.80-7.85 ms at 1x12x32760x128; 6
  // stages no better than 4), 3% slower at 1x40x75600 with Lk = 512.
  return p.len_kv >= 4096 ? launch<D, 1, 5>(ap, p, stream) : launch<D, 1, 4>(ap, p, stream);
}

Status sm90_attention(const AttnParams& ap, const AttnProblem& p, const SageSparse* sp, cudaStream_t stream) {
  return p.head_dim == 128 ? run_d<128>(ap, p, sp, stream) : run_d<64>(ap, p, sp, stream);
}

}  // namespace td::kernels::sage
