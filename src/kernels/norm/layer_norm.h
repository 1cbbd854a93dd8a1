// LayerNorm over the last dimension of [rows, dim] activations, as
// torch.nn.functional.layer_norm (biased variance):
//   y[r, i] = (x[r, i] - mean_r) * rsqrt(var_r + eps) * weight[i] + bias[i]
// Statistics are exact two-pass fp32 sums over the row (held in registers on
// the GPU); the result is rounded once to y's type. weight and bias (fp32
// [dim]) are each optional. x and y may be F32, F16 or BF16, independently;
// y may alias x exactly (in place). Wan's norm3 is this with weight and bias,
// eps = 1e-6.
#pragma once

#include <cstdint>

#include "kernels/norm/norm_variant.h"
#include "kernels/status.h"

namespace td::kernels {

Status layer_norm_cpu(const void* x, ElemType x_type, int64_t x_stride,
                      void* y, ElemType y_type, int64_t y_stride,
                      const float* weight, const float* bias, int64_t rows, int64_t dim, float eps);

#if TURBODIFF_HAVE_CUDA
Status layer_norm_cuda(const void* x, ElemType x_type, int64_t x_stride,
                       void* y, ElemType y_type, int64_t y_stride,
                       const float* weight, const float* bias, int64_t rows, int64_t dim, float eps,
                       void* stream, NormRowsKernel kernel = NormRowsKernel::Auto);
#endif

Status layer_norm_check(const void* x, ElemType x_type, int64_t x_stride,
                        const void* y, ElemType y_type, int64_t y_stride,
                        int64_t rows, int64_t dim, float eps);

}  // namespace td::kernels
