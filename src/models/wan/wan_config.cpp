#include "models/wan/wan_config.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace td::models::wan {
namespace {

namespace fs = std::filesystem;

struct Preset {
  const char* name;
  int64_t dim, ffn_dim, heads, layers, in_dim;
};
// wan21-and-rcm.md §1.1, turbodiffusion.md §3 (select_model).
constexpr Preset kPresets[] = {
    {"Wan2.1-T2V-1.3B", 1536, 8960, 12, 30, 16},
    {"Wan2.1-T2V-14B", 5120, 13824, 40, 40, 16},
    {"Wan2.2-I2V-A14B", 5120, 13824, 40, 40, 36},
};

WanConfig from_preset(const Preset& p) {
  WanConfig c;
  c.variant = p.name;
  c.dim = p.dim;
  c.ffn_dim = p.ffn_dim;
  c.num_heads = p.heads;
  c.num_layers = p.layers;
  c.in_dim = p.in_dim;
  c.source = cat("preset ", p.name);
  return c;
}

// The preset whose sizes these are, or "custom".
std::string variant_of(const WanConfig& c) {
  for (const Preset& p : kPresets)
    if (c.dim == p.dim && c.ffn_dim == p.ffn_dim && c.num_heads == p.heads && c.num_layers == p.layers &&
        c.in_dim == p.in_dim && c.out_dim == 16 && c.text_dim == 4096 && c.freq_dim == 256 && c.patch_t == 1 &&
        c.patch_h == 2 && c.patch_w == 2)
      return p.name;
  return "custom";
}

int64_t json_int(const nlohmann::json& j, const char* key, int64_t def, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return def;
  TD_CHECK(j[key].is_number_integer(), Format, path, ": \"", key, "\" must be an integer, found ", j[key].dump());
  return j[key].get<int64_t>();
}

}  // namespace

void WanConfig::validate() const {
  const auto bad = [&](auto&&... parts) { fail(ErrorKind::Format, source, ": ", parts...); };
  if (dim <= 0 || ffn_dim <= 0 || num_heads <= 0 || num_layers <= 0 || in_dim <= 0 || out_dim <= 0 || text_dim <= 0 ||
      freq_dim <= 0)
    bad("every size must be positive (", describe(), ")");
  if (dim % num_heads != 0) bad("dim ", dim, " is not a multiple of num_heads ", num_heads);
  if (head_dim() % 2 != 0 || head_dim() < 6)
    bad("head_dim ", head_dim(), " must be even and >= 6 (3-D RoPE splits it into three pair groups)");
  if (freq_dim % 2 != 0) bad("freq_dim ", freq_dim, " must be even (cos and sin halves)");
  if (patch_t <= 0 || patch_h <= 0 || patch_w <= 0) bad("patch size must be positive");
  if (!(eps > 0)) bad("eps must be > 0, got ", eps);
}

std::string WanConfig::describe() const {
  return cat(variant, " (dim ", dim, ", ", num_heads, " heads of ", head_dim(), ", ", num_layers, " layers, ffn ",
             ffn_dim, ", in ", in_dim, " / out ", out_dim, " channels, text_dim ", text_dim, ", freq_dim ", freq_dim,
             ", patch ", patch_t, "x", patch_h, "x", patch_w, ")");
}

const std::vector<std::string>& wan_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Preset& p : kPresets) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

