#include "models/wan/wan_keys.h"

#include <cctype>
#include <utility>

namespace td::models::wan {
namespace {

// (original, diffusers) module paths. Top-level ones are matched at the start
// of the name; block ones after "blocks.<i>.". Each is followed by "." and a
// parameter name, except the bare parameters (modulation tables).
constexpr std::pair<const char*, const char*> kTopLevel[] = {
    {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
    {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
    {"time_projection.1", "condition_embedder.time_proj"},
    {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
    {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
    {"head.head", "proj_out"},
    {"patch_embedding", "patch_embedding"},
    {"img_emb.proj.0", "condition_embedder.image_embedder.norm1"},
    {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"},
    {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"},
    {"img_emb.proj.4", "condition_embedder.image_embedder.norm2"},
};
constexpr std::pair<const char*, const char*> kTopLevelParams[] = {{"head.modulation", "scale_shift_table"}};

constexpr std::pair<const char*, const char*> kBlock[] = {
    {"self_attn.q", "attn1.to_q"},
    {"self_attn.k", "attn1.to_k"},
    {"self_attn.v", "attn1.to_v"},
    {"self_attn.o", "attn1.to_out.0"},
    {"self_attn.norm_q", "attn1.norm_q"},
    {"self_attn.norm_k", "attn1.norm_k"},
    {"cross_attn.q", "attn2.to_q"},
    {"cross_attn.k", "attn2.to_k"},
    {"cross_attn.v", "attn2.to_v"},
    {"cross_attn.o", "attn2.to_out.0"},
    {"cross_attn.norm_q", "attn2.norm_q"},
    {"cross_attn.norm_k", "attn2.norm_k"},
    {"cross_attn.k_img", "attn2.add_k_proj"},
    {"cross_attn.v_img", "attn2.add_v_proj"},
    {"cross_attn.norm_k_img", "attn2.norm_added_k"},
    {"ffn.0", "ffn.net.0.proj"},
    {"ffn.2", "ffn.net.2"},
    {"norm3", "norm2"},  // the cross-attention affine LayerNorm
    // TurboDiffusion SLA: only ever in original-named checkpoints (no diffusers name).
    {"self_attn.attn_op.local_attn.proj_l", nullptr},
};
constexpr std::pair<const char*, const char*> kBlockParams[] = {{"modulation", "scale_shift_table"}};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Splits "blocks.<i>.<rest>" into ("blocks.<i>.", rest); nullopt otherwise.
std::optional<std::pair<std::string, std::string>> split_block(std::string_view name) {
  if (!starts_with(name, "blocks.")) return std::nullopt;
  size_t p = 7, q = p;
  while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
  if (q == p || q >= name.size() || name[q] != '.') return std::nullopt;
  return std::pair{std::string(name.substr(0, q + 1)), std::string(name.substr(q + 1))};
}

// Renames `name` through `table` (from column `from` to the other); module
// paths must be followed by '.', bare parameters must match exactly.
template <size_t N, size_t M>
std::optional<std::string> rename(std::string_view name, const std::pair<const char*, const char*> (&modules)[N],
                                  const std::pair<const char*, const char*> (&params)[M], bool to_original) {
  for (const auto& [orig, diff] : params)
    if (name == (to_original ? diff : orig)) return std::string(to_original ? orig : diff);
  // The longest matching module path wins (a '.' must follow it, so "self_attn.q" never
  // matches "self_attn.norm_q.weight"; longest-first keeps that true for any table).
  std::optional<std::string> best;
  size_t best_len = 0;
  for (const auto& [orig, diff] : modules) {
    if (!diff) continue;
    const std::string_view from = to_original ? diff : orig;
    if (name.size() > from.size() && starts_with(name, from) && name[from.size()] == '.' && from.size() > best_len) {
      best = std::string(to_original ? orig : diff) + std::string(name.substr(from.size()));
      best_len = from.size();
    }
  }
  return best;
}

}  // namespace

// Whether `name` is a parameter of one of the original module paths in `modules`.
template <size_t N, size_t M>
bool is_original(std::string_view name, const std::pair<const char*, const char*> (&modules)[N],
                 const std::pair<const char*, const char*> (&params)[M]) {
  for (const auto& [orig, diff] : params)
    if (name == orig) return true;
  for (const auto& [orig, diff] : modules) {
    const std::string_view m = orig;
    if (name.size() > m.size() && starts_with(name, m) && name[m.size()] == '.') return true;
  }
  return false;
}

std::optional<std::string> to_original_name(std::string_view name, KeyLayout layout) {
  const auto b = split_block(name);
  if (layout != KeyLayout::Diffusers) {
    const bool known = b ? is_original(b->second, kBlock, kBlockParams) : is_original(name, kTopLevel, kTopLevelParams);
    return known ? std::optional<std::string>(std::string(name)) : std::nullopt;
  }
  if (b) {
    auto r = rename(b->second, kBlock, kBlockParams, true);
    if (!r) return std::nullopt;
    return b->first + *r;
  }
  return rename(name, kTopLevel, kTopLevelParams, true);
}

std::string from_original_name(std::string_view original, KeyLayout layout) {
  if (layout != KeyLayout::Diffusers) return std::string(original);
  if (auto b = split_block(original)) {
    if (auto r = rename(b->second, kBlock, kBlockParams, false)) return b->first + *r;
    return std::string(original);
  }
  if (auto r = rename(original, kTopLevel, kTopLevelParams, false)) return *r;
  return std::string(original);
}

std::vector<WanTensorSpec> wan_tensor_specs(const WanConfig& c, bool with_proj_l) {
  using D = WanParamDType;
  std::vector<WanTensorSpec> s;
  const int64_t dim = c.dim;
  auto linear = [&](const std::string& base, int64_t out, int64_t in, D dt, bool block) {
    s.push_back({base + ".weight", {out, in}, dt, block, false});
    s.push_back({base + ".bias", {out}, dt, false, false});
  };
  // The patch embedding writes the fp32 residual stream directly, so its bias is f32.
  s.push_back({"patch_embedding.weight", {dim, c.patch_in_features()}, D::Run, false, false});
  s.push_back({"patch_embedding.bias", {dim}, D::F32, false, false});
  linear("text_embedding.0", dim, c.text_dim, D::Run, false);
  linear("text_embedding.2", dim, dim, D::Run, false);
  linear("time_embedding.0", dim, c.freq_dim, D::F32, false);
  linear("time_embedding.2", dim, dim, D::F32, false);
  linear("time_projection.1", 6 * dim, dim, D::F32, false);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = cat("blocks.", i, ".");
    s.push_back({b + "modulation", {1, 6, dim}, D::F32, false, false});
    for (const char* attn : {"self_attn", "cross_attn"}) {
      for (const char* proj : {"q", "k", "v", "o"}) linear(b + attn + "." + proj, dim, dim, D::Run, true);
      s.push_back({b + attn + ".norm_q.weight", {dim}, D::F32, false, false});
      s.push_back({b + attn + ".norm_k.weight", {dim}, D::F32, false, false});
      if (std::string_view(attn) == "self_attn" && with_proj_l) {
        const std::string pl = b + "self_attn.attn_op.local_attn.proj_l.";
        s.push_back({pl + "weight", {c.head_dim(), c.head_dim()}, D::F32, false, true});
        s.push_back({pl + "bias", {c.head_dim()}, D::F32, false, true});
      }
    }
    s.push_back({b + "norm3.weight", {dim}, D::F32, false, false});
    s.push_back({b + "norm3.bias", {dim}, D::F32, false, false});
    linear(b + "ffn.0", c.ffn_dim, dim, D::Run, true);
    linear(b + "ffn.2", dim, c.ffn_dim, D::Run, true);
  }
  linear("head.head", c.patch_out_features(), dim, D::F32, false);
  s.push_back({"head.modulation", {1, 2, dim}, D::F32, false, false});
  return s;
}

}  // namespace td::models::wan
