// The Wan DiT forward (shared/reference/wan21-and-rcm.md §1.2), T2V and
// Wan2.2-I2V-A14B (36 input channels, no image branch), on the device its
// weights live on: host tensors run the fp32 CPU reference ops, CUDA tensors
// the GPU ops (BF16 matmuls and attention, fp32 time embedding, modulation,
// norms and head, as the original computes them).
//
//   tokens   patch embedding: a Linear over (c, kt, kh, kw) patch features
//   e        time_embedding(sinusoid(t)): [cos, sin] in fp64, then an fp32 MLP
//   e0       time_projection(silu(e)) -> 6 modulation vectors per sample
//   ctx      text_embedding (Linear, gelu-tanh, Linear) of the context as given
//            (the caller zero-pads it; the model does not mask)
//   blocks   x += gate_msa * SelfAttn(LN1(x) * (1 + scale_msa) + shift_msa)
//            x += CrossAttn(LN3_affine(x), ctx)
//            x += gate_ffn * FFN(LN2(x) * (1 + scale_ffn) + shift_ffn)
//            with (shift, scale, gate)_{msa,ffn} = block.modulation + e0
//   head     Linear(LN(x) * (1 + scale) + shift), (shift, scale) = head.modulation + e
//   output   unpatchified in (kt, kh, kw, c) order
//
// The residual stream x is fp32 on every device (the original's gate * y in
// fp32 makes it so); each gated residual add is fused with the next norm
// (ops::residual_gate_norm).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "models/wan/wan_config.h"
#include "models/wan/wan_loader.h"
#include "nn/attention.h"
#include "nn/ffn.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace td::models::wan {

struct WanBlock {
  Tensor modulation;  // f32 [6 * dim]: shift, scale, gate (self-attention), shift, scale, gate (FFN)
  nn::SelfAttention self_attn;
  nn::LayerNorm norm3;  // the cross-attention pre-norm (affine)
  nn::CrossAttention cross_attn;
  nn::FFN ffn;
};

class WanDiT {
 public:
  // Takes the loaded tensors (moved out of the checkpoint). `attention` selects
  // the self-attention variant; sla / sagesla (with sla_topk, the fraction of
  // key blocks kept) run the SLA reference on the host (nn::SelfAttention) and
  // are an Unsupported error on CUDA (issue 6). A checkpoint without proj_l
  // runs SLA with proj_l = 0 (TurboDiffusion's zero initialisation).
  //
  // default_norm (`--default-norm`): the unfused norms, composed from plain
  // ops as the original Wan code computes them: LayerNorm, then the AdaLN
  // modulation (x * (1 + scale) + shift) as separate elementwise ops, the gated
  // residual add as its own op, and RMSNorm of q/k followed by a separate RoPE.
  // Otherwise the fused FastNorm kernels (residual_gate_norm, adaln_modulate,
  // qk_norm_rope). Same math; the fused path rounds less often.
  explicit WanDiT(WanCheckpoint checkpoint, nn::AttentionKind attention = nn::AttentionKind::Original,
                  double sla_topk = 0.1, bool default_norm = false);

  // latent [B, in_dim, T, H, W] (T, H, W multiples of the patch size), timestep
  // [B] (one per sample, in [0, 1000]), context [B, Lc, text_dim]; any float
  // dtype, on the host or the model's device. Returns the velocity
  // [B, out_dim, T, H, W], f32, on the model's device.
  Tensor forward(const Tensor& latent, const Tensor& timestep, const Tensor& context) const;

  // The checks forward() runs first (Shape / DType errors naming the input).
  void check_inputs(const Tensor& latent, const Tensor& timestep, const Tensor& context) const;

  const WanConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }  // the run dtype of the matmuls
  nn::AttentionKind attention() const { return attention_; }
  bool has_proj_l() const { return has_proj_l_; }
  bool default_norm() const { return default_norm_; }
  // Set when the block linears run as W8A8 INT8 (WanLoadOptions::int8_variant).
  std::optional<nn::Int8LinearVariant> int8_variant() const { return int8_variant_; }

 private:
  WanConfig config_;
  Device device_;
  DType dtype_ = DType::F32;
  nn::AttentionKind attention_ = nn::AttentionKind::Original;
  bool has_proj_l_ = false;
  std::optional<nn::Int8LinearVariant> int8_variant_;
  nn::Linear patch_embedding_, text_embedding_0_, text_embedding_2_, time_embedding_0_, time_embedding_2_,
      time_projection_, head_;
  Tensor head_modulation_;  // f32 [2, dim]: shift, scale
  Tensor zeros_;            // f32 [dim] of zeros (a strided-to-dense copy through ops::add)
  Tensor ones_;             // f32 [dim] of ones (1 + scale on the default-norm path)
  bool default_norm_ = false;
  std::vector<WanBlock> blocks_;
  // RoPE tables per patch grid (built once per grid on the host in fp64, then
  // kept on the device): a sampler calls forward() with the same grid every step.
  struct RopeCache;
  std::shared_ptr<RopeCache> rope_cache_;
  Tensor rope_tables_for(const ops::PatchGrid& grid) const;
};

// Host helpers of the forward, exposed for tests.
// latent f32 [B, C, T, H, W] -> [B, L, C * pt * ph * pw], features in (c, kt, kh, kw) order.
Tensor wan_patchify(const Tensor& latent, int64_t pt, int64_t ph, int64_t pw);
// tokens f32 [B, L, pt * ph * pw * C] in (kt, kh, kw, c) order -> [B, C, T, H, W].
Tensor wan_unpatchify(const Tensor& tokens, int64_t frames, int64_t height, int64_t width, int64_t pt, int64_t ph,
                      int64_t pw);
// [cos(t * f_i), sin(t * f_i)], f_i = 10000^(-i / (dim / 2)), computed in fp64, as f32 [B, dim].
Tensor wan_time_sinusoid(const Tensor& timestep, int64_t dim);

}  // namespace td::models::wan
