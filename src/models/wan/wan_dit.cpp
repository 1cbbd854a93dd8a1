#include "models/wan/wan_dit.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "core/profile.h"
#include "core/thread_pool.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sla.h"

namespace td::models::wan {
namespace {

Tensor take(std::map<std::string, Tensor>& ts, const std::string& name) {
  auto it = ts.find(name);
  TD_CHECK(it != ts.end(), Internal, "Wan DiT: tensor ", name, " was not loaded");
  Tensor t = std::move(it->second);
  ts.erase(it);
  return t;
}

nn::Linear take_linear(std::map<std::string, Tensor>& ts, const std::string& base) {
  Tensor w = take(ts, base + ".weight");
  Tensor b = take(ts, base + ".bias");
  return nn::Linear(std::move(w), std::move(b));
}

// A block linear: INT8 (W8A8) when the loader kept it so, else floating point.
nn::Linear take_block_linear(WanCheckpoint& ck, const std::string& base) {
  auto it = ck.int8_weights.find(base);
  if (it == ck.int8_weights.end()) return take_linear(ck.tensors, base);
  TD_CHECK(ck.int8_variant.has_value(), Internal, "Wan DiT: INT8 weight ", base, " without a W8A8 variant");
  Tensor b = take(ck.tensors, base + ".bias");
  nn::Int8Linear l(std::move(it->second), b, *ck.int8_variant, b.device());
  ck.int8_weights.erase(it);
  return nn::Linear(std::move(l));
}

// Host f32 copy of an input (inputs are small: latents, timesteps, contexts).
Tensor host_f32(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  return h.dtype() == DType::F32 ? h.contiguous() : h.contiguous().to(DType::F32);
}

// Host tensor -> `dtype` on `device`.
Tensor to_run(const Tensor& host, DType dtype, Device device) {
  Tensor t = host.dtype() == dtype ? host : host.to(dtype);
  return device.is_cpu() ? t : t.to(device);
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

}  // namespace

Tensor wan_patchify(const Tensor& latent, int64_t pt, int64_t ph, int64_t pw) {
  TD_CHECK(latent.device().is_cpu() && latent.dtype() == DType::F32 && latent.dim() == 5 && latent.is_contiguous(),
           Internal, "wan_patchify takes a contiguous host f32 [B, C, T, H, W], got ", latent.desc());
  return ops::patchify(latent, pt, ph, pw, DType::F32);
}

Tensor wan_unpatchify(const Tensor& tokens, int64_t T, int64_t H, int64_t W, int64_t pt, int64_t ph, int64_t pw) {
  TD_CHECK(tokens.device().is_cpu() && tokens.dtype() == DType::F32 && tokens.dim() == 3 && tokens.is_contiguous(),
           Internal, "wan_unpatchify takes contiguous host f32 [B, L, features], got ", tokens.desc());
  TD_CHECK(pt > 0 && ph > 0 && pw > 0 && tokens.size(2) % (pt * ph * pw) == 0 &&
               tokens.size(1) == (T / pt) * (H / ph) * (W / pw),
           Internal, "wan_unpatchify: ", tokens.desc(), " does not fit a ", T, "x", H, "x", W, " latent");
  return ops::unpatchify(tokens, T, H, W, pt, ph, pw);
}

Tensor wan_time_sinusoid(const Tensor& timestep, int64_t dim) {
  const Tensor t = host_f32(timestep);
  const int64_t B = t.numel(), half = dim / 2;
  Tensor out = Tensor::empty({B, dim}, DType::F32);
  float* o = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    const double tb = double(t.data<float>()[b]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = tb * std::pow(10000.0, -double(i) / double(half));
      o[b * dim + i] = float(std::cos(angle));
      o[b * dim + half + i] = float(std::sin(angle));
    }
  }
  return out;
}

struct WanDiT::RopeCache {
  std::mutex mutex;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Tensor> tables;
};

Tensor WanDiT::rope_tables_for(const ops::PatchGrid& g) const {
  std::lock_guard<std::mutex> lock(rope_cache_->mutex);
  auto& slot = rope_cache_->tables[{g.frames, g.height, g.width}];
  if (!slot.defined()) slot = ops::rope_tables(config_.head_dim(), g, device_, config_.rope_theta);
  return slot;
}

WanDiT::WanDiT(WanCheckpoint ck, nn::AttentionKind attention, double sla_topk, bool default_norm)
    : config_(ck.config),
      attention_(attention),
      has_proj_l_(ck.has_proj_l),
      int8_variant_(ck.int8_variant),
      default_norm_(default_norm),
      rope_cache_(std::make_shared<RopeCache>()) {
  auto& ts = ck.tensors;
  device_ = ts.at("patch_embedding.weight").device();
  if (attention != nn::AttentionKind::Original) {
    if (device_.is_cuda() && attention == nn::AttentionKind::SageSLA) {
      ops::SlaOptions sage_blocks;  // sagesla's 64 x 128 blocks run on the SageAttention-style kernel
      sage_blocks.block_q = 64;
      sage_blocks.block_k = 128;
      TD_CHECK(ops::sla_cuda_available(sage_blocks), Unsupported,
               "--attention sagesla on CUDA: this build has no SageAttention-style sparse kernel "
               "(kernels/sage_attention), which runs sagesla's sparse branch; --attention sla (BF16 sparse branch) "
               "or original run on CUDA");
    }
    TD_CHECK(sla_topk > 0 && sla_topk <= 1, Usage, "--sla-topk ", sla_topk,
             ": expected the fraction of key blocks kept, in (0, 1]");
  }
  dtype_ = ts.at("patch_embedding.weight").dtype();
  patch_embedding_ = take_linear(ts, "patch_embedding");
  text_embedding_0_ = take_linear(ts, "text_embedding.0");
  text_embedding_2_ = take_linear(ts, "text_embedding.2");
  time_embedding_0_ = take_linear(ts, "time_embedding.0");
  time_embedding_2_ = take_linear(ts, "time_embedding.2");
  time_projection_ = take_linear(ts, "time_projection.1");
  head_ = take_linear(ts, "head.head");
  head_modulation_ = take(ts, "head.modulation").view({2, config_.dim});
  zeros_ = Tensor::zeros({config_.dim}, DType::F32, device_);
  {
    Tensor ones = Tensor::from_f32({config_.dim}, std::vector<float>(size_t(config_.dim), 1.f));
    ones_ = device_.is_cpu() ? ones : ones.to(device_);
  }
  const float eps = config_.eps;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string b = cat("blocks.", i, ".");
    WanBlock blk;
    blk.modulation = take(ts, b + "modulation").view({6 * config_.dim});
    auto& sa = blk.self_attn;
    sa.q = take_block_linear(ck, b + "self_attn.q");
    sa.k = take_block_linear(ck, b + "self_attn.k");
    sa.v = take_block_linear(ck, b + "self_attn.v");
    sa.o = take_block_linear(ck, b + "self_attn.o");
    sa.norm_q = take(ts, b + "self_attn.norm_q.weight");
    sa.norm_k = take(ts, b + "self_attn.norm_k.weight");
    if (ck.has_proj_l) {
      sa.proj_l_weight = take(ts, b + "self_attn.attn_op.local_attn.proj_l.weight");
      sa.proj_l_bias = take(ts, b + "self_attn.attn_op.local_attn.proj_l.bias");
    }
    sa.heads = config_.num_heads;
    sa.eps = eps;
    sa.kind = attention;
    sa.sla_topk = sla_topk;
    sa.fused_norm_rope = !default_norm;
    blk.norm3 = {take(ts, b + "norm3.weight"), take(ts, b + "norm3.bias"), eps};
    auto& ca = blk.cross_attn;
    ca.q = take_block_linear(ck, b + "cross_attn.q");
    ca.k = take_block_linear(ck, b + "cross_attn.k");
    ca.v = take_block_linear(ck, b + "cross_attn.v");
    ca.o = take_block_linear(ck, b + "cross_attn.o");
    ca.norm_q = take(ts, b + "cross_attn.norm_q.weight");
    ca.norm_k = take(ts, b + "cross_attn.norm_k.weight");
    ca.heads = config_.num_heads;
    ca.eps = eps;
    blk.ffn.fc1 = take_block_linear(ck, b + "ffn.0");
    blk.ffn.fc2 = take_block_linear(ck, b + "ffn.2");
    blocks_.push_back(std::move(blk));
  }
  TD_CHECK(ck.int8_weights.empty(), Internal, "Wan DiT: ", ck.int8_weights.size(),
           " INT8 weights were not used, e.g. ", ck.int8_weights.begin()->first);
  TD_CHECK(ts.empty(), Internal, "Wan DiT: ", ts.size(), " loaded tensors were not used, e.g. ", ts.begin()->first);
}

