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
// The streaming (frame-chunked) structure bounds memory by one chunk.
//
// Two implementations of the same network: the channel-first fp32 CPU path
// (the reference, matched to diffusers), and the channels-last path
// ([B, T, H, W, C] activations over the ops/conv.h *_cl ops) that runs on
// CUDA in BF16 (cuDNN convolutions with fp32 accumulation, weights converted
// once per device at first use) and, for tests, on the CPU in fp32.
// Batches run one sample at a time (the caches are per sample).
//
// Spatial tiling (diffusers' AutoencoderKLWan.tiled_decode / tiled_encode):
// overlapping tiles (default 256x256 pixels every 192) run independently,
// each tile is blended linearly into the tile above and the one to its left
// over the overlap, in diffusers' order, and cropped to the stride. It bounds
// the activation memory by one tile instead of the whole frame; the result
// differs from the untiled one near the seams (an approximation, as in diffusers).
#pragma once

#include <map>
#include <memory>
#include <optional>
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

// Sizes in pixels (sample space), multiples of the spatial factor (8), 0 < stride <= tile.
// Tiling applies only when a frame is larger than one tile (as in diffusers).
struct WanVaeTiling {
  bool enabled = false;
  int64_t tile_height = 256, tile_width = 256;
  int64_t stride_height = 192, stride_width = 192;
  void validate(int64_t spatial_factor) const;  // Usage error naming the value at fault
  std::string describe() const;                 // "256x256 every 192x192" or "off"
};

struct WanVaeRunOptions {
  // Where the VAE runs; unset: the input's device. CUDA runs the channels-last path.
  std::optional<Device> device;
  // Activation / weight dtype of the channels-last path: BF16 on CUDA unless
  // set (F32 for tests); always F32 on the CPU.
  std::optional<DType> dtype;
  // On the CPU: run the channels-last path (the CUDA structure) in fp32
  // instead of the channel-first reference (tests).
  bool channels_last = false;
  WanVaeTiling tiling;
};

class WanVae {
 public:
  explicit WanVae(WanVaeCheckpoint checkpoint);
  ~WanVae();
  const WanVaeConfig& config() const { return ck_.config; }
  const std::string& layout() const { return ck_.layout; }

  // latent [B, z_dim, T, h, w] (normalised; any float dtype, any device) ->
  // video [B, 3, 4(T-1)+1, 8h, 8w] f32 in [-1, 1], always on the host.
  Tensor decode(const Tensor& latent, const WanVaeRunOptions& options = {}) const;
  // video [B, 3, 4k+1, H, W] in [-1, 1], H and W multiples of 8 (any float
  // dtype, any device) -> normalised mu [B, z_dim, k+1, H/8, W/8] f32 on the host.
  Tensor encode(const Tensor& video, const WanVaeRunOptions& options = {}) const;

  void check_latent(const Tensor& latent) const;  // Shape / DType errors naming what is wrong
  void check_video(const Tensor& video) const;

  // Drops the weights converted for devices (they are rebuilt on next use).
  void release_device_weights() const;

 private:
  struct DeviceWeights;
  const DeviceWeights& device_weights(Device device, DType dtype) const;
  Tensor decode_untiled(const Tensor& latent, const WanVaeRunOptions& o, bool clamp) const;
  Tensor encode_untiled(const Tensor& video, const WanVaeRunOptions& o) const;

  WanVaeCheckpoint ck_;
  struct DeviceCache;
  std::unique_ptr<DeviceCache> dev_;
};

}  // namespace td::models::wan_vae
