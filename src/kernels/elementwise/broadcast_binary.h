// Broadcasting add / multiply of [rows, dim] activations:
//   out[r, i] = a[r, i] op B(r, i),  op = + or *
// where B is, by `broadcast`:
//   Full:      b[r, i], an activation tensor of a's type, row stride b_stride
//   Vector:    b[i], an fp32 [dim] vector (a bias, a per-channel scale); b_stride unused
//   PerSample: b[r / rows_per_batch, i], fp32 rows [batch, dim] b_stride apart
//              (tokens of one sample share a row: modulation vectors, gates)
// computed in fp32 and rounded once to out's type. a and out may be F32, F16
// or BF16 independently; out may alias a (or b, Full) exactly: same pointer,
// type and stride.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

enum class BinaryOp { Add, Mul };
enum class Broadcast { Full, Vector, PerSample };

struct BroadcastBinaryParams {
  BinaryOp op = BinaryOp::Add;
  Broadcast broadcast = Broadcast::Full;
  const void* a = nullptr;
  ElemType a_type = ElemType::BF16;
  int64_t a_stride = 0;
  const void* b = nullptr;  // Full: a_type; Vector, PerSample: fp32
  int64_t b_stride = 0;     // Full, PerSample
  int64_t rows_per_batch = 1;  // PerSample
  void* out = nullptr;
  ElemType out_type = ElemType::BF16;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
};

Status broadcast_binary_cpu(const BroadcastBinaryParams& p);

#if TURBODIFF_HAVE_CUDA
Status broadcast_binary_cuda(const BroadcastBinaryParams& p, void* stream);
#endif

Status broadcast_binary_check(const BroadcastBinaryParams& p);

}  // namespace td::kernels
