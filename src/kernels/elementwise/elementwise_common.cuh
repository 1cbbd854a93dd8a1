// Launch layout shared by the elementwise kernels (activation.cu,
// broadcast_binary.cu). The row layout of the norm kernels, without the
// whole-row requirement: blockDim = (threads per row, rows per block), each
// thread handles kElementwiseVpt chunks of its row, tpr apart (coalesced),
// issuing all its loads before any arithmetic; rows longer than one block's
// tile (tpr * kElementwiseVpt chunks) are split over gridDim.y. Chunks are 8
// elements (16-byte accesses) when every operand allows, else 1.
#pragma once

#include "kernels/norm/norm_common.cuh"

namespace td::kernels::gpu {

constexpr int kElementwiseVpt = 4;           // chunks per thread: 64 bytes of bf16 in flight per operand
constexpr int kElementwiseMaxThreads = 256;  // threads per block (and per row, at most)

struct ElementwisePlan {
  int chunk = 8;  // 8 (vector path) or 1 (scalar path)
  int tpr = 0;    // threads per row (blockDim.x)
  int rpb = 0;    // rows per block (blockDim.y)
  int tiles = 0;  // column tiles per row (gridDim.y)
};

// False when the row would need more than 65535 column tiles.
inline bool plan_elementwise(int64_t dim, bool vectorized, ElementwisePlan* plan) {
  ElementwisePlan p;
  p.chunk = vectorized ? 8 : 1;
  const int64_t nchunks = dim / p.chunk;
  int64_t tpr = (nchunks + kElementwiseVpt - 1) / kElementwiseVpt;
  if (tpr <= 32) {
    int64_t p2 = 1;
    while (p2 < tpr) p2 <<= 1;
    tpr = p2;
  } else {
    tpr = std::min<int64_t>((tpr + 31) / 32 * 32, kElementwiseMaxThreads);
  }
  p.tpr = int(tpr);
  p.rpb = p.tpr >= kElementwiseMaxThreads ? 1 : kElementwiseMaxThreads / p.tpr;
  const int64_t tile = tpr * kElementwiseVpt;
  const int64_t tiles = (nchunks + tile - 1) / tile;
  if (tiles > 65535) return false;
  p.tiles = int(tiles);
  *plan = p;
  return true;
}

}  // namespace td::kernels::gpu
