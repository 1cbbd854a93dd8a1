// Tensor-level ops of the Wan VAE over kernels/conv: the fp32 CPU reference.
// Activations are contiguous channel-first f32: [B, C, T, H, W] for video,
// [B, C, H, W] for images. On CUDA tensors each op throws Unsupported (the
// cuDNN path is not written yet).
#pragma once

#include "core/tensor.h"

namespace td::ops {

struct ConvOptions {
  int64_t stride_t = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // spatial zero padding
  static ConvOptions same_pad(int64_t p) { return {1, 1, 1, p, p, p, p}; }
};

// x [B, Ci, T, H, W], weight [Co, Ci, kt, kh, kw], bias [Co] or undefined.
// No temporal padding: a causal conv puts its cached or zero frames in front
// of x itself. Returns [B, Co, To, Ho, Wo].
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o = {});
// x [B, Ci, H, W], weight [Co, Ci, kh, kw]; stride_t is ignored.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o = {});
// Nearest (= nearest-exact at scale 2) 2x upsampling of the last two dims.
Tensor upsample_nearest2x(const Tensor& x);
// Wan RMS_norm over dim 1 of x [B, C, ...]: x / max(||x||_2 over C, 1e-12) *
// sqrt(C) * gamma (+ bias). gamma / bias: C f32 values in any shape ([C],
// [C,1,1,1], [C,1,1]); bias may be undefined.
Tensor channel_rms_norm(const Tensor& x, const Tensor& gamma, const Tensor& bias = {});

}  // namespace td::ops
