#include "pipeline/generate.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/image_reader.h"
#include "io/checkpoint.h"
#include "io/tensor_file.h"
#include "io/video_writer.h"
#include "models/detect.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "models/umt5/umt5_tokenizer.h"
#include "models/wan/wan_attention.h"
#include "models/wan/wan_config.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_loader.h"
#include "models/taehv/taehv.h"
#include "models/wan_vae/wan_vae.h"
#include "pipeline/image_condition.h"
#include "sampling/noise.h"
#include "sampling/samplers.h"

namespace td::pipeline {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string join(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
  return s;
}

// What a DiT checkpoint is, before its weights are converted: its config
// (config.json given or beside the weights; else detected from names and
// shapes, reading the files' headers through the mapping readers) and an
// estimate of its parameter count.
struct DitInfo {
  std::vector<std::string> paths;
  std::string flag;  // "--dit", "--high-noise-dit", "--low-noise-dit"
  models::wan::WanConfig config;
  size_t params = 0;
  std::string what() const { return cat(flag, " ", join(paths)); }
};

DitInfo peek_dit(const std::vector<std::string>& paths, const std::string& flag, const std::string& config_path) {
  DitInfo info;
  info.paths = paths;
  info.flag = flag;
  std::string cfg = config_path.empty() && paths.size() == 1 ? models::wan::find_wan_config_json(paths.front())
                                                              : config_path;
  if (!cfg.empty()) {
    info.config = models::wan::wan_config_from_json(cfg);
  } else {
    std::vector<models::TensorMeta> metas;
    for (const auto& p : paths) {
      const io::TensorFile f = io::read_tensor_file(p);
      for (const auto& [n, t] : f.tensors) metas.push_back({n, t.dtype(), t.shape()});
    }
    const models::ModelDetection d = models::detect_model(metas);
    TD_CHECK(d.kind == models::ModelKind::WanDiT, Format, info.what(), " is not a Wan DiT checkpoint (",
             d.description, ")");
    info.config = models::wan::wan_config_from_detection(d, info.what());
  }
  // Blocks (self- and cross-attention, FFN), patch / text / time embeddings, head.
  const auto& c = info.config;
  info.params = size_t(c.num_layers * (8 * c.dim * c.dim + 2 * c.dim * c.ffn_dim + 16 * c.dim) +
                       c.patch_in_features() * c.dim + c.text_dim * c.dim + c.dim * c.dim + c.freq_dim * c.dim +
                       7 * c.dim * c.dim + c.dim * c.patch_out_features());
  return info;
}

bool same_architecture(const models::wan::WanConfig& a, const models::wan::WanConfig& b) {
  return a.dim == b.dim && a.ffn_dim == b.ffn_dim && a.num_heads == b.num_heads && a.num_layers == b.num_layers &&
         a.in_dim == b.in_dim && a.out_dim == b.out_dim && a.text_dim == b.text_dim && a.freq_dim == b.freq_dim &&
         a.patch_t == b.patch_t && a.patch_h == b.patch_h && a.patch_w == b.patch_w;
}

// A copy of a checkpoint loaded on the host, on `device` (the tensor maps
// share storage when the device is the host).
models::wan::WanCheckpoint checkpoint_on(const models::wan::WanCheckpoint& host, Device device) {
  models::wan::WanCheckpoint ck = host;
  if (!device.is_cuda()) return ck;
  ProgressBar bar("upload DiT", int64_t(ck.tensors.size() + ck.int8_weights.size()), "tensors");
  for (auto& [name, t] : ck.tensors) {
    t = t.to(device);
    bar.advance();
  }
  for (auto& [name, w] : ck.int8_weights) {
    w.q = w.q.to(device);
    w.scale = w.scale.to(device);
    bar.advance();
  }
  bar.finish();
  return ck;
}

// Executes a residency plan stage by stage: each component says how it is
// loaded, staged, uploaded, offloaded and released.
struct ComponentOps {
  std::function<void(Device)> load;  // straight onto the device it runs on
  std::function<void()> stage, upload, offload, release;
};

class Residency {
 public:
  Residency(ResidencyPlan plan, std::map<Component, ComponentOps> ops, Device gpu, bool two_experts,
            std::vector<std::string>* trace)
      : plan_(std::move(plan)), ops_(std::move(ops)), gpu_(gpu), two_experts_(two_experts), trace_(trace) {}

