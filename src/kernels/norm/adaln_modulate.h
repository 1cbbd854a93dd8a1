// Wan's norm1 / norm2 with AdaLN modulation (and the head's final norm):
//   y[r, i] = LN(x[r, :])[i] * (1 + scale[b, i]) + shift[b, i],  b = r / rows_per_batch
// where LN is a LayerNorm without affine parameters (biased variance, eps),
// all in fp32, rounded once to y's type. scale and shift are fp32 rows
// [batch, dim], `mod_stride` elements apart (Wan's e0 is [B, 6, D]: pass
// e0 + 1*D as scale, e0 + 0*D as shift and mod_stride = 6*D); either may be
// null (then 0). mod_stride 0 shares one row among all samples; rows_per_batch
// = 1 gives per-token modulation (Wan2.2 TI2V). x and y may be F32, F16 or
// BF16 independently; y may alias x exactly (in place).
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

Status adaln_modulate_cpu(const void* x, ElemType x_type, int64_t x_stride,
                          void* y, ElemType y_type, int64_t y_stride,
                          const float* scale, const float* shift, int64_t mod_stride, int64_t rows_per_batch,
                          int64_t rows, int64_t dim, float eps);

// CUDA kernel variants:
//   Lean  the lean row kernel (norm_lean.cuh: ~3x fewer instructions per
//         element, one CTA barrier per row at 5120; the default): measured on
//         the H200 (2026-11-30) 86.1-87.4 / 96.4-96.7% of copy at 32760x1536 /
//         75600x5120 against One's 82.9-85.2 / 85.8-86.2%. Bit-identical to
//         One for rows of <= 32 threads (1536); wider rows merge per-warp
//         statistics (fp32 rounding apart).
//   One   the row engine's kernel (norm_rows.cuh), one row per thread group.
//   Auto  TURBODIFF_ADALN_ROWS=one|lean if set (read per call), else Lean.
// (Measured and removed: Teams (persistent warp teams, 76-77%), Two (two rows
// per thread, no gain), Cta64 / Cta128 (+-1%), LeanFma (one FFMA for
// o * (1 + scale) + shift, -0.1 to -1.8% against Lean).)
enum class AdaLnRows { Auto, One, Lean };

#if TURBODIFF_HAVE_CUDA
Status adaln_modulate_cuda(const void* x, ElemType x_type, int64_t x_stride,
                           void* y, ElemType y_type, int64_t y_stride,
                           const float* scale, const float* shift, int64_t mod_stride, int64_t rows_per_batch,
                           int64_t rows, int64_t dim, float eps, void* stream,
                           AdaLnRows rows_per_thread = AdaLnRows::Auto);
#endif

Status adaln_modulate_check(const void* x, ElemType x_type, int64_t x_stride,
                            const void* y, ElemType y_type, int64_t y_stride,
                            int64_t mod_stride, int64_t rows_per_batch, int64_t rows, int64_t dim, float eps);

}  // namespace td::kernels
