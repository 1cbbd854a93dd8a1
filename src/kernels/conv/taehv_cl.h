// The kernels the TAEHV tiny decoder adds to the channels-last conv family
// (besides cuDNN convolutions and vae_cl.h's upsample / layout kernels).
// Activations are [t, hw, c] rows with the channel dim contiguous. Each
// kernel has an fp32 CPU reference (`*_cpu`) and a CUDA version taking F32
// or BF16 (`type`), fp32 math inside, one rounding to the output type.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

// Pointwise ops of TAEHV over n elements:
//   Relu:       y = max(x, 0)
//   TanhClamp3: y = 3 tanh(x / 3)   (TAEHV's Clamp at the decoder's entry)
//   AddRelu:    y = max(x + r, 0)   (a MemBlock's residual add and final ReLU)
// r is used only by AddRelu (null otherwise). y may equal x or r.
enum class TaehvPointwise { Relu, TanhClamp3, AddRelu };

Status taehv_pointwise_cpu(TaehvPointwise op, const float* x, const float* r, int64_t n, float* y);

// A MemBlock's input: the channel concatenation of each frame with the frame
// before it (its memory). x [t, hw, c] -> y [t, hw, 2c]:
//   y[i, p, 0:c]  = x[i, p, :]
//   y[i, p, c:2c] = x[i-1, p, :] for i > 0; for i = 0 prev[p, :] (the last
//                   frame of the previous chunk) or zeros when prev is null.
// y must not overlap x or prev.
Status taehv_memblock_input_cpu(const float* x, const float* prev, int64_t t, int64_t hw, int64_t c, float* y);

#if TURBODIFF_HAVE_CUDA
Status taehv_pointwise_cuda(TaehvPointwise op, const void* x, const void* r, ElemType type, int64_t n, void* y,
                            void* stream);
Status taehv_memblock_input_cuda(const void* x, const void* prev, ElemType type, int64_t t, int64_t hw, int64_t c,
                                 void* y, void* stream);
#endif

}  // namespace td::kernels
