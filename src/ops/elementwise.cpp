#include "ops/elementwise.h"

#include "core/cuda_runtime.h"
#include "kernels/elementwise/activation.h"
#include "kernels/elementwise/broadcast_binary.h"
#include "ops/common.h"

namespace td::ops {
namespace {

Tensor activation(kernels::Activation act, const char* op, const Tensor& x, std::optional<DType> out_dtype) {
  const Rows r = as_rows(x, op, "x");
  Tensor y = Tensor::empty(x.shape(), out_dtype.value_or(x.dtype()), x.device());
  const auto xt = elem_type(x.dtype(), op, "x"), yt = elem_type(y.dtype(), op, "y");
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (x.device().is_cuda())
    s = kernels::activation_cuda(act, r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, r.rows, r.dim,
                                 cuda::current_stream());
  else
#endif
    s = kernels::activation_cpu(act, r.ptr, xt, r.stride, y.raw_data(), yt, r.dim, r.rows, r.dim);
  check_status(s, op, x.desc());
  return y;
}

void binary(kernels::BinaryOp bop, const char* op, const Tensor& a, const Tensor& b, Tensor& out) {
  check_same_device(op, {{"a", &a}, {"b", &b}, {"out", &out}});
  const Rows ra = as_rows(a, op, "a");
  const Rows ro = as_rows(out, op, "out");
  kernels::BroadcastBinaryParams p;
  p.op = bop;
  p.a = ra.ptr;
  p.a_type = elem_type(a.dtype(), op, "a");
  p.a_stride = ra.stride;
  p.out = ro.ptr;
  p.out_type = elem_type(out.dtype(), op, "out");
  p.out_stride = ro.stride;
  p.rows = ra.rows;
  p.dim = ra.dim;
  if (b.shape() == a.shape() && b.dtype() == a.dtype()) {
    const Rows rb = as_rows(b, op, "b");
    p.broadcast = kernels::Broadcast::Full;
    p.b = rb.ptr;
    p.b_stride = rb.stride;
  } else if (b.dim() == 1) {
    TD_CHECK(b.dtype() == DType::F32 && b.numel() == ra.dim && b.is_contiguous(), Shape, op, ": vector operand ",
             b.desc(), " must be contiguous f32 with ", ra.dim, " values");
    p.broadcast = kernels::Broadcast::Vector;
    p.b = b.raw_data();
  } else {
    const ModRows m = as_mod_rows(b, ra.dim, op, "b");
    TD_CHECK(m.batch > 0 && ra.rows % m.batch == 0, Shape, op, ": ", ra.rows, " rows of ", a.desc(),
             " cannot be split among ", m.batch, " rows of ", b.desc());
    p.broadcast = kernels::Broadcast::PerSample;
    p.b = m.ptr;
    p.b_stride = m.stride;
    p.rows_per_batch = ra.rows / m.batch;
  }
  kernels::Status s;
#if TURBODIFF_HAVE_CUDA
  if (a.device().is_cuda()) s = kernels::broadcast_binary_cuda(p, cuda::current_stream());
  else
#endif
    s = kernels::broadcast_binary_cpu(p);
  check_status(s, op, a.desc() + " with " + b.desc());
}

}  // namespace

Tensor gelu_tanh(const Tensor& x, std::optional<DType> o) { return activation(kernels::Activation::GeluTanh, "gelu_tanh", x, o); }
Tensor silu(const Tensor& x, std::optional<DType> o) { return activation(kernels::Activation::Silu, "silu", x, o); }

Tensor add(const Tensor& a, const Tensor& b, std::optional<DType> o) {
  Tensor out = Tensor::empty(a.shape(), o.value_or(a.dtype()), a.device());
  binary(kernels::BinaryOp::Add, "add", a, b, out);
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b, std::optional<DType> o) {
  Tensor out = Tensor::empty(a.shape(), o.value_or(a.dtype()), a.device());
  binary(kernels::BinaryOp::Mul, "mul", a, b, out);
  return out;
}
void add_(Tensor& a, const Tensor& b) { binary(kernels::BinaryOp::Add, "add_", a, b, a); }
void mul_(Tensor& a, const Tensor& b) { binary(kernels::BinaryOp::Mul, "mul_", a, b, a); }

}  // namespace td::ops
