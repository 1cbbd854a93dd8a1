// Kernel variants of layer_norm_cuda and rms_norm_cuda (issue 3's bandwidth
// bar; the lead flips Auto after measuring on the H200):
//   Rows   the row engine (norm_rows.cuh): one row per 32-thread CTA at
//          1536 wide, parameters through L1 per row (the default);
//   Teams  the persistent warp-team kernel (norm_team.cuh): 256-thread CTAs
//          in one wave, weight / bias staged once per CTA in shared memory,
//          statistics by shuffles. Vector path, x and y of one type, dim <=
//          6144; otherwise Rows. An output may differ from Rows' by one ulp
//          of its type (statistics summed in another order).
//   Auto   TURBODIFF_NORM_KERNEL=teams if set (read per call), else Rows.
#pragma once

namespace td::kernels {

enum class NormRowsKernel { Auto, Rows, Teams };

}  // namespace td::kernels
