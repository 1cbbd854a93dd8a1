// Pointwise activations of the Wan DiT over [rows, dim] activations:
//   GeluTanh: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (torch gelu, approximate='tanh';
//             the FFN's activation and the text embedding's)
//   Silu:     y = x / (1 + exp(-x))                                  (time embedding / projection)
// computed in fp32 and rounded once to y's type. x and y may be F32, F16 or
// BF16 independently; y may alias x exactly (same pointer, type and stride).
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

enum class Activation { GeluTanh, Silu };

Status activation_cpu(Activation act, const void* x, ElemType x_type, int64_t x_stride,
                      void* y, ElemType y_type, int64_t y_stride, int64_t rows, int64_t dim);

#if TURBODIFF_HAVE_CUDA
Status activation_cuda(Activation act, const void* x, ElemType x_type, int64_t x_stride,
                       void* y, ElemType y_type, int64_t y_stride, int64_t rows, int64_t dim, void* stream);
#endif

Status activation_check(Activation act, const void* x, ElemType x_type, int64_t x_stride,
                        const void* y, ElemType y_type, int64_t y_stride, int64_t rows, int64_t dim);

}  // namespace td::kernels
