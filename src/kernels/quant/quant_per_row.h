// Per-row INT8 quantization (quant_common.h, format 2: symmetric, one scale =
// amax/127 per row over all its columns, zero rows -> scale 0, codes 0).
//
// This is the operand format of the post-scale W8A8 variant (the TurboT2AV
// notes: int8 products accumulated continuously over all of K, scales applied
// once in the epilogue): weights [N, K] get one scale per output channel, and
// activations [M, K] one scale per token; out = (sum_k qa*qw) * sa[m] * sw[n].
//
//   x      [rows, cols] fp32 / fp16 / bf16, row stride ld_x (>= cols)
//   q      [rows, cols] int8, row stride ld_q (>= cols)
//   scales [rows] fp32
//
// Any rows and cols. The CUDA kernel is bit-identical to the CPU reference.
#pragma once

#include <cstdint>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

Status quantize_per_row_cpu(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                            int64_t ld_q, float* scales);

// out[r, c] = q[r, c] * scales[r] (fp32).
Status dequantize_per_row_cpu(const int8_t* q, int64_t rows, int64_t cols, int64_t ld_q, const float* scales,
                              float* out, int64_t ld_out);

#if TURBODIFF_HAVE_CUDA
// One CTA of 256 threads per row: a pass for the amax, then a pass that
// re-reads the row (from L1: a row is at most tens of KB) and writes codes.
Status quantize_per_row_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales, void* stream);
#endif

}  // namespace td::kernels
