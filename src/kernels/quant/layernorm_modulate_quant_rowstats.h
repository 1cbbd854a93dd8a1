// Internal to the quant folder: LnQuantBlockPath::RowStats, the block128
// fused LayerNorm + AdaLN modulation + INT8 quantization as two streaming
// kernels, row statistics to a workspace, then the block quantizer applying
// them (contract and formulas: layernorm_modulate_quant.h; design:
// layernorm_modulate_quant_rowstats.cu). layernorm_modulate_quant_block128_cuda
// dispatches to it after its own argument checks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant/layernorm_modulate_quant_columns.h"  // LnQuantArgs
#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

#if TURBODIFF_HAVE_CUDA
// Rows up to this width (a warp holds a row in registers: 20 packs of 8 per lane).
inline constexpr int64_t kLnRowStatsMaxDim = 5120;

// Workspace bytes for `rows` rows: (mean, rstd) as two floats per row.
size_t ln_mod_quant_block128_rowstats_workspace_bytes(int64_t rows);

// Runs both kernels on `stream`; Status::Unsupported for rows wider than
// kLnRowStatsMaxDim, Status::InvalidArgument for a missing, short or
// misaligned (< 16 bytes) workspace. Arguments as
// layernorm_modulate_quant_block128_cuda's, already checked by it.
Status ln_mod_quant_block128_rowstats_cuda(ElemType x_type, const LnQuantArgs& a, void* workspace,
                                           size_t workspace_bytes, void* stream);
#endif

}  // namespace td::kernels
