// Tensor-level norms (the FastNorm family). Each op takes activations viewed
// as [rows, dim] (last dim contiguous), fp32 weights/bias/modulation, and runs
// the CUDA kernel for CUDA tensors or the fp32 CPU reference for host tensors.
// Outputs are fresh tensors of x's shape in `out_dtype` (default: x's dtype).
#pragma once

#include <optional>

#include "core/tensor.h"
#include "ops/int8_linear.h"

namespace td::ops {

// y = x * rsqrt(mean(x^2) + eps) * weight (weight: f32 [dim] or undefined).
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, std::optional<DType> out_dtype = {});

// y = (x - mean) * rsqrt(var + eps) * weight + bias (weight/bias: f32 [dim] or undefined).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  std::optional<DType> out_dtype = {});

// Wan's norm1/norm2 with modulation: LN(x) * (1 + scale[b]) + shift[b], where
// scale/shift are f32 [batch, dim] (row stride allowed) and the rows of x are
// split evenly among the batch (b = row / (rows / batch)).
Tensor adaln_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, float eps,
                      std::optional<DType> out_dtype = {});

// The fused step between sub-layers of a Wan block:
//   x <- x + gate[b] * y      (in place in `x`; gate undefined: x + y)
//   returns LN(x) [* weight + bias] [* (1 + scale[b]) + shift[b]]
// weight/bias and scale/shift are each optional (undefined tensors).
struct ResidualNormArgs {
  Tensor gate, weight, bias, scale, shift;
  float eps = 1e-6f;
  std::optional<DType> out_dtype;
};
Tensor residual_gate_norm(Tensor& x, const Tensor& y, const ResidualNormArgs& args);

// residual_gate_norm whose output only feeds INT8 linears of scheme `act`:
// the same x update and the same codes and scales as
// quantize_activation(residual_gate_norm(x, y, args), act), bit for bit. On
// CUDA with token128 at Wan's shapes (rows >= kInt8LinearMinRowsCuda, bf16
// y and output, dim % 128 == 0) one kernel writes the codes and scales
// without the bf16 output (the result's x_written is false: its x is only a
// shape); elsewhere the two ops run in turn.
QuantizedActivation residual_gate_norm_quantized(Tensor& x, const Tensor& y, const ResidualNormArgs& args,
                                                 Int8ActScheme act);

}  // namespace td::ops
