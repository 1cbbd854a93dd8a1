#include "ops/sage_attention.h"

#include <cmath>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "ops/common.h"

namespace td::ops {
namespace {

constexpr const char* kOp = "sage_attention";
thread_local std::string t_last_backend;

}  // namespace

const std::string& sage_attention_last_backend() { return t_last_backend; }

Tensor sage_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SageAttentionOptions& options,
                      std::optional<DType> out_dtype, Tensor* lse) {
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
  p.scale = options.scale.value_or(float(1.0 / std::sqrt(double(D))));
  p.qkv_type = elem_type(q.dtype(), kOp, "q");
  p.o_type = elem_type(ot, kOp, "out");
  const std::string ctx = cat("q ", q.desc(), ", k ", k.desc());

  kernels::SageSparse sparse;
  const kernels::SageSparse* sp = nullptr;
  if (options.lut.defined()) {
    const Tensor& lut = options.lut;
    TD_CHECK(lut.device() == q.device(), Shape, kOp, ": lut ", lut.desc(), " must be on q's device ", q.device().str());
    TD_CHECK(lut.dtype() == DType::I32 && lut.dim() == 4 && lut.is_contiguous(), Shape, kOp,
             ": lut must be a contiguous int32 [B, H, QB, n_sel], got ", lut.desc());
    TD_CHECK(options.block_q > 0, Shape, kOp, ": block_q must be positive");
    const int64_t QB = (Lq + options.block_q - 1) / options.block_q;
    TD_CHECK(lut.size(0) == B && lut.size(1) == H && lut.size(2) == QB, Shape, kOp, ": lut ", lut.desc(),
             " must be [", B, ", ", H, ", ", QB, ", n_sel] for ", ctx, " and block_q ", options.block_q);
    sparse.lut = static_cast<const int32_t*>(lut.raw_data());
    sparse.n_sel = lut.size(3);
    sparse.block_q = options.block_q;
    sparse.block_k = options.block_k;
    sp = &sparse;
  }

  Tensor o = Tensor::empty({B, Lq, H, D}, ot, q.device());
  Tensor lse_t;
  if (lse) lse_t = Tensor::empty({B, H, Lq}, DType::F32, q.device());
  float* lse_ptr = lse ? static_cast<float*>(lse_t.raw_data()) : nullptr;

  if (q.device().is_cpu()) {
    const kernels::Status s = kernels::sage_attention_cpu(p, q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(),
                                                          lse_ptr, sp, options.backend);
    if (s != kernels::Status::Ok) check_status(s, kOp, cat(ctx, ": ", kernels::attention_last_error()));
    t_last_backend = "cpu";
    if (lse) *lse = lse_t;
    return o;
  }
#if TURBODIFF_HAVE_CUDA
  TD_CHECK(q.dtype() == DType::BF16 && ot == DType::BF16, Unsupported, kOp,
           ": the CUDA kernels take bf16 q/k/v and output; got ", dtype_name(q.dtype()), " in, ", dtype_name(ot),
           " out (", ctx, ")");
  cuda::set_device(q.device().index);
  void* stream = cuda::current_stream();
  kernels::SageBackend be = options.backend;
  kernels::Status s = kernels::sage_attention_supports(p, sp, be);
  std::string reasons;
  if (s == kernels::Status::Unsupported && be == kernels::SageBackend::Auto) {
    // Auto picked sm_90a but it refuses this problem: the portable kernel.
    reasons = kernels::attention_last_error();
    be = kernels::SageBackend::Portable;
    s = kernels::sage_attention_supports(p, sp, be);
  }
  if (s != kernels::Status::Ok)
    check_status(s, kOp, cat(ctx, ": ", reasons.empty() ? "" : cat(reasons, "; "), kernels::attention_last_error()));
  if (be == kernels::SageBackend::Auto) {
    be = kernels::sage_attention_supports(p, sp, kernels::SageBackend::Sm90) == kernels::Status::Ok
             ? kernels::SageBackend::Sm90
             : kernels::SageBackend::Portable;
  }
  const size_t ws_bytes = kernels::sage_attention_workspace_size(p, be);
  Tensor ws = Tensor::empty({int64_t(ws_bytes)}, DType::U8, q.device());
  s = kernels::sage_attention_cuda(p, q.raw_data(), k.raw_data(), v.raw_data(), o.raw_data(), lse_ptr, sp, be,
                                   ws.raw_data(), ws_bytes, stream);
  if (s != kernels::Status::Ok) check_status(s, kOp, cat(ctx, ": ", kernels::attention_last_error()));
  t_last_backend = be == kernels::SageBackend::Sm90 ? "sm90" : "portable";
  log_once(LogLevel::Info, cat("sage-attention-backend:", t_last_backend),
           cat("sage_attention: ", be == kernels::SageBackend::Sm90 ? "sm_90a wgmma kernel" : "portable mma.sync kernel",
               sp ? " (block-sparse)" : "", reasons.empty() ? "" : cat(" (sm_90a refused: ", reasons, ")")));
  if (lse) *lse = lse_t;
  return o;
#else
  fail(ErrorKind::Unsupported, kOp, ": ", q.device().str(), " tensors in a build without CUDA");
#endif
}

}  // namespace td::ops
