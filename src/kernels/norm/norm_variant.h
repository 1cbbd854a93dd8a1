// Kernel variants of layer_norm_cuda and rms_norm_cuda (issue 3's bandwidth
// bar; the lead flips Auto after measuring on the H200):
//   Rows   the row engine (norm_rows.cuh): one row per 32-thread CTA at
//          1536 wide, parameters through L1 per row (the default);
//   Cta64 / Cta128  the row engine's kernel with 64- / 128-thread CTAs:
//          rows narrower than the CTA (1536: one warp per row) go 2 / 4 per
//          CTA, each warp its own row (shuffle reductions, no CTA-wide
//          barrier); wider rows run as Rows. Same arithmetic: bit-identical
//          to Rows. (Why: one-warp CTAs hit the 32-CTA-per-SM limit, 32 warps
//          per SM, while the registers (54 per thread at 1536 bf16, profile)
//          would allow 36; a row finished frees less than a whole CTA, the
//          reason 256-thread CTAs measured slower, so only 2 or 4 rows.)
//          Predicted at 32760x1536 bf16 (profile run2: layer 54 registers,
//          occupancy 46% of a 50% cap, issue 69%, DRAM 71%): 36 warps per SM
//          instead of 32 and fewer CTA launches: +1-3% of copy (layer_norm
//          84.6 -> 86-88%, rms_norm 87.7 -> 88-90%); adaln_modulate (96
//          registers: 20-21 warps per SM whatever the CTA size) unchanged;
//          5120 (160-thread rows) runs as Rows. Not enough for the 90% bar
//          alone: the rest is instructions (23.6 per element, profile).
//   Lean   norm_lean.cuh: the row engine's layout with ~3x fewer
//          instructions per element (column layout as template arguments
//          at Wan's widths, the row unpacked once, parameter branches once
//          per row, one CTA barrier per LayerNorm row at 5120). Bit-identical
//          to Rows for RMS norm and for rows of <= 32 threads; wider LayerNorm
//          rows merge per-warp statistics (fp32 rounding apart). Prediction
//          in norm_lean.cuh (layer_norm 84.7/89.2% -> ~94/96% of copy);
//          measured on the H200 (2026-11-30, plain loads): layer_norm
//          86.9-88.4 / 95.6-96.3%, rms 89.9-90.9 / 96.0-96.8% against the
//          defaults' 84.2-86.4 / 89.4-89.7% and 89.1-90.3 / 97.3-97.8%:
//          meets the 93% bar at 5120 (not rms: 1% under Rows), not at 1536.
//   (Lean2, two rows per warp at 1536, measured 76.8-87.4% of copy there
//          against Lean's 84.4-88.8% on the H200 on 2026-11-30: removed.)
//   LeanFma  Lean with o * w + b as one FFMA (rows of 1536 / 5120, x and y
//          of one type; else Lean): one instruction per element fewer, one
//          rounding instead of two (not the default's bits; within the
//          tests' tolerance). Predicted +1-2% of copy over Lean for
//          layer_norm (adaln: o * (1 + scale) + shift likewise, +2-4%);
//          measured no gain (-0.1 to -1.8% against Lean, H200 2026-11-30).
//   Auto   TURBODIFF_NORM_KERNEL=cta64|cta128|lean|lean_fma if set (read per call), else Rows.
// (A persistent warp-team variant, Teams, measured 75-83% of copy against
// the row engine's 83-97% on the H200 on 2026-11-30 and was removed.)
#pragma once

namespace td::kernels {

enum class NormRowsKernel { Auto, Rows, Cta64, Cta128, Lean, LeanFma };

}  // namespace td::kernels