void WanDiT::check_inputs(const Tensor& latent, const Tensor& timestep, const Tensor& context) const {
  const WanConfig& c = config_;
  TD_CHECK(latent.defined() && latent.dim() == 5, Shape, "latent must be [B, C, T, H, W], got ",
           latent.defined() ? latent.desc() : std::string("nothing"));
  TD_CHECK(is_float(latent.dtype()) && is_float(timestep.dtype()) && is_float(context.dtype()), DType,
           "latent, timestep and context must be floating-point, got ", dtype_name(latent.dtype()), ", ",
           dtype_name(timestep.dtype()), ", ", dtype_name(context.dtype()));
  const int64_t B = latent.size(0), T = latent.size(2), H = latent.size(3), W = latent.size(4);
  TD_CHECK(B >= 1 && T >= 1 && H >= 1 && W >= 1, Shape, "latent ", latent.desc(), " is empty");
  TD_CHECK(latent.size(1) == c.in_dim, Shape, "latent ", latent.desc(), " has ", latent.size(1), " channels; ",
           c.variant, " takes ", c.in_dim, c.in_dim == 36 ? " (16 noise + 4 mask + 16 image latent)" : "");
  TD_CHECK(T % c.patch_t == 0 && H % c.patch_h == 0 && W % c.patch_w == 0, Shape, "latent ", latent.desc(),
           ": frames, height and width must be multiples of the patch size ", c.patch_t, "x", c.patch_h, "x",
           c.patch_w, " (height and width even), got T=", T, " H=", H, " W=", W);
  TD_CHECK(timestep.dim() == 1 && timestep.size(0) == B, Shape, "timestep must be [B] = [", B,
           "] (one per sample of the latent), got ", timestep.desc());
  TD_CHECK(context.dim() == 3 && context.size(0) == B && context.size(2) == c.text_dim && context.size(1) >= 1, Shape,
           "context must be [B, Lc, text_dim] = [", B, ", Lc >= 1, ", c.text_dim, "], got ", context.desc());
  const Tensor t = host_f32(timestep);
  for (int64_t b = 0; b < B; ++b)
    TD_CHECK(std::isfinite(t.data<float>()[b]), Shape, "timestep[", b, "] is ", t.data<float>()[b],
             "; it must be finite (Wan uses t in [0, 1000])");
}

