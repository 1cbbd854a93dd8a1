// Fused LayerNorm (no affine) + AdaLN modulation + INT8 quantization: the
// input side of Wan's self-attention QKV projection and FFN up-projection,
//   y[r, c] = (x[r, c] - mean_r) * rstd_r * (1 + mod_scale[b, c]) + mod_shift[b, c]
//   mean_r, rstd_r = 1/sqrt(var_r + eps): biased statistics over the row, fp32
//   b = r / rows_per_batch
// written directly as int8 codes + fp32 scales, so the normalized activation
// never goes through memory in bf16 on its way to the GEMM.
//
//   x          [rows, dim] fp32 / fp16 / bf16, row stride ld_x (>= dim)
//   mod_shift, mod_scale  fp32, entry (b, c) at [b * ld_mod + c]; ld_mod >= dim.
//              (Wan's e0 = modulation + time projection is [B, 6, dim]: shift
//              is e0[:, 0], scale e0[:, 1], ld_mod = 6 * dim.)
//   rows_per_batch  rows of one sample (L tokens), >= 1
//   q          [rows, dim] int8, row stride ld_q (>= dim)
//
// Two granularities, in the layouts of the standalone quantizers:
//   token128: scales as quant_token128.h (K-block-major, [g * ld_scales + r],
//             amax/127, zero groups -> 0)
//   block128: scales as quant_block128.h (dense [ceil(rows/128), ceil(dim/128)],
//             TurboDiffusion's formula, amax/128 with the 1e-8 floor)
//
// The CPU references are the composition layernorm_modulate_f32_cpu ->
// quantize_*_cpu on the fp32 y. The CUDA kernels compute y in fp32 in a
// different order (tree reductions, fused multiply-adds), so y differs from
// the reference by a few ulp and a code can differ by +-1 where y*inv lies
// that close to a rounding boundary; scales agree to ~1e-6 relative.
//
// CUDA requirements: dim a multiple of 8 and at most 32768; ld_x, ld_q,
// ld_mod multiples of 8; x, mod_shift, mod_scale 16-byte and q 8-byte
// aligned. Otherwise Status::InvalidArgument (the CPU references take any dim).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

// The unfused reference: y = LN(x) * (1 + scale[b]) + shift[b] in fp32,
// statistics accumulated in fp64. y [rows, dim] with row stride ld_y.
Status layernorm_modulate_f32_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                  const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                  int64_t rows_per_batch, float eps, float* y, int64_t ld_y);

Status layernorm_modulate_quant_token128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                             const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                             int64_t rows_per_batch, float eps, int8_t* q, int64_t ld_q,
                                             float* scales, int64_t ld_scales);

Status layernorm_modulate_quant_block128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                             const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                             int64_t rows_per_batch, float eps, int8_t* q, int64_t ld_q,
                                             float* scales);

#if TURBODIFF_HAVE_CUDA
// The token128 kernel (variants):
//   One         one CTA per row (the default above dim 2048).
//   WarpRows    a row per warp, 4 independent rows per 128-thread CTA (no
//               barrier), the row in registers once (16-byte loads), the
//               statistics summed in the default's exact order (per-"thread"
//               partials of the default's plan, one shuffle tree each), one
//               quantization-parameter division pair per lane per chunk of
//               slots, PRMT code packing: bit-identical to One. Runs where
//               the default's plan has <= 5 warps and the raw row fits 80
//               registers per lane (16-bit dim <= 5120, fp32 <= 2560), else
//               One. Candidate for issue 3's bar (layernorm_modulate_quant.cu).
//   WarpRowsLean  WarpRows traded for occupancy for 16-bit rows of <= 6
//               words per lane that fill every slot (16-bit 1536): raw
//               row re-unpacked per pass, parameters in chunks of 3 slots, 72 registers (28 warps per SM instead
//               of 20); bit-identical to One; elsewhere WarpRows.
//   PairRows    a team (1536: one warp; wider rows: 2-8 warps, one per
//               CTA) owns two consecutive rows, each lane the same columns
//               of both, so the fp32 shift / scale (the profile's L1-bound
//               traffic) are read once per two rows; a lane holds 16
//               columns of one 128-group (group max over 8 lanes), one
//               division pair per lane per 512 columns. Not bit-identical
//               to One (statistics' order). 16-bit x with dim % 512 == 0
//               (1536, 3072, 4096, 5120, ...), else One. Candidate for
//               issue 3's bar (layernorm_modulate_quant.cu).
//   PairRowsReload  PairRows with each 512-column block of x loaded again
//               (L1 / L2) for y instead of held in registers since the
//               statistics: 80 registers instead of 128 (24 warps per SM
//               instead of 16). Same results as PairRows.
//   Auto        TURBODIFF_LNQ_TOKEN_ROWS=1|warps|warps_lean|pairs|pairs_reload|columns
//               if set, else Columns where it takes the rows, then
//               PairRowsReload where it takes them (16-bit x, dim % 512 ==
//               0), WarpRowsLean up to dim 2048, One above.
//   (Two / Four rows per CTA, WarpTeams and WarpRowsPrefetch measured slower
//   than WarpRowsLean / One on the H200 and were removed.)
//   Columns     threads own columns of R rows at a time, x through a
//               cp.async ring (layernorm_modulate_quant_columns.cu): 94.9-
//               98.5% / 85.8-87.1% of a same-traffic copy at 32760x1536 /
//               75600x5120 on the H200 (PairRowsReload: 81.6-84.6% / 65.9-
//               67.1%). 16-bit x with dim % 256 == 0 and dim <= 5120; an
//               explicit Columns runs One elsewhere. Not bit-identical to
//               the others (codes within +-1 near ties).
enum class LnQuantTokenRows { Auto, One, WarpRows, WarpRowsLean, PairRows, PairRowsReload, Columns };

