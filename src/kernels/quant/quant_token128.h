// Per-token INT8 quantization of activations in 1x128 groups (quant_common.h,
// format 2: symmetric, scale = amax/127, zero groups -> scale 0, codes 0):
// the A operand of a block-scaled GEMM that rescales its int32 partial sums
// once per 128-wide K block (DeepGEMM-style on Hopper).
//
//   x      [rows, cols] fp32 / fp16 / bf16, row stride ld_x (>= cols)
//   q      [rows, cols] int8, row stride ld_q (>= cols)
//   scales K-block-major: scales[g * ld_scales + m] is the scale of row m,
//          columns [128g, 128g+128) (clipped to cols), for g < ceil(cols/128).
//          ld_scales >= rows: pass rows for a dense [ceil(cols/128), rows]
//          array, or rows rounded up to a multiple of 4 when a TMA-fed GEMM
//          needs each K block's scale row 16-byte aligned. The GEMM's CTA for
//          rows [m0, m0+BM) then reads one contiguous run of BM scales per K
//          block. Padding entries (m >= rows) are not written.
//
// Any rows and cols are accepted; the last group of a row may be shorter than
// 128. The CUDA kernel is bit-identical to the CPU reference (vectorized when
// cols, ld_x, ld_q are multiples of 8 and x is 16-byte, q 8-byte aligned).
#pragma once

#include <cstdint>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

Status quantize_token128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales, int64_t ld_scales);

// out[m, c] = q[m, c] * scales[(c/128) * ld_scales + m] (fp32).
Status dequantize_token128_cpu(const int8_t* q, int64_t rows, int64_t cols, int64_t ld_q, const float* scales,
                               int64_t ld_scales, float* out, int64_t ld_out);

// CUDA kernel variants (bit-identical results):
//   Items4       4 groups per half-warp, 64-bit index decode (the first kernel);
//   Items8Idx32  8 groups per half-warp, 32-bit index decode (when
//                rows * groups < 2^31; else Items4). Candidate for issue 3's
//                bandwidth bar: flip Auto once measured faster on the H200.
//   Items4Idx32  4 groups per half-warp, 32-bit index decode (same condition).
//   Items4Idx32Lane  Items4Idx32 with one quantization-parameter division
//                pair per lane (lane u of a half-warp for its item u, the
//                inverse shuffled back) and codes packed by PRMT; same
//                condition. Candidate for issue 3's bandwidth bar.
//   RowSlabs     a warp per slab of one row (32 x 4..6 packs of 8: a whole
//                1536 row, a quarter of 5120), one decode and one division
//                pair per lane per slab, PRMT packing; vector path with
//                rows x slabs < 2^31, else Items4Idx32. 94% / 99.5% of copy on
//                the H200 (2026-11-30).
//   Auto         TURBODIFF_QUANT_TOKEN128_KERNEL=items8|items4|items4_32|items4_32_lane
//                if set, else RowSlabs (measured fastest on the H200, 2026-11-30).
enum class Token128QuantKernel { Auto, Items4, Items8Idx32, Items4Idx32, Items4Idx32Lane, RowSlabs };

#if TURBODIFF_HAVE_CUDA
// Half a warp per (row, group): 16 lanes x 8 elements, amax by xor shuffles;
// each half-warp handles 4 (or 8) groups with all loads issued first.
Status quantize_token128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                              int64_t ld_q, float* scales, int64_t ld_scales, void* stream,
                              Token128QuantKernel kernel = Token128QuantKernel::Auto);
#endif

}  // namespace td::kernels
