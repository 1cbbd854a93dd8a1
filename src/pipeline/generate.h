// Video generation, T2V and I2V: prompt (and image) -> umT5 context
// (zero-padded) -> DiT sampling (rCM few-step student, or the Wan teacher with
// UniPC / Euler and classifier-free guidance) -> Wan VAE decode -> MP4 or PNG
// frames, for one or more samples.
//
// T2V: one DiT (in_dim = z). I2V (Wan2.2-I2V-A14B): the image becomes the
// 36-channel condition (pipeline/image_condition.h) and two experts share the
// steps: the high-noise expert while the step's time is at or above the
// boundary, the low-noise one below it:
//   rCM            expert = high iff t_cur >= boundary, t_cur the flow time of
//                  the step (TurboDiffusion's wan2.2_i2v_infer.py switches when
//                  t_cur < boundary; with sigma_max 200 and 4 steps, times
//                  0.995, 0.934, 0.853, 0.609 at boundary 0.9: high, high, low, low)
//   UniPC / Euler  expert = high iff timestep >= boundary * 1000 (Wan2.2's
//                  generate and diffusers' WanImageToVideoPipeline with
//                  boundary_ratio), the same guidance for both experts.
// A single DiT with in_dim 36 (--dit with --image) runs every step.
//
// Samples: sample k uses seed + k (its initial noise and rCM's per-step noise
// are the Philox streams of that seed, sampling/noise.h), so sample k of a run
// is the video a one-sample run with --seed seed+k makes. The text (and the
// image condition) are computed once; samples go through the DiT in batches
// of sample_batch (default 1: one after another), each sample with its own
// seed's noise, so the batch size does not change the videos; the models stay
// resident (pipeline/residency.h decides what sits on the GPU). Output names: one sample writes `output`; N > 1 insert _k before
// the extension (out.mp4 -> out_0.mp4 ..., f_%04d.png -> f_%04d_0.png ...).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/attention.h"
#include "pipeline/residency.h"
#include "sampling/schedule.h"

namespace td::pipeline {

enum class SamplerKind { Rcm, UniPC, Euler };

struct GenerateOptions {
  // Model files. T2V: `dit`. I2V: `high_noise_dit` + `low_noise_dit` (or `dit` alone with in_dim 36).
  std::vector<std::string> dit;  // one or more files / folders (sharded checkpoints)
  std::vector<std::string> high_noise_dit, low_noise_dit;
  std::string dit_config;        // diffusers config.json for the DiT(s); "" = beside the weights or detected
  std::string vae, text_encoder, tokenizer;
  std::string model;  // "" = detected; else a wan_preset name every DiT must match (dim, layers, heads)
  // I2V.
  std::string image;                 // "" = T2V
  bool adaptive_resolution = false;  // keep the area of width x height, take the image's aspect ratio
  double boundary = 0.9;             // in [0, 1]
  // What to make.
  std::string prompt, negative_prompt;
  uint64_t seed = 0;
  int64_t num_samples = 1;
  int64_t sample_batch = 1;           // samples per DiT batch (0 = all at once; activations grow with it)
  int64_t num_frames = 81;            // 4k + 1
  int64_t width = 832, height = 480;  // multiples of 16 (the target area with adaptive_resolution)
  int64_t max_text_tokens = 512;
  // Where and how.
  Device device = Device::cpu();     // text encoder, DiT(s), and the VAE unless vae_device says otherwise
  std::optional<Device> vae_device;  // unset: `device` (CUDA: the VAE's channels-last BF16 path)
  bool vae_tiling = false;           // the VAE in 256x256 tiles every 192 (diffusers' tiled decode / encode)
  // A TAEHV checkpoint (taew2_1.pth): decode with the TAEHV tiny decoder
  // (models/taehv: fast approximate previews) instead of the Wan VAE, on the
  // VAE's device. The Wan VAE is still read (it sizes the latent, checks the
  // DiT, and encodes the I2V image). "" = the Wan VAE decodes.
  std::string taehv;
  DType dtype = DType::F32;       // run dtype of DiT / encoder matmuls (bf16 on CUDA)
  bool quant_linear = false;
  bool default_norm = false;  // plain unfused norms instead of the FastNorm kernels (WanDiT)
  OffloadPolicy offload = OffloadPolicy::Auto;
  // Self-attention: sla / sagesla run the fp32 SLA reference on the host only (issue 6).
  nn::AttentionKind attention = nn::AttentionKind::Original;
  // --attention auto: each DiT takes what models/wan/wan_attention.h chooses for
  // its checkpoint (sagesla > sla only with proj_l, or with allow_zero_proj_l),
  // logged with the reason; `attention` is then ignored.
  bool attention_auto = false;
  bool allow_zero_proj_l = false;
  double sla_topk = 0.1;
  // Sampler.
  SamplerKind sampler = SamplerKind::Rcm;
  int num_steps = 4;  // rCM, 1..4
  double sigma_max = 80.0;
  bool ode = false;
  int steps = 50;  // teacher
  double guidance = 5.0, shift = 5.0;
  std::string output;  // .mp4 or %04d.png pattern
  int fps = 16;