// The row(s) held in registers: one read of x, one write of q.
Status layernorm_modulate_quant_token128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                              int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                              int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                              int64_t ld_q, float* scales, int64_t ld_scales, void* stream,
                                              LnQuantTokenRows rows_per_cta = LnQuantTokenRows::Auto);

// How the 128x128-block variant gets the amax of y over a 128-row stripe
// before writing codes (layernorm_modulate_quant.cu):
//   RowStats (sm_80+, needs a workspace of 8 bytes per row): two streaming
//            kernels, the row statistics (mean, rstd) to the workspace, then
//            a 128x128 block quantizer applying them (stripes last to first,
//            so the first reads hit L2): x read twice, no dependency inside
//            either kernel (layernorm_modulate_quant_rowstats.cu). dim <= 5120.
//   Cluster  (sm_90+): persistent thread-block clusters of 8 CTAs x 16 rows
//            (or 16 x 8) walk the stripes, each stripe share double-buffered
//            in shared memory (cp.async), threads owning 8-column packs of
//            all their CTA's rows, statistics by transposed butterflies,
//            group maxima exchanged through distributed shared memory: x is
//            read once (layernorm_modulate_quant_cluster.cu). Needs two
//            buffers of 8 rows x dim in shared memory (16-bit x: dim <=
//            ~6900, fp32: ~3450; dim <= 16384) as the occupancy calculator
//            allows, else Unsupported; Unsupported below sm_90. Measured
//            (H200, 2026-12-01, bench_quant_rope) slower than RowStats and
//            Portable: 42% / 30% of a same-traffic copy at 32760x1536 /
//            75600x5120 (the previous cluster kernel ~33% / 30%).
//   Portable (sm_80+): one CTA per stripe, x read twice (the second time
//            from L2 only while the concurrent stripes fit in it).
//   Auto:    RowStats where a large enough workspace is given and dim <=
//            5120, else Portable (never Cluster: slower than RowStats on
//            the H200, docs/benchmarks.md, sessions 10 and 15).
enum class LnQuantBlockPath { Auto, Cluster, Portable, RowStats };

// Workspace bytes RowStats needs for `rows` rows (8 per row; any contents,
// 16-byte aligned). One launch at a time per workspace (streams that may
// overlap need their own).
size_t layernorm_modulate_quant_block128_workspace_bytes(int64_t rows);

// workspace / workspace_bytes: for RowStats (explicit: required, else
// InvalidArgument; Auto: used when large enough). May be null otherwise.
Status layernorm_modulate_quant_block128_cuda(ElemType x_type, const void* x, int64_t rows, int64_t dim,
                                              int64_t ld_x, const float* mod_shift, const float* mod_scale,
                                              int64_t ld_mod, int64_t rows_per_batch, float eps, int8_t* q,
                                              int64_t ld_q, float* scales, LnQuantBlockPath path, void* stream,
                                              void* workspace = nullptr, size_t workspace_bytes = 0);
#endif

}  // namespace td::kernels
