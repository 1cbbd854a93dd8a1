// Row reductions of the column-owner LayerNorm kernels (threads own 8-column
// packs of several rows: layernorm_modulate_quant_columns.cu, token128, and
// layernorm_modulate_quant_cluster.cu, block128): each lane holds partials of
// R rows, reduced by a transposed butterfly (R - 1 shuffles while a lane holds
// several rows, instead of 5 per row), then over the CTA's warps in a fixed
// order so every warp gets the same bits. Device code only.
#pragma once

#include <cuda_runtime.h>

namespace td::kernels::lnq {

// Rows still held per lane after `level` halving steps of a transposed
// butterfly over R rows.
template <int R>
__host__ __device__ constexpr int rows_held(int level) {
  return (R >> level) > 0 ? (R >> level) : 1;
}

// Transposed butterfly sum over aligned groups of `width` lanes: v[i] is the
// lane's partial of row i; on return v[0] is the group's total of row
// `row` (the returned index). At each halving step while a lane holds more
// than one row it keeps half of them and receives its partner's partials of
// that half (R - 1 shuffles in those steps), then plain xor steps.
template <int R, int width, typename Op>
__device__ __forceinline__ int transposed_reduce(float (&v)[R], Op op) {
  const int lane = int(threadIdx.x & 31u);
  int row = 0;
#pragma unroll
  for (int l = 0; (width >> (l + 1)) > 0; ++l) {
    const int o = width >> (l + 1);
    const int cnt = rows_held<R>(l);
    if (cnt > 1) {
      const bool upper = (lane & o) != 0;
      const int h = cnt / 2;
#pragma unroll
      for (int k = 0; k < h; ++k) {
        const float send = upper ? v[k] : v[k + h];
        const float keep = upper ? v[k + h] : v[k];
        v[k] = op(keep, __shfl_xor_sync(0xffffffffu, send, o));
      }
      if (upper) row += h;
    } else {
      v[0] = op(v[0], __shfl_xor_sync(0xffffffffu, v[0], o));
    }
  }
  return row;
}

// The lane (within its aligned group of `width` lanes) that holds row i after
// transposed_reduce<R, width>.
template <int R, int width>
__device__ __forceinline__ int lane_of_row(int i) {
  int lane = 0;
#pragma unroll
  for (int l = 0; (width >> (l + 1)) > 0; ++l) {
    const int cnt = rows_held<R>(l);
    if (cnt > 1 && (i & (cnt / 2))) lane |= width >> (l + 1);
  }
  return lane;
}

// Row totals over the CTA's warps: each warp's transposed_reduce result is
// published in part[row][warp] (one lane per row and warp), then after the
// barrier every warp sums the partials in the same fixed order: lane l takes
// row l % R and the warps w = l / R, l / R + 32 / R, ..., then xor steps
// over the lanes of the same row. Returns, in every lane, the total of row
// (lane % R): identical in all warps (same operations, same order).
template <int R, int kMaxWarps>
__device__ __forceinline__ float cta_row_sum(float (&v)[R], float (*part)[kMaxWarps], int nwarps) {
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  const int row = transposed_reduce<R, 32>(v, [](float a, float b) { return a + b; });
  if ((lane & (32 / R - 1)) == 0) part[row][warp] = v[0];
  __syncthreads();
  const int i = lane % R;
  float acc = 0.f;
#pragma unroll
  for (int w = lane / R; w < kMaxWarps; w += 32 / R)
    if (w < nwarps) acc += part[i][w];
#pragma unroll
  for (int o = R; o < 32; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

// acc[i] = the sum of row i's V packs of 8 values, pairwise in a fixed order
// (the first pass of the two-pass statistics; both kernels' bits).
template <int R, int V>
__device__ __forceinline__ void row_pack_sums(const float (&v)[R][V][8], float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    acc[i] = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j)
      acc[i] += ((v[i][j][0] + v[i][j][1]) + (v[i][j][2] + v[i][j][3])) +
                ((v[i][j][4] + v[i][j][5]) + (v[i][j][6] + v[i][j][7]));
  }
}

}  // namespace td::kernels::lnq
