// The channels-last VAE ops (contract in conv.h): host f32 tensors run the
// fp32 CPU references (the convolution through the channel-first conv3d,
// permuting around it), CUDA tensors cuDNN and kernels/conv/vae_cl.cu.
#include <atomic>
#include <cstring>

#include "core/cuda_runtime.h"
#include "core/log.h"
#include "kernels/conv/conv.h"
#include "kernels/conv/vae_cl.h"
#include "ops/common.h"
#include "ops/conv.h"
#include "ops/elementwise.h"

namespace td::ops {
namespace {

// F32 on the host; F32 or BF16 on CUDA; contiguous.
void check_act(const char* op, const char* what, const Tensor& t) {
  TD_CHECK(t.defined(), Internal, op, ": ", what, " is undefined");
  TD_CHECK(t.is_contiguous(), Shape, op, ": ", what, " must be contiguous, got ", t.desc());
  if (t.device().is_cpu())
    TD_CHECK(t.dtype() == DType::F32, DType, op, ": ", what, " on the CPU must be f32 (the fp32 reference), got ",
             t.desc());
  else
    TD_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, DType, op, ": ", what,
             " on CUDA must be bf16 or f32, got ", t.desc());
}

void check_vec(const char* op, const char* what, const Tensor& v, int64_t n, const Tensor& like) {
  if (!v.defined()) return;
  TD_CHECK(v.dtype() == DType::F32 && v.is_contiguous() && v.numel() == n, Shape, op, ": ", what,
           " must be a contiguous f32 tensor of ", n, " values, got ", v.desc());
  TD_CHECK(v.device() == like.device(), Shape, op, ": ", what, " is on ", v.device().str(), " but the data on ",
           like.device().str());
}

const float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

void copy2d(const char* op, const Device& d, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
            size_t row_bytes, size_t rows);

[[noreturn, maybe_unused]] void no_cuda(const char* op, const Tensor& t) {
  fail(ErrorKind::Unsupported, op, ": ", t.desc(), " is a CUDA tensor in a build without CUDA");
}

// Permute a contiguous 5-D tensor and make it contiguous (host only).
Tensor permuted(const Tensor& x, const std::vector<int64_t>& dims) { return x.permute(dims).contiguous(); }

}  // namespace

namespace {
std::atomic<bool> g_fuse_bias{true};
}  // namespace

void set_conv_cl_fuse_bias(bool fuse) { g_fuse_bias = fuse; }
bool conv_cl_fuse_bias() { return g_fuse_bias; }

Tensor conv_weight_to_cl(const Tensor& weight, DType dtype, Device device) {
  TD_CHECK(weight.dim() == 5, Shape, "conv_weight_to_cl: weight must be [Co, Ci, kt, kh, kw], got ", weight.desc());
  TD_CHECK(weight.device().is_cpu(), Unsupported, "conv_weight_to_cl: weight must be on the host, got ",
           weight.desc());
  Tensor w = weight.dtype() == DType::F32 ? weight : weight.to(DType::F32);
  w = permuted(w, {0, 2, 3, 4, 1});
  if (dtype != DType::F32) w = w.to(dtype);
  return device.is_cpu() ? w : w.to(device);
}

