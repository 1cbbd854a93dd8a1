// The image side of I2V (Wan2.2-I2V-A14B as TurboDiffusion's
// wan2.2_i2v_infer.py and diffusers' WanImageToVideoPipeline with
// expand_timesteps=False run it):
//
//   size      fixed: --resolution/--aspect-ratio (or --width/--height); with
//             --adaptive-resolution the area of that size at the image's
//             aspect ratio: w = round(sqrt(A / r) / 16) * 16,
//             h = round(sqrt(A * r) / 16) * 16, r = image h / w, round half to
//             even (Python's round on numpy floats), 16 = VAE stride 8 x patch 2
//   resize    the whole image to exactly w x h, no crop (the aspect ratio is
//             not kept unless adaptive): antialiased bilinear as torchvision's
//             Resize(antialias=True) on a uint8 image = PIL's BILINEAR
//             (triangle filter widened by the scale when shrinking, a
//             horizontal then a vertical pass, each rounded to 8 bits)
//   tensor    x / 255 * 2 - 1 (ToDtype(scale=True) then Normalize(0.5, 0.5))
//   condition video = [image, F - 1 zero frames] -> VAE encode (the mean,
//             normalised: (mu - mean) / std) -> latent [1, z, T, h, w];
//             mask [1, 4, T, h, w]: pixel frame 0 is 1, the rest 0, the first
//             frame repeated 4 times so the frame mask folds into 4 channels
//             per latent frame (latent frame 0 all ones, the rest zeros);
//             y = concat(mask, latent) on channels: [1, 4 + z, T, h, w]
//   DiT input concat(x, y) on channels: 16 + 4 + 16 = 36 = the I2V in_dim.
#pragma once
#include <cstdint>
#include <utility>

#include "core/tensor.h"
#include "io/image_reader.h"

namespace td::models::wan_vae {
class WanVae;
struct WanVaeRunOptions;
}

namespace td::pipeline {

// {width, height} of --adaptive-resolution (see above). Usage error when the
// image is so elongated that a side rounds to 0.
std::pair<int64_t, int64_t> adaptive_resolution(int64_t image_width, int64_t image_height, int64_t target_width,
                                                int64_t target_height, int64_t stride = 16);

// Antialiased bilinear resize of an 8-bit RGB image (see above).
io::RgbImage resize_bilinear_antialias(const io::RgbImage& image, int64_t width, int64_t height);

// f32 [1, 3, H, W] in [-1, 1].
Tensor image_to_tensor(const io::RgbImage& image);

// The I2V frame mask folded onto latent frames: f32 [1, temporal_factor, T, h, w],
// T = (num_frames - 1) / temporal_factor + 1, 1 on latent frame 0.
Tensor i2v_latent_mask(int64_t num_frames, int64_t temporal_factor, int64_t latent_height, int64_t latent_width);

// y = concat(mask, VAE latent of [image, zero frames]): f32 [1, 4 + z, T, h, w].
// image: f32 [1, 3, H, W] in [-1, 1].
// `run`: where and how the VAE encodes (device, tiling).
Tensor i2v_condition(const models::wan_vae::WanVae& vae, const Tensor& image, int64_t num_frames,
                     const models::wan_vae::WanVaeRunOptions& run);

// concat(x, y) along channels: x [B, Cx, T, h, w], y [1 or B, Cy, T, h, w] (a
// single y is shared by the batch); any float dtype, any device -> f32 host
// [B, Cx + Cy, T, h, w].
Tensor concat_channels(const Tensor& x, const Tensor& y);

}  // namespace td::pipeline
