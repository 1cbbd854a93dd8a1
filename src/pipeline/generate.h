// Text to video: prompt -> umT5 context (zero-padded) -> DiT sampling (rCM
// few-step student, or the Wan teacher with UniPC / Euler and classifier-free
// guidance) -> Wan VAE decode -> MP4 or PNG frames.
//
// Residency: the text encoder is loaded, run and freed before the DiT is
// loaded, so the two never share the GPU; the VAE runs on the CPU (its CUDA
// path is not written yet), after the DiT is freed.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/attention.h"

namespace td::pipeline {

enum class T2VSampler { Rcm, UniPC, Euler };

struct T2VOptions {
  // Model files.
  std::vector<std::string> dit;  // one or more files / folders (sharded checkpoints)
  std::string dit_config;        // diffusers config.json; "" = beside the weights or detected
  std::string vae, text_encoder, tokenizer;
  std::string model;  // "" = detected; else a wan_preset name the DiT must match (dim, layers, heads)
  // What to make.
  std::string prompt, negative_prompt;
  uint64_t seed = 0;
  int64_t num_frames = 81;  // 4k + 1
  int64_t width = 832, height = 480;  // multiples of 16
  int64_t max_text_tokens = 512;
  // Where and how.
  Device device = Device::cpu();  // DiT and text encoder; the VAE runs on the CPU
  DType dtype = DType::F32;       // run dtype of DiT / encoder matmuls (bf16 on CUDA)
  bool quant_linear = false;
  // Self-attention: sla / sagesla run the fp32 SLA reference on the host only (issue 6).
  nn::AttentionKind attention = nn::AttentionKind::Original;
  double sla_topk = 0.1;
  // Sampler.
  T2VSampler sampler = T2VSampler::Rcm;
  int num_steps = 4;  // rCM, 1..4
  double sigma_max = 80.0;
  bool ode = false;
  int steps = 50;  // teacher
  double guidance = 5.0, shift = 5.0;
  std::string output;  // .mp4 or %04d.png pattern
  int fps = 16;
};

struct T2VResult {
  Shape latent_shape;             // [1, z, T, H/8, W/8]
  int64_t frames = 0, width = 0, height = 0;
  int64_t prompt_tokens = 0;      // after truncation, with </s>
  int64_t prompt_tokens_untruncated = 0;
  double text_s = 0, diffusion_s = 0, vae_s = 0, encode_s = 0, total_s = 0;  // load included in each stage
  size_t peak_gpu_bytes = 0;      // 0 on the CPU
  std::string dit_description, vae_description, text_encoder_description;
};

// The pixel size TurboDiffusion uses for a resolution and aspect ratio
// (reference/turbodiffusion.md §3): {width, height}. Usage error for an
// unknown pair.
std::pair<int64_t, int64_t> wan_resolution(const std::string& resolution, const std::string& aspect_ratio);

// Checks the options that need no file: frames 4k+1, sizes multiples of 16,
// step counts, the output path (kind and writable directory). Usage / Io errors.
void validate_t2v_options(const T2VOptions& options);

// Runs the whole pipeline and writes options.output. Throws td::Error on any
// failure; the output name is only created once the file is complete.
T2VResult run_t2v(const T2VOptions& options);

}  // namespace td::pipeline