Tensor conv3d_cl(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvOptions& o) {
  static const char* op = "conv3d_cl";
  check_act(op, "x", x);
  check_act(op, "weight", weight);
  TD_CHECK(x.dim() == 5, Shape, op, ": x must be [B, T, H, W, C], got ", x.desc());
  TD_CHECK(weight.dim() == 5 && weight.size(4) == x.size(4) && weight.dtype() == x.dtype() &&
               weight.device() == x.device(),
           Shape, op, ": weight must be [Co, kt, kh, kw, ", x.size(4), "] in x's dtype on x's device, got ",
           weight.desc(), " for x ", x.desc());
  check_vec(op, "bias", bias, weight.size(0), x);
  const int64_t ot = kernels::conv_out_size(x.size(1), weight.size(1), o.stride_t, 0, 0);
  const int64_t oh = kernels::conv_out_size(x.size(2), weight.size(2), o.stride_h, o.pad_top, o.pad_bottom);
  const int64_t ow = kernels::conv_out_size(x.size(3), weight.size(3), o.stride_w, o.pad_left, o.pad_right);
  TD_CHECK(ot > 0 && oh > 0 && ow > 0, Shape, op, ": input ", x.desc(), " is smaller than the kernel ",
           weight.desc(), " with this padding");
  if (x.device().is_cpu()) {
    const Tensor y = conv3d(permuted(x, {0, 4, 1, 2, 3}), permuted(weight, {0, 4, 1, 2, 3}), bias, o);
    return permuted(y, {0, 2, 3, 4, 1});
  }
#if TURBODIFF_HAVE_CUDNN
  kernels::ConvCudnnProblem p;
  p.n = x.size(0);
  p.t = x.size(1);
  p.h = x.size(2);
  p.w = x.size(3);
  p.cin = x.size(4);
  p.cout = weight.size(0);
  p.kt = weight.size(1);
  p.kh = weight.size(2);
  p.kw = weight.size(3);
  p.stride_t = o.stride_t;
  p.stride_h = o.stride_h;
  p.stride_w = o.stride_w;
  p.pad_top = o.pad_top;
  p.pad_bottom = o.pad_bottom;
  p.pad_left = o.pad_left;
  p.pad_right = o.pad_right;
  p.type = elem_type(x.dtype(), op, "x");
  cuda::set_device(x.device().index);
  Tensor y = Tensor::empty({p.n, ot, oh, ow, p.cout}, x.dtype(), x.device());
  const auto run = [&](bool with_bias) -> kernels::Status {
    p.bias = with_bias;
    size_t ws = 0;
    kernels::Status s = kernels::conv3d_cudnn_workspace_size(p, &ws);
    if (s != kernels::Status::Ok) return s;
    Tensor workspace = ws ? Tensor::empty({int64_t(ws)}, DType::I8, x.device()) : Tensor();
    return kernels::conv3d_cudnn(p, x.raw_data(), weight.raw_data(), with_bias ? bias.data<float>() : nullptr,
                                 y.raw_data(), ws ? workspace.raw_data() : nullptr, ws, cuda::current_stream());
  };
  const std::string ctx = cat("x ", x.desc(), ", weight ", weight.desc());
  if (bias.defined() && !g_fuse_bias) {
    const kernels::Status s = run(false);
    if (s == kernels::Status::Ok) {
      add_(y, bias);
      return y;
    }
  }
  kernels::Status s = run(bias.defined());
  if (s == kernels::Status::Unsupported && bias.defined()) {
    log_once(LogLevel::Info, cat("conv3d_cl-unfused:", ctx),
             cat(op, ": cuDNN refused the conv+bias graph for ", ctx, " (", kernels::conv_cudnn_last_error(),
                 "); running the convolution and the bias add apart"));
    s = run(false);
    if (s == kernels::Status::Ok) {
      add_(y, bias);
      return y;
    }
  }
  if (s == kernels::Status::Unsupported && (p.cin % 8 != 0 || p.cout % 8 != 0)) {
    // cuDNN's channels-last engines may want channel counts in multiples of 8
    // (the VAE's 3-channel stem and head): pad both with zeros and crop.
    log_once(LogLevel::Info, cat("conv3d_cl-padded:", ctx),
             cat(op, ": cuDNN refused ", ctx, " (", kernels::conv_cudnn_last_error(),
                 "); running it with channels zero-padded to multiples of 8"));
    const int64_t ci8 = (p.cin + 7) / 8 * 8, co8 = (p.cout + 7) / 8 * 8;
    const size_t es = dtype_size(x.dtype());
    Tensor xp = Tensor::zeros({p.n, p.t, p.h, p.w, ci8}, x.dtype(), x.device());
    copy2d(op, x.device(), xp.raw_data(), size_t(ci8) * es, x.raw_data(), size_t(p.cin) * es, size_t(p.cin) * es,
           size_t(x.numel() / p.cin));
    Tensor wp = Tensor::zeros({co8, p.kt, p.kh, p.kw, ci8}, x.dtype(), x.device());
    copy2d(op, x.device(), wp.raw_data(), size_t(ci8) * es, weight.raw_data(), size_t(p.cin) * es,
           size_t(p.cin) * es, size_t(weight.numel() / p.cin));
    Tensor bp;
    if (bias.defined()) {
      bp = Tensor::zeros({co8}, DType::F32, x.device());
      copy2d(op, x.device(), bp.raw_data(), size_t(co8) * 4, bias.raw_data(), size_t(p.cout) * 4,
             size_t(p.cout) * 4, 1);
    }
    const Tensor yp = conv3d_cl(xp, wp, bp, o);
    copy2d(op, x.device(), y.raw_data(), size_t(p.cout) * es, yp.raw_data(), size_t(co8) * es, size_t(p.cout) * es,
           size_t(y.numel() / p.cout));
    return y;
  }
  check_status(s, op, cat(ctx, ": ", kernels::conv_cudnn_last_error()));
  return y;
#elif TURBODIFF_HAVE_CUDA
  fail(ErrorKind::Unsupported, op, ": this build has no cuDNN (the CUDA VAE convolutions run through cuDNN); ",
       "rebuild with cuDNN 9 and the cuDNN frontend headers (scripts/setup.sh), or run the VAE with --device cpu");
#else
  no_cuda(op, x);
#endif
}

