#include "pipeline/t2v.h"

#include <chrono>
#include <filesystem>
#include <optional>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/video_writer.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "models/umt5/umt5_tokenizer.h"
#include "models/wan/wan_config.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "models/wan_vae/wan_vae.h"
#include "sampling/samplers.h"
#include "sampling/schedule.h"

namespace td::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string dit_name(const T2VOptions& o) {
  std::string s;
  for (const auto& p : o.dit) s += (s.empty() ? "" : ", ") + p;
  return s;
}

// The DiT's config without loading its weights, when a config.json says it
// (given, or beside the weights): lets a DiT / encoder / VAE mismatch fail
// before the text encoder runs. nullopt when only the weights can tell.
std::optional<models::wan::WanConfig> dit_config_early(const T2VOptions& o) {
  std::string path = o.dit_config;
  if (path.empty() && o.dit.size() == 1) path = models::wan::find_wan_config_json(o.dit[0]);
  if (path.empty()) return std::nullopt;
  return models::wan::wan_config_from_json(path);
}

void check_dit_vae(const models::wan::WanConfig& dit, const std::string& dit_files,
                   const models::wan_vae::WanVaeConfig& vae, const std::string& vae_file) {
  TD_CHECK(dit.in_dim == vae.z_dim && dit.out_dim == vae.z_dim, Format, "the DiT ", dit_files, " has in_dim ",
           dit.in_dim, " / out_dim ", dit.out_dim, " latent channels but the VAE ", vae_file, " has z_dim ", vae.z_dim,
           ": they do not belong together (T2V needs in_dim = out_dim = z_dim)");
}

void check_dit_encoder(const models::wan::WanConfig& dit, const std::string& dit_files, int64_t d_model,
                       const std::string& encoder_file) {
  TD_CHECK(dit.text_dim == d_model, Format, "the DiT ", dit_files, " expects text_dim ", dit.text_dim,
           " but the text encoder ", encoder_file, " has d_model ", d_model, ": they do not belong together");
}

}  // namespace

std::pair<int64_t, int64_t> wan_resolution(const std::string& resolution, const std::string& aspect_ratio) {
  // rcm/datasets/utils.py of TurboDiffusion; 720p 9:16 and 4:3 follow the same
  // rule as 480p (transpose of 16:9; 4:3 at the short side).
  if (resolution == "480p") {
    if (aspect_ratio == "16:9") return {832, 480};
    if (aspect_ratio == "9:16") return {480, 832};
    if (aspect_ratio == "4:3") return {640, 480};
    if (aspect_ratio == "1:1") return {640, 640};
  } else if (resolution == "720p") {
    if (aspect_ratio == "16:9") return {1280, 720};
    if (aspect_ratio == "9:16") return {720, 1280};
    if (aspect_ratio == "4:3") return {960, 720};
    if (aspect_ratio == "1:1") return {960, 960};
  } else {
    fail(ErrorKind::Usage, "--resolution ", resolution, ": expected 480p or 720p");
  }
  fail(ErrorKind::Usage, "--aspect-ratio ", aspect_ratio, ": expected 16:9, 9:16, 4:3 or 1:1");
}

void validate_t2v_options(const T2VOptions& o) {
  TD_CHECK(o.num_frames >= 1 && (o.num_frames - 1) % 4 == 0, Usage, "--num-frames ", o.num_frames,
           ": expected 4k+1 frames (the VAE makes 4 frames per latent after the first), e.g. ",
           o.num_frames < 1 ? 1 : (o.num_frames - 1) / 4 * 4 + 1, " or ", ((o.num_frames - 1) / 4 + 1) * 4 + 1);
  TD_CHECK(o.width >= 16 && o.height >= 16 && o.width % 16 == 0 && o.height % 16 == 0, Usage, "size ", o.width, "x",
           o.height, ": width and height must be positive multiples of 16 (VAE stride 8 x DiT patch 2)");
  if (o.sampler == T2VSampler::Rcm) {
    TD_CHECK(o.num_steps >= 1 && o.num_steps <= 4, Usage, "--num-steps ", o.num_steps, ": rCM runs 1 to 4 steps");
    TD_CHECK(o.sigma_max > 0, Usage, "--sigma-max ", o.sigma_max, ": expected > 0");
  } else {
    TD_CHECK(o.steps >= 1, Usage, "--steps ", o.steps, ": expected >= 1");
    TD_CHECK(o.shift > 0, Usage, "--shift ", o.shift, ": expected > 0");
  }
  TD_CHECK(o.fps >= 1, Usage, "fps ", o.fps, ": expected >= 1");
  TD_CHECK(!o.dit.empty(), Usage, "--dit: no DiT checkpoint given");
  TD_CHECK(!o.vae.empty() && !o.text_encoder.empty() && !o.tokenizer.empty(), Usage,
           "--vae, --text-encoder and --tokenizer are all needed for T2V");
  for (const auto* p : {&o.vae, &o.text_encoder, &o.tokenizer})
    TD_CHECK(std::filesystem::exists(*p), Io, "model file ", *p, " does not exist");
  for (const auto& p : o.dit) TD_CHECK(std::filesystem::exists(p), Io, "--dit ", p, " does not exist");
  io::check_video_output(o.output);
}

