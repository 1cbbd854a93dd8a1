// Internal to the quant folder: LnQuantBlockPath::Cluster, the block128 fused
// LayerNorm + AdaLN modulation + INT8 quantization with each 128-row stripe
// resident in the shared memory of a thread-block cluster (sm_90+), x read
// once (contract and formulas: layernorm_modulate_quant.h; design:
// layernorm_modulate_quant_cluster.cu). layernorm_modulate_quant_block128_cuda
// dispatches to it after its own argument checks.
#pragma once

#include <cstdint>

#include "kernels/quant/layernorm_modulate_quant_columns.h"  // LnQuantArgs
#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

#if TURBODIFF_HAVE_CUDA
// Runs the cluster kernel on `stream`. Status::Unsupported below sm_90, for
// rows wider than 16384 columns, and where no cluster configuration's two
// stripe buffers fit in shared memory (2 x 8 rows x dim: 16-bit x dim <=
// ~6900, fp32 <= ~3450), as reported by the occupancy calculator.
// Arguments as layernorm_modulate_quant_block128_cuda's, already checked by it.
Status ln_mod_quant_block128_cluster_cuda(ElemType x_type, const LnQuantArgs& a, void* stream);
#endif

}  // namespace td::kernels