  bool i2v() const { return !image.empty(); }
  bool two_experts() const { return !high_noise_dit.empty() || !low_noise_dit.empty(); }
};

struct GenerateResult {
  std::string mode;               // "t2v" or "i2v"
  Shape latent_shape;             // [1, z, T, H/8, W/8]
  int64_t frames = 0, width = 0, height = 0;
  int64_t image_width = 0, image_height = 0;  // I2V: the input image as read
  int64_t prompt_tokens = 0;      // after truncation, with </s>
  int64_t prompt_tokens_untruncated = 0;
  std::vector<std::string> outputs;  // one per sample
  std::vector<uint64_t> seeds;       // one per sample
  std::vector<std::string> step_experts;  // per step: "dit", or "high" / "low"
  OffloadPolicy offload = OffloadPolicy::None;  // as resolved
  std::vector<std::string> residency;  // what happened before each stage (describe_plan lines)
  std::string attention;              // the self-attention the DiT(s) ran (auto resolved)
  // Seconds, load included in each stage; diffusion / vae / encode summed over samples.
  double text_s = 0, image_s = 0, diffusion_s = 0, vae_s = 0, encode_s = 0, total_s = 0;
  // Per DiT batch (diffusion) and per sample (vae, encode): the first includes
  // loading and one-time set-up (cuDNN plans), the later ones show the warm cost.
  std::vector<double> batch_diffusion_s, sample_vae_s, sample_encode_s;
  size_t peak_gpu_bytes = 0;      // 0 on the CPU
  size_t peak_text_bytes = 0, peak_image_bytes = 0, peak_diffusion_bytes = 0, peak_vae_bytes = 0;  // per stage
  std::string dit_description, low_noise_dit_description, vae_description, text_encoder_description;
  std::string decoder_description;  // what decoded the frames: the Wan VAE's or TAEHV's description
};

// The pixel size TurboDiffusion uses for a resolution and aspect ratio
// (reference/turbodiffusion.md §3): {width, height}. Usage error for an
// unknown pair.
std::pair<int64_t, int64_t> wan_resolution(const std::string& resolution, const std::string& aspect_ratio);

// The name sample `index` of `count` is written to (see above).
std::string sample_output_path(const std::string& output, int64_t index, int64_t count);

// Which steps the high-noise expert runs (true) and which the low-noise one
// (false), by the rules above.
std::vector<bool> rcm_high_noise_steps(const sampling::RcmSchedule& schedule, double boundary);
std::vector<bool> flow_high_noise_steps(const sampling::FlowSchedule& schedule, double boundary);

// Checks the options that need no model file: frames 4k+1, sizes multiples of
// 16, step counts, samples >= 1, the boundary, which models go with which
// mode, that the model files and the image exist, every output path (kind and
// writable directory). Usage / Io errors.
void validate_generate_options(const GenerateOptions& options);

// Runs the whole pipeline and writes the outputs. Throws td::Error on any
// failure; an output name is only created once its file is complete.
GenerateResult run_generate(const GenerateOptions& options);

}  // namespace td::pipeline
