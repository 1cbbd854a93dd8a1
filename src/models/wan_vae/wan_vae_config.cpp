#include "models/wan_vae/wan_vae_config.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace td::models::wan_vae {
namespace fs = std::filesystem;

int64_t WanVaeConfig::temporal_factor() const {
  int64_t f = 1;
  for (bool t : temporal_downsample) f *= t ? 2 : 1;
  return f;
}
int64_t WanVaeConfig::spatial_factor() const { return int64_t(1) << (dim_mult.size() - 1); }

std::string WanVaeConfig::describe() const {
  std::string mult, tds;
  for (auto m : dim_mult) {
    if (!mult.empty()) mult += ',';
    mult += std::to_string(m);
  }
  for (bool t : temporal_downsample) {
    if (!tds.empty()) tds += ',';
    tds += t ? 'T' : 'F';
  }
  return cat("Wan2.1 VAE (base_dim ", base_dim, ", z_dim ", z_dim, ", dim_mult [", mult, "], num_res_blocks ",
             num_res_blocks, ", temporal_downsample [", tds, "]; ", source, ")");
}

void WanVaeConfig::validate() const {
  const auto bad = [&](auto&&... parts) { fail(ErrorKind::Format, source, ": ", parts...); };
  if (base_dim <= 0 || z_dim <= 0 || num_res_blocks <= 0) bad("base_dim, z_dim and num_res_blocks must be positive");
  if (dim_mult.size() < 2) bad("dim_mult needs at least 2 stages, got ", dim_mult.size());
  for (auto m : dim_mult)
    if (m <= 0) bad("dim_mult entries must be positive");
  if (temporal_downsample.size() != dim_mult.size() - 1)
    bad("temperal_downsample must have ", dim_mult.size() - 1, " entries (one per downsample), got ",
        temporal_downsample.size());
  if (int64_t(latents_mean.size()) != z_dim || int64_t(latents_std.size()) != z_dim)
    bad("latents_mean and latents_std must have z_dim = ", z_dim, " values, got ", latents_mean.size(), " and ",
        latents_std.size());
  for (float s : latents_std)
    if (!(s > 0)) bad("latents_std values must be > 0, got ", s);
  for (size_t i = 1; i < dim_mult.size(); ++i)
    if ((base_dim * dim_mult[i]) % 2 != 0) bad("decoder upsample halves base_dim * dim_mult[", i, "], which is odd");
}

std::string find_wan_vae_config_json(const std::string& weights_path) {
  std::error_code ec;
  const fs::path p(weights_path);
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  const fs::path cfg = (dir.empty() ? fs::path(".") : dir) / "config.json";
  return fs::is_regular_file(cfg, ec) ? cfg.string() : std::string();
}

WanVaeConfig wan_vae_config_from_json(const std::string& path) {
  std::ifstream f(path);
  TD_CHECK(f.good(), Io, "cannot open VAE config ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::Format, path, ": not valid JSON (", e.what(), ")");
  }
  WanVaeConfig c;
  c.source = path;
  try {
    if (j.contains("_class_name") && j["_class_name"] != "AutoencoderKLWan")
      fail(ErrorKind::Format, path, ": _class_name is ", j["_class_name"].dump(), ", expected \"AutoencoderKLWan\"");
    if (j.value("is_residual", false) || (j.contains("patch_size") && !j["patch_size"].is_null()))
      fail(ErrorKind::Unsupported, path, ": is_residual / patch_size set: this is the Wan2.2 VAE, which is not "
                                         "implemented (only the Wan2.1 VAE is)");
    if (j.contains("attn_scales") && !j["attn_scales"].empty())
      fail(ErrorKind::Unsupported, path, ": attn_scales ", j["attn_scales"].dump(),
           ": attention outside the middle blocks is not implemented (Wan2.1 has none)");
    if (j.contains("decoder_base_dim") && !j["decoder_base_dim"].is_null() &&
        j["decoder_base_dim"] != j.value("base_dim", int64_t(96)))
      fail(ErrorKind::Unsupported, path, ": decoder_base_dim differs from base_dim (not implemented)");
    if (j.value("in_channels", 3) != 3 || j.value("out_channels", 3) != 3)
      fail(ErrorKind::Unsupported, path, ": in_channels/out_channels must be 3 (RGB)");
    c.base_dim = j.value("base_dim", c.base_dim);
    c.z_dim = j.value("z_dim", c.z_dim);
    c.dim_mult = j.value("dim_mult", c.dim_mult);
    c.num_res_blocks = j.value("num_res_blocks", c.num_res_blocks);
    c.temporal_downsample = j.value("temperal_downsample", c.temporal_downsample);
    c.latents_mean = j.value("latents_mean", c.latents_mean);
    c.latents_std = j.value("latents_std", c.latents_std);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::Format, path, ": a field has the wrong type (", e.what(), ")");
  }
  c.validate();
  return c;
}

