// FastNorm's fusion between the sub-layers of a Wan block: one pass that
// reads the residual stream x and a sub-layer output y once and writes both
// the new residual and the normalised input of the next sub-layer:
//
//   x_new[r, i] = round_res( x[r, i] + gate[b, i] * y[r, i] )     (gate null: x + y)
//   x_out[r, i] = x_new[r, i]
//   out[r, i]   = round_out( ((LN(x_new[r, :])[i] * weight[i] + bias[i]) * (1 + scale[b, i]) + shift[b, i] )
//
// with b = r / rows_per_batch and LN a LayerNorm without affine parameters.
// The sum is computed in fp32 as torch does it eagerly (the product rounded,
// then the sum), rounded to the residual type, and the norm is taken of that
// rounded value: the fused op equals the unfused sequence exactly.
// weight, bias, scale, shift and gate are each optional (fp32; weight/bias
// [dim]; gate/scale/shift rows [batch, dim] `mod_stride` elements apart).
//
// Wan uses it as:
//   x += gate_msa * attn;  out = norm3(x)                 (weight, bias; no modulation)
//   x += cross_attn;       out = norm2(x)*(1+scale_ffn)+shift_ffn   (no gate)
//   x += gate_ffn * ffn;   out = next block's norm1(x)*(1+scale_msa)+shift_msa
//
// Types: the residual (x, x_out) is F32 (Wan's original fp32 stream) or BF16
// (diffusers / rCM); y and out are F32, F16 or BF16. x_out may alias x and out
// may alias y exactly (same pointer, type and stride); out must not alias x.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

struct ResidualGateNormParams {
  // residual stream in and out (x_out == x for an in-place update)
  const void* x = nullptr;
  int64_t x_stride = 0;
  void* x_out = nullptr;
  int64_t x_out_stride = 0;
  ElemType residual_type = ElemType::BF16;
  // sub-layer output added to the residual
  const void* y = nullptr;
  ElemType y_type = ElemType::BF16;
  int64_t y_stride = 0;
  // normalised output
  void* out = nullptr;
  ElemType out_type = ElemType::BF16;
  int64_t out_stride = 0;
  // optional fp32 parameters
  const float* gate = nullptr;    // [batch, dim] rows, mod_stride apart
  const float* weight = nullptr;  // [dim]
  const float* bias = nullptr;    // [dim]
  const float* scale = nullptr;   // [batch, dim] rows, mod_stride apart
  const float* shift = nullptr;   // [batch, dim] rows, mod_stride apart
  int64_t mod_stride = 0;
  int64_t rows_per_batch = 1;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
  // Optional: out also quantized as the token128 quantizer would quantize it
  // (quantize_token128_*: 1 x 128 groups of the values rounded to out_type,
  // codes [rows, dim] `codes_stride` apart, scales [dim / 128, ld_scales]),
  // so that norm -> quantize -> INT8 GEMM skips the round trip of out; out
  // may then be null (not written). CUDA: dim % 128 == 0 and the 16-byte path.
  int8_t* codes = nullptr;
  int64_t codes_stride = 0;
  float* code_scales = nullptr;
  int64_t ld_scales = 0;
};

Status residual_gate_norm_cpu(const ResidualGateNormParams& p);

#if TURBODIFF_HAVE_CUDA
Status residual_gate_norm_cuda(const ResidualGateNormParams& p, void* stream);
#endif

Status residual_gate_norm_check(const ResidualGateNormParams& p);

}  // namespace td::kernels
