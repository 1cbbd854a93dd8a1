#include "models/detect.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

namespace td::models {
namespace {

// Wrapper prefixes seen in the wild: rCM training checkpoints ({"state_dict": {"net.…"}}),
// DDP ("module."), torch.compile ("_orig_mod."), EMA copies ("model.").
const char* kWrapperPrefixes[] = {"state_dict.", "model.", "net.", "module.", "_orig_mod.", "ema."};

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The longest chain of wrapper prefixes shared by every tensor name.
std::string common_wrapper_prefix(const std::vector<TensorMeta>& ts) {
  std::string prefix;
  for (;;) {
    bool extended = false;
    for (const char* p : kWrapperPrefixes) {
      const std::string cand = prefix + p;
      bool all = !ts.empty();
      for (const auto& t : ts)
        if (!starts_with(t.name, cand)) {
          all = false;
          break;
        }
      if (all) {
        prefix = cand;
        extended = true;
        break;
      }
    }
    if (!extended) return prefix;
  }
}

struct Index {
  std::map<std::string, const TensorMeta*> by_name;
  const TensorMeta* get(const std::string& n) const {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : it->second;
  }
};

int64_t count_blocks(const Index& idx, const std::string& block_prefix) {
  std::set<int64_t> ids;
  for (const auto& [n, t] : idx.by_name) {
    if (!starts_with(n, block_prefix)) continue;
    size_t p = block_prefix.size(), q = p;
    while (q < n.size() && std::isdigit(static_cast<unsigned char>(n[q]))) ++q;
    if (q > p && q < n.size() && n[q] == '.') ids.insert(std::stoll(n.substr(p, q - p)));
  }
  return int64_t(ids.size());
}

std::string dominant_float_dtype(const std::vector<TensorMeta>& ts) {
  std::map<std::string, int64_t> bytes;
  for (const auto& t : ts)
    if (dtype_is_floating(t.dtype)) bytes[dtype_name(t.dtype)] += shape_numel(t.shape) * int64_t(dtype_size(t.dtype));
  std::string best;
  int64_t most = -1;
  for (const auto& [k, v] : bytes)
    if (v > most) most = v, best = k;
  return best;
}

// First dim of a Linear's weight, whether stored as `.weight` or TurboDiffusion's `.int8_weight`.
std::optional<Shape> linear_shape(const Index& idx, const std::string& base) {
  if (auto* t = idx.get(base + ".weight")) return t->shape;
  if (auto* t = idx.get(base + ".int8_weight")) return t->shape;
  return std::nullopt;
}

void detect_dit(const Index& idx, ModelDetection& d) {
  const bool diffusers = idx.get("blocks.0.attn1.to_q.weight") || idx.get("blocks.0.attn1.to_q.int8_weight");
  d.layout = diffusers ? KeyLayout::Diffusers : KeyLayout::Original;
  const std::string q = diffusers ? "blocks.0.attn1.to_q" : "blocks.0.self_attn.q";
  const std::string ffn0 = diffusers ? "blocks.0.ffn.net.0.proj" : "blocks.0.ffn.0";
  const std::string text0 = diffusers ? "condition_embedder.text_embedder.linear_1" : "text_embedding.0";
  const std::string time0 = diffusers ? "condition_embedder.time_embedder.linear_1" : "time_embedding.0";
  const std::string head = diffusers ? "proj_out" : "head.head";
  if (auto s = linear_shape(idx, q)) d.dim = (*s)[0];
  if (auto s = linear_shape(idx, ffn0)) d.ffn_dim = (*s)[0];
  if (auto s = linear_shape(idx, text0); s && s->size() == 2) d.text_dim = (*s)[1];
  if (auto s = linear_shape(idx, time0); s && s->size() == 2) d.freq_dim = (*s)[1];
  if (auto s = linear_shape(idx, head); s && s->size() == 2) d.out_dim = (*s)[0] / 4;  // patch (1,2,2)
  d.num_layers = count_blocks(idx, "blocks.");
  if (auto* pe = idx.get("patch_embedding.weight")) {
    if (pe->shape.size() == 5) d.in_dim = pe->shape[1];
    else if (pe->shape.size() == 2) d.in_dim = pe->shape[1] / 4, d.patch_embedding_linear = true;
  }
  for (const auto& [n, t] : idx.by_name) {
    if (ends_with(n, ".int8_weight")) d.int8_quantized = true;
    if (n.find("local_attn.proj_l.") != std::string::npos) d.has_sla_proj_l = true;
    if (n.find("cross_attn.k_img.") != std::string::npos || n.find("attn2.add_k_proj.") != std::string::npos)
      d.has_image_cross_attn = true;
  }
  if (d.dim == 1536 && d.num_layers == 30 && d.ffn_dim == 8960) {
    d.variant = d.in_dim == 16 ? "Wan2.1-T2V-1.3B" : cat("Wan2.1-1.3B (in_dim ", d.in_dim, ")");
  } else if (d.dim == 5120 && d.num_layers == 40 && d.ffn_dim == 13824) {
    if (d.in_dim == 36 && d.has_image_cross_attn) d.variant = "Wan2.1-I2V-14B";
    else if (d.in_dim == 36) d.variant = "Wan2.2-I2V-A14B expert";
    else if (d.in_dim == 16) d.variant = "Wan2.1-T2V-14B";
    else d.variant = cat("Wan-14B (in_dim ", d.in_dim, ")");
  } else {
    d.variant = "custom";
  }
  std::string desc = cat("Wan DiT ", d.variant);
  if (d.variant == "custom")
    desc = cat("Wan DiT (custom size: dim ", d.dim, ", ", d.num_layers, " layers, ffn ", d.ffn_dim, ", in ", d.in_dim,
               " channels", d.in_dim == 36 ? ", I2V" : "", ")");
  desc += d.layout == KeyLayout::Diffusers ? ", diffusers layout" : (d.patch_embedding_linear ? ", rCM/TurboDiffusion layout" : ", original Wan layout");
  if (d.int8_quantized) desc += ", TurboDiffusion INT8 (-quant)";
  desc += d.has_sla_proj_l ? ", with SLA proj_l" : ", no SLA proj_l";
  d.description = desc;
}

void detect_vae(const Index& idx, ModelDetection& d) {
  const bool diffusers = idx.get("decoder.conv_in.weight") != nullptr;
  d.layout = diffusers ? KeyLayout::Diffusers : KeyLayout::Original;
  if (auto* pq = idx.get(diffusers ? "post_quant_conv.weight" : "conv2.weight")) d.z_dim = pq->shape[0];
  const bool has_encoder = idx.get(diffusers ? "encoder.conv_in.weight" : "encoder.conv1.weight") != nullptr;
  d.variant = "Wan2.1-VAE";
  d.description = cat("Wan VAE (z_dim ", d.z_dim, ", ", has_encoder ? "encoder + decoder" : "decoder only", ", ",
                      diffusers ? "diffusers" : "original", " layout)");
}

void detect_umt5(const Index& idx, ModelDetection& d, bool hf) {
  d.layout = hf ? KeyLayout::Diffusers : KeyLayout::Original;
  const TensorMeta* emb = idx.get(hf ? "shared.weight" : "token_embedding.weight");
  if (!emb) emb = idx.get("encoder.embed_tokens.weight");
  if (emb && emb->shape.size() == 2) d.vocab = emb->shape[0], d.dim = emb->shape[1];
  d.num_layers = count_blocks(idx, hf ? "encoder.block." : "blocks.");
  // umT5 has a relative-position table in every layer; T5 only in the first.
  const bool per_layer = hf ? idx.get("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight") != nullptr
                            : idx.get("blocks.1.pos_embedding.embedding.weight") != nullptr;
  d.variant = (d.vocab == 256384 && d.dim == 4096 && d.num_layers == 24) ? "umT5-XXL encoder" : "custom";
  d.description = cat(d.variant == "custom" ? "umT5-style encoder (custom size)" : "umT5-XXL encoder", ": vocab ", d.vocab,
                      ", d_model ", d.dim, ", ", d.num_layers, " layers",
                      per_layer ? ", per-layer relative position" : ", shared relative position (T5, not umT5)",
                      hf ? ", HF transformers layout" : ", Wan layout");
}

// TAEHV (madebyollin/taehv: "encoder.<i>..." / "decoder.<i>..." of an
// nn.Sequential): Clamp at decoder.0 (no tensor), conv decoder.1, MemBlocks
// from decoder.3 (conv.0/2/4), final conv decoder.22 (3 channels x patch^2).
void detect_taehv(const Index& idx, ModelDetection& d) {
  d.layout = KeyLayout::Original;
  const TensorMeta* first = idx.get("decoder.1.weight");
  if (first && first->shape.size() == 4) d.z_dim = first->shape[1];
  const TensorMeta* last = idx.get("decoder.22.weight");
  const bool has_encoder = idx.get("encoder.0.weight") != nullptr;
  const bool super = idx.get("decoder.0.weight") != nullptr;
  const int64_t out_ch = last && !last->shape.empty() ? last->shape[0] : 0;
  d.variant = super ? "TAEHV-super" : (d.z_dim == 16 && out_ch == 3 ? "TAEHV (taew2_1, Wan2.1 latents)" : "TAEHV");
  d.description = cat("TAEHV tiny autoencoder ", d.variant, ": ", d.z_dim, " latent channels, ",
                      has_encoder ? "encoder + decoder" : "decoder only",
                      out_ch && out_ch != 3 ? cat(", ", out_ch, " output channels (patch size 2)") : std::string(),
                      super ? " (super decoder: not supported by turbodiff)" : "",
                      first ? "" : " (no decoder: not usable by turbodiff)");
}

}  // namespace

const char* model_kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::WanDiT: return "wan-dit";
    case ModelKind::WanVAE: return "wan-vae";
    case ModelKind::UMT5Encoder: return "umt5-encoder";
    case ModelKind::TAEHV: return "taehv";
    case ModelKind::Unknown: return "unknown";
  }
  return "unknown";
}

