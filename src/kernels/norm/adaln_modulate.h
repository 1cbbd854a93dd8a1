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

// CUDA kernel variants (same arithmetic):
//   One   the row engine's kernel, one row per thread group (the default);
//   Two   each thread holds the same chunks of 2 consecutive rows and reads
//         their fp32 scale/shift once (vector path; rows that would not fit
//         in 64 registers per thread take One). Candidate for issue 3's
//         bandwidth bar: flip Auto once measured faster on the H200.
//   Cta64 / Cta128  One's kernel with 64- / 128-thread CTAs: rows narrower
//         than the CTA (1536: one warp per row) go 2 / 4 per CTA, each warp
//         its own row, no CTA-wide barrier; wider rows as One. Bit-identical
//         to One (norm_variant.h says why it might help).
//   Lean  the lean row kernel (norm_lean.cuh: ~3x fewer instructions per
//         element, one CTA barrier per row at 5120); bit-identical to One
//         for rows of <= 32 threads (1536), per-warp statistics merged
//         (fp32 rounding apart) for wider rows. Predicted 83.2/85.6% ->
//         ~93/95% of copy at 32760x1536 / 75600x5120; measured on the H200
//         (2026-11-30) 86.1-87.4 / 96.4-96.7% against One's 82.9-85.2 /
//         85.8-86.2% (5120 with 56 registers; under 48 it spilled: 82%).
//   LeanFma  Lean with o * (1 + scale) + shift as one FFMA (1536 / 5120,
//         x and y of one type; else Lean): not the default's bits, one
//         instruction per element fewer (NormRowsKernel::LeanFma).
//   Auto  TURBODIFF_ADALN_ROWS=2|cta64|cta128|lean|lean_fma if set, else One.
// (A persistent warp-team variant, Teams, measured 76-77% of copy against
// One's 83-86% on the H200 on 2026-11-30 and was removed.)
enum class AdaLnRows { Auto, One, Two, Cta64, Cta128, Lean, LeanFma };

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
