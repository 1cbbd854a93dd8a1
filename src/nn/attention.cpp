#include "nn/attention.h"

#include "core/profile.h"
#include "ops/attention.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/sla.h"

namespace td::nn {
namespace {

// [B, L, heads * head_dim] -> [B, L, heads, head_dim] (a view).
Tensor split_heads(const Tensor& t, int64_t heads) {
  return t.view({t.size(0), t.size(1), heads, t.size(2) / heads});
}

Tensor merge_heads(const Tensor& t) { return t.view({t.size(0), t.size(1), t.size(2) * t.size(3)}); }

}  // namespace

const char* attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::Original: return "original";
    case AttentionKind::SLA: return "sla";
    case AttentionKind::SageSLA: return "sagesla";
  }
  return "?";
}

std::optional<AttentionKind> parse_attention_kind(std::string_view s) {
  if (s == "original") return AttentionKind::Original;
  if (s == "sla") return AttentionKind::SLA;
  if (s == "sagesla") return AttentionKind::SageSLA;
  return std::nullopt;
}

std::optional<ops::Int8ActScheme> SelfAttention::input_act_scheme() const {
  const std::optional<ops::Int8ActScheme> act = q.int8_act_scheme();
  if (act && k.int8_act_scheme() == act && v.int8_act_scheme() == act) return act;
  return std::nullopt;
}

Tensor SelfAttention::operator()(const Tensor& x, const ops::PatchGrid& grid, const Tensor& rope_tables) const {
  TD_CHECK(x.dim() == 3, Shape, "self-attention: x must be [B, L, dim], got ", x.desc());
  if (const std::optional<ops::Int8ActScheme> act = input_act_scheme()) {
    // W8A8 q, k and v of one scheme read the same x: quantized once, not three times.
    ops::QuantizedActivation xq;
    {
      const prof::Scope scope(prof::OpClass::Gemm, x.device().is_cuda());
      xq = ops::quantize_activation(x, *act);
    }
    return (*this)(xq, grid, rope_tables);
  }
  return attend(q(x), k(x), v(x), x.device().is_cuda(), grid, rope_tables);
}

Tensor SelfAttention::operator()(const ops::QuantizedActivation& xq, const ops::PatchGrid& grid,
                                 const Tensor& rope_tables) const {
  TD_CHECK(xq.x.dim() == 3, Shape, "self-attention: x must be [B, L, dim], got ", xq.x.desc());
  return attend(q(xq), k(xq), v(xq), xq.x.device().is_cuda(), grid, rope_tables);
}

Tensor SelfAttention::attend(const Tensor& qp, const Tensor& kp, const Tensor& vp, bool cuda,
                             const ops::PatchGrid& grid, const Tensor& rope_tables) const {
  const ops::QK qk = [&] {
    const prof::Scope scope(prof::OpClass::Norm, cuda);
    if (fused_norm_rope) return ops::qk_norm_rope(qp, kp, norm_q, norm_k, rope_tables, grid, heads, eps);
    return ops::QK{ops::rope_apply(ops::rms_norm(qp, norm_q, eps), rope_tables, grid, heads),
                   ops::rope_apply(ops::rms_norm(kp, norm_k, eps), rope_tables, grid, heads)};
  }();
  if (kind == AttentionKind::Original) {
    Tensor a;
    {
      const prof::Scope scope(prof::OpClass::Attention, cuda);
      a = ops::attention(qk.q, qk.k, split_heads(vp, heads));
    }
    return o(merge_heads(a));
  }
  ops::SlaOptions so;
  so.topk = sla_topk;
  so.block_q = kind == AttentionKind::SageSLA ? 64 : 128;
  so.block_k = kind == AttentionKind::SageSLA ? 128 : 64;
  Tensor a;
  {
    const prof::Scope scope(prof::OpClass::Attention, cuda);
    a = ops::sla(qk.q, qk.k, split_heads(vp, heads), proj_l_weight, proj_l_bias, so);
  }
  return o(merge_heads(a));
}

Tensor CrossAttention::operator()(const Tensor& x, const Tensor& context) const {
  TD_CHECK(x.dim() == 3 && context.dim() == 3 && context.size(0) == x.size(0), Shape,
           "cross-attention: x [B, L, dim] and context [B, Lc, dim] expected, got ", x.desc(), " and ",
           context.desc());
  return attend(q(x), context);
}

Tensor CrossAttention::operator()(const ops::QuantizedActivation& xq, const Tensor& context) const {
  const Tensor& x = xq.x;
  TD_CHECK(x.dim() == 3 && context.dim() == 3 && context.size(0) == x.size(0), Shape,
           "cross-attention: x [B, L, dim] and context [B, Lc, dim] expected, got ", x.desc(), " and ",
           context.desc());
  return attend(q(xq), context);
}

Tensor CrossAttention::attend(const Tensor& qp, const Tensor& context) const {
  const bool cuda = qp.device().is_cuda();
  const Tensor kp = k(context), vp = v(context);
  Tensor qn, kn, a;
  {
    const prof::Scope scope(prof::OpClass::Norm, cuda);
    qn = ops::rms_norm(qp, norm_q, eps);
    kn = ops::rms_norm(kp, norm_k, eps);
  }
  {
    const prof::Scope scope(prof::OpClass::Attention, cuda);
    a = ops::attention(split_heads(qn, heads), split_heads(kn, heads), split_heads(vp, heads));
  }
  return o(merge_heads(a));
}

}  // namespace td::nn
