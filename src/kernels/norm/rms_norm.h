// RMSNorm over the last dimension of [rows, dim] activations:
//   y[r, i] = x[r, i] * rsqrt(mean_i x[r, i]^2 + eps) * weight[i]
// computed in fp32 and rounded once to y's type. weight (fp32 [dim]) is
// optional (null: no scale). x and y may be F32, F16 or BF16, independently;
// y may alias x exactly (same pointer, type and stride: in place).
// Wan uses eps = 1e-6.
#pragma once

#include <cstdint>

#include "kernels/norm/norm_variant.h"
#include "kernels/status.h"

namespace td::kernels {

Status rms_norm_cpu(const void* x, ElemType x_type, int64_t x_stride,
                    void* y, ElemType y_type, int64_t y_stride,
                    const float* weight, int64_t rows, int64_t dim, float eps);

#if TURBODIFF_HAVE_CUDA
// Same contract; `stream` is a cudaStream_t. Device pointers.
Status rms_norm_cuda(const void* x, ElemType x_type, int64_t x_stride,
                     void* y, ElemType y_type, int64_t y_stride,
                     const float* weight, int64_t rows, int64_t dim, float eps, void* stream,
                     NormRowsKernel kernel = NormRowsKernel::Auto);
#endif

// The argument check both versions run (exposed for the ops layer and tests).
Status rms_norm_check(const void* x, ElemType x_type, int64_t x_stride,
                      const void* y, ElemType y_type, int64_t y_stride,
                      int64_t rows, int64_t dim, float eps);

}  // namespace td::kernels
