// Tensor-level ops of the Wan VAE over kernels/conv.
//
// Channel-first ops (conv3d, conv2d, upsample_nearest2x, channel_rms_norm):
// the fp32 CPU path the CPU VAE runs, on contiguous f32 [B, C, T, H, W] /
// [B, C, H, W] host tensors; CUDA tensors are refused (the CUDA VAE uses the
// channels-last ops below).
//
// Channels-last ops (*_cl, to_channels_last / to_channels_first,
// softmax_rows): the layout of the CUDA VAE ([B, T, H, W, C], channels
// contiguous, what cuDNN's BF16 convolutions are fast with). CUDA tensors
// (BF16, or F32) run cuDNN / kernels/conv/vae_cl.cu; host f32 tensors run the
// fp32 CPU references, so the CUDA VAE's whole structure can run, and be
// tested, on the CPU.
#pragma once

#include <vector>

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

// ---------------------------------------------------------------- channels last

// x [B, T, H, W, Ci], weight [Co, kt, kh, kw, Ci] (x's dtype and device), bias
// [Co] f32 or undefined -> [B, To, Ho, Wo, Co]. Same conventions as conv3d
// (no temporal padding, spatial padding per side). CUDA: cuDNN (bias fused;
// where cuDNN refuses the fused graph, an unfused conv and a bias add, logged once).
Tensor conv3d_cl(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o = {});
// Whether conv3d_cl on CUDA fuses the bias into the cuDNN graph (default) or
// runs a plain convolution and a separate bias add. A fused graph may need a
// runtime-compiled cuDNN engine, slower to build the first time a shape is
// seen; the switch lets the benchmark measure both. Process-wide.
void set_conv_cl_fuse_bias(bool fuse);
bool conv_cl_fuse_bias();
// A conv3d weight [Co, Ci, kt, kh, kw] (host, any float dtype) -> contiguous
// [Co, kt, kh, kw, Ci] in `dtype` on `device` (weights are converted at load).
Tensor conv_weight_to_cl(const Tensor& weight, DType dtype, Device device);
// Wan's RMS_norm over the last (channel) dim of a contiguous x, gamma C f32
// values on x's device; then SiLU when `silu`.
Tensor channel_rms_norm_cl(const Tensor& x, const Tensor& gamma, bool silu);
// [..., H, W, C] -> [..., 2H, 2W, C], nearest.
Tensor upsample_nearest2x_cl(const Tensor& x);
// Contiguous [B, t_i, H, W, C] parts -> [B, sum t_i, H, W, C].
Tensor cat_frames_cl(const std::vector<Tensor>& parts);
// The temporal upsample's reshape: y [B, t, H, W, 2C] (channel half k of
// frame s) -> [B, 2t, H, W, C] (frame 2s + k).
Tensor channel_halves_to_frames_cl(const Tensor& y);
// Row softmax of f32 scores [rows, cols] (contiguous) times `scale`, in out_dtype.
Tensor softmax_rows(const Tensor& s, float scale, DType out_dtype);
// x [B, C, T_total, H, W] f32 (contiguous; any device) frames [t0, t0 + t) ->
// [B, t, H, W, C] in `dtype` on x's device, times scale[c] plus shift[c]
// (undefined = 1 / 0; f32 [C] on x's device).
Tensor to_channels_last(const Tensor& x, int64_t t0, int64_t t, DType dtype, const Tensor& scale = {},
                        const Tensor& shift = {});
// x [B, t, H, W, Cx] (channels last, same device as y) channels [0, C) ->
// y [B, C, T_total, H, W] f32 frames [t0, t0 + t), times scale plus shift,
// clamped to [-1, 1] when `clamp`.
void to_channels_first(const Tensor& x, Tensor& y, int64_t t0, const Tensor& scale = {}, const Tensor& shift = {},
                       bool clamp = false);

}  // namespace td::ops
