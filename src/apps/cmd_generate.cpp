// `turbodiff generate`: prompt -> video file (T2V). The flags follow
// TurboDiffusion's inference scripts (shared/DESIGN.md, turbodiffusion.md §3);
// the work is in pipeline/t2v.
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "nn/attention.h"
#include "pipeline/t2v.h"

namespace td::app {
namespace {

struct GenerateOptions {
  pipeline::T2VOptions t2v;
  std::string model, resolution = "480p", aspect_ratio = "16:9";
  int64_t width = 0, height = 0;  // 0 = from --resolution / --aspect-ratio
  int64_t num_samples = 1;
  std::string sampler = "rcm";
  std::string device = "auto", dtype = "auto";
  std::string attention = "original";
  double sla_topk = 0.1;
  bool quiet = false, json = false;
  // I2V (not implemented): any of these set is an Unsupported error.
  std::string high_noise_dit, low_noise_dit, image;
  double boundary = 0.9;
  bool adaptive_resolution = false;
  CLI::App* sub = nullptr;
};

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

int run_generate(GenerateOptions& g) {
  for (const char* flag : {"--high-noise-dit", "--low-noise-dit", "--image", "--boundary", "--adaptive-resolution"})
    if (g.sub->count(flag) > 0)
      fail(ErrorKind::Unsupported, flag, ": I2V not implemented yet (generate runs T2V: --dit, --prompt)");
  if (g.model == "Wan2.2-A14B") fail(ErrorKind::Unsupported, "--model Wan2.2-A14B: I2V not implemented yet");
  if (g.attention == "original" && g.sub->count("--sla-topk") > 0)
    fail(ErrorKind::Usage, "--sla-topk applies to --attention sla|sagesla, not to original");
  if (!(g.sla_topk > 0 && g.sla_topk <= 1))
    fail(ErrorKind::Usage, "--sla-topk ", g.sla_topk, ": expected a fraction of key blocks in (0, 1]");
  if (g.num_samples != 1)
    fail(ErrorKind::Unsupported, "--num-samples ", g.num_samples, ": one sample per run for now (run again with "
         "another --seed)");
  if (g.sampler == "rcm") {
    for (const char* flag : {"--steps", "--guidance", "--shift", "--negative-prompt"})
      if (g.sub->count(flag) > 0)
        fail(ErrorKind::Usage, flag, " is a teacher flag: add --sampler unipc|euler (rCM uses --num-steps)");
  } else {
    for (const char* flag : {"--num-steps", "--sigma-max", "--ode"})
      if (g.sub->count(flag) > 0)
        fail(ErrorKind::Usage, flag, " is an rCM flag; --sampler ", g.sampler, " uses --steps/--shift/--guidance");
  }

  pipeline::T2VOptions& o = g.t2v;
  if (g.width || g.height) {
    TD_CHECK(g.width > 0 && g.height > 0, Usage, "--width and --height go together (got ", g.width, "x", g.height,
             ")");
    o.width = g.width;
    o.height = g.height;
  } else {
    std::tie(o.width, o.height) = pipeline::wan_resolution(g.resolution, g.aspect_ratio);
  }
  if (!g.model.empty()) o.model = g.model == "Wan2.1-1.3B" ? "Wan2.1-T2V-1.3B" : "Wan2.1-T2V-14B";
  o.sampler = g.sampler == "rcm" ? pipeline::T2VSampler::Rcm
              : g.sampler == "unipc" ? pipeline::T2VSampler::UniPC
                                     : pipeline::T2VSampler::Euler;
  // Everything that needs no model file is checked before the device is touched.
  pipeline::validate_t2v_options(o);

  const bool gpu = cuda::device_count() > 0;
  const std::string device_name = g.device == "auto" ? (gpu ? "cuda" : "cpu") : g.device;
  if (device_name == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  o.device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const std::string dtype_str = g.dtype == "auto" ? (o.device.is_cuda() ? "bf16" : "f32") : g.dtype;
  o.dtype = dtype_str == "bf16" ? DType::BF16 : DType::F32;
  o.attention = *nn::parse_attention_kind(g.attention);  // CLI11 already checked the name
  o.sla_topk = g.sla_topk;
  if (o.attention != nn::AttentionKind::Original && o.device.is_cuda())
    fail(ErrorKind::Unsupported, "--attention ", g.attention, " on CUDA: SLA on CUDA not implemented yet (issue 6); "
         "use --device cpu (the fp32 SLA reference) or --attention original");
  if (o.device.is_cuda() && o.dtype == DType::F32)
    fail(ErrorKind::Unsupported, "--dtype f32 on CUDA: the GPU paths run bf16; use --dtype bf16 or --device cpu");

  if (g.quiet || g.json) set_progress_enabled(false);
  const pipeline::T2VResult r = pipeline::run_t2v(o);
  const double gib = double(r.peak_gpu_bytes) / double(1ull << 30);
  if (g.json) {
    std::printf(
        "{\"output\": \"%s\", \"frames\": %lld, \"width\": %lld, \"height\": %lld, \"fps\": %d, \"seed\": %llu, "
        "\"sampler\": \"%s\", \"steps\": %d, \"device\": \"%s\", \"dtype\": \"%s\", \"attention\": \"%s\", "
        "\"prompt_tokens\": %lld, \"latent\": \"%s\", \"dit\": \"%s\", \"timings_s\": {\"text\": %.4f, "
        "\"diffusion\": %.4f, \"vae\": %.4f, \"encode\": %.4f, \"total\": %.4f}, \"peak_gpu_bytes\": %zu}\n",
        json_escape(o.output).c_str(), (long long)r.frames, (long long)r.width, (long long)r.height, o.fps,
        (unsigned long long)o.seed, g.sampler.c_str(), g.sampler == "rcm" ? o.num_steps : o.steps,
        o.device.str().c_str(), dtype_name(o.dtype), g.attention.c_str(), (long long)r.prompt_tokens,
        shape_str(r.latent_shape).c_str(), json_escape(r.dit_description).c_str(), r.text_s, r.diffusion_s, r.vae_s,
        r.encode_s, r.total_s, r.peak_gpu_bytes);
  } else if (!g.quiet) {
    std::printf("%s: %lld frames %lldx%lld at %d fps (%s %s, %s %d steps, seed %llu; text %.2f s, diffusion %.2f s, "
                "vae %.2f s, encode %.2f s, total %.2f s%s)\n",
                o.output.c_str(), (long long)r.frames, (long long)r.width, (long long)r.height, o.fps,
                o.device.str().c_str(), dtype_name(o.dtype), g.sampler.c_str(),
                g.sampler == "rcm" ? o.num_steps : o.steps, (unsigned long long)o.seed, r.text_s, r.diffusion_s,
                r.vae_s, r.encode_s, r.total_s, o.device.is_cuda() ? cat("; peak GPU ", gib, " GiB").c_str() : "");
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Commands& cmds) {
  auto g = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand("generate", "Generate a video from a prompt (T2V): umT5 -> DiT (rCM or the Wan "
                                             "teacher) -> Wan VAE -> MP4 (H.264, 16 fps) or PNG frames");
  g->sub = sub;
  pipeline::T2VOptions& o = g->t2v;
  sub->add_option("--dit", o.dit, "DiT checkpoint files or folders (rCM/TurboDiffusion .pth, original Wan, diffusers)")
      ->required()
      ->expected(1, -1);
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
  sub->add_option("--num-samples", g->num_samples, "videos per prompt (1 for now)");
  sub->add_option("--num-frames", o.num_frames, "frames, 4k+1 (default 81)");
  sub->add_option("--resolution", g->resolution, "480p or 720p")->check(CLI::IsMember({"480p", "720p"}));
  sub->add_option("--aspect-ratio", g->aspect_ratio, "16:9, 9:16, 4:3 or 1:1")
      ->check(CLI::IsMember({"16:9", "9:16", "4:3", "1:1"}));
  sub->add_option("--width", g->width, "width in pixels, a multiple of 16 (overrides --resolution)");
  sub->add_option("--height", g->height, "height in pixels, a multiple of 16 (overrides --resolution)");
  sub->add_option("--sampler", g->sampler, "rcm (few-step student, default), unipc or euler (Wan teacher)")
      ->check(CLI::IsMember({"rcm", "unipc", "euler"}));
  sub->add_option("--num-steps", o.num_steps, "rCM steps, 1 to 4 (default 4)");
  sub->add_option("--sigma-max", o.sigma_max, "rCM initial sigma (default 80)");
  sub->add_flag("--ode", o.ode, "rCM: deterministic ODE update instead of fresh noise each step");
  sub->add_option("--steps", o.steps, "teacher steps (default 50)");
  sub->add_option("--guidance", o.guidance, "teacher classifier-free guidance (default 5; 1 = no negative pass)");
  sub->add_option("--shift", o.shift, "teacher sigma shift (default 5)");
  sub->add_option("--negative-prompt", o.negative_prompt, "teacher negative prompt (default empty)");
  sub->add_option("--attention", g->attention,
                  "original (exact); sla or sagesla: the fp32 SLA reference, CPU only so far (CUDA: issue 6)")
      ->check(CLI::IsMember({"original", "sla", "sagesla"}));
  sub->add_option("--sla-topk", g->sla_topk, "SLA/SageSLA: fraction of key blocks kept per query block (default 0.1)");
  sub->add_flag("--quant-linear", o.quant_linear, "W8A8 INT8 block linears (INT8 checkpoints as they are)");
  sub->add_option("--device", g->device, "cpu or cuda for the text encoder and DiT (the VAE runs on the CPU)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--dtype", g->dtype, "f32 (CPU) or bf16 (default: f32 on cpu, bf16 on cuda)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  sub->add_option("-o,--output", o.output, "out.mp4 (H.264, 16 fps) or a frame pattern like frames/%04d.png")
      ->required();
  sub->add_flag("--quiet", g->quiet, "no progress bars or summary");
  sub->add_flag("--json", g->json, "print a JSON summary (per-stage timings, peak GPU memory) instead of text");
  sub->add_option("--high-noise-dit", g->high_noise_dit, "I2V (not implemented yet)");
  sub->add_option("--low-noise-dit", g->low_noise_dit, "I2V (not implemented yet)");
  sub->add_option("--boundary", g->boundary, "I2V (not implemented yet)");
  sub->add_option("--image", g->image, "I2V (not implemented yet)");
  sub->add_flag("--adaptive-resolution", g->adaptive_resolution, "I2V (not implemented yet)");
  cmds.emplace_back(sub, [g] { return run_generate(*g); });
}

}  // namespace td::app
