// CUDA per-token 1x128 group INT8 quantizer (quant_common.h, format 2).
//
// Design: a (row, group) pair is a work item, numbered row-major (item =
// row * groups + g). Half a warp owns an item: lane l of the 16 loads
// columns [8l, 8l+8) of the group (one 16-byte load for bf16), the group
// amax is 4 xor shuffles inside the half-warp, and each lane writes its 8
// codes (8 bytes). Each half-warp takes 4 items, strided by the number of
// half-warps in the grid, and issues all 4 loads before reducing, so a
// thread keeps 64 bytes in flight; at any moment the running half-warps
// cover consecutive items, i.e. contiguous memory. Scales go to
// scales[g * ld_scales + row] (lane 0 of the half-warp): K-block-major, the
// layout the GEMM reads one K block at a time.
//
// Traffic per element: 2 bytes read (bf16) + 1 written, + 4 bytes of scale
// per 128 elements.
// Predicted (bytes / 4.0 TB/s), bf16:
//   32760 x 1536: 152.5 MB -> 38.1 us;  75600 x 5120: 1173.3 MB -> 293 us.
#include <cstdlib>
#include <cstring>

#include "kernels/quant/quant_device.cuh"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {
namespace {

using namespace qdev;

constexpr int kThreads = 256;
constexpr int kItemsPerHalfWarp = 4;

// Token128QuantKernel::Items8Idx32 (variant beside the default Items4): 8
// items per half-warp (128 bytes of bf16 in flight per thread instead of 64)
// and the item -> (row, group) decode in 32-bit integers (a 64-bit division
// is a ~70-instruction subroutine, 4 of them per thread for 32 bytes of data
// in the default: ~9 instructions per element, against a budget of ~20 per
// element at HBM speed for a 3-byte/element kernel). Used when
// rows * groups < 2^31. Predicted: 74-77% -> ~85-90% of copy bandwidth.
// Token128QuantKernel::Items4Idx32: the 32-bit decode alone with 4 items
// (Items8Idx32 needs ~115 registers, so 2 CTAs of 256 per SM hold the same
// 64 KB in flight as the default's 4; this one keeps the default's occupancy).
// kIdx32 == false with kItems == 4 is the default kernel, unchanged.
// Token128QuantKernel::Items4Idx32Lane (kLaneParams): Items4Idx32 with the
// per-group work cut. The profile of the default (H200, 32760 x 1536) counts
// ~22 thread instructions per element against ~26 that HBM speed allows at
// 100% issue (3 bytes per element, 132 SMs): issue-bound at 72%. Per 8-element
// item a lane spends ~8 on the group amax shuffles, ~20 on the two IEEE
// divisions of symmetric_params_dev (MUFU.RCP + Newton steps + FCHK and the
// slow-path branch) and ~16 on masking, shifting and ORing the 8 codes.
// Here, after the 4 group maxima, lane u of each half-warp derives item u's
// parameters only and one shuffle per item hands inv back (one division pair
// per lane instead of 4: -15 per item), lane u also stores item u's scale,
// and the codes are gathered by PRMT (6 per 8 codes: -10 per item). Same
// operations on the same values: bit-identical codes and scales.
// Predicted: ~-3 instructions per element (~17 -> ~14 after the 32-bit
// decode, an estimate: the profile caught Items4, ~22), issue ~55-65%:
// 84-90% of copy (from 77-79%); RowSlabs (below) removes more.
template <typename T, bool kVec, int kItems = kItemsPerHalfWarp, bool kIdx32 = false, bool kLaneParams = false>
__global__ void __launch_bounds__(kThreads)
    quantize_token128_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* __restrict__ q,
                             int64_t ld_q, float* __restrict__ scales, int64_t ld_scales, int64_t groups) {
  constexpr int kItemsPerHalfWarp = kItems;
  const int lane16 = int(threadIdx.x & 15u);
  const int64_t half_warp = (int64_t(blockIdx.x) * kThreads + threadIdx.x) >> 4;
  const int64_t half_warps = (int64_t(gridDim.x) * kThreads) >> 4;
  const int64_t items = rows * groups;

  Pack8<T> raw[kItemsPerHalfWarp];
  int64_t row[kItemsPerHalfWarp], g[kItemsPerHalfWarp];
  int ncols[kItemsPerHalfWarp];
  bool valid[kItemsPerHalfWarp];
#pragma unroll
  for (int u = 0; u < kItemsPerHalfWarp; ++u) {
    const int64_t item = half_warp + u * half_warps;
    valid[u] = item < items;
    if constexpr (kIdx32)
      row[u] = valid[u] ? int64_t(uint32_t(item) / uint32_t(groups)) : 0;
    else
      row[u] = valid[u] ? item / groups : 0;
    g[u] = valid[u] ? item - row[u] * groups : 0;
    const int64_t col = g[u] * kQuantGroup + lane16 * 8;
    const int64_t left = valid[u] ? cols - col : 0;
    ncols[u] = int(left < 0 ? 0 : (left > 8 ? 8 : left));
    const T* src = x + row[u] * ld_x + col;
    if (ncols[u] > 0)
      raw[u] = kVec ? load_pack(src) : load_pack_partial(src, ncols[u]);
    else
      raw[u] = zero_pack<T>();
  }

  if constexpr (kLaneParams) {
    float amax[kItemsPerHalfWarp];
#pragma unroll
    for (int u = 0; u < kItemsPerHalfWarp; ++u)
      amax[u] = group_max<16>(amax_from_bits<T>(absmax_bits(raw[u], 0u)));  // all 32 lanes take part
    float my_amax = amax[0];
#pragma unroll
    for (int u = 1; u < kItemsPerHalfWarp; ++u)
      if (lane16 == u) my_amax = amax[u];
    const QuantParams mine = symmetric_params_dev(my_amax);
    const int half_base = int(threadIdx.x & 16u);
#pragma unroll
    for (int u = 0; u < kItemsPerHalfWarp; ++u) {
      const float inv = __shfl_sync(0xffffffffu, mine.inv, half_base | u);
      float f[8];
      unpack(raw[u], f);
      int8_t* dst = q + row[u] * ld_q + g[u] * kQuantGroup + lane16 * 8;
      if (kVec && ncols[u] == 8)
        *reinterpret_cast<uint2*>(dst) = quantize8_prmt(f, inv);
      else if (ncols[u] > 0)
        store_codes(dst, quantize8(f, inv), ncols[u], false);
      if (lane16 == u && valid[u]) scales[g[u] * ld_scales + row[u]] = mine.scale;
    }
  } else {
#pragma unroll
    for (int u = 0; u < kItemsPerHalfWarp; ++u) {
      const float amax = group_max<16>(amax_from_bits<T>(absmax_bits(raw[u], 0u)));  // all 32 lanes take part
      const QuantParams p = symmetric_params_dev(amax);
      float f[8];
      unpack(raw[u], f);
      if (ncols[u] > 0)
        store_codes(q + row[u] * ld_q + g[u] * kQuantGroup + lane16 * 8, quantize8(f, p.inv), ncols[u], kVec);
      if (lane16 == 0 && valid[u]) scales[g[u] * ld_scales + row[u]] = p.scale;
    }
  }
}

