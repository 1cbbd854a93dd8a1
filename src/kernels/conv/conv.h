// CPU fp32 kernels of the Wan VAE, framework-free (raw pointers, sizes, a
// Status back). Activations are channel-first and contiguous, one sample at a
// time: [C, T, H, W] (a per-frame 2-D op sees T frames of [C, H, W] planes).
//
// conv3d_f32_cpu is the one convolution every VAE layer maps onto: a causal
// 3x3x3 conv (the caller puts the cached / zero frames in front, so there is
// no temporal padding here), a 1x1x1 conv, the (3,1,1) time_conv (stride 1 or
// 2 in time) and every per-frame Conv2d (kt = 1: 3x3 pad 1, 3x3 stride 2 with
// the downsampler's right/bottom-only zero pad, 1x1). Spatial zero padding is
// given per side. It runs as im2col over blocks of output positions (bounded
// scratch) and the fp32 GEMM of kernels/gemm_f32, so it is threaded through
// td::parallel_for; it must not be called from inside another parallel_for.
#pragma once

#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

struct Conv3dParams {
  const float* x = nullptr;  // [cin, t, h, w]
  int64_t cin = 0, t = 0, h = 0, w = 0;
  const float* weight = nullptr;  // [cout, cin, kt, kh, kw]
  int64_t cout = 0, kt = 1, kh = 1, kw = 1;
  const float* bias = nullptr;  // [cout] or null
  int64_t stride_t = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // spatial zero padding
  float* y = nullptr;  // [cout, out_t, out_h, out_w]; must not overlap x
};

// Output extent of one dimension (0 when the padded input is shorter than the kernel).
inline int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad_lo, int64_t pad_hi) {
  const int64_t span = in + pad_lo + pad_hi - k;
  return span < 0 ? 0 : span / stride + 1;
}

// InvalidArgument for non-positive sizes / strides, negative padding, null
// pointers, or an input smaller than the kernel.
Status conv3d_check(const Conv3dParams& p);
Status conv3d_f32_cpu(const Conv3dParams& p);

// y[c, t, 2i+a, 2j+b] = x[c, t, i, j] (a, b in {0, 1}): torch's nearest /
// nearest-exact upsampling at an exact scale of 2 (both pick source floor(dst/2)).
// planes = c * t; x [planes, h, w], y [planes, 2h, 2w].
Status upsample_nearest2x_f32_cpu(const float* x, int64_t planes, int64_t h, int64_t w, float* y);

// Wan's RMS_norm on channel-first data: for each position p of [c, positions],
// y[:, p] = x[:, p] / max(||x[:, p]||_2, 1e-12) * sqrt(c) * gamma (+ bias),
// i.e. torch F.normalize over the channel dim. gamma [c]; bias [c] or null
// (Wan's VAE has none). y may equal x (in place).
Status channel_rms_norm_f32_cpu(const float* x, int64_t c, int64_t positions, const float* gamma,
                                const float* bias, float* y);

#if TURBODIFF_HAVE_CUDNN
// The same convolutions on CUDA through a cuDNN frontend fprop graph, in the
// channels-last layout the CUDA VAE keeps its activations in:
//   x [n, t, h, w, cin], weight [cout, kt, kh, kw, cin], y [n, out_t, out_h, out_w, cout],
// all contiguous, BF16 (or F32, for tests) in and out, fp32 accumulation; the
// bias ([cout] fp32, or null) is fused into the graph as a pointwise add.
// Spatial zero padding per side (cuDNN's pre/post padding), none in time.
// Each distinct problem (sizes, strides, padding, type, bias or not, device)
// is built once and its plan cached; a refusal is cached with its reason
// (conv_cudnn_last_error()). `workspace` must hold conv3d_cudnn_workspace_size() bytes.
struct ConvCudnnProblem {
  int64_t n = 1, cin = 0, t = 0, h = 0, w = 0;
  int64_t cout = 0, kt = 1, kh = 1, kw = 1;
  int64_t stride_t = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  bool bias = false;
  ElemType type = ElemType::BF16;  // x, weight and y
};
Status conv3d_cudnn_workspace_size(const ConvCudnnProblem& p, size_t* bytes);
Status conv3d_cudnn(const ConvCudnnProblem& p, const void* x, const void* weight, const float* bias, void* y,
                    void* workspace, size_t workspace_bytes, void* stream);
const char* conv_cudnn_last_error();   // why the last call on this thread did not return Ok
size_t conv_cudnn_cached_plans();      // distinct plans built so far
#endif

}  // namespace td::kernels