Tensor channel_rms_norm_cl(const Tensor& x, const Tensor& gamma, bool silu) {
  static const char* op = "channel_rms_norm_cl";
  check_act(op, "x", x);
  TD_CHECK(x.dim() >= 1, Shape, op, ": x must be [..., C], got ", x.desc());
  const int64_t c = x.size(-1), rows = x.numel() / std::max<int64_t>(c, 1);
  check_vec(op, "gamma", gamma, c, x);
  TD_CHECK(gamma.defined(), Internal, op, ": gamma is undefined");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() == 0) return y;
  if (x.device().is_cpu()) {
    check_status(kernels::channel_rms_norm_cl_cpu(x.data<float>(), rows, c, gamma.data<float>(), silu,
                                                  y.data<float>()),
                 op, x.desc());
    return y;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::channel_rms_norm_cl_cuda(x.raw_data(), elem_type(x.dtype(), op, "x"), rows, c,
                                                 gamma.data<float>(), silu, y.raw_data(), cuda::current_stream()),
               op, x.desc());
  return y;
#else
  no_cuda(op, x);
#endif
}

Tensor upsample_nearest2x_cl(const Tensor& x) {
  static const char* op = "upsample_nearest2x_cl";
  check_act(op, "x", x);
  TD_CHECK(x.dim() >= 3, Shape, op, ": x must be [..., H, W, C], got ", x.desc());
  Shape out = x.shape();
  const int64_t c = out[out.size() - 1], w = out[out.size() - 2], h = out[out.size() - 3];
  out[out.size() - 3] = 2 * h;
  out[out.size() - 2] = 2 * w;
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  if (x.numel() == 0) return y;
  const int64_t planes = x.numel() / (h * w * c);
  if (x.device().is_cpu()) {
    check_status(kernels::upsample_nearest2x_cl_cpu(x.data<float>(), planes, h, w, c, y.data<float>()), op, x.desc());
    return y;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::upsample_nearest2x_cl_cuda(x.raw_data(), elem_type(x.dtype(), op, "x"), planes, h, w, c,
                                                   y.raw_data(), cuda::current_stream()),
               op, x.desc());
  return y;
#else
  no_cuda(op, x);
#endif
}

