#include "ops/conv.h"

#include "kernels/conv/conv.h"
#include "ops/common.h"

namespace td::ops {
namespace {

void check_cpu_f32(const char* op, const char* what, const Tensor& t) {
  if (t.device().is_cuda())
    fail(ErrorKind::Unsupported, op, ": ", what, " is on ", t.device().str(),
         ": the channel-first VAE ops are the fp32 CPU path; on CUDA the VAE runs the channels-last ops "
         "(ops::conv3d_cl and friends)");
  TD_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), DType, op, ": ", what,
           " must be a contiguous f32 tensor, got ", t.desc());
}

}  // namespace

Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o) {
  static const char* op = "conv3d";
  check_cpu_f32(op, "x", x);
  check_cpu_f32(op, "weight", weight);
  if (bias.defined()) check_cpu_f32(op, "bias", bias);
  TD_CHECK(x.dim() == 5, Shape, op, ": x must be [B, C, T, H, W], got ", x.desc());
  TD_CHECK(weight.dim() == 5 && weight.size(1) == x.size(1), Shape, op, ": weight must be [Co, ", x.size(1),
           ", kt, kh, kw] for x ", x.desc(), ", got ", weight.desc());
  TD_CHECK(!bias.defined() || bias.numel() == weight.size(0), Shape, op, ": bias must have ", weight.size(0),
           " values, got ", bias.desc());
  kernels::Conv3dParams p;
  p.cin = x.size(1);
  p.t = x.size(2);
  p.h = x.size(3);
  p.w = x.size(4);
  p.cout = weight.size(0);
  p.kt = weight.size(2);
  p.kh = weight.size(3);
  p.kw = weight.size(4);
  p.stride_t = o.stride_t;
  p.stride_h = o.stride_h;
  p.stride_w = o.stride_w;
  p.pad_top = o.pad_top;
  p.pad_bottom = o.pad_bottom;
  p.pad_left = o.pad_left;
  p.pad_right = o.pad_right;
  const int64_t ot = kernels::conv_out_size(p.t, p.kt, p.stride_t, 0, 0);
  const int64_t oh = kernels::conv_out_size(p.h, p.kh, p.stride_h, p.pad_top, p.pad_bottom);
  const int64_t ow = kernels::conv_out_size(p.w, p.kw, p.stride_w, p.pad_left, p.pad_right);
  TD_CHECK(ot > 0 && oh > 0 && ow > 0, Shape, op, ": input ", x.desc(), " is smaller than the kernel ",
           weight.desc(), " with this padding");
  Tensor y = Tensor::empty({x.size(0), p.cout, ot, oh, ow}, DType::F32);
  p.weight = weight.data<float>();
  p.bias = bias.defined() ? bias.data<float>() : nullptr;
  const int64_t in_sample = p.cin * p.t * p.h * p.w, out_sample = p.cout * ot * oh * ow;
  for (int64_t b = 0; b < x.size(0); ++b) {
    p.x = x.data<float>() + b * in_sample;
    p.y = y.data<float>() + b * out_sample;
    check_status(kernels::conv3d_f32_cpu(p), op, cat("x ", x.desc(), ", weight ", weight.desc()));
  }
  return y;
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o) {
  static const char* op = "conv2d";
  check_cpu_f32(op, "x", x);
  check_cpu_f32(op, "weight", weight);
  TD_CHECK(x.dim() == 4, Shape, op, ": x must be [B, C, H, W], got ", x.desc());
  TD_CHECK(weight.dim() == 4, Shape, op, ": weight must be [Co, Ci, kh, kw], got ", weight.desc());
  ConvOptions o3 = o;
  o3.stride_t = 1;
  const Tensor y = conv3d(x.view({x.size(0), x.size(1), 1, x.size(2), x.size(3)}),
                          weight.view({weight.size(0), weight.size(1), 1, weight.size(2), weight.size(3)}), bias, o3);
  return y.view({y.size(0), y.size(1), y.size(3), y.size(4)});
}

Tensor upsample_nearest2x(const Tensor& x) {
  static const char* op = "upsample_nearest2x";
  check_cpu_f32(op, "x", x);
  TD_CHECK(x.dim() >= 3, Shape, op, ": x must have at least 3 dims, got ", x.desc());
  Shape out = x.shape();
  const int64_t h = out[out.size() - 2], w = out.back();
  out[out.size() - 2] = 2 * h;
  out.back() = 2 * w;
  Tensor y = Tensor::empty(out, DType::F32);
  if (x.numel() == 0) return y;
  check_status(kernels::upsample_nearest2x_f32_cpu(x.data<float>(), x.numel() / (h * w), h, w, y.data<float>()), op,
               x.desc());
  return y;
}

Tensor channel_rms_norm(const Tensor& x, const Tensor& gamma, const Tensor& bias) {
  static const char* op = "channel_rms_norm";
  check_cpu_f32(op, "x", x);
  check_cpu_f32(op, "gamma", gamma);
  if (bias.defined()) check_cpu_f32(op, "bias", bias);
  TD_CHECK(x.dim() >= 2, Shape, op, ": x must be [B, C, ...], got ", x.desc());
  const int64_t c = x.size(1);
  TD_CHECK(gamma.numel() == c, Shape, op, ": gamma must have ", c, " values for x ", x.desc(), ", got ",
           gamma.desc());
  TD_CHECK(!bias.defined() || bias.numel() == c, Shape, op, ": bias must have ", c, " values, got ", bias.desc());
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  if (x.numel() == 0) return y;
  const int64_t positions = x.numel() / (x.size(0) * c);
  for (int64_t b = 0; b < x.size(0); ++b)
    check_status(kernels::channel_rms_norm_f32_cpu(x.data<float>() + b * c * positions, c, positions,
                                                   gamma.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
                                                   y.data<float>() + b * c * positions),
                 op, x.desc());
  return y;
}

}  // namespace td::ops
