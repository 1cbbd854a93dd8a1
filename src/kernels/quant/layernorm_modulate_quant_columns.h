// Internal to the quant folder: the fused LayerNorm + AdaLN modulation + INT8
// quantization kernels' argument block, and LnQuantTokenRows::Columns, the
// column-owner token128 kernel (contract and formulas:
// layernorm_modulate_quant.h; design: layernorm_modulate_quant_columns.cu),
// which layernorm_modulate_quant_token128_cuda dispatches to after its own
// argument checks.
#pragma once

#include <cstdint>

#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels {

// The arguments of the fused kernels (layernorm_modulate_quant.h's, checked
// by its entry points), passed to the kernels by value.
struct LnQuantArgs {
  const void* x;
  int64_t rows;
  int dim;
  int64_t ld_x;
  const float* shift;
  const float* scale;
  int64_t ld_mod;
  int64_t rows_per_batch;
  float eps;
  int8_t* q;
  int64_t ld_q;
  float* scales;
  int64_t ld_scales;
};

#ifdef __CUDACC__
// Sample index of row r: a 32-bit division where the values fit (a 64-bit
// one is a ~70-instruction subroutine).
__device__ __forceinline__ int64_t lnq_sample_of(int64_t r, int64_t rows_per_batch) {
  return (r <= int64_t(UINT32_MAX) && rows_per_batch <= int64_t(UINT32_MAX))
             ? int64_t(uint32_t(r) / uint32_t(rows_per_batch))
             : r / rows_per_batch;
}
#endif

#if TURBODIFF_HAVE_CUDA
// The rows this kernel takes: 16-bit x with dim a multiple of 256 and at most
// kLnColumnsMaxDim (a thread per 8 columns, <= 640 threads), 16-byte aligned
// rows (ld_x % 8 == 0, checked by the caller).
inline constexpr int64_t kLnColumnsMaxDim = 5120;
bool ln_mod_quant_token128_columns_takes(ElemType x_type, int64_t dim);

// Runs the kernel; Status::Unsupported where ln_mod_quant_token128_columns_takes
// is false (or the device cannot hold one CTA). Arguments as
// layernorm_modulate_quant_token128_cuda's, already checked by it.
Status ln_mod_quant_token128_columns_cuda(ElemType x_type, const LnQuantArgs& a, void* stream);
#endif

}  // namespace td::kernels
