// Wan's attention layers, composed from ops:
//   SelfAttention   q/k/v projections, RMSNorm of q and k over the full model
//                   dim fused with 3-D RoPE (ops::qk_norm_rope), softmax
//                   attention with scale 1/sqrt(head_dim), output projection
//   CrossAttention  q from the tokens, k/v from the embedded text context,
//                   RMSNorm of q and k, no RoPE, no mask
// The attention variant (original / sla / sagesla) is a switch on the
// self-attention only: TurboDiffusion keeps cross-attention dense.
#pragma once

#include <optional>
#include <string_view>

#include "nn/linear.h"
#include "ops/rope.h"

namespace td::nn {

enum class AttentionKind { Original, SLA, SageSLA };
const char* attention_kind_name(AttentionKind k);
std::optional<AttentionKind> parse_attention_kind(std::string_view s);  // "original", "sla", "sagesla"

struct SelfAttention {
  Linear q, k, v, o;
  Tensor norm_q, norm_k;  // f32 [dim]
  // TurboDiffusion SLA checkpoints: the linear branch's projection
  // (self_attn.attn_op.local_attn.proj_l), f32 [head_dim, head_dim] + [head_dim];
  // undefined when the checkpoint has none. `original` does not use it.
  Tensor proj_l_weight, proj_l_bias;
  int64_t heads = 0;
  float eps = 1e-6f;
  AttentionKind kind = AttentionKind::Original;
  // sla / sagesla: fraction of key blocks kept per query block (TurboDiffusion's
  // --sla_topk, default 0.1). Blocks: sla 128 x 64 (q x k), sagesla 64 x 128 (its
  // sm90 tiles). On the host both run the fp32 SLA reference (ops::sla): SageSLA's
  // INT8 Q/K and FP8 V quantization is a detail of its GPU kernel, not modelled.
  // An undefined proj_l runs as proj_l = 0, as TurboDiffusion zero-initialises it.
  double sla_topk = 0.1;
  // false (`--default-norm`): plain RMSNorm of q and k, then RoPE as a separate
  // op (ops::rope_apply), as the original Wan code computes them; true: the
  // fused FastNorm kernel (ops::qk_norm_rope). Same math, one rounding less.
  bool fused_norm_rope = true;

  // x: [B, L, dim] with L = grid.tokens(); rope_tables: ops::rope_tables(head_dim,
  // grid, x's device). Returns [B, L, dim] in x's dtype.
  Tensor operator()(const Tensor& x, const ops::PatchGrid& grid, const Tensor& rope_tables) const;
  // On x already quantized for INT8 q, k and v of one scheme (input_act_scheme()).
  Tensor operator()(const ops::QuantizedActivation& x, const ops::PatchGrid& grid, const Tensor& rope_tables) const;
  // The scheme q, k and v read x in when all three are INT8 of one scheme, or nothing.
  std::optional<ops::Int8ActScheme> input_act_scheme() const;

 private:
  Tensor attend(const Tensor& qp, const Tensor& kp, const Tensor& vp, bool cuda, const ops::PatchGrid& grid,
                const Tensor& rope_tables) const;
};

struct CrossAttention {
  Linear q, k, v, o;
  Tensor norm_q, norm_k;  // f32 [dim]
  int64_t heads = 0;
  float eps = 1e-6f;

  // x: [B, L, dim]; context: [B, Lc, dim] (already through the text embedding).
  // Returns [B, L, dim] in x's dtype.
  Tensor operator()(const Tensor& x, const Tensor& context) const;
  // On x already quantized for an INT8 q (input_act_scheme()).
  Tensor operator()(const ops::QuantizedActivation& x, const Tensor& context) const;
  std::optional<ops::Int8ActScheme> input_act_scheme() const { return q.int8_act_scheme(); }

 private:
  Tensor attend(const Tensor& qp, const Tensor& context) const;
};

}  // namespace td::nn