  void enter(Component c) {
    TD_CHECK(next_ < plan_.steps.size() && plan_.steps[next_].stage == c, Internal, "residency: stage ",
             component_name(c, two_experts_), " entered out of plan (step ", next_, " of ", plan_.steps.size(), ")");
    const ResidencyStep& step = plan_.steps[next_++];
    run(step.before, step.on_gpu.count(c) > 0 ? gpu_ : Device::cpu());
    std::string g;
    for (const auto r : step.on_gpu) g += cat(g.empty() ? "" : ", ", component_name(r, two_experts_));
    trace_->push_back(cat(component_name(c, two_experts_), ": ", moves(step.before), " | gpu: ", g.empty() ? "-" : g));
  }
  void finish() {
    TD_CHECK(next_ == plan_.steps.size(), Internal, "residency: ", plan_.steps.size() - next_,
             " planned stages did not run");
    run(plan_.final_moves, Device::cpu());
    trace_->push_back(cat("end: ", moves(plan_.final_moves)));
  }

 private:
  std::string moves(const std::vector<ResidencyMove>& ms) const {
    std::string m;
    for (const auto& mv : ms)
      m += cat(m.empty() ? "" : ", ", move_kind_name(mv.kind), " ", component_name(mv.component, two_experts_));
    return m.empty() ? "-" : m;
  }
  // `load_device`: where a Load of this stage's model puts it.
  void run(const std::vector<ResidencyMove>& ms, Device load_device) {
    for (const auto& mv : ms) {
      ComponentOps& o = ops_.at(mv.component);
      switch (mv.kind) {
        case MoveKind::Load: o.load(load_device); break;
        case MoveKind::Stage: o.stage(); break;
        case MoveKind::Upload: o.upload(); break;
        case MoveKind::Offload: o.offload(); break;
        case MoveKind::Release: o.release(); break;
      }
    }
  }
  ResidencyPlan plan_;
  std::map<Component, ComponentOps> ops_;
  Device gpu_;
  bool two_experts_;
  std::vector<std::string>* trace_;
  size_t next_ = 0;
};

// [1, ...] -> [n, ...] (the same rows n times), on `device`; `one` is the
// single-row tensor already there (returned as it is when n == 1).
Tensor repeat_batch(const Tensor& host, int64_t n, const Tensor& one, Device device) {
  if (n == 1) return one;
  const Tensor src = host.contiguous();
  Shape shape = src.shape();
  shape[0] = n;
  Tensor out = Tensor::empty(shape, src.dtype());
  const size_t bytes = src.nbytes();
  for (int64_t k = 0; k < n; ++k)
    std::memcpy(static_cast<char*>(out.raw_data()) + size_t(k) * bytes, src.raw_data(), bytes);
  return device.is_cuda() ? out.to(device) : out;
}

// Peak GPU memory of one stage (reset at its start) and of the run.
struct PeakMeter {
  bool cuda = false;
  int device = 0;
  size_t overall = 0;
  void start() const {
    if (cuda) cuda::reset_peak(device);
  }
  size_t stop() {
    if (!cuda) return 0;
    const size_t p = cuda::peak_allocated_bytes(device);
    overall = std::max(overall, p);
    return p;
  }
};

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

std::string sample_output_path(const std::string& output, int64_t index, int64_t count) {
  if (count == 1) return output;
  const std::filesystem::path p(output);
  const std::string stem = p.stem().string(), ext = p.extension().string();
  return (p.parent_path() / (stem + "_" + std::to_string(index) + ext)).string();
}

std::vector<bool> rcm_high_noise_steps(const sampling::RcmSchedule& s, double boundary) {
  std::vector<bool> high;
  for (int i = 0; i < s.steps(); ++i) high.push_back(s.times[size_t(i)] >= boundary);
  return high;
}

std::vector<bool> flow_high_noise_steps(const sampling::FlowSchedule& s, double boundary) {
  const double boundary_timestep = boundary * 1000.0;
  std::vector<bool> high;
  for (int i = 0; i < s.steps(); ++i) high.push_back(s.timesteps[size_t(i)] >= boundary_timestep);
  return high;
}

void validate_generate_options(const GenerateOptions& o) {
  TD_CHECK(o.num_samples >= 1, Usage, "--num-samples ", o.num_samples, ": expected 1 or more videos");
  TD_CHECK(o.sample_batch >= 0, Usage, "--sample-batch ", o.sample_batch,
           ": expected the number of samples per DiT batch (0 = all of them)");
  TD_CHECK(o.num_frames >= 1 && (o.num_frames - 1) % 4 == 0, Usage, "--num-frames ", o.num_frames,
           ": expected 4k+1 frames (the VAE makes 4 frames per latent after the first), e.g. ",
           o.num_frames < 1 ? 1 : (o.num_frames - 1) / 4 * 4 + 1, " or ", ((o.num_frames - 1) / 4 + 1) * 4 + 1);
  TD_CHECK(o.width >= 16 && o.height >= 16 && o.width % 16 == 0 && o.height % 16 == 0, Usage, "size ", o.width, "x",
           o.height, ": width and height must be positive multiples of 16 (VAE stride 8 x DiT patch 2)");
  if (o.sampler == SamplerKind::Rcm) {
    TD_CHECK(o.num_steps >= 1 && o.num_steps <= 4, Usage, "--num-steps ", o.num_steps, ": rCM runs 1 to 4 steps");
    TD_CHECK(o.sigma_max > 0, Usage, "--sigma-max ", o.sigma_max, ": expected > 0");
  } else {
    TD_CHECK(o.steps >= 1, Usage, "--steps ", o.steps, ": expected >= 1");
    TD_CHECK(o.shift > 0, Usage, "--shift ", o.shift, ": expected > 0");
  }
  TD_CHECK(o.fps >= 1, Usage, "fps ", o.fps, ": expected >= 1");
  // Which models go with which mode.
  const bool experts = o.two_experts();
  TD_CHECK(!(experts && !o.dit.empty()), Usage,
           "--dit and --high-noise-dit/--low-noise-dit exclude each other: give one DiT, or the two I2V experts");
  TD_CHECK(!experts || (!o.high_noise_dit.empty() && !o.low_noise_dit.empty()), Usage,
           o.high_noise_dit.empty() ? "--low-noise-dit" : "--high-noise-dit", " given without ",
           o.high_noise_dit.empty() ? "--high-noise-dit" : "--low-noise-dit",
           ": Wan2.2 I2V needs both experts (or one --dit for every step)");
  TD_CHECK(experts || !o.dit.empty(), Usage,
           "no DiT given: --dit for T2V, or --high-noise-dit and --low-noise-dit (with --image) for I2V");
  TD_CHECK(!experts || o.i2v(), Usage,
           "missing --image: --high-noise-dit/--low-noise-dit are the Wan2.2 I2V experts, which generate from an "
           "input image (--image photo.png)");
  TD_CHECK(o.i2v() || !o.adaptive_resolution, Usage, "--adaptive-resolution needs --image (it follows the image's "
           "aspect ratio)");
  TD_CHECK(o.boundary >= 0.0 && o.boundary <= 1.0, Usage, "--boundary ", o.boundary,
           ": expected a fraction of the noise range in [0, 1] (0.9 = switch to the low-noise expert at t < 0.9)");
  TD_CHECK(!o.vae.empty() && !o.text_encoder.empty() && !o.tokenizer.empty(), Usage,
           "--vae, --text-encoder and --tokenizer are all needed");
  for (const auto* p : {&o.vae, &o.text_encoder, &o.tokenizer})
    TD_CHECK(std::filesystem::exists(*p), Io, "model file ", *p, " does not exist");
  if (!o.taehv.empty()) {
    TD_CHECK(std::filesystem::exists(o.taehv), Io, "--taehv ", o.taehv, " does not exist");
    TD_CHECK(!o.vae_tiling, Usage, "--vae-tiling applies to the Wan VAE's decode; with --preview-decoder taehv the "
             "TAEHV decoder bounds its memory by decoding a few latent frames at a time");
  }
  for (const auto& [flag, list] : {std::pair{"--dit", &o.dit}, std::pair{"--high-noise-dit", &o.high_noise_dit},
                                   std::pair{"--low-noise-dit", &o.low_noise_dit}})
    for (const auto& p : *list) TD_CHECK(std::filesystem::exists(p), Io, flag, " ", p, " does not exist");
  if (o.i2v()) {
    TD_CHECK(std::filesystem::exists(o.image), Io, "--image ", o.image, " does not exist");
    TD_CHECK(!std::filesystem::is_directory(o.image), Io, "--image ", o.image, " is a directory, not an image");
  }
  io::check_video_output(o.output);
  for (int64_t k = 0; k < o.num_samples && o.num_samples > 1; ++k)
    io::check_video_output(sample_output_path(o.output, k, o.num_samples));
}

GenerateResult run_generate(const GenerateOptions& o) {
  validate_generate_options(o);
  const auto t_start = Clock::now();
  GenerateResult r;
  r.mode = o.i2v() ? "i2v" : "t2v";
  r.frames = o.num_frames;
  const bool cuda = o.device.is_cuda();
  const bool two = o.two_experts();
  PeakMeter peak{cuda, cuda ? o.device.index : 0, 0};

  // What the DiT(s) are, before any weight is converted: mismatches between
  // the models fail here, before the text encoder runs.
  const DitInfo high = two ? peek_dit(o.high_noise_dit, "--high-noise-dit", o.dit_config)
                           : peek_dit(o.dit, "--dit", o.dit_config);
  std::optional<DitInfo> low;
  if (two) {
    low = peek_dit(o.low_noise_dit, "--low-noise-dit", o.dit_config);
    TD_CHECK(same_architecture(high.config, low->config), Format, "the I2V experts do not belong together: ",
             high.what(), " is ", high.config.describe(), " but ", low->what(), " is ", low->config.describe());
  }
  const models::wan::WanConfig& cfg = high.config;
  if (!o.model.empty()) {
    const models::wan::WanConfig want = models::wan::wan_preset(o.model);
    for (const DitInfo* d : std::vector<const DitInfo*>{&high, low ? &*low : nullptr}) {
      if (!d) continue;
      TD_CHECK(want.dim == d->config.dim && want.num_layers == d->config.num_layers &&
                   want.num_heads == d->config.num_heads && want.in_dim == d->config.in_dim,
               Format, "--model ", o.model, " has dim ", want.dim, ", ", want.num_layers, " layers, ", want.num_heads,
               " heads, in_dim ", want.in_dim, " but ", d->what(), " has dim ", d->config.dim, ", ",
               d->config.num_layers, " layers, ", d->config.num_heads, " heads, in_dim ", d->config.in_dim, " (",
               d->config.describe(), ")");
    }
  }

  // The VAE: small, needed to size the latent and to check the DiT against.
  const auto t_vae_load = Clock::now();
  models::wan_vae::WanVaeCheckpoint vae_ck = models::wan_vae::load_wan_vae(o.vae);
  size_t vae_numel = 0;
  for (const auto& [n, t] : vae_ck.tensors) vae_numel += size_t(t.numel());
  std::optional<models::wan_vae::WanVae> vae(std::move(vae_ck));
  double vae_load_s = seconds_since(t_vae_load);
  r.vae_description = vae->config().describe();
  const Device vae_device = o.vae_device.value_or(o.device);
  models::wan_vae::WanVaeRunOptions vae_run;
  vae_run.device = vae_device;
  vae_run.tiling.enabled = o.vae_tiling;
  const size_t vae_params = vae_numel;
  // The TAEHV preview decoder, read now so a bad file fails before any model runs.
  std::optional<models::taehv::TaehvDecoder> taehv;
  models::taehv::TaehvRunOptions taehv_run;
  taehv_run.device = vae_device;
  if (!o.taehv.empty()) {
    const auto t_taehv = Clock::now();
    taehv.emplace(models::taehv::load_taehv(o.taehv));
    vae_load_s += seconds_since(t_taehv);
    TD_CHECK(taehv->config().latent_channels == vae->config().z_dim, Format, "--taehv ", o.taehv, " decodes ",
             taehv->config().latent_channels, "-channel latents but the VAE ", o.vae, " has z_dim ",
             vae->config().z_dim);
    log_info("frames decoded by the TAEHV preview decoder (", o.taehv, ") instead of the Wan VAE");
  }
  r.decoder_description = taehv ? taehv->config().describe() : r.vae_description;
  const int64_t z = vae->config().z_dim, sf = vae->config().spatial_factor(), tf = vae->config().temporal_factor();
  const int64_t cond_channels = o.i2v() ? tf + z : 0;
  TD_CHECK(cfg.out_dim == z && cfg.in_dim == z + cond_channels, Format, "the DiT ", high.what(), " has in_dim ",
           cfg.in_dim, " / out_dim ", cfg.out_dim, " latent channels but the VAE ", o.vae, " has z_dim ", z, ": ",
           o.i2v() ? cat("I2V needs in_dim = 2 z_dim + ", tf, " (noise, mask, image latent) = ", 2 * z + tf,
                         " and out_dim = z_dim")
                   : cat("T2V needs in_dim = out_dim = z_dim", cfg.in_dim == 2 * z + tf
                                                                  ? " (this is an I2V DiT: add --image)"
                                                                  : ""));
  TD_CHECK((o.num_frames - 1) % tf == 0, Usage, "--num-frames ", o.num_frames, ": the VAE ", o.vae, " needs ", tf,
           "k+1 frames");

  // I2V: the image, the size it sets (adaptive), resized as TurboDiffusion does.
  int64_t width = o.width, height = o.height;
  std::optional<Tensor> image;
  if (o.i2v()) {
    const auto t0 = Clock::now();
    const io::RgbImage img = io::read_image_rgb(o.image);
    r.image_width = img.width;
    r.image_height = img.height;
    if (o.adaptive_resolution) std::tie(width, height) = adaptive_resolution(img.width, img.height, o.width, o.height);
    image = image_to_tensor(resize_bilinear_antialias(img, width, height));
    r.image_s += seconds_since(t0);
    log_info("I2V image ", o.image, " (", img.width, "x", img.height, ") -> ", width, "x", height);
  }
  r.width = width;
  r.height = height;
  TD_CHECK(width % sf == 0 && height % sf == 0, Usage, "size ", width, "x", height,
           " is not a multiple of the VAE's spatial factor ", sf, " (", o.vae, ")");
  r.latent_shape = {1, z, (o.num_frames - 1) / tf + 1, height / sf, width / sf};
  TD_CHECK(r.latent_shape[3] % cfg.patch_h == 0 && r.latent_shape[4] % cfg.patch_w == 0, Usage, "size ", width, "x",
           height, ": the latent ", r.latent_shape[4], "x", r.latent_shape[3], " is not a multiple of the DiT's patch ",
           cfg.patch_w, "x", cfg.patch_h);

  // Outputs and seeds.
  for (int64_t k = 0; k < o.num_samples; ++k) {
    r.outputs.push_back(sample_output_path(o.output, k, o.num_samples));
    r.seeds.push_back(o.seed + uint64_t(k));
  }

  // The schedule and which expert runs each step.
  std::optional<sampling::RcmSchedule> rcm;
  std::optional<sampling::FlowSchedule> flow;
  std::vector<bool> high_steps;
  if (o.sampler == SamplerKind::Rcm) {
    rcm = sampling::rcm_schedule(o.num_steps, o.sigma_max);
    high_steps = rcm_high_noise_steps(*rcm, o.boundary);
  } else {
    const auto kind = o.sampler == SamplerKind::UniPC ? sampling::FlowScheduleKind::Wan
                                                      : sampling::FlowScheduleKind::DiffusersEuler;
    flow = sampling::flow_schedule(kind, o.steps, o.shift);
    high_steps = flow_high_noise_steps(*flow, o.boundary);
  }
  std::vector<Component> step_expert;
  for (const bool h : high_steps) {
    step_expert.push_back(!two || h ? Component::Dit : Component::LowNoiseDit);
    r.step_experts.push_back(!two ? "dit" : h ? "high" : "low");
  }

  // The stages and the residency plan.
  std::vector<Component> stages{Component::TextEncoder};
  if (o.i2v()) stages.push_back(Component::Vae);
  // Per batch of samples: the experts in step order, then the VAE.
  const int64_t batches = o.sample_batch == 0 ? 1 : (o.num_samples + o.sample_batch - 1) / o.sample_batch;
  for (int64_t b = 0; b < batches; ++b) {
    for (size_t i = 0; i < step_expert.size(); ++i)
      if (i == 0 || step_expert[i] != step_expert[i - 1]) stages.push_back(step_expert[i]);
    stages.push_back(Component::Vae);
  }
  // The text encoder and the DiTs run on o.device (also when that is the
  // host: the plan is the same and the moves are cheap); the VAE where --vae-device says.
  std::set<Component> gpu_components{Component::TextEncoder, Component::Dit, Component::LowNoiseDit};
  if (vae_device.is_cuda() || (!cuda && vae_device == o.device)) gpu_components.insert(Component::Vae);
  {
    const size_t run_bytes = dtype_size(o.dtype);
    const size_t resident = (high.params + (low ? low->params : 0)) * run_bytes +
                            (vae_device.is_cuda() ? vae_params * 2 : 0);
    const int64_t tokens = r.latent_shape[2] * r.latent_shape[3] * r.latent_shape[4] / cfg.patch_volume();
    // Working-set estimate of one DiT forward: fp32 residual and its
    // temporaries (~16 dim floats per token), the FFN hidden in bf16, 2 GiB slack.
    const size_t working = size_t(tokens) * size_t(16 * cfg.dim + 2 * cfg.ffn_dim) + (size_t(2) << 30);
    const size_t free = cuda ? cuda::device_info(o.device.index).free_memory : ~size_t(0) / 2;
    r.offload = resolve_offload(o.offload, resident, working, free);
    if (cuda && o.offload == OffloadPolicy::Auto)
      log_info("--offload auto: DiT weights ~", double(resident) / double(1ull << 30), " GiB + working set ~",
               double(working) / double(1ull << 30), " GiB vs ", double(free) / double(1ull << 30),
               " GiB free -> ", offload_policy_name(r.offload));
  }
  ResidencyPlan plan = plan_residency(stages, r.offload, gpu_components);

  // The models as the plan moves them.
  std::unique_ptr<models::umt5::UMT5Encoder> encoder;
  struct DitSlot {
    const DitInfo* info = nullptr;
    std::optional<models::wan::WanCheckpoint> host;  // staged copy
    std::unique_ptr<models::wan::WanDiT> dit;        // runnable, on o.device
  };
  std::map<Component, DitSlot> dits;
  dits[Component::Dit].info = &high;
  if (low) dits[Component::LowNoiseDit].info = &*low;
  auto load_options = [&](Device device) {
    models::wan::WanLoadOptions lo;
    lo.device = device;
    lo.dtype = o.dtype;
    lo.config_path = o.dit_config;
    if (o.quant_linear) lo.int8_variant = nn::kDefaultInt8LinearVariant;
    return lo;
  };
  auto make_dit = [&](models::wan::WanCheckpoint ck) {
    nn::AttentionKind attention = o.attention;
    if (o.attention_auto) {
      const auto choice = models::wan::choose_attention("auto", o.device, ck.has_proj_l, o.allow_zero_proj_l);
      attention = choice.kind;
      log_once(LogLevel::Warn, cat("generate attention auto ", ck.detection.description), choice.reason);
    }
    r.attention = nn::attention_kind_name(attention);
    return std::make_unique<models::wan::WanDiT>(std::move(ck), attention, o.sla_topk, o.default_norm);
  };
  auto describe = [&](Component c, const models::wan::WanCheckpoint& ck) {
    TD_CHECK(same_architecture(ck.config, dits.at(c).info->config), Internal, "the DiT ", dits.at(c).info->what(),
             " loaded as ", ck.config.describe(), ", not as first read (", dits.at(c).info->config.describe(), ")");
    (c == Component::Dit ? r.dit_description : r.low_noise_dit_description) = ck.detection.description;
  };
  std::map<Component, ComponentOps> ops;
  ops[Component::TextEncoder] = ComponentOps{
      [&](Device device) {
        models::umt5::UMT5LoadOptions lo;
        lo.device = device;
        lo.dtype = o.dtype;
        encoder = std::make_unique<models::umt5::UMT5Encoder>(models::umt5::load_umt5(o.text_encoder, lo));
      },
      [] { fail(ErrorKind::Internal, "residency: the text encoder is never staged (it runs once)"); },
      [] { fail(ErrorKind::Internal, "residency: the text encoder is never staged (it runs once)"); },
      [] { fail(ErrorKind::Internal, "residency: the text encoder is never offloaded (it runs once)"); },
      [&] { encoder.reset(); }};
  for (auto& [component, slot_ref] : dits) {
    DitSlot* slot = &slot_ref;
    ops[component] = ComponentOps{
        [&, slot, component](Device device) {
          models::wan::WanCheckpoint ck = models::wan::load_wan_checkpoint(slot->info->paths, load_options(device));
          describe(component, ck);
          slot->dit = make_dit(std::move(ck));
        },
        [&, slot, component] {
          slot->host = models::wan::load_wan_checkpoint(slot->info->paths, load_options(Device::cpu()));
          describe(component, *slot->host);
        },
        [&, slot] { slot->dit = make_dit(checkpoint_on(*slot->host, o.device)); },
        [slot] { slot->dit.reset(); },
        [slot] {
          slot->dit.reset();
          slot->host.reset();
        }};
  }
  // The VAE is read above (it sizes the latent), so its load / stage moves
  // have nothing left to do; its device weights are converted at its first
  // use on the device and dropped by an offload.
  ops[Component::Vae] = ComponentOps{[](Device) {}, [] {}, [] {},
                                     [&] {
                                       vae->release_device_weights();
                                       if (taehv) taehv->release_device_weights();
                                     },
                                     [&] {
                                       vae.reset();
                                       taehv.reset();
                                     }};
  Residency residency(std::move(plan), std::move(ops), o.device, two, &r.residency);
  if (cuda) cuda::reset_peak(o.device.index);

  // Text: the prompt (and the negative prompt for guided teacher sampling), once for all samples.
  const bool guided = o.sampler != SamplerKind::Rcm && o.guidance != 1.0;
  Tensor context, negative_context;
  {
    const auto t0 = Clock::now();
    peak.start();
    ProgressBar bar("text", guided ? 3 : 2, "stages");
    const auto tokenizer = models::umt5::UMT5Tokenizer::load(o.tokenizer);
    residency.enter(Component::TextEncoder);
    bar.advance();
    TD_CHECK(tokenizer.vocab_size() <= encoder->config().vocab, Format, "tokenizer ", tokenizer.path(), " has ",
             tokenizer.vocab_size(), " pieces but the text encoder ", o.text_encoder, " has a vocabulary of ",
             encoder->config().vocab, ": they do not belong together");
    TD_CHECK(cfg.text_dim == encoder->config().d_model, Format, "the DiT ", high.what(), " expects text_dim ",
             cfg.text_dim, " but the text encoder ", o.text_encoder, " has d_model ", encoder->config().d_model,
             ": they do not belong together");
    r.text_encoder_description = encoder->config().describe();
    auto encode = [&](const std::string& text, bool record) {
      const auto batch = tokenizer.tokenize({text}, o.max_text_tokens);  // warns when it truncates
      if (record) {
        r.prompt_tokens = batch.lengths[0];
        r.prompt_tokens_untruncated = batch.untruncated[0];
      }
      Tensor hidden = encoder->forward(batch.ids, batch.mask);
      if (!hidden.device().is_cpu()) hidden = hidden.to(Device::cpu());
      return models::umt5::zero_pad_context(hidden, batch.lengths);
    };
    context = encode(o.prompt, true);
    bar.advance();
    if (guided) {
      negative_context = encode(o.negative_prompt, false);
      bar.advance();
    }
    bar.finish();
    if (cuda) cuda::synchronize(o.device.index);
    r.peak_text_bytes = peak.stop();
    r.text_s = seconds_since(t0);
  }

  // I2V: the condition y = concat(mask, VAE latent of [image, zeros]), once for all samples.
  Tensor y;
  if (o.i2v()) {
    const auto t0 = Clock::now();
    peak.start();
    residency.enter(Component::Vae);
    ProgressBar bar("vae encode", 1, "images");
    y = i2v_condition(*vae, *image, o.num_frames, vae_run);
    bar.finish();
    if (cuda) cuda::synchronize(o.device.index);
    r.peak_image_bytes = peak.stop();
    r.image_s += seconds_since(t0);
  }

  // Samples go through the DiT in batches of `batch` (one seed each).
  const int64_t batch = o.sample_batch == 0 ? o.num_samples : std::min(o.sample_batch, o.num_samples);
  const Tensor ctx_one = cuda ? context.to(o.device) : context;
  const Tensor neg_one = negative_context.defined() && cuda ? negative_context.to(o.device) : negative_context;
  // The network sees the state in its run dtype (rCM's reference feeds bf16 latents and condition).
  const DType input_dtype = o.dtype == DType::BF16 ? DType::BF16 : DType::F32;
  const int total_steps = int(step_expert.size());
  for (int64_t first = 0; first < o.num_samples; first += batch) {
    const int64_t n = std::min(batch, o.num_samples - first);
    const std::vector<uint64_t> seeds(r.seeds.begin() + first, r.seeds.begin() + first + n);
    Shape shape = r.latent_shape;
    shape[0] = n;
    const Tensor ctx = repeat_batch(context, n, ctx_one, o.device);
    const Tensor neg = negative_context.defined() ? repeat_batch(negative_context, n, neg_one, o.device) : Tensor();
    // Diffusion.
    Tensor latent;
    {
      const auto t0 = Clock::now();
      peak.start();
      int step = 0;
      std::optional<Component> active;
      auto velocity_with = [&](const Tensor& c) {
        return [&, c](const Tensor& x, double timestep) {
          TD_CHECK(step < total_steps, Internal, "sampler called the model after its last step");
          const Component want = step_expert[size_t(step)];
          if (active != want) {
            residency.enter(want);
            active = want;
          }
          const models::wan::WanDiT& dit = *dits.at(want).dit;
          const Tensor t = Tensor::from_f32({n}, std::vector<float>(size_t(n), float(timestep)));
          const Tensor in = o.i2v() ? concat_channels(x, y) : x;
          Tensor v = dit.forward(in.to(input_dtype), t, c);
          if (cuda) v = v.to(Device::cpu());
          return v;
        };
      };
      const std::string label = o.num_samples == 1 ? std::string("diffusion")
                                : n == 1            ? cat("diffusion ", first + 1, "/", o.num_samples)
                                                    : cat("diffusion ", first + 1, "-", first + n, "/", o.num_samples);
      ProgressBar bar(label, total_steps, "steps");
      auto on_step = [&](int, int, const Tensor&) {
        ++step;
        bar.advance();
      };
      if (rcm) {
        sampling::RcmOptions ro;
        ro.ode = o.ode;
        ro.on_step = on_step;
        ro.sample_seeds = seeds;
        latent = sampling::rcm_sample(shape, seeds[0], *rcm, velocity_with(ctx), ro);
      } else {
        sampling::GuidedVelocity model;
        model.cond = velocity_with(ctx);
        if (neg.defined()) model.uncond = velocity_with(neg);
        model.guidance = o.guidance;
        sampling::FlowOptions fo;
        fo.solver = o.sampler == SamplerKind::UniPC ? sampling::FlowSolver::UniPC : sampling::FlowSolver::Euler;
        fo.on_step = on_step;
        // Stream 0 of each sample's seed: sampling::initial_noise of a one-sample run.
        latent = sampling::flow_sample(sampling::randn_per_sample(shape, seeds, 0, DType::F64), *flow, model, fo);
      }
      if (cuda) cuda::synchronize(o.device.index);
      bar.finish();
      r.peak_diffusion_bytes = std::max(r.peak_diffusion_bytes, peak.stop());
      r.batch_diffusion_s.push_back(seconds_since(t0));
      r.diffusion_s += r.batch_diffusion_s.back();
    }

    // VAE decode on the VAE's device (CUDA: channels-last BF16 with cuDNN
    // convolutions; CPU: the fp32 reference), one sample at a time; frames
    // come back on the host. Then encode and write each.
    residency.enter(Component::Vae);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = first + j;
      Tensor video;
      {
        const auto t0 = Clock::now();
        peak.start();
        ProgressBar bar(taehv ? "taehv decode" : "vae decode", 1, "videos");
        // The sampler's f64 state, as f32 on the host (what every VAE path takes).
        const Tensor lat = latent.slice(0, j, j + 1).contiguous().to(DType::F32);
        video = (taehv ? taehv->decode(lat, taehv_run) : vae->decode(lat, vae_run)).select(0, 0).contiguous();
        if (cuda) cuda::synchronize(o.device.index);
        bar.finish();
        r.peak_vae_bytes = std::max(r.peak_vae_bytes, peak.stop());
        r.sample_vae_s.push_back(seconds_since(t0));
        r.vae_s += r.sample_vae_s.back();
      }
      TD_CHECK(video.shape()[1] == o.num_frames && video.shape()[2] == height && video.shape()[3] == width, Shape,
               "the VAE ", o.vae, " decoded ", shape_str(video.shape()), ", expected [3, ", o.num_frames, ", ",
               height, ", ", width, "]");
      const auto t0 = Clock::now();
      ProgressBar bar("encode", o.num_frames, "frames");
      io::write_video(r.outputs[size_t(k)], video, o.fps, [&bar](int64_t) { bar.advance(); });
      bar.finish();
      r.sample_encode_s.push_back(seconds_since(t0));
      r.encode_s += r.sample_encode_s.back();
    }
  }
  r.vae_s += vae_load_s;
  residency.finish();
  r.peak_gpu_bytes = peak.overall;
  r.total_s = seconds_since(t_start);
  return r;
}

}  // namespace td::pipeline
