// Kernel variants of layer_norm_cuda and rms_norm_cuda (issue 3's bandwidth
// bar; figures: H200, 2026-11-30, bench_norm, fraction of the copy bandwidth
// of the same run at 32760x1536 / 75600x5120):
//   Rows   the row engine (norm_rows.cuh): one row per 32-thread CTA at
//          1536 wide, parameters through L1 per row. rms_norm's default
//          (89.1-90.3 / 97.3-97.8%; layer_norm 84.2-86.4 / 89.4-89.7%).
//   Lean   norm_lean.cuh: the row engine's layout with ~3x fewer
//          instructions per element (column layout as template arguments
//          at Wan's widths, the row unpacked per pass, parameter branches
//          once per row, one CTA barrier per LayerNorm row at 5120).
//          layer_norm's default (86.9-88.4 / 95.6-96.3%); rms_norm
//          89.9-90.9 / 96.0-96.8%. Bit-identical to Rows for RMS norm and
//          for rows of <= 32 threads; wider LayerNorm rows merge per-warp
//          statistics (fp32 rounding apart).
//   Auto   TURBODIFF_NORM_KERNEL=rows|lean if set (read per call), else the
//          op's default.
// (Measured and removed: Teams (persistent warp teams, 75-83%), Cta64 /
// Cta128 (several one-warp rows per CTA, +-1%), Lean2 (two rows per warp at
// 1536, 76.8-87.4%), LeanFma (one FFMA for o * w + b, -0.1 to -1.8% against
// Lean).)
#pragma once

namespace td::kernels {

enum class NormRowsKernel { Auto, Rows, Lean };

}  // namespace td::kernels