// Token128QuantKernel::RowSlabs (variant beside the half-warp-per-group
// kernels above): the per-group overhead of those kernels (the item ->
// (row, group) decode, three 64-bit addresses, the group's two divisions,
// for 8 elements per lane) is what keeps them issue-bound. Here a warp owns
// a "slab" of one row: 32 x V consecutive 8-element packs (V = 6: a whole
// 1536-wide row; 5120 = 4 slabs of V = 5; 4096 = 4 of V = 4), pack p0 +
// lane + 32 j in register slot j, so each slot's 16 lanes hold one aligned
// 128-column group (amax: 4 xor shuffles on the raw bits' maxima). One
// 32-bit decode and one set of row addresses per slab (V x 256 bytes of
// bf16), immediate offsets for the packs, lane j of each half-warp derives
// slot j's scale and inverse (one IEEE division pair per lane per slab; the
// inverse goes back by one shuffle per slot; lane j stores slot j's scale),
// codes packed by PRMT. Same operations on the same values as the default:
// bit-identical codes and scales. Vector path only (else Items4Idx32).
// Counted per bf16 element: |x| max on the bits 1, group max 1, unpack 1,
// product + cvt 2, PRMT 0.75, parameters ~0.6, decode / addresses ~0.6,
// LDG/STG 0.25: ~7; the sm_90a SASS of the V = 6 kernel has 505
// instructions for a lane's 48 elements (~10.5 per element, the division
// slow path included), against ~22 per element for Items4 (profile) and ~26
// available at 4 TB/s (3 bytes per element). 48 registers: 5 CTAs = 40
// warps per SM, ~120 KB of loads in flight. Predicted: HBM-bound, 90-95% of
// copy at both Wan shapes (as quant_block128, 93-101%), from 77-79%.
constexpr int kSlabWarps = kThreads / 32;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    quantize_token128_slab_kernel(const T* __restrict__ x, int cols, int64_t ld_x, int8_t* __restrict__ q, int64_t ld_q,
                                  float* __restrict__ scales, int64_t ld_scales, int slabs, int units) {
  const int lane = int(threadIdx.x & 31u), lane16 = lane & 15;
  const int unit = int(blockIdx.x) * kSlabWarps + int(threadIdx.x >> 5);
  if (unit >= units) return;  // a whole warp; no block-wide barrier follows
  const int row = unit / slabs, slab = unit - row * slabs;
  const int packs = cols / 8;
  const int p0 = slab * 32 * V;
  const T* xr = x + int64_t(row) * ld_x;
  int8_t* qr = q + int64_t(row) * ld_q;

  Pack8<T> raw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int p = p0 + lane + 32 * j;
    raw[j] = p < packs ? load_pack(xr + p * 8) : zero_pack<T>();
  }
  float amax[V];
