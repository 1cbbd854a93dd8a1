// The TAEHV channels-last ops (contract in taehv.h): host f32 tensors run the
// fp32 CPU references, CUDA tensors kernels/conv/taehv_cl.cu.
#include "ops/taehv.h"

#include "core/cuda_runtime.h"
#include "kernels/conv/taehv_cl.h"
#include "ops/common.h"

namespace td::ops {
namespace {

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

void pointwise(kernels::TaehvPointwise kop, const char* op, Tensor& x, const Tensor* r) {
  check_act(op, "x", x);
  if (r) {
    check_act(op, "r", *r);
    TD_CHECK(r->shape() == x.shape() && r->dtype() == x.dtype() && r->device() == x.device(), Shape, op,
             ": r must have x's shape, dtype and device: x ", x.desc(), ", r ", r->desc());
  }
  const int64_t n = x.numel();
  if (x.device().is_cpu()) {
    check_status(kernels::taehv_pointwise_cpu(kop, x.data<float>(), r ? r->data<float>() : nullptr, n, x.data<float>()),
                 op, x.desc());
    return;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::taehv_pointwise_cuda(kop, x.raw_data(), r ? r->raw_data() : nullptr,
                                             elem_type(x.dtype(), op, "x"), n, x.raw_data(), cuda::current_stream()),
               op, x.desc());
#else
  fail(ErrorKind::Unsupported, op, ": ", x.desc(), " is a CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

void relu_(Tensor& x) { pointwise(kernels::TaehvPointwise::Relu, "relu_", x, nullptr); }
void tanh_clamp3_(Tensor& x) { pointwise(kernels::TaehvPointwise::TanhClamp3, "tanh_clamp3_", x, nullptr); }
void add_relu_(Tensor& x, const Tensor& r) { pointwise(kernels::TaehvPointwise::AddRelu, "add_relu_", x, &r); }

Tensor memblock_input_cl(const Tensor& x, const Tensor& prev) {
  static const char* op = "memblock_input_cl";
  check_act(op, "x", x);
  TD_CHECK(x.dim() == 5 && x.size(0) == 1, Shape, op, ": x must be [1, T, H, W, C], got ", x.desc());
  const int64_t t = x.size(1), h = x.size(2), w = x.size(3), c = x.size(4);
  if (prev.defined()) {
    check_act(op, "prev", prev);
    TD_CHECK(prev.shape() == Shape({1, 1, h, w, c}) && prev.dtype() == x.dtype() && prev.device() == x.device(),
             Shape, op, ": prev must be [1, 1, ", h, ", ", w, ", ", c, "] in x's dtype on x's device, got ",
             prev.desc(), " for x ", x.desc());
  }
  Tensor y = Tensor::empty({1, t, h, w, 2 * c}, x.dtype(), x.device());
  if (y.numel() == 0) return y;
  if (x.device().is_cpu()) {
    check_status(kernels::taehv_memblock_input_cpu(x.data<float>(), prev.defined() ? prev.data<float>() : nullptr, t,
                                                   h * w, c, y.data<float>()),
                 op, x.desc());
    return y;
  }
#if TURBODIFF_HAVE_CUDA
  cuda::set_device(x.device().index);
  check_status(kernels::taehv_memblock_input_cuda(x.raw_data(), prev.defined() ? prev.raw_data() : nullptr,
                                                  elem_type(x.dtype(), op, "x"), t, h * w, c, y.raw_data(),
                                                  cuda::current_stream()),
               op, x.desc());
  return y;
#else
  fail(ErrorKind::Unsupported, op, ": ", x.desc(), " is a CUDA tensor in a build without CUDA");
#endif
}

}  // namespace td::ops
