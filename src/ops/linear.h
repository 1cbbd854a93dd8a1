// Tensor-level Linear: y[..., N] = x[..., K] W[N, K]^T (+ bias[N]).
//
// Host tensors run the blocked fp32 CPU GEMM (kernels/gemm_f32: F32/BF16/F16
// operands widened to fp32, fp32 accumulation). CUDA tensors run cuBLASLt
// with fp32 accumulation (BF16 x BF16, F16 x F16 or F32 x F32, no TF32); the
// bias is fused into cuBLASLt's epilogue when its dtype equals the output's,
// otherwise an fp32 bias is added by a second kernel.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace td::ops {

// x: [..., K], last dim contiguous, leading dims collapsible into rows of one
// stride (ops::as_rows). weight: [N, K], last dim contiguous (any row stride).
// bias: undefined, or a contiguous [N] vector (F32, or the output's dtype).
// Returns a fresh contiguous [..., N] tensor in out_dtype (default x's dtype).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, std::optional<DType> out_dtype = {});

}  // namespace td::ops