WanConfig wan_preset(std::string_view name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return from_preset(p);
  std::string known;
  for (const auto& n : wan_preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail(ErrorKind::Usage, "unknown Wan model '", name, "'; known: ", known);
}

WanConfig wan_config_from_json(const std::string& path) {
  std::ifstream f(path);
  TD_CHECK(f.good(), Io, "cannot open Wan config ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::Format, path, ": not valid JSON (", e.what(), ")");
  }
  TD_CHECK(j.is_object(), Format, path, ": a diffusers config must be a JSON object");
  if (j.contains("_class_name") && j["_class_name"].is_string()) {
    const std::string cls = j["_class_name"].get<std::string>();
    TD_CHECK(cls == "WanTransformer3DModel", Format, path, ": _class_name is \"", cls,
             "\", expected \"WanTransformer3DModel\" (the config of a Wan DiT)");
  }
  for (const char* key : {"num_attention_heads", "attention_head_dim", "num_layers", "ffn_dim"})
    TD_CHECK(j.contains(key), Format, path, ": missing \"", key, "\" (a diffusers WanTransformer3DModel config has it)");
  WanConfig c;
  c.source = path;
  c.num_heads = json_int(j, "num_attention_heads", 40, path);
  const int64_t head_dim = json_int(j, "attention_head_dim", 128, path);
  c.dim = c.num_heads * head_dim;
  c.num_layers = json_int(j, "num_layers", 40, path);
  c.ffn_dim = json_int(j, "ffn_dim", 13824, path);
  c.in_dim = json_int(j, "in_channels", 16, path);
  c.out_dim = json_int(j, "out_channels", c.in_dim, path);
  c.text_dim = json_int(j, "text_dim", 4096, path);
  c.freq_dim = json_int(j, "freq_dim", 256, path);
  if (j.contains("eps") && j["eps"].is_number()) c.eps = j["eps"].get<float>();
  if (j.contains("patch_size") && !j["patch_size"].is_null()) {
    const auto& p = j["patch_size"];
    TD_CHECK(p.is_array() && p.size() == 3 && p[0].is_number_integer() && p[1].is_number_integer() &&
                 p[2].is_number_integer(),
             Format, path, ": \"patch_size\" must be three integers, found ", p.dump());
    c.patch_t = p[0].get<int64_t>();
    c.patch_h = p[1].get<int64_t>();
    c.patch_w = p[2].get<int64_t>();
  }
  const auto non_null = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  TD_CHECK(!non_null("image_dim") && !non_null("added_kv_proj_dim"), Unsupported, path,
           ": the Wan2.1 I2V CLIP image branch (image_dim / added_kv_proj_dim) is not implemented; turbodiff runs T2V "
           "and Wan2.2-I2V-A14B (36 input channels, no image branch)");
  TD_CHECK(!non_null("pos_embed_seq_len"), Unsupported, path,
           ": pos_embed_seq_len (the FLF2V image position embedding) is not implemented");
  if (j.contains("cross_attn_norm") && j["cross_attn_norm"].is_boolean())
    TD_CHECK(j["cross_attn_norm"].get<bool>(), Unsupported, path,
             ": cross_attn_norm false is not a Wan configuration turbodiff implements");
  if (non_null("qk_norm")) {
    TD_CHECK(j["qk_norm"].is_string() && j["qk_norm"].get<std::string>() == "rms_norm_across_heads", Unsupported, path,
             ": qk_norm ", j["qk_norm"].dump(), " is not implemented (Wan uses \"rms_norm_across_heads\")");
  }
  c.variant = variant_of(c);
  c.validate();
  return c;
}

std::string find_wan_config_json(const std::string& weights_path) {
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  const fs::path cfg = (dir.empty() ? fs::path(".") : dir) / "config.json";
  return fs::is_regular_file(cfg, ec) ? cfg.string() : std::string();
}

WanConfig wan_config_from_detection(const ModelDetection& d, const std::string& what) {
  TD_CHECK(d.kind == ModelKind::WanDiT, Format, what, " is not a Wan DiT checkpoint (", d.description, ")");
  TD_CHECK(!d.has_image_cross_attn, Unsupported, what, ": ", d.description,
           " has the Wan2.1 I2V CLIP image branch (cross_attn.k_img), which is not implemented; turbodiff runs T2V "
           "and Wan2.2-I2V-A14B (36 input channels, no image branch)");
  for (const Preset& p : kPresets) {
    if (d.dim != p.dim || d.ffn_dim != p.ffn_dim || d.num_layers != p.layers) continue;
    WanConfig c = from_preset(p);
    c.in_dim = d.in_dim;
    c.out_dim = d.out_dim;
    c.text_dim = d.text_dim;
    c.freq_dim = d.freq_dim;
    c.num_heads = d.dim / 128;
    c.source = cat(what, " (sizes detected from tensor shapes)");
    c.variant = variant_of(c);
    if (c.variant == "custom") c.variant = cat(p.dim == 1536 ? "Wan2.1-1.3B" : "Wan-14B", " (in_dim ", c.in_dim, ")");
    c.validate();
    return c;
  }
  fail(ErrorKind::Format, what, ": ", d.description,
       " is not a published Wan size, and the number of attention heads cannot be inferred from tensor shapes: put "
       "the model's diffusers config.json beside the weights (or pass --config FILE)");
}

}  // namespace td::models::wan