T2VResult run_t2v(const T2VOptions& o) {
  validate_t2v_options(o);
  const auto t_start = Clock::now();
  T2VResult r;
  r.frames = o.num_frames;
  r.width = o.width;
  r.height = o.height;
  const bool cuda = o.device.is_cuda();
  if (cuda) cuda::reset_peak(o.device.index);

  // The VAE first: it is small, it is needed to size the latent, and a VAE
  // that does not fit the DiT fails before anything heavy runs.
  const auto t_vae_load = Clock::now();
  const models::wan_vae::WanVae vae(models::wan_vae::load_wan_vae(o.vae));
  double vae_load_s = seconds_since(t_vae_load);
  r.vae_description = vae.config().describe();
  const int64_t sf = vae.config().spatial_factor(), tf = vae.config().temporal_factor();
  TD_CHECK(o.width % sf == 0 && o.height % sf == 0, Usage, "size ", o.width, "x", o.height,
           " is not a multiple of the VAE's spatial factor ", sf, " (", o.vae, ")");
  TD_CHECK((o.num_frames - 1) % tf == 0, Usage, "--num-frames ", o.num_frames, ": the VAE ", o.vae, " needs ", tf,
           "k+1 frames");
  const std::optional<models::wan::WanConfig> early = dit_config_early(o);
  if (early) check_dit_vae(*early, dit_name(o), vae.config(), o.vae);
  r.latent_shape = {1, vae.config().z_dim, (o.num_frames - 1) / tf + 1, o.height / sf, o.width / sf};
  if (early)
    TD_CHECK(r.latent_shape[3] % early->patch_h == 0 && r.latent_shape[4] % early->patch_w == 0, Usage, "size ",
             o.width, "x", o.height, ": the latent ", r.latent_shape[4], "x", r.latent_shape[3],
             " is not a multiple of the DiT's patch ", early->patch_w, "x", early->patch_h);

  // Text: encode the prompt (and the negative prompt for guided teacher
  // sampling), then free the encoder before the DiT is loaded.
  Tensor context, negative_context;
  {
    const auto t0 = Clock::now();
    ProgressBar bar("text", o.sampler != T2VSampler::Rcm && o.guidance != 1.0 ? 3 : 2, "stages");
    const auto tokenizer = models::umt5::UMT5Tokenizer::load(o.tokenizer);
    models::umt5::UMT5LoadOptions lo;
    lo.device = o.device;
    lo.dtype = o.dtype;
    models::umt5::UMT5Encoder encoder(models::umt5::load_umt5(o.text_encoder, lo));
    bar.advance();
    TD_CHECK(tokenizer.vocab_size() <= encoder.config().vocab, Format, "tokenizer ", tokenizer.path(), " has ",
             tokenizer.vocab_size(), " pieces but the text encoder ", o.text_encoder, " has a vocabulary of ",
             encoder.config().vocab, ": they do not belong together");
    if (early) check_dit_encoder(*early, dit_name(o), encoder.config().d_model, o.text_encoder);
    r.text_encoder_description = encoder.config().describe();
    auto encode = [&](const std::string& text, bool record) {
      const auto batch = tokenizer.tokenize({text}, o.max_text_tokens);  // warns when it truncates
      if (record) {
        r.prompt_tokens = batch.lengths[0];
        r.prompt_tokens_untruncated = batch.untruncated[0];
      }
      Tensor hidden = encoder.forward(batch.ids, batch.mask);
      if (!hidden.device().is_cpu()) hidden = hidden.to(Device::cpu());
      return models::umt5::zero_pad_context(hidden, batch.lengths);
    };
    context = encode(o.prompt, true);
    bar.advance();
    if (o.sampler != T2VSampler::Rcm && o.guidance != 1.0) {
      negative_context = encode(o.negative_prompt, false);
      bar.advance();
    }
    bar.finish();
    r.text_s = seconds_since(t0);
  }

  // Diffusion.
  Tensor latent;
  {
    const auto t0 = Clock::now();
    models::wan::WanLoadOptions lo;
    lo.device = o.device;
    lo.dtype = o.dtype;
    lo.config_path = o.dit_config;
    if (o.quant_linear) lo.int8_variant = nn::kDefaultInt8LinearVariant;
    models::wan::WanCheckpoint ck = models::wan::load_wan_checkpoint(o.dit, lo);
    r.dit_description = ck.detection.description;
    if (!o.model.empty()) {
      const models::wan::WanConfig want = models::wan::wan_preset(o.model);
      TD_CHECK(want.dim == ck.config.dim && want.num_layers == ck.config.num_layers &&
                   want.num_heads == ck.config.num_heads,
               Format, "--model ", o.model, " has dim ", want.dim, ", ", want.num_layers, " layers, ", want.num_heads,
               " heads but the DiT ", dit_name(o), " has dim ", ck.config.dim, ", ", ck.config.num_layers,
               " layers, ", ck.config.num_heads, " heads (", ck.config.describe(), ")");
    }
    check_dit_vae(ck.config, dit_name(o), vae.config(), o.vae);
    check_dit_encoder(ck.config, dit_name(o), context.shape()[2], o.text_encoder);
    TD_CHECK(r.latent_shape[3] % ck.config.patch_h == 0 && r.latent_shape[4] % ck.config.patch_w == 0, Usage,
             "size ", o.width, "x", o.height, ": the latent ", r.latent_shape[4], "x", r.latent_shape[3],
             " is not a multiple of the DiT's patch ", ck.config.patch_w, "x", ck.config.patch_h);
    const models::wan::WanDiT dit(std::move(ck), o.attention, o.sla_topk);
    // The network sees the state in its run dtype (rCM's reference feeds bf16 latents).
    const DType input_dtype = o.dtype == DType::BF16 ? DType::BF16 : DType::F32;
    const Tensor ctx = cuda ? context.to(o.device) : context;
    const Tensor neg = negative_context.defined() && cuda ? negative_context.to(o.device) : negative_context;
    auto velocity_with = [&](const Tensor& c) {
      return [&dit, c, input_dtype, cuda](const Tensor& x, double timestep) {
        const Tensor t = Tensor::from_f32({1}, {float(timestep)});
        Tensor v = dit.forward(x.to(input_dtype), t, c);
        if (cuda) v = v.to(Device::cpu());
        return v;
      };
    };
    const int total_steps = o.sampler == T2VSampler::Rcm ? o.num_steps : o.steps;
    ProgressBar bar("diffusion", total_steps, "steps");
    auto on_step = [&bar](int, int, const Tensor&) { bar.advance(); };
    if (o.sampler == T2VSampler::Rcm) {
      sampling::RcmOptions ro;
      ro.ode = o.ode;
      ro.on_step = on_step;
      latent = sampling::rcm_sample(r.latent_shape, o.seed, sampling::rcm_schedule(o.num_steps, o.sigma_max),
                                    velocity_with(ctx), ro);
    } else {
      sampling::GuidedVelocity model;
      model.cond = velocity_with(ctx);
      if (neg.defined()) model.uncond = velocity_with(neg);
      model.guidance = o.guidance;
      sampling::FlowOptions fo;
      fo.solver = o.sampler == T2VSampler::UniPC ? sampling::FlowSolver::UniPC : sampling::FlowSolver::Euler;
      fo.on_step = on_step;
      const auto kind = o.sampler == T2VSampler::UniPC ? sampling::FlowScheduleKind::Wan
                                                       : sampling::FlowScheduleKind::DiffusersEuler;
      latent = sampling::flow_sample(sampling::initial_noise(r.latent_shape, o.seed),
                                     sampling::flow_schedule(kind, o.steps, o.shift), model, fo);
    }
    if (cuda) cuda::synchronize(o.device.index);
    bar.finish();
    r.diffusion_s = seconds_since(t0);
  }

  // VAE decode (CPU, fp32).
  Tensor video;
  {
    const auto t0 = Clock::now();
    if (cuda) log_warn("VAE decode runs on the CPU (its CUDA path is not implemented yet): expect it to dominate");
    ProgressBar bar("vae decode", 1, "videos");
    video = vae.decode(latent.to(DType::F32)).select(0, 0).contiguous();
    bar.finish();
    r.vae_s = seconds_since(t0) + vae_load_s;
  }
  TD_CHECK(video.shape()[1] == o.num_frames && video.shape()[2] == o.height && video.shape()[3] == o.width, Shape,
           "the VAE ", o.vae, " decoded ", shape_str(video.shape()), ", expected [3, ", o.num_frames, ", ", o.height,
           ", ", o.width, "]");

  // Encode and write.
  {
    const auto t0 = Clock::now();
    ProgressBar bar("encode", o.num_frames, "frames");
    io::write_video(o.output, video, o.fps, [&bar](int64_t) { bar.advance(); });
    bar.finish();
    r.encode_s = seconds_since(t0);
  }
  if (cuda) r.peak_gpu_bytes = cuda::peak_allocated_bytes(o.device.index);
  r.total_s = seconds_since(t_start);
  return r;
}

}  // namespace td::pipeline
