#include "ops/attention.h"

#include <cmath>

#include "core/cuda_runtime.h"
#include "core/log.h"
#include "kernels/attention/attention.h"
#include "ops/common.h"

namespace td::ops {
namespace {

constexpr const char* kOp = "attention";
thread_local std::string t_last_backend;

}  // namespace

const std::string& attention_last_backend() { return t_last_backend; }

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<float> scale,
                 std::optional<DType> out_dtype) {
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}});
  check_attention_operand(q, kOp, "q");
  check_attention_operand(k, kOp, "k");
  check_attention_operand(v, kOp, "v");
  TD_CHECK(k.shape() == v.shape(), Shape, kOp, ": k ", k.desc(), " and v ", v.desc(), " differ in shape");
  TD_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3), Shape, kOp, ": q ", q.desc(),
           " and k ", k.desc(), " differ in batch, heads or head_dim");
  TD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), DType, kOp, ": q, k and v must share a dtype, got ",
           dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  const int64_t B = q.size(0), Lq = q.size(1), H = q.size(2), D = q.size(3), Lk = k.size(1);
  const DType ot = out_dtype.value_or(q.dtype());
  Tensor o = Tensor::empty({B, Lq, H, D}, ot, q.device());

  kernels::AttnProblem p;
  p.batch = B;
  p.heads = H;
  p.len_q = Lq;
  p.len_kv = Lk;
  p.head_dim = D;
  p.q = attention_strides(q);
  p.k = attention_strides(k);
  p.v = attention_strides(v);
  p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, H, Lq, D);
  p.scale = scale.value_or(float(1.0 / std::sqrt(double(D))));
  p.qkv_type = elem_type(q.dtype(), kOp, "q");
  p.o_type = elem_type(ot, kOp, "out");
  const std::string ctx = cat("q ", q.desc(), ", k ", k.desc());

  if (q.device().is_cpu()) {
    const kernels::Status s = kernels::attention_cpu(p, q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), nullptr);
    if (s != kernels::Status::Ok) check_status(s, kOp, cat(ctx, ": ", kernels::attention_last_error()));
    t_last_backend = "cpu";
    return o;
  }
#if TURBODIFF_HAVE_CUDA
  TD_CHECK(q.dtype() == DType::BF16 && ot == DType::BF16, Unsupported, kOp,
           ": the CUDA backends (cuDNN SDPA, flash) take bf16 q/k/v and output; got ", dtype_name(q.dtype()), " in, ",
           dtype_name(ot), " out (", ctx, "). Run the model in bf16 on CUDA, or on the CPU for f32");
  cuda::set_device(q.device().index);
  void* stream = cuda::current_stream();
  std::string reasons;
#if TURBODIFF_HAVE_CUDNN
  {
    size_t ws_bytes = 0;
    kernels::Status s = kernels::attention_cudnn_workspace_size(p, false, &ws_bytes);
    if (s == kernels::Status::Ok) {
      Tensor ws;
      if (ws_bytes) ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
      s = kernels::attention_cudnn(p, q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), nullptr,
                                   ws_bytes ? ws.raw_data() : nullptr, ws_bytes, stream);
      if (s == kernels::Status::Ok) {
        t_last_backend = "cudnn";
        return o;
      }
    }
    if (s != kernels::Status::Unsupported) check_status(s, kOp, cat(ctx, ": ", kernels::attention_last_error()));
    reasons = cat("cuDNN: ", kernels::attention_last_error());
    log_once(LogLevel::Info, cat("attention-cudnn-refused:", ctx),
             cat("attention: cuDNN refused ", ctx, " (", kernels::attention_last_error(), "); trying the flash kernel"));
  }
#else
  reasons = "cuDNN: not in this build";
#endif
  kernels::Status s = kernels::attention_flash_supports(p);
  if (s == kernels::Status::Ok) {
    s = kernels::attention_flash_cuda(p, q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), nullptr, stream);
    if (s == kernels::Status::Ok) {
      t_last_backend = "flash";
      return o;
    }
  }
  if (s != kernels::Status::Unsupported) check_status(s, kOp, cat(ctx, ": ", kernels::attention_last_error()));
  fail(ErrorKind::Unsupported, kOp, ": no CUDA backend takes ", ctx, ": ", reasons, "; flash: ",
       kernels::attention_last_error());
#else
  fail(ErrorKind::Unsupported, kOp, ": ", q.device().str(), " tensors in a build without CUDA");
#endif
}

}  // namespace td::ops
