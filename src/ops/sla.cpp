#include "ops/sla.h"

#include <cmath>

#include "core/error.h"
#include "ops/common.h"

namespace td::ops {
namespace {

constexpr const char* kOp = "sla";

void check_operand(const Tensor& t, const char* what) {
  TD_CHECK(t.defined() && t.dim() == 4, Shape, kOp, ": ", what, " must be 4-D [B, L, heads, head_dim], got ",
           t.defined() ? t.desc() : std::string("undefined"));
  TD_CHECK(dtype_is_floating(t.dtype()), DType, kOp, ": ", what, " ", t.desc(), " must be floating-point");
}

// fp32 with head_dim contiguous, as [B, L, H, D] strides (batch, head, token).
Tensor as_f32(const Tensor& t) {
  Tensor f = t.dtype() == DType::F32 ? t : t.to(DType::F32);
  if (f.size(3) != 1 && f.strides()[3] != 1) f = f.contiguous();
  for (int64_t d = 0; d < 3; ++d)
    if (f.strides()[size_t(d)] < 0) return f.contiguous();
  return f;
}

kernels::AttnStrides strides_of(const Tensor& t) {
  const auto& s = t.strides();
  return {s[0], s[2], s[1]};
}

}  // namespace

Tensor sla(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& proj_weight, const Tensor& proj_bias,
           const SlaOptions& options, std::optional<DType> out_dtype) {
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}, {"proj_l.weight", &proj_weight}, {"proj_l.bias", &proj_bias}});
  check_operand(q, "q");
  check_operand(k, "k");
  check_operand(v, "v");
  TD_CHECK(q.shape() == k.shape() && q.shape() == v.shape(), Shape, kOp,
           ": self-attention needs q, k and v of one shape, got q ", q.desc(), ", k ", k.desc(), ", v ", v.desc());
  if (q.device().is_cuda())
    fail(ErrorKind::Unsupported, kOp, ": SLA on CUDA not implemented yet (issue 6); got q ", q.desc(),
         ". Run on --device cpu, or use --attention original");
  const int64_t B = q.size(0), L = q.size(1), H = q.size(2), D = q.size(3);
  TD_CHECK(proj_weight.defined() == proj_bias.defined(), Shape, kOp,
           ": proj_l weight and bias must both be given or both be absent, got weight ",
           proj_weight.defined() ? proj_weight.desc() : std::string("undefined"), ", bias ",
           proj_bias.defined() ? proj_bias.desc() : std::string("undefined"));
  Tensor w, bias;
  if (proj_weight.defined()) {
    const bool shapes_ok = proj_weight.shape() == Shape{D, D} && proj_bias.shape() == Shape{D};
    TD_CHECK(shapes_ok, Shape, kOp,
             ": proj_l must be weight [", D, ", ", D, "] and bias [", D, "] for head_dim ", D, ", got ",
             proj_weight.desc(), " and ", proj_bias.desc());
    w = proj_weight.to(DType::F32).contiguous();
    bias = proj_bias.to(DType::F32).contiguous();
  }
  const Tensor qf = as_f32(q), kf = as_f32(k), vf = as_f32(v);
  Tensor o = Tensor::empty({B, L, H, D}, DType::F32);

  kernels::SlaProblem p;
  p.batch = B;
  p.heads = H;
  p.len = L;
  p.head_dim = D;
  p.q = strides_of(qf);
  p.k = strides_of(kf);
  p.v = strides_of(vf);
  p.o = kernels::attn_contiguous_strides(kernels::AttnLayout::BLHD, H, L, D);
  p.scale = options.scale.value_or(float(1.0 / std::sqrt(double(D))));
  p.block_q = options.block_q;
  p.block_k = options.block_k;
  p.topk = options.topk;
  p.feature_map = options.feature_map;
  const kernels::Status s =
      kernels::sla_cpu(p, qf.data<float>(), kf.data<float>(), vf.data<float>(), w.defined() ? w.data<float>() : nullptr,
                       bias.defined() ? bias.data<float>() : nullptr, o.data<float>());
  if (s != kernels::Status::Ok) check_status(s, kOp, cat("q ", q.desc(), ": ", kernels::sla_last_error()));
  const DType ot = out_dtype.value_or(q.dtype());
  return ot == DType::F32 ? o : o.to(ot);
}

}  // namespace td::ops