Tensor WanDiT::forward(const Tensor& latent, const Tensor& timestep, const Tensor& context) const {
  check_inputs(latent, timestep, context);
  const WanConfig& c = config_;
  const int64_t B = latent.size(0), T = latent.size(2), H = latent.size(3), W = latent.size(4), D = c.dim;
  const ops::PatchGrid grid{T / c.patch_t, H / c.patch_h, W / c.patch_w};
  const float eps = c.eps;
  const bool cuda = device_.is_cuda();

  // Patchify on the model's device (the latent is moved there as f32 first when
  // it is not already), straight into the run dtype; patch embedding into the
  // fp32 residual stream.
  const Tensor lat = latent.device() == device_ && latent.dtype() == DType::F32
                         ? latent
                         : to_run(host_f32(latent), DType::F32, device_);
  Tensor x = patch_embedding_(ops::patchify(lat, c.patch_t, c.patch_h, c.patch_w, dtype_), DType::F32);  // [B, L, D]

  // Time embedding and the per-sample modulation source, all fp32.
  const Tensor sinusoid = to_run(wan_time_sinusoid(timestep, c.freq_dim), DType::F32, device_);
  const Tensor e = time_embedding_2_(ops::silu(time_embedding_0_(sinusoid)));  // [B, D]
  const Tensor e0 = time_projection_(ops::silu(e));                             // [B, 6D]

  // Text embedding of the context as given (zero pad rows included).
  const Tensor ctx_in = context.device() == device_ && context.dtype() == dtype_
                            ? context
                            : to_run(host_f32(context), dtype_, device_);
  const Tensor ctx = text_embedding_2_(ops::gelu_tanh(text_embedding_0_(ctx_in)));  // [B, Lc, D]

  const Tensor rope = rope_tables_for(grid);
  const Tensor head_shift = ops::add(e, head_modulation_.select(0, 0));
  const Tensor head_scale = ops::add(e, head_modulation_.select(0, 1));
  // Rows of [B, 6, D]: 0 shift_msa, 1 scale_msa, 2 gate_msa, 3 shift_ffn, 4 scale_ffn, 5 gate_ffn.
  const auto modulation = [&](const WanBlock& blk) { return ops::add(e0, blk.modulation).view({B, 6, D}); };

  if (default_norm_) {
    // The unfused path: every norm, modulation and residual add its own op.
    // LN(x) * (1 + scale) + shift in fp32, then rounded to out.
    const auto modulated_ln = [&](const Tensor& xs, const Tensor& scale, const Tensor& shift, DType out) {
      const Tensor n = ops::layer_norm(xs, Tensor(), Tensor(), eps, DType::F32);
      const Tensor m = ops::mul(n, ops::add(scale, ones_), DType::F32);
      return ops::add(m, shift, out);
    };
    // x += gate * y (gate undefined: x += y), in fp32.
    const auto residual = [&](Tensor& xs, const Tensor& y, const Tensor& gate) {
      ops::add_(xs, gate.defined() ? ops::mul(y, gate, DType::F32) : ops::add(y, zeros_, DType::F32));
    };
    Tensor h;
    for (const WanBlock& blk : blocks_) {
      const Tensor mod = modulation(blk);
      {
        const prof::Scope scope(prof::OpClass::Norm, cuda);
        h = modulated_ln(x, mod.select(1, 1), mod.select(1, 0), dtype_);
      }
      Tensor y = blk.self_attn(h, grid, rope);
      {
        const prof::Scope scope(prof::OpClass::Norm, cuda);
        residual(x, y, mod.select(1, 2));
        h = ops::layer_norm(x, blk.norm3.weight, blk.norm3.bias, eps, dtype_);
      }
      y = blk.cross_attn(h, ctx);
      {
        const prof::Scope scope(prof::OpClass::Norm, cuda);
        residual(x, y, Tensor());
        h = modulated_ln(x, mod.select(1, 4), mod.select(1, 3), dtype_);
      }
      y = blk.ffn(h);
      const prof::Scope scope(prof::OpClass::Norm, cuda);
      residual(x, y, mod.select(1, 5));
    }
    {
      const prof::Scope scope(prof::OpClass::Norm, cuda);
      h = modulated_ln(x, head_scale, head_shift, DType::F32);
    }
    return ops::unpatchify(head_(h, DType::F32), T, H, W, c.patch_t, c.patch_h, c.patch_w);
  }

  Tensor mod = modulation(blocks_.front());
  Tensor h;
  {
    const prof::Scope scope(prof::OpClass::Norm, cuda);
    h = ops::adaln_modulate(x, mod.select(1, 1), mod.select(1, 0), eps, dtype_);
  }
  // A norm whose output only feeds W8A8 linears of one scheme (q, k and v;
  // cross-attention's q; fc1) writes their INT8 codes directly
  // (ops::residual_gate_norm_quantized: the same x and codes as the norm
  // followed by the quantizer, without the bf16 round trip);
  // TURBODIFF_FUSED_NORM_QUANT=0 keeps the two ops apart (A/B).
  const char* fnq = std::getenv("TURBODIFF_FUSED_NORM_QUANT");
  const bool fuse_quant = !(fnq && fnq[0] == '0');
  ops::QuantizedActivation hq;
  bool h_quantized = false;
  // x += gate * y, then the norm of a, as h or (act given) as hq.
  auto residual_norm = [&](const Tensor& y, const ops::ResidualNormArgs& a, std::optional<ops::Int8ActScheme> act) {
    const prof::Scope scope(prof::OpClass::Norm, cuda);
    h_quantized = fuse_quant && act.has_value();
    if (h_quantized) {
      hq = ops::residual_gate_norm_quantized(x, y, a, *act);
      h = Tensor();
    } else {
      h = ops::residual_gate_norm(x, y, a);
      hq = {};
    }
  };
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const WanBlock& blk = blocks_[i];
    Tensor y = h_quantized ? blk.self_attn(hq, grid, rope) : blk.self_attn(h, grid, rope);
    ops::ResidualNormArgs a;
    a.eps = eps;
    a.out_dtype = dtype_;
    a.gate = mod.select(1, 2);
    a.weight = blk.norm3.weight;
    a.bias = blk.norm3.bias;
    residual_norm(y, a, blk.cross_attn.input_act_scheme());  // x += gate_msa * y; h = LN3(x)

    y = h_quantized ? blk.cross_attn(hq, ctx) : blk.cross_attn(h, ctx);
    a = {};
    a.eps = eps;
    a.out_dtype = dtype_;
    a.shift = mod.select(1, 3);
    a.scale = mod.select(1, 4);
    residual_norm(y, a, blk.ffn.input_act_scheme());  // x += y; h = LN2(x) * (1 + scale_ffn) + shift_ffn

    y = h_quantized ? blk.ffn(hq) : blk.ffn(h);
    a = {};
    a.eps = eps;
    a.gate = mod.select(1, 5);
    if (i + 1 < blocks_.size()) {
      const Tensor next = modulation(blocks_[i + 1]);
      a.shift = next.select(1, 0);
      a.scale = next.select(1, 1);
      a.out_dtype = dtype_;
      // x += gate_ffn * y; h = next block's LN1 modulated
      residual_norm(y, a, blocks_[i + 1].self_attn.input_act_scheme());
      mod = next;
    } else {
      // The fused kernel takes gate, shift and scale with one row stride: copy the
      // gate out of the [B, 6, D] table to match the head's [B, D] shift and scale.
      a.gate = ops::add(mod.select(1, 5), zeros_);
      a.shift = head_shift;
      a.scale = head_scale;
      a.out_dtype = DType::F32;
      residual_norm(y, a, std::nullopt);  // x += gate_ffn * y; h = the head's modulated LN, fp32
    }
  }
  // The head, then unpatchify on the device: [B, L, out_dim * patch volume] -> [B, out_dim, T, H, W].
  return ops::unpatchify(head_(h, DType::F32), T, H, W, c.patch_t, c.patch_h, c.patch_w);
}

}  // namespace td::models::wan