namespace {

void copy2d(const char* op, const Device& d, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
            size_t row_bytes, size_t rows) {
  if (d.is_cpu()) {
    check_status(kernels::copy2d_cpu(dst, dst_pitch, src, src_pitch, row_bytes, rows), op, "copy");
    return;
  }
#if TURBODIFF_HAVE_CUDA
  check_status(kernels::copy2d_cuda(dst, dst_pitch, src, src_pitch, row_bytes, rows, cuda::current_stream()), op,
               "copy");
#else
  fail(ErrorKind::Unsupported, op, ": CUDA tensors in a build without CUDA");
#endif
}

}  // namespace

Tensor cat_frames_cl(const std::vector<Tensor>& parts) {
  static const char* op = "cat_frames_cl";
  TD_CHECK(!parts.empty(), Shape, op, ": nothing to concatenate");
  const Tensor& f = parts.front();
  int64_t t = 0;
  for (const Tensor& p : parts) {
    check_act(op, "part", p);
    TD_CHECK(p.dim() == 5 && p.size(0) == f.size(0) && p.size(2) == f.size(2) && p.size(3) == f.size(3) &&
                 p.size(4) == f.size(4) && p.dtype() == f.dtype() && p.device() == f.device(),
             Shape, op, ": parts must be [B, t_i, H, W, C] alike, got ", p.desc(), " and ", f.desc());
    t += p.size(1);
  }
  Tensor out = Tensor::empty({f.size(0), t, f.size(2), f.size(3), f.size(4)}, f.dtype(), f.device());
  if (f.device().is_cuda()) cuda::set_device(f.device().index);
  const size_t frame_bytes = size_t(f.size(2) * f.size(3) * f.size(4)) * dtype_size(f.dtype());
  char* o = static_cast<char*>(out.raw_data());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const size_t bytes = size_t(p.size(1)) * frame_bytes;
    if (bytes)
      copy2d(op, f.device(), o + size_t(at) * frame_bytes, size_t(t) * frame_bytes, p.raw_data(), bytes, bytes,
             size_t(f.size(0)));
    at += p.size(1);
  }
  return out;
}

Tensor channel_halves_to_frames_cl(const Tensor& y) {
  static const char* op = "channel_halves_to_frames_cl";
  check_act(op, "y", y);
  TD_CHECK(y.dim() == 5 && y.size(4) % 2 == 0, Shape, op, ": y must be [B, t, H, W, 2C], got ", y.desc());
  const int64_t b = y.size(0), t = y.size(1), hw = y.size(2) * y.size(3), c = y.size(4) / 2;
  Tensor out = Tensor::empty({b, 2 * t, y.size(2), y.size(3), c}, y.dtype(), y.device());
  if (y.device().is_cuda()) cuda::set_device(y.device().index);
  const size_t es = dtype_size(y.dtype()), half = size_t(c) * es;
  const char* src = static_cast<const char*>(y.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t s = 0; s < b * t; ++s)
    for (int64_t k = 0; k < 2; ++k)
      copy2d(op, y.device(), dst + size_t(2 * s + k) * size_t(hw) * half, half,
             src + size_t(s) * size_t(hw) * 2 * half + size_t(k) * half, 2 * half, half, size_t(hw));
  return out;
}