#pragma unroll
  for (int j = 0; j < V; ++j) amax[j] = group_max<16>(amax_from_bits<T>(absmax_bits(raw[j], 0u)));
  float my_amax = amax[0];
#pragma unroll
  for (int j = 1; j < V; ++j)
    if (lane16 == j) my_amax = amax[j];
  const QuantParams mine = symmetric_params_dev(my_amax);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float inv = __shfl_sync(0xffffffffu, mine.inv, (lane & 16) | j);
    const int p = p0 + lane + 32 * j;
    if (p < packs) {
      float f[8];
      unpack(raw[j], f);
      *reinterpret_cast<uint2*>(qr + p * 8) = quantize8_prmt(f, inv);
    }
  }
  if (lane16 < V) {
    const int pg = p0 + 32 * lane16 + (lane & 16);  // first pack of slot lane16's group
    if (pg < packs) scales[int64_t(pg >> 4) * ld_scales + row] = mine.scale;
  }
}

// Packs per lane of a slab for rows of `packs` packs: V in {4, 5, 6}, the
// fewest idle pack slots over the row's slabs, ties to the larger V.
int slab_packs(int64_t packs) {
  int best = 0;
  int64_t best_idle = -1;
  for (int v : {6, 5, 4}) {
    const int64_t per = 32 * int64_t(v), slabs = (packs + per - 1) / per;
    const int64_t idle = slabs * per - packs;
    if (best_idle < 0 || idle < best_idle) best_idle = idle, best = v;
  }
  return best;
}

}  // namespace

