// The Wan2.1 VAE (diffusers AutoencoderKLWan semantics), fp32 on the CPU.
//
// Decode: z = z_n * std + mean (z_n is the normalised latent the DiT works
// on), conv2 (post_quant_conv) over all frames, then the decoder one latent
// frame at a time. Every causal 3x3x3 conv keeps the last two frames of its
// own input as a cache that it puts in front of the next call's input (zero
// frames stand in for missing history). The temporal upsample skips its
// time_conv on the first latent frame (the "first-chunk" rule), so T latents
// give 4(T-1)+1 frames; the result is clamped to [-1, 1].
// Encode: the first frame alone, then chunks of 4 (F must be 4k+1), through
// the same caches; conv1 (quant_conv); mu = the first z_dim channels;
// returns (mu - mean) / std.
//
// The streaming (frame-chunked) structure bounds memory by one chunk; the
// CUDA path (cuDNN convolutions) will plug in at the ops layer.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"
#include "models/wan_vae/wan_vae_config.h"

namespace td::models::wan_vae {

struct WanVaeLoadOptions {
  // A diffusers config.json; "" = the one beside the weights if present, else
  // base_dim and z_dim detected from tensor shapes with Wan2.1's other values.
  std::string config_path;
};

struct WanVaeCheckpoint {
  WanVaeConfig config;
  std::string path;
  std::string layout;  // "original" (Wan2.1_VAE.pth names) or "diffusers"
  std::map<std::string, Tensor> tensors;  // original names -> contiguous f32 host tensors
};

WanVaeCheckpoint load_wan_vae(const std::string& path, const WanVaeLoadOptions& options = {});

// The name check alone on tensors already read: which layout they use, and
// each original name -> its source tensor. Throws Format listing every
// missing, unexpected and mis-shaped tensor by name.
std::map<std::string, Tensor> match_wan_vae_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                    const WanVaeConfig& config, const std::string& what,
                                                    std::string* layout = nullptr);

class WanVae {
 public:
  explicit WanVae(WanVaeCheckpoint checkpoint);
  const WanVaeConfig& config() const { return ck_.config; }
  const std::string& layout() const { return ck_.layout; }

  // latent [B, z_dim, T, h, w] f32 (normalised) -> video [B, 3, 4(T-1)+1, 8h, 8w] in [-1, 1].
  Tensor decode(const Tensor& latent) const;
  // video [B, 3, 4k+1, H, W] f32 in [-1, 1], H and W multiples of 8 -> normalised mu [B, z_dim, k+1, H/8, W/8].
  Tensor encode(const Tensor& video) const;

  void check_latent(const Tensor& latent) const;  // Shape / DType errors naming what is wrong
  void check_video(const Tensor& video) const;

 private:
  WanVaeCheckpoint ck_;
};

}  // namespace td::models::wan_vae
