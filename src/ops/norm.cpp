#include "ops/norm.h"

#include "core/cuda_runtime.h"
#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/residual_gate_norm.h"
#include "kernels/norm/rms_norm.h"
#include "ops/common.h"

namespace td::ops {
namespace {

const float* vec_f32(const Tensor& t, int64_t dim, const char* op, const char* what) {
  if (!t.defined()) return nullptr;
  TD_CHECK(t.dtype() == DType::F32 && t.numel() == dim && t.is_contiguous(), Shape, op, ": ", what,
           " must be a contiguous f32 vector of ", dim, " values, got ", t.desc());
  return t.data<float>();
}

int64_t rows_per_batch(int64_t rows, int64_t batch, const char* op) {
  TD_CHECK(batch > 0 && rows % batch == 0, Shape, op, ": ", rows, " rows cannot be split evenly among ", batch,
           " modulation rows");
  return rows / batch;
}

std::string ctx(const Tensor& x) { return x.desc(); }

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, std::optional<DType> out_dtype) {
  static const char* op = "rms_norm";
  check_same_device(op, {{"x", &x}, {"weight", &weight}});
  const Rows r = as_rows(x, op, "x");
  Tensor y = Tensor::empty(x.shape(), out_dtype.value_or(x.dtype()), x.device());
  const float* w = vec_f32(weight, r.dim, op, "weight");
  const auto xt = elem_type(x.dtype(), op, "x"), yt = elem_type(y.dtype(), op, "y");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda())
    s = kernels::rms_norm_cuda(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, w, r.rows, r.dim, eps,
                               cuda::current_stream());
  else
#endif
    s = kernels::rms_norm_cpu(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, w, r.rows, r.dim, eps);
  check_status(s, op, ctx(x));
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                  std::optional<DType> out_dtype) {
  static const char* op = "layer_norm";
  check_same_device(op, {{"x", &x}, {"weight", &weight}, {"bias", &bias}});
  const Rows r = as_rows(x, op, "x");
  Tensor y = Tensor::empty(x.shape(), out_dtype.value_or(x.dtype()), x.device());
  const float* w = vec_f32(weight, r.dim, op, "weight");
  const float* b = vec_f32(bias, r.dim, op, "bias");
  const auto xt = elem_type(x.dtype(), op, "x"), yt = elem_type(y.dtype(), op, "y");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda())
    s = kernels::layer_norm_cuda(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, w, b, r.rows, r.dim, eps,
                                 cuda::current_stream());
  else
#endif
    s = kernels::layer_norm_cpu(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, w, b, r.rows, r.dim, eps);
  check_status(s, op, ctx(x));
  return y;
}

Tensor adaln_modulate(const Tensor& x, const Tensor& scale, const Tensor& shift, float eps,
                      std::optional<DType> out_dtype) {
  static const char* op = "adaln_modulate";
  check_same_device(op, {{"x", &x}, {"scale", &scale}, {"shift", &shift}});
  const Rows r = as_rows(x, op, "x");
  const ModRows sc = as_mod_rows(scale, r.dim, op, "scale");
  const ModRows sh = as_mod_rows(shift, r.dim, op, "shift");
  TD_CHECK(sc.batch == sh.batch && sc.stride == sh.stride, Shape, op, ": scale ", scale.desc(), " and shift ",
           shift.desc(), " differ in batch or row stride");
  const int64_t rpb = rows_per_batch(r.rows, sc.batch, op);
  Tensor y = Tensor::empty(x.shape(), out_dtype.value_or(x.dtype()), x.device());
  const auto xt = elem_type(x.dtype(), op, "x"), yt = elem_type(y.dtype(), op, "y");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda())
    s = kernels::adaln_modulate_cuda(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, sc.ptr, sh.ptr, sc.stride, rpb,
                                     r.rows, r.dim, eps, cuda::current_stream());
  else
#endif
    s = kernels::adaln_modulate_cpu(r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, sc.ptr, sh.ptr, sc.stride, rpb,
                                    r.rows, r.dim, eps);
  check_status(s, op, ctx(x));
  return y;
}

