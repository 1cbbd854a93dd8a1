// INT8 quantization in TurboDiffusion's 128x128 block format (quant_common.h,
// format 1): activations [M, K] before a W8A8 GEMM, and weights [N, K] when a
// checkpoint is converted (TurboDiffusion's Int8Linear.from_linear runs the
// same quantizer on the weight), so one op serves both.
//
//   x      [rows, cols] fp32 / fp16 / bf16, row stride ld_x elements (>= cols)
//   q      [rows, cols] int8, row stride ld_q (>= cols)
//   scales [ceil(rows/128), ceil(cols/128)] fp32, row-major and dense
//          (TurboDiffusion's `*.scale` layout); block (i, j) covers rows
//          [128i, 128i+128) and columns [128j, 128j+128), clipped to the matrix.
//
// Any rows and cols are accepted (ragged edge blocks take their amax over the
// elements that exist). rows == 0 or cols == 0 is a no-op. The CUDA kernel
// takes a vectorized path when cols, ld_x and ld_q are multiples of 8 and x
// is 16-byte and q 8-byte aligned, and an element-wise path otherwise; both
// give the same codes as the CPU reference, bit for bit.
#pragma once

#include <cstdint>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

Status quantize_block128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales);

// out[r, c] = q[r, c] * scales[r/128, c/128] (fp32), for tests and tools.
Status dequantize_block128_cpu(const int8_t* q, int64_t rows, int64_t cols, int64_t ld_q, const float* scales,
                               float* out, int64_t ld_out);

#if TURBODIFF_HAVE_CUDA
// One CTA of 256 threads per 128x128 block, the block held in registers:
// one read of x, one write of q. Stream-ordered; no synchronization.
Status quantize_block128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                              int64_t ld_q, float* scales, void* stream);
#endif

}  // namespace td::kernels