Tensor softmax_rows(const Tensor& s, float scale, DType out_dtype) {
  static const char* op = "softmax_rows";
  TD_CHECK(s.dim() == 2 && s.dtype() == DType::F32 && s.is_contiguous(), Shape, op,
           ": scores must be a contiguous f32 [rows, cols] tensor, got ", s.desc());
  Tensor p = Tensor::empty(s.shape(), out_dtype, s.device());
  if (s.numel() == 0) return p;
  if (s.device().is_cpu()) {
    TD_CHECK(out_dtype == DType::F32, DType, op, ": on the CPU the output is f32");
    check_status(kernels::softmax_rows_cpu(s.data<float>(), s.size(0), s.size(1), scale, p.data<float>()), op,
                 s.desc());
    return p;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(s.device().index);
  check_status(kernels::softmax_rows_cuda(s.data<float>(), s.size(0), s.size(1), scale, p.raw_data(),
                                          elem_type(out_dtype, op, "out"), cuda::current_stream()),
               op, s.desc());
  return p;
#else
  no_cuda(op, s);
#endif
}

Tensor to_channels_last(const Tensor& x, int64_t t0, int64_t t, DType dtype, const Tensor& scale,
                        const Tensor& shift) {
  static const char* op = "to_channels_last";
  TD_CHECK(x.dim() == 5 && x.dtype() == DType::F32 && x.is_contiguous(), Shape, op,
           ": x must be a contiguous f32 [B, C, T, H, W] tensor, got ", x.desc());
  TD_CHECK(t0 >= 0 && t > 0 && t0 + t <= x.size(2), Shape, op, ": frames [", t0, ", ", t0 + t, ") outside ",
           x.desc());
  check_vec(op, "scale", scale, x.size(1), x);
  check_vec(op, "shift", shift, x.size(1), x);
  kernels::ToChannelsLast p;
  p.n = x.size(0);
  p.c = x.size(1);
  p.t_total = x.size(2);
  p.t0 = t0;
  p.t = t;
  p.hw = x.size(3) * x.size(4);
  p.scale = f32_or_null(scale);
  p.shift = f32_or_null(shift);
  Tensor y = Tensor::empty({p.n, t, x.size(3), x.size(4), p.c}, dtype, x.device());
  if (y.numel() == 0) return y;
  if (x.device().is_cpu()) {
    TD_CHECK(dtype == DType::F32, DType, op, ": on the CPU the output is f32");
    check_status(kernels::to_channels_last_cpu(p, x.data<float>(), y.data<float>()), op, x.desc());
    return y;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::to_channels_last_cuda(p, x.data<float>(), y.raw_data(), elem_type(dtype, op, "out"),
                                              cuda::current_stream()),
               op, x.desc());
  return y;
#else
  no_cuda(op, x);
#endif
}

void to_channels_first(const Tensor& x, Tensor& y, int64_t t0, const Tensor& scale, const Tensor& shift, bool clamp) {
  static const char* op = "to_channels_first";
  check_act(op, "x", x);
  TD_CHECK(x.dim() == 5 && y.dim() == 5 && y.dtype() == DType::F32 && y.is_contiguous() &&
               y.device() == x.device() && y.size(0) == x.size(0) && y.size(1) <= x.size(4) &&
               y.size(3) == x.size(2) && y.size(4) == x.size(3) && t0 >= 0 && t0 + x.size(1) <= y.size(2),
           Shape, op, ": x [B, t, H, W, Cx] ", x.desc(), " does not fit y [B, C <= Cx, T, H, W] f32 ", y.desc(),
           " at frame ", t0);
  check_vec(op, "scale", scale, y.size(1), x);
  check_vec(op, "shift", shift, y.size(1), x);
  kernels::ToChannelsFirst p;
  p.n = x.size(0);
  p.c_x = x.size(4);
  p.c = y.size(1);
  p.t_total = y.size(2);
  p.t0 = t0;
  p.t = x.size(1);
  p.hw = x.size(2) * x.size(3);
  p.scale = f32_or_null(scale);
  p.shift = f32_or_null(shift);
  p.clamp = clamp;
  if (x.numel() == 0) return;
  if (x.device().is_cpu()) {
    check_status(kernels::to_channels_first_cpu(p, x.data<float>(), y.data<float>()), op, x.desc());
    return;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::to_channels_first_cuda(p, x.raw_data(), elem_type(x.dtype(), op, "x"), y.data<float>(),
                                               cuda::current_stream()),
               op, x.desc());
#else
  no_cuda(op, x);
#endif
}

}  // namespace td::ops
