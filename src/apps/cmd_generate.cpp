// `turbodiff generate`: prompt (and image) -> video file(s), T2V and I2V. The
// flags follow TurboDiffusion's inference scripts (shared/DESIGN.md,
// turbodiffusion.md §3); the work is in pipeline/generate.
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "ops/sla.h"
#include "core/progress.h"
#include "nn/attention.h"
#include "pipeline/generate.h"

namespace td::app {
namespace {

struct GenerateOptions {
  pipeline::GenerateOptions gen;
  std::string model, resolution = "480p", aspect_ratio = "16:9";
  int64_t width = 0, height = 0;  // 0 = from --resolution / --aspect-ratio
  std::string sampler = "rcm";
  std::string device = "auto", dtype = "auto";
  std::string attention = "original";
  std::string offload = "auto";
  std::string vae_device = "auto";
  std::string preview_decoder = "none";  // none | taehv
  double sla_topk = 0.1;
  bool allow_zero_proj_l = false;
  bool quiet = false, json = false;
  CLI::App* sub = nullptr;
};

std::string json_strings(const std::vector<std::string>& v);

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out;
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += cat(i ? ", " : "", "\"", json_escape(v[i]), "\"");
  return s + "]";
}

int run_generate(GenerateOptions& g) {
  pipeline::GenerateOptions& o = g.gen;
  const bool i2v = !o.image.empty() || g.sub->count("--high-noise-dit") > 0 || g.sub->count("--low-noise-dit") > 0;
  if (g.sub->count("--boundary") > 0 && g.sub->count("--high-noise-dit") == 0 && g.sub->count("--low-noise-dit") == 0)
    fail(ErrorKind::Usage, "--boundary switches between the two I2V experts: it needs --high-noise-dit and "
         "--low-noise-dit");
  if (g.model == "Wan2.2-A14B" && !i2v)
    fail(ErrorKind::Usage, "--model Wan2.2-A14B is the I2V model: give --image, --high-noise-dit and --low-noise-dit");
  if (i2v && !g.model.empty() && g.model != "Wan2.2-A14B")
    fail(ErrorKind::Usage, "--model ", g.model, " is a T2V model; I2V runs Wan2.2-A14B");
  if (g.attention == "original" && g.sub->count("--sla-topk") > 0)
    fail(ErrorKind::Usage, "--sla-topk applies to --attention sla|sagesla, not to original");
  if (!(g.sla_topk > 0 && g.sla_topk <= 1))
    fail(ErrorKind::Usage, "--sla-topk ", g.sla_topk, ": expected a fraction of key blocks in (0, 1]");
  if (g.sampler == "rcm") {
    for (const char* flag : {"--steps", "--guidance", "--shift", "--negative-prompt"})
      if (g.sub->count(flag) > 0)
        fail(ErrorKind::Usage, flag, " is a teacher flag: add --sampler unipc|euler (rCM uses --num-steps)");
  } else {
    for (const char* flag : {"--num-steps", "--sigma-max", "--ode"})
      if (g.sub->count(flag) > 0)
        fail(ErrorKind::Usage, flag, " is an rCM flag; --sampler ", g.sampler, " uses --steps/--shift/--guidance");
  }

  // TurboDiffusion's I2V script defaults: 720p and sigma_max 200.
  if (i2v && g.sub->count("--resolution") == 0) g.resolution = "720p";
  if (i2v && g.sub->count("--sigma-max") == 0) o.sigma_max = 200.0;
  if (g.width || g.height) {
    TD_CHECK(g.width > 0 && g.height > 0, Usage, "--width and --height go together (got ", g.width, "x", g.height,
             ")");
    o.width = g.width;
    o.height = g.height;
  } else {
    std::tie(o.width, o.height) = pipeline::wan_resolution(g.resolution, g.aspect_ratio);
  }
  if (!g.model.empty())
    o.model = g.model == "Wan2.1-1.3B" ? "Wan2.1-T2V-1.3B" : g.model == "Wan2.1-14B" ? "Wan2.1-T2V-14B"
                                                                                   : "Wan2.2-I2V-A14B";
  o.sampler = g.sampler == "rcm" ? pipeline::SamplerKind::Rcm
              : g.sampler == "unipc" ? pipeline::SamplerKind::UniPC
                                     : pipeline::SamplerKind::Euler;
  o.offload = pipeline::parse_offload_policy(g.offload);
  // Everything that needs no model file is checked before the device is touched.
  pipeline::validate_generate_options(o);

  const bool gpu = cuda::device_count() > 0;
  const std::string device_name = g.device == "auto" ? (gpu ? "cuda" : "cpu") : g.device;
  if (device_name == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  o.device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  if (g.vae_device == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--vae-device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  if (g.preview_decoder == "taehv")
    TD_CHECK(!o.taehv.empty(), Usage, "--preview-decoder taehv needs --taehv FILE (taew2_1.pth or .safetensors)");
  else
    TD_CHECK(o.taehv.empty(), Usage, "--taehv ", o.taehv, " is only used with --preview-decoder taehv");
  if (g.vae_device != "auto") o.vae_device = g.vae_device == "cuda" ? Device::cuda(0) : Device::cpu();
  const std::string dtype_str = g.dtype == "auto" ? (o.device.is_cuda() ? "bf16" : "f32") : g.dtype;
  o.dtype = dtype_str == "bf16" ? DType::BF16 : DType::F32;
  o.attention_auto = g.attention == "auto";
  if (g.allow_zero_proj_l && !o.attention_auto)
    fail(ErrorKind::Usage, "--allow-zero-proj-l only applies with --attention auto (an explicit sla / sagesla "
                           "already runs a checkpoint without proj_l with proj_l = 0)");
  o.allow_zero_proj_l = g.allow_zero_proj_l;
  o.attention = o.attention_auto ? nn::AttentionKind::Original
                                 : *nn::parse_attention_kind(g.attention);  // CLI11 already checked the name
  o.sla_topk = g.sla_topk;
  if (o.attention == nn::AttentionKind::SageSLA && o.device.is_cuda()) {
    ops::SlaOptions sage_blocks;  // sagesla's 64 x 128 blocks run on the SageAttention-style kernel
    sage_blocks.block_q = 64;
    sage_blocks.block_k = 128;
    if (!ops::sla_cuda_available(sage_blocks))
      fail(ErrorKind::Unsupported, "--attention sagesla on CUDA: this build has no SageAttention-style sparse "
           "kernel (kernels/sage_attention); use --attention sla (BF16 sparse branch on CUDA), --device cpu or "
           "--attention original");
  }
  if (o.device.is_cuda() && o.dtype == DType::F32)
    fail(ErrorKind::Unsupported, "--dtype f32 on CUDA: the GPU paths run bf16; use --dtype bf16 or --device cpu");

  if (g.quiet || g.json) set_progress_enabled(false);
  const pipeline::GenerateResult r = pipeline::run_generate(o);
  const double gib = double(r.peak_gpu_bytes) / double(1ull << 30);
  std::vector<std::string> seeds;
  for (const auto sd : r.seeds) seeds.push_back(std::to_string(sd));
  if (g.json) {
    std::string seeds_json = "[";
    for (size_t i = 0; i < seeds.size(); ++i) seeds_json += (i ? ", " : "") + seeds[i];
    seeds_json += "]";
    // Per DiT batch / per sample: the first includes loading and one-time set-up.
    const auto numbers = [](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    };
    const std::string each_json = "{\"diffusion_per_batch\": " + numbers(r.batch_diffusion_s) +
                                  ", \"vae_per_sample\": " + numbers(r.sample_vae_s) +
                                  ", \"encode_per_sample\": " + numbers(r.sample_encode_s) + "}";
    std::printf(
        "{\"mode\": \"%s\", \"output\": \"%s\", \"outputs\": %s, \"frames\": %lld, \"width\": %lld, "
        "\"height\": %lld, \"fps\": %d, \"seed\": %llu, \"seeds\": %s, \"num_samples\": %lld, \"sample_batch\": %lld, "
        "\"sampler\": \"%s\", \"steps\": %d, \"step_experts\": %s, \"boundary\": %g, \"device\": \"%s\", "
        "\"dtype\": \"%s\", \"attention\": \"%s\", \"offload\": \"%s\", \"residency\": %s, "
        "\"prompt_tokens\": %lld, \"latent\": \"%s\", \"image\": \"%s\", \"image_size\": [%lld, %lld], "
        "\"dit\": \"%s\", \"low_noise_dit\": \"%s\", \"timings_s\": {\"text\": %.4f, \"image\": %.4f, "
        "\"diffusion\": %.4f, \"vae\": %.4f, \"encode\": %.4f, \"total\": %.4f}, \"timings_each_s\": %s, "
        "\"vae_device\": \"%s\", \"decoder\": \"%s\", \"peak_gpu_bytes_by_stage\": {\"text\": %zu, \"image\": %zu, \"diffusion\": %zu, "
        "\"vae\": %zu}, "
        "\"peak_gpu_bytes\": %zu}\n",
        r.mode.c_str(), json_escape(o.output).c_str(), json_strings(r.outputs).c_str(), (long long)r.frames,
        (long long)r.width, (long long)r.height, o.fps, (unsigned long long)o.seed, seeds_json.c_str(),
        (long long)o.num_samples, (long long)(o.sample_batch == 0 ? o.num_samples : std::min(o.sample_batch, o.num_samples)),
        g.sampler.c_str(), g.sampler == "rcm" ? o.num_steps : o.steps,
        json_strings(r.step_experts).c_str(), o.boundary, o.device.str().c_str(), dtype_name(o.dtype),
        (r.attention.empty() ? g.attention : r.attention).c_str(), pipeline::offload_policy_name(r.offload), json_strings(r.residency).c_str(),
        (long long)r.prompt_tokens, shape_str(r.latent_shape).c_str(), json_escape(o.image).c_str(),
        (long long)r.image_width, (long long)r.image_height, json_escape(r.dit_description).c_str(),
        json_escape(r.low_noise_dit_description).c_str(), r.text_s, r.image_s, r.diffusion_s, r.vae_s, r.encode_s,
        r.total_s, each_json.c_str(), o.vae_device.value_or(o.device).str().c_str(), o.taehv.empty() ? "wan-vae" : "taehv",
        r.peak_text_bytes, r.peak_image_bytes,
        r.peak_diffusion_bytes, r.peak_vae_bytes, r.peak_gpu_bytes);
  } else if (!g.quiet) {
    std::string outs;
    for (const auto& p : r.outputs) outs += (outs.empty() ? "" : ", ") + p;
    std::printf("%s: %s, %lld frames %lldx%lld at %d fps (%s %s, %s %d steps, seed %llu%s; text %.2f s,%s diffusion "
                "%.2f s, %s %.2f s, encode %.2f s, total %.2f s%s)\n",
                outs.c_str(), r.mode.c_str(), (long long)r.frames, (long long)r.width, (long long)r.height, o.fps,
                o.device.str().c_str(), dtype_name(o.dtype), g.sampler.c_str(),
                g.sampler == "rcm" ? o.num_steps : o.steps, (unsigned long long)o.seed,
                o.num_samples > 1 ? cat(" .. ", o.seed + uint64_t(o.num_samples - 1)).c_str() : "", r.text_s,
                r.mode == "i2v" ? cat(" image ", r.image_s, " s,").c_str() : "", r.diffusion_s,
                o.taehv.empty() ? "vae" : "taehv preview decode", r.vae_s, r.encode_s,
                r.total_s,
                o.device.is_cuda() ? cat("; offload ", pipeline::offload_policy_name(r.offload), ", peak GPU ", gib,
                                         " GiB").c_str()
                                   : "");
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Commands& cmds) {
  auto g = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "Generate videos from a prompt (T2V) or a prompt and an image (I2V, "
                                             "Wan2.2-A14B's two experts): umT5 -> DiT (rCM or the Wan teacher) -> "
                                             "Wan VAE -> MP4 (H.264, 16 fps) or PNG frames");
  g->sub = sub;
  pipeline::GenerateOptions& o = g->gen;
  sub->add_option("--dit", o.dit, "DiT checkpoint files or folders (rCM/TurboDiffusion .pth, original Wan, "
                                  "diffusers); T2V, or I2V with one DiT of in_dim 36")
      ->expected(1, -1);
  sub->add_option("--high-noise-dit", o.high_noise_dit, "I2V: the Wan2.2-A14B high-noise expert (steps with t >= "
                                                         "--boundary)")
      ->expected(1, -1);
  sub->add_option("--low-noise-dit", o.low_noise_dit, "I2V: the Wan2.2-A14B low-noise expert (steps with t < "
                                                       "--boundary)")
      ->expected(1, -1);
  sub->add_option("--boundary", o.boundary, "I2V: where the low-noise expert takes over, in [0, 1] of the noise "
                                            "range (default 0.9; rCM: flow time, teacher: timestep / 1000)");
  sub->add_option("--image", o.image, "I2V: the first frame (PNG or JPEG), resized to the output size");
  sub->add_flag("--adaptive-resolution", o.adaptive_resolution, "I2V: keep the area of --resolution/--aspect-ratio, "
                                                                "take the image's aspect ratio (multiples of 16)");
  sub->add_option("--config", o.dit_config, "diffusers config.json of the DiT (default: beside it, else detected)");
  sub->add_option("--vae", o.vae, "Wan2.1 VAE: Wan2.1_VAE.pth or diffusers AutoencoderKLWan")->required();
  sub->add_option("--text-encoder", o.text_encoder, "umT5: models_t5_umt5-xxl-enc-bf16.pth or HF UMT5EncoderModel")
      ->required();
  sub->add_option("--tokenizer", o.tokenizer, "tokenizer folder with spiece.model, or the file")->required();
  sub->add_option("--model", g->model, "Wan2.1-1.3B, Wan2.1-14B or Wan2.2-A14B (default: detected); the DiT must "
                                       "match")
      ->check(CLI::IsMember({"Wan2.1-1.3B", "Wan2.1-14B", "Wan2.2-A14B"}));
  sub->add_option("--prompt", o.prompt, "the prompt (truncated to 512 tokens with a warning)")->required();
  sub->add_option("--seed", o.seed, "seed of the latent noise (Philox: the same video on any machine)");
  sub->add_option("--num-samples", o.num_samples, "videos per prompt, seeds seed, seed+1, ...; N > 1 writes "
                                                 "out_0.mp4, out_1.mp4, ... (f_%04d_0.png, ... for frames)");
  sub->add_option("--sample-batch", o.sample_batch, "samples per DiT batch (default 1: one after another; 0 = all "
                                                   "at once); the videos do not depend on it");
  sub->add_option("--num-frames", o.num_frames, "frames, 4k+1 (default 81)");
  sub->add_option("--resolution", g->resolution, "480p or 720p (default 480p; I2V 720p)")->check(CLI::IsMember({"480p", "720p"}));
  sub->add_option("--aspect-ratio", g->aspect_ratio, "16:9, 9:16, 4:3 or 1:1")
      ->check(CLI::IsMember({"16:9", "9:16", "4:3", "1:1"}));
  sub->add_option("--width", g->width, "width in pixels, a multiple of 16 (overrides --resolution)");
  sub->add_option("--height", g->height, "height in pixels, a multiple of 16 (overrides --resolution)");
  sub->add_option("--sampler", g->sampler, "rcm (few-step student, default), unipc or euler (Wan teacher)")
      ->check(CLI::IsMember({"rcm", "unipc", "euler"}));
  sub->add_option("--num-steps", o.num_steps, "rCM steps, 1 to 4 (default 4)");
  sub->add_option("--sigma-max", o.sigma_max, "rCM initial sigma (default 80; I2V 200)");
  sub->add_flag("--ode", o.ode, "rCM: deterministic ODE update instead of fresh noise each step");
  sub->add_option("--steps", o.steps, "teacher steps (default 50)");
  sub->add_option("--guidance", o.guidance, "teacher classifier-free guidance (default 5; 1 = no negative pass)");
  sub->add_option("--shift", o.shift, "teacher sigma shift (default 5)");
  sub->add_option("--negative-prompt", o.negative_prompt, "teacher negative prompt (default empty)");
  sub->add_option("--attention", g->attention,
                  "original (exact); sla or sagesla: top-k block-sparse + linear attention (CPU: the fp32 reference; CUDA: GPU kernels, sagesla where the sage kernel is built); auto: the fastest that runs here and keeps the checkpoint's model (sagesla, then sla, when the checkpoint has SLA proj_l; else original), logged")
      ->check(CLI::IsMember({"original", "sla", "sagesla", "auto"}));
  sub->add_flag("--allow-zero-proj-l", g->allow_zero_proj_l,
                "with --attention auto: accept sla/sagesla on a checkpoint without SLA proj_l (proj_l = 0)");
  sub->add_flag("--default-norm", o.default_norm,
                "plain unfused norms (LayerNorm, separate modulation and residual add; RMSNorm, separate RoPE) "
                "instead of the fused FastNorm kernels");
  sub->add_option("--sla-topk", g->sla_topk, "SLA/SageSLA: fraction of key blocks kept per query block (default 0.1)");
  sub->add_flag("--quant-linear", o.quant_linear, "W8A8 INT8 block linears (INT8 checkpoints as they are)");
  sub->add_option("--device", g->device, "cpu or cuda for the text encoder, the DiT(s) and the VAE (default: cuda "
                                         "when there is a GPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--vae-device", g->vae_device, "where the VAE runs, if not on --device: cpu (fp32 reference) or "
                                                 "cuda (BF16 channels-last path)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--preview-decoder", g->preview_decoder,
                  "none (default: the Wan VAE decodes) or taehv: decode the frames with the TAEHV tiny decoder "
                  "(--taehv FILE) on the VAE's device, a fast approximate preview; --vae is still read (latent "
                  "size, DiT check, I2V image encode)")
      ->check(CLI::IsMember({"none", "taehv"}));
  sub->add_option("--taehv", o.taehv, "TAEHV checkpoint for --preview-decoder taehv: taew2_1.pth or "
                                      "taew2_1.safetensors (madebyollin/taehv)");
  sub->add_flag("--vae-tiling", o.vae_tiling, "VAE in overlapping 256x256 tiles every 192 pixels (diffusers' tiled "
                                              "decode/encode): bounds its memory, differs slightly near the seams");
  sub->add_option("--offload", g->offload, "which models share the GPU: none (each stays from its first to its last "
                                           "use), model (only the running one; others wait in host memory), auto "
                                           "(none when everything fits, default)")
      ->check(CLI::IsMember({"none", "model", "auto"}));
  sub->add_option("--dtype", g->dtype, "f32 (CPU) or bf16 (default: f32 on cpu, bf16 on cuda)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  sub->add_option("-o,--output", o.output, "out.mp4 (H.264, 16 fps) or a frame pattern like frames/%04d.png")
      ->required();
  sub->add_flag("--quiet", g->quiet, "no progress bars or summary");
  sub->add_flag("--json", g->json, "print a JSON summary (per-stage timings, peak GPU memory) instead of text");
  cmds.emplace_back(sub, [g] { return run_generate(*g); });
}

}  // namespace td::app