Status quantize_token128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                              int64_t ld_q, float* scales, int64_t ld_scales, void* stream,
                              Token128QuantKernel kernel) {
  if (rows < 0 || cols < 0) return Status::InvalidArgument;
  if (rows == 0 || cols == 0) return Status::Ok;
  if (!x || !q || !scales || ld_x < cols || ld_q < cols || ld_scales < rows) return Status::InvalidArgument;
  const int64_t groups = quant_groups(cols);
  if (kernel == Token128QuantKernel::Auto) {
    // RowSlabs: 94.0% / 99.5% of copy on the H200 (2026-11-30, 32760x1536 /
    // 75600x5120) against 77-79% for Items4Idx32 (the earlier default) and
    // 81-84% for Items4Idx32Lane; bit-identical codes, GPU tests passed.
    kernel = Token128QuantKernel::RowSlabs;
    if (const char* e = std::getenv("TURBODIFF_QUANT_TOKEN128_KERNEL"))  // read per call: A/B in benchmarks
      kernel = std::strcmp(e, "items8") == 0        ? Token128QuantKernel::Items8Idx32
               : std::strcmp(e, "items4") == 0       ? Token128QuantKernel::Items4
               : std::strcmp(e, "items4_32") == 0    ? Token128QuantKernel::Items4Idx32
               : std::strcmp(e, "items4_32_lane") == 0 ? Token128QuantKernel::Items4Idx32Lane
                                                     : Token128QuantKernel::RowSlabs;
  }
  const bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_q % 8 == 0 && aligned_to(x, 16) && aligned_to(q, 8);
  if (kernel == Token128QuantKernel::RowSlabs) {
    // Vector path with every slab index (rows x slabs) and cols in 32 bits;
    // otherwise Items4Idx32 (below).
    const int v = slab_packs(cols / 8);
    const int64_t slabs = (cols / 8 + 32 * v - 1) / (32 * v);
    if (vec && cols <= int64_t(0x7fffffff) && rows * slabs <= int64_t(0x7fffffff) - kSlabWarps) {
      const int units = int(rows * slabs);
      const unsigned grid = unsigned((units + kSlabWarps - 1) / kSlabWarps);
      auto s = static_cast<cudaStream_t>(stream);
      return dispatch_act_type(x_type, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* xt = static_cast<const T*>(x);
        if (v == 6)
          quantize_token128_slab_kernel<T, 6><<<grid, kThreads, 0, s>>>(xt, int(cols), ld_x, q, ld_q, scales, ld_scales,
                                                                          int(slabs), units);
        else if (v == 5)
          quantize_token128_slab_kernel<T, 5><<<grid, kThreads, 0, s>>>(xt, int(cols), ld_x, q, ld_q, scales, ld_scales,
                                                                          int(slabs), units);
        else
          quantize_token128_slab_kernel<T, 4><<<grid, kThreads, 0, s>>>(xt, int(cols), ld_x, q, ld_q, scales, ld_scales,
                                                                          int(slabs), units);
        return launch_status();
      });
    }
    kernel = Token128QuantKernel::Items4Idx32;
  }
  // The 32-bit decode needs every item index (and the grid's half-warp
  // count) below 2^31; otherwise the default kernel runs.
  if (kernel != Token128QuantKernel::Items4 && rows * groups >= int64_t(0x7fffffff) - 8 * 16 * int64_t(kThreads))
    kernel = Token128QuantKernel::Items4;
  const bool wide = kernel == Token128QuantKernel::Items8Idx32;
  const int64_t items_per_block = int64_t(kThreads / 16) * (wide ? 8 : kItemsPerHalfWarp);
  const int64_t blocks = (rows * groups + items_per_block - 1) / items_per_block;
  if (blocks > 0x7fffffff) return Status::InvalidArgument;
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_act_type(x_type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (wide) {
      if (vec)
        quantize_token128_kernel<T, true, 8, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      else
        quantize_token128_kernel<T, false, 8, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      return launch_status();
    }
    if (kernel == Token128QuantKernel::Items4Idx32Lane) {
      if (vec)
        quantize_token128_kernel<T, true, 4, true, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      else
        quantize_token128_kernel<T, false, 4, true, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      return launch_status();
    }
    if (kernel == Token128QuantKernel::Items4Idx32) {
      if (vec)
        quantize_token128_kernel<T, true, 4, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      else
        quantize_token128_kernel<T, false, 4, true><<<unsigned(blocks), kThreads, 0, s>>>(
            static_cast<const T*>(x), rows, cols, ld_x, q, ld_q, scales, ld_scales, groups);
      return launch_status();
    }
    if (vec)
      quantize_token128_kernel<T, true><<<unsigned(blocks), kThreads, 0, s>>>(static_cast<const T*>(x), rows, cols,
                                                                              ld_x, q, ld_q, scales, ld_scales, groups);
    else
      quantize_token128_kernel<T, false><<<unsigned(blocks), kThreads, 0, s>>>(static_cast<const T*>(x), rows, cols,
                                                                               ld_x, q, ld_q, scales, ld_scales, groups);
    return launch_status();
  });
}

}  // namespace td::kernels