namespace {

// residual_gate_norm's checked parameters for x, y and a, writing `out`
// (undefined: no bf16 output, the codes only).
kernels::ResidualGateNormParams residual_norm_params(Tensor& x, const Tensor& y, const ResidualNormArgs& a,
                                                     const Tensor& out, DType out_dtype) {
  static const char* op = "residual_gate_norm";
  check_same_device(op, {{"x", &x}, {"y", &y}, {"gate", &a.gate}, {"weight", &a.weight}, {"bias", &a.bias},
                         {"scale", &a.scale}, {"shift", &a.shift}});
  TD_CHECK(x.shape() == y.shape(), Shape, op, ": residual x ", x.desc(), " and update y ", y.desc(), " differ in shape");
  const Rows rx = as_rows(x, op, "x");
  const Rows ry = as_rows(y, op, "y");
  kernels::ResidualGateNormParams p;
  p.x = rx.ptr;
  p.x_stride = rx.stride;
  p.x_out = rx.ptr;
  p.x_out_stride = rx.stride;
  p.residual_type = elem_type(x.dtype(), op, "x");
  p.y = ry.ptr;
  p.y_type = elem_type(y.dtype(), op, "y");
  p.y_stride = ry.stride;
  p.out = out.defined() ? out.raw_data() : nullptr;
  p.out_type = elem_type(out_dtype, op, "out");
  p.out_stride = rx.dim;
  p.rows = rx.rows;
  p.dim = rx.dim;
  p.eps = a.eps;
  p.weight = vec_f32(a.weight, rx.dim, op, "weight");
  p.bias = vec_f32(a.bias, rx.dim, op, "bias");
  int64_t batch = 0, mod_stride = 0;
  auto take_mod = [&](const Tensor& t, const char* what) -> const float* {
    if (!t.defined()) return nullptr;
    const ModRows m = as_mod_rows(t, rx.dim, op, what);
    TD_CHECK(batch == 0 || (m.batch == batch && m.stride == mod_stride), Shape, op, ": ", what, " ", t.desc(),
             " differs in batch or row stride from the other modulation vectors");
    batch = m.batch;
    mod_stride = m.stride;
    return m.ptr;
  };
  p.gate = take_mod(a.gate, "gate");
  p.scale = take_mod(a.scale, "scale");
  p.shift = take_mod(a.shift, "shift");
  TD_CHECK((p.scale == nullptr) == (p.shift == nullptr), Usage, op, ": scale and shift must be given together");
  p.mod_stride = mod_stride;
  p.rows_per_batch = batch ? rows_per_batch(rx.rows, batch, op) : rx.rows;
  return p;
}

kernels::Status run_residual_norm(const Tensor& x, const kernels::ResidualGateNormParams& p) {
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda()) return kernels::residual_gate_norm_cuda(p, cuda::current_stream());
#endif
  return kernels::residual_gate_norm_cpu(p);
}

}  // namespace

Tensor residual_gate_norm(Tensor& x, const Tensor& y, const ResidualNormArgs& a) {
  const DType out_dtype = a.out_dtype.value_or(y.dtype());
  Tensor out = Tensor::empty(x.shape(), out_dtype, x.device());
  const kernels::ResidualGateNormParams p = residual_norm_params(x, y, a, out, out_dtype);
  check_status(run_residual_norm(x, p), "residual_gate_norm", ctx(x));
  return out;
}

QuantizedActivation residual_gate_norm_quantized(Tensor& x, const Tensor& y, const ResidualNormArgs& a,
                                                 Int8ActScheme act) {
  const DType out_dtype = a.out_dtype.value_or(y.dtype());
  const bool fuse = act == Int8ActScheme::Token128 && x.device().is_cuda() && y.dtype() == DType::BF16 &&
                    out_dtype == DType::BF16 && x.dim() >= 1 && x.size(x.dim() - 1) % 128 == 0;
  if (fuse) {
    // h only as a shape: the kernel writes the codes and scales, not h.
    Tensor h = Tensor::empty(x.shape(), out_dtype, x.device());
    QuantizedActivation q = quantized_activation_buffers(h, act);
    if (q.codes.defined()) {
      kernels::ResidualGateNormParams p = residual_norm_params(x, y, a, Tensor(), out_dtype);
      p.codes = q.codes.data<int8_t>();
      p.codes_stride = p.dim;
      p.code_scales = q.scale.data<float>();
      p.ld_scales = q.ld_scale;
      const kernels::Status s = run_residual_norm(x, p);
      if (s != kernels::Status::Unsupported) {
        check_status(s, "residual_gate_norm", ctx(x));
        q.x_written = false;
        return q;
      }
    }
  }
  return quantize_activation(residual_gate_norm(x, y, a), act);
}

}  // namespace td::ops
