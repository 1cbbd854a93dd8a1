// TAEHV ("Tiny AutoEncoder for Hunyuan Video", madebyollin/taehv), the decoder
// half, as published for Wan2.1 latents (taew2_1.pth / taew2_1.safetensors):
// a small approximate decoder of the same 16-channel latents the Wan VAE
// decodes, used for previews.
//
// The network (state-dict names "decoder.<i>..." of the published module):
//   0 Clamp (3 tanh(x/3)), 1 conv3x3(16 -> 256) + 2 ReLU,
//   per stage s = 0, 1, 2 (widths n_f = 256, 128, 64, then 64):
//     3 MemBlocks(n_f[s]), nearest 2x upsample, TGrow(n_f[s], stride),
//     conv3x3(n_f[s] -> n_f[s+1], no bias)
//   (indices 3-8, 9-14, 15-20), 21 ReLU, 22 conv3x3(64 -> 3).
// MemBlock(x, past) = ReLU(conv(ReLU(conv(ReLU(conv(cat[x, past])))) + x),
// past = the block's input at the previous frame (zeros at frame 0): 2-D
// convolutions over each frame, the only temporal link is that memory.
// TGrow: a 1x1 conv C -> stride*C, channel group k becoming frame
// stride*t + k. Wan's taew2_1 runs TGrow strides (1, 2, 2): T latents give
// 4T frames, of which the first 3 are dropped (4T - 3 = 4(T-1) + 1, as the
// Wan VAE). A checkpoint whose stride-1 TGrow weight has more rows (trained
// with stride 2) uses its last rows, as the published loader does.
// Input: the normalised latent the DiT produces (TAEHV uses no latent
// mean/std); output: frames in [0, 1], returned here as 2x - 1 clamped to
// [-1, 1] (the Wan VAE's convention).
//
// One implementation, channels last ([1, T, H, W, C], ops/conv.h *_cl and
// ops/taehv.h): fp32 on the CPU (the reference, matched to a PyTorch
// implementation in scripts/make_taehv_fixtures.py), BF16 (or F32) on CUDA
// with cuDNN convolutions. Latent frames go through in chunks, each MemBlock
// carrying its last input frame to the next chunk, so the result does not
// depend on the chunk size and memory is bounded by one chunk.
// Only the decoder is implemented; the encoder tensors of a full checkpoint
// are ignored. Not supported (refused by name): the patch-size-2 models
// (taew2_2, taehv1_5: 48 / 32 latent channels with pixel shuffle) and the
// "super" decoders.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace td::models::taehv {

struct TaehvConfig {
  int64_t latent_channels = 16;
  std::array<int64_t, 4> n_f{256, 128, 64, 64};
  std::array<int64_t, 3> time_stride{1, 2, 2};  // Wan2.1: decoder_time_upscale (False, True, True)
  int64_t t_upscale() const { return time_stride[0] * time_stride[1] * time_stride[2]; }
  int64_t frames_to_trim() const { return t_upscale() - 1; }
  int64_t spatial_factor() const { return 8; }
  int64_t frames_out(int64_t latent_frames) const { return t_upscale() * latent_frames - frames_to_trim(); }
  std::string describe() const;  // "TAEHV decoder (16 latent channels, widths 256/128/64/64)"
};

struct TaehvCheckpoint {
  TaehvConfig config;
  std::string path;
  bool has_encoder = false;
  std::map<std::string, Tensor> tensors;  // decoder names -> contiguous f32 host tensors (TGrow rows already cut)
};

// Whether these names are a TAEHV checkpoint (decoder and/or encoder of the
// published module); for model detection.
bool looks_like_taehv(const std::vector<std::string>& names);

// The decoder tensors among `tensors` (any float dtype), config from their
// shapes; Format errors list every missing, mis-shaped and unexpected name.
TaehvCheckpoint match_taehv_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::string& what);
TaehvCheckpoint load_taehv(const std::string& path);  // .pth or .safetensors
// Random weights for `c` (benchmarks, GPU tests): conv weights U(-a, a),
// a = sqrt(3 / fan_in), biases U(-0.05, 0.05); deterministic for a seed.
TaehvCheckpoint random_taehv_checkpoint(const TaehvConfig& c = {}, uint32_t seed = 8);

// TURBODIFF_TAEHV_CHUNK (latent frames per chunk, 0 = all) when set, else 4:
// the default of TaehvRunOptions, so a benchmark or a run can be switched
// without a flag.
int64_t default_taehv_chunk();

struct TaehvRunOptions {
  std::optional<Device> device;  // unset: the latent's device
  std::optional<DType> dtype;    // CUDA: BF16 unless set (F32 for tests); the CPU: F32 only
  // Latent frames per chunk; 0 = all frames at once. The result is the same
  // for every value; memory grows with it.
  int64_t latent_frames_per_chunk = default_taehv_chunk();
};

class TaehvDecoder {
 public:
  explicit TaehvDecoder(TaehvCheckpoint checkpoint);
  ~TaehvDecoder();
  const TaehvConfig& config() const { return ck_.config; }
  const std::string& path() const { return ck_.path; }

  // latent [B, 16, T, h, w] (normalised; any float dtype and device) ->
  // video [B, 3, 4T - 3, 8h, 8w] f32 in [-1, 1] on the host.
  Tensor decode(const Tensor& latent, const TaehvRunOptions& options = {}) const;
  void check_latent(const Tensor& latent) const;
  void release_device_weights() const;

 private:
  struct Weights;
  const Weights& weights(Device device, DType dtype) const;
  TaehvCheckpoint ck_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace td::models::taehv
