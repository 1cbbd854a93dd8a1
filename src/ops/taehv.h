// Tensor-level ops the TAEHV tiny decoder adds to the channels-last conv ops
// of conv.h (over kernels/conv/taehv_cl.h). Activations are contiguous
// channels-last tensors: host f32 (the fp32 CPU references) or CUDA BF16/F32.
#pragma once

#include "core/tensor.h"

namespace td::ops {

// In place: x <- max(x, 0).
void relu_(Tensor& x);
// In place: x <- 3 tanh(x / 3) (TAEHV's Clamp).
void tanh_clamp3_(Tensor& x);
// In place: x <- max(x + r, 0); r: x's shape, dtype and device.
void add_relu_(Tensor& x, const Tensor& r);
// A MemBlock's input: x [1, T, H, W, C] -> [1, T, H, W, 2C], the channels of
// each frame followed by those of the frame before it; frame 0's memory is
// prev [1, 1, H, W, C] (the last frame of the previous chunk) or zeros when
// prev is undefined.
Tensor memblock_input_cl(const Tensor& x, const Tensor& prev);

}  // namespace td::ops