std::vector<WanVaeTensorSpec> wan_vae_tensor_specs(const WanVaeConfig& c) {
  std::vector<WanVaeTensorSpec> out;
  const auto add = [&](const std::string& o, const std::string& d, Shape s) { out.push_back({o, d, std::move(s)}); };
  const auto conv = [&](const std::string& o, const std::string& d, Shape w) {
    const int64_t co = w[0];
    add(o + ".weight", d + ".weight", std::move(w));
    add(o + ".bias", d + ".bias", {co});
  };
  const auto res = [&](const std::string& o, const std::string& d, int64_t in, int64_t outc) {
    add(o + "residual.0.gamma", d + "norm1.gamma", {in, 1, 1, 1});
    conv(o + "residual.2", d + "conv1", {outc, in, 3, 3, 3});
    add(o + "residual.3.gamma", d + "norm2.gamma", {outc, 1, 1, 1});
    conv(o + "residual.6", d + "conv2", {outc, outc, 3, 3, 3});
    if (in != outc) conv(o + "shortcut", d + "conv_shortcut", {outc, in, 1, 1, 1});
  };
  const auto middle = [&](const std::string& o, const std::string& d, int64_t ch) {
    res(o + "middle.0.", d + "mid_block.resnets.0.", ch, ch);
    add(o + "middle.1.norm.gamma", d + "mid_block.attentions.0.norm.gamma", {ch, 1, 1});
    conv(o + "middle.1.to_qkv", d + "mid_block.attentions.0.to_qkv", {3 * ch, ch, 1, 1});
    conv(o + "middle.1.proj", d + "mid_block.attentions.0.proj", {ch, ch, 1, 1});
    res(o + "middle.2.", d + "mid_block.resnets.1.", ch, ch);
  };
  const size_t stages = c.dim_mult.size();
  const int64_t z2 = 2 * c.z_dim;

  // Encoder: dims = base * [1] + dim_mult.
  std::vector<int64_t> dims = {c.base_dim};
  for (auto m : c.dim_mult) dims.push_back(c.base_dim * m);
  conv("encoder.conv1", "encoder.conv_in", {dims[0], 3, 3, 3, 3});
  int idx = 0;
  for (size_t i = 0; i < stages; ++i) {
    int64_t in = dims[i];
    const int64_t o = dims[i + 1];
    for (int64_t r = 0; r < c.num_res_blocks; ++r, ++idx) {
      res(cat("encoder.downsamples.", idx, "."), cat("encoder.down_blocks.", idx, "."), in, o);
      in = o;
    }
    if (i + 1 != stages) {
      conv(cat("encoder.downsamples.", idx, ".resample.1"), cat("encoder.down_blocks.", idx, ".resample.1"),
           {o, o, 3, 3});
      if (c.temporal_downsample[i])
        conv(cat("encoder.downsamples.", idx, ".time_conv"), cat("encoder.down_blocks.", idx, ".time_conv"),
             {o, o, 3, 1, 1});
      ++idx;
    }
  }
  middle("encoder.", "encoder.", dims.back());
  add("encoder.head.0.gamma", "encoder.norm_out.gamma", {dims.back(), 1, 1, 1});
  conv("encoder.head.2", "encoder.conv_out", {z2, dims.back(), 3, 3, 3});
  conv("conv1", "quant_conv", {z2, z2, 1, 1, 1});
  conv("conv2", "post_quant_conv", {c.z_dim, c.z_dim, 1, 1, 1});

  // Decoder: dims = base * [dim_mult[-1]] + reversed(dim_mult); stages after
  // the first take half the channels (the upsample's Conv2d halves them).
  std::vector<int64_t> ddims = {c.base_dim * c.dim_mult.back()};
  for (size_t i = stages; i-- > 0;) ddims.push_back(c.base_dim * c.dim_mult[i]);
  conv("decoder.conv1", "decoder.conv_in", {ddims[0], c.z_dim, 3, 3, 3});
  middle("decoder.", "decoder.", ddims[0]);
  idx = 0;
  for (size_t i = 0; i < stages; ++i) {
    int64_t in = i > 0 ? ddims[i] / 2 : ddims[i];
    const int64_t o = ddims[i + 1];
    for (int64_t r = 0; r <= c.num_res_blocks; ++r, ++idx) {
      res(cat("decoder.upsamples.", idx, "."), cat("decoder.up_blocks.", i, ".resnets.", r, "."), in, o);
      in = o;
    }
    if (i + 1 != stages) {
      const std::string po = cat("decoder.upsamples.", idx, "."), pd = cat("decoder.up_blocks.", i, ".upsamplers.0.");
      conv(po + "resample.1", pd + "resample.1", {o / 2, o, 3, 3});
      if (c.temporal_downsample[stages - 2 - i]) conv(po + "time_conv", pd + "time_conv", {2 * o, o, 3, 1, 1});
      ++idx;
    }
  }
  add("decoder.head.0.gamma", "decoder.norm_out.gamma", {ddims.back(), 1, 1, 1});
  conv("decoder.head.2", "decoder.conv_out", {3, ddims.back(), 3, 3, 3});
  return out;
}

}  // namespace td::models::wan_vae
