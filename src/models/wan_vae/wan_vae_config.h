// The Wan2.1 VAE's configuration (diffusers AutoencoderKLWan's config.json
// fields) and the full list of tensors it implies, under both the original
// `Wan2.1_VAE.pth` names and diffusers' names, with their shapes.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace td::models::wan_vae {

struct WanVaeConfig {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temporal_downsample = {false, true, true};  // encoder; the decoder upsamples reversed
  // Per-channel latent statistics: the DiT sees (mu - mean) / std.
  std::vector<float> latents_mean = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                                     0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
  std::vector<float> latents_std = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                    3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
  std::string source = "Wan2.1 defaults";

  int64_t temporal_factor() const;  // 4 for Wan2.1: T latents <-> 4(T-1)+1 frames
  int64_t spatial_factor() const;   // 8 for Wan2.1
  std::string describe() const;
  void validate() const;  // Format error naming `source` and the field at fault
};

// Reads a diffusers AutoencoderKLWan config.json. Wan2.2's VAE (is_residual,
// patch_size) and attention outside the middle blocks (attn_scales) are
// Unsupported, named as such.
WanVaeConfig wan_vae_config_from_json(const std::string& path);
// config.json beside a weights file (or inside a folder), or "".
std::string find_wan_vae_config_json(const std::string& weights_path);

struct WanVaeTensorSpec {
  std::string original;   // Wan2.1_VAE.pth name (the name the model uses)
  std::string diffusers;  // AutoencoderKLWan name
  Shape shape;
};
// Every tensor of the VAE (encoder, decoder, conv1/conv2) in a fixed order.
std::vector<WanVaeTensorSpec> wan_vae_tensor_specs(const WanVaeConfig& c);

}  // namespace td::models::wan_vae