ModelDetection detect_model(const std::vector<TensorMeta>& tensors) {
  ModelDetection d;
  d.prefix = common_wrapper_prefix(tensors);
  Index idx;
  for (const auto& t : tensors) idx.by_name[t.name.substr(d.prefix.size())] = &t;
  d.weight_dtype = dominant_float_dtype(tensors);

  const bool dit = idx.get("blocks.0.self_attn.q.weight") || idx.get("blocks.0.self_attn.q.int8_weight") ||
                   idx.get("blocks.0.attn1.to_q.weight") || idx.get("blocks.0.attn1.to_q.int8_weight");
  const bool vae = idx.get("decoder.conv1.weight") || idx.get("decoder.conv_in.weight") ||
                   idx.get("encoder.conv1.weight") || idx.get("encoder.conv_in.weight");
  const bool t5_wan = idx.get("token_embedding.weight") && idx.get("blocks.0.attn.q.weight");
  const bool t5_hf = idx.get("encoder.block.0.layer.0.SelfAttention.q.weight") != nullptr;
  const bool taehv = (idx.get("decoder.1.weight") && idx.get("decoder.3.conv.0.weight")) ||
                     (idx.get("encoder.0.weight") && idx.get("encoder.4.conv.0.weight"));
  if (dit) {
    d.kind = ModelKind::WanDiT;
    detect_dit(idx, d);
  } else if (vae) {
    d.kind = ModelKind::WanVAE;
    detect_vae(idx, d);
  } else if (taehv) {
    d.kind = ModelKind::TAEHV;
    detect_taehv(idx, d);
  } else if (t5_wan || t5_hf) {
    d.kind = ModelKind::UMT5Encoder;
    detect_umt5(idx, d, t5_hf);
  } else {
    d.description = "not recognised as a Wan DiT, Wan VAE, umT5 encoder or TAEHV decoder";
  }
  return d;
}

ModelDetection detect_model(const io::TensorFile& file) {
  std::vector<TensorMeta> metas;
  metas.reserve(file.tensors.size());
  for (const auto& [n, t] : file.tensors) metas.push_back({n, t.dtype(), t.shape()});
  return detect_model(metas);
}

}  // namespace td::models
