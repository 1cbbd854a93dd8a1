// `turbodiff bench e2e`: the end-to-end speed of a Wan DiT at real size with
// random weights built on the device (models/wan/wan_random.h; no checkpoint
// file), in TurboDiffusion's cumulative stages (issue 9):
//   a  BF16 dense original attention, default (unfused) norms, 50-step teacher
//      with classifier-free guidance (2 forwards per step)
//   b  + W8A8 INT8 block linears and the fused FastNorm kernels
//   c  + 4-step rCM (1 forward per step, no guidance): the forward of b
//   d  + SageSLA at topk 0.1 (sla when sagesla cannot run here, else not run;
//      the JSON says which attention ran and why). The random model has an SLA
//      proj_l in every block, as TurboDiffusion's SLA checkpoints do, so the
//      linear branch runs (proj_l = 0 would skip it: --no-proj-l).
// Per stage: time per forward (CUDA events after warm-up, the median), the
// diffusion time (forwards x the median; for the rCM stages also the real
// sampler loop, measured), VAE decode and text-encoder times (random-weight
// models, measured once: the same in every stage), peak GPU memory. JSON out;
// `--profile` adds the time per op class of one fully accelerated forward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/profile.h"
#include "models/umt5/umt5_encoder.h"
#include "models/umt5/umt5_loader.h"
#include "models/wan/wan_attention.h"
#include "models/wan/wan_config.h"
#include "models/wan/wan_dit.h"
#include "models/wan/wan_random.h"
#include "models/wan_vae/wan_vae.h"
#include "models/wan_vae/wan_vae_config.h"
#include "ops/random.h"
#include "sampling/noise.h"
#include "sampling/samplers.h"
#include "sampling/schedule.h"

namespace td::app {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct BenchE2eOptions {
  std::string model = "Wan2.1-1.3B";
  std::string config;  // a diffusers config.json instead of --model
  int frames = 0;  // 0: 81 (tiny: 5)
  int height = 0, width = 0;  // 0: the model's resolution (1.3B 480x832, 14B 720x1280, tiny 64x64)
  std::string stages = "a,b,c,d";
  int forwards = 3, warmup = 1;
  int teacher_steps = 50, rcm_steps = 4;
  double sla_topk = 0.1;
  std::string int8_variant;
  std::string device = "auto";
  std::string json_path;
  bool profile = false;
  bool no_sampler = false, no_vae = false, no_text_encoder = false;
  bool switches = false;  // every switch combination instead of the stages
  bool no_proj_l = false;  // default: every block has an SLA proj_l, as TurboDiffusion's SLA checkpoints
  uint64_t seed = 0;
  int text_len = 512;
  int vae_runs = 0;  // timed VAE decodes after an untimed one; 0 = 2 (tiny: 1)
};

struct StageDef {
  std::string id, label;
  bool quant = false, default_norm = false;
  std::string attention = "original";  // "sla" or "sagesla"
  int steps = 0, forwards_per_step = 1;
  bool rcm = false;
  bool fallback = false;  // sagesla: take sla when sagesla cannot run (stage d)
};

struct ForwardKey {
  bool quant, default_norm;
  std::string attention;
  bool fallback;
  bool operator<(const ForwardKey& o) const {
    return std::tie(quant, default_norm, attention, fallback) <
           std::tie(o.quant, o.default_norm, o.attention, o.fallback);
  }
};

struct ForwardResult {
  bool ran = false;
  std::string attention_ran;  // what ran ("" when nothing did)
  json attempts = json::array();  // [{attention, error}] of the paths that could not run
  std::vector<double> ms;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  size_t peak_bytes = 0, weight_bytes = 0;
  double build_s = 0;
  std::optional<double> sampler_s;  // the real rCM sampler loop (rcm steps), wall clock
  int sampler_steps = 0;
  json profile;
};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The model: a preset, "tiny" (CI), or a config.json.
models::wan::WanConfig bench_config(const BenchE2eOptions& o) {
  if (!o.config.empty()) return models::wan::wan_config_from_json(o.config);
  const std::string m = lower(o.model);
  if (m == "wan2.1-1.3b" || m == "1.3b" || m == "wan2.1-t2v-1.3b") return models::wan::wan_preset("Wan2.1-T2V-1.3B");
  if (m == "wan2.1-14b" || m == "14b" || m == "wan2.1-t2v-14b") return models::wan::wan_preset("Wan2.1-T2V-14B");
  if (m == "tiny") {
    models::wan::WanConfig c;
    c.variant = "tiny";
    c.dim = 128;
    c.ffn_dim = 256;
    c.num_heads = 2;
    c.num_layers = 2;
    c.text_dim = 64;
    c.freq_dim = 64;
    c.source = "bench e2e tiny";
    c.validate();
    return c;
  }
  fail(ErrorKind::Usage, "--model ", o.model, ": expected Wan2.1-1.3B, Wan2.1-14B or tiny (or --config config.json)");
}

std::vector<StageDef> all_stages(const BenchE2eOptions& o, DType dtype) {
  const std::string topk = cat(o.sla_topk);
  std::string dt = dtype_name(dtype);
  for (char& c : dt) c = char(std::toupper(static_cast<unsigned char>(c)));
  return {
      {"a", cat(dt, " dense, default norms, ", o.teacher_steps, "-step teacher with CFG"), false, true, "original",
       o.teacher_steps, 2, false},
      {"b", "+ W8A8 + FastNorm", true, false, "original", o.teacher_steps, 2, false},
      {"c", cat("+ ", o.rcm_steps, "-step rCM"), true, false, "original", o.rcm_steps, 1, true},
      {"d", cat("+ SageSLA topk ", topk), true, false, "sagesla", o.rcm_steps, 1, true, true},
  };
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

class DeviceTimer {
 public:
  explicit DeviceTimer(Device d) : cuda_(d.is_cuda()), device_(d) {}
  void start() {
    if (cuda_) {
      a_ = std::make_unique<cuda::Event>();
      b_ = std::make_unique<cuda::Event>();
      a_->record(cuda::current_stream());
    } else {
      t0_ = Clock::now();
    }
  }
  double stop_ms() {
    if (cuda_) {
      b_->record(cuda::current_stream());
      b_->synchronize();
      return double(cuda::Event::elapsed_ms(*a_, *b_));
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  }

 private:
  bool cuda_;
  Device device_;
  std::unique_ptr<cuda::Event> a_, b_;
  Clock::time_point t0_;
};

void sync(Device d) {
  if (d.is_cuda()) cuda::synchronize(d.index);
}

struct Inputs {
  Shape latent_shape;
  Tensor latent, timestep, context;
};

Inputs make_inputs(const models::wan::WanConfig& c, const Shape& latent_shape, int text_len, Device device,
                   DType dtype, uint64_t seed) {
  Inputs in;
  in.latent_shape = latent_shape;
  in.latent = Tensor::empty(latent_shape, DType::F32, device);
  ops::random_fill_(in.latent, seed, 1u << 20, -1.7f, 1.7f);
  in.timestep = Tensor::from_f32({latent_shape[0]}, std::vector<float>(size_t(latent_shape[0]), 500.f));
  in.context = Tensor::empty({latent_shape[0], text_len, c.text_dim}, dtype, device);
  ops::random_fill_(in.context, seed, (1u << 20) + 1, -0.5f, 0.5f);
  return in;
}

ForwardResult measure_forward(const BenchE2eOptions& o, const models::wan::WanConfig& cfg, const ForwardKey& key,
                              const Inputs& in, Device device, DType dtype, nn::Int8LinearVariant variant,
                              int sampler_steps, bool profile) {
  ForwardResult r;
  std::vector<std::string> kinds = {key.attention};
  if (key.attention == "sagesla" && key.fallback) kinds.push_back("sla");
  for (const std::string& kind_name : kinds) {
    const nn::AttentionKind kind = *nn::parse_attention_kind(kind_name);
    try {
      if (device.is_cuda()) {
        sync(device);
        cuda::reset_peak(device.index);
      }
      const auto t0 = Clock::now();
      models::wan::RandomWanOptions ro;
      ro.device = device;
      ro.dtype = dtype;
      if (key.quant) ro.int8_variant = variant;
      ro.with_proj_l = !o.no_proj_l;
      ro.seed = o.seed;
      models::wan::WanCheckpoint ck = models::wan::random_wan_checkpoint(cfg, ro);
      r.weight_bytes = ck.device_bytes;
      const models::wan::WanDiT model(std::move(ck), kind, o.sla_topk, key.default_norm);
      sync(device);
      r.build_s = std::chrono::duration<double>(Clock::now() - t0).count();

      DeviceTimer timer(device);
      for (int i = 0; i < o.warmup; ++i) (void)model.forward(in.latent, in.timestep, in.context);
      sync(device);
      for (int i = 0; i < o.forwards; ++i) {
        timer.start();
        (void)model.forward(in.latent, in.timestep, in.context);
        r.ms.push_back(timer.stop_ms());
      }
      r.median_ms = median_of(r.ms);
      r.min_ms = *std::min_element(r.ms.begin(), r.ms.end());
      r.max_ms = *std::max_element(r.ms.begin(), r.ms.end());

      if (profile) {
        prof::enable(device.is_cuda());
        timer.start();
        (void)model.forward(in.latent, in.timestep, in.context);
        const double total = timer.stop_ms();
        const prof::Summary s = prof::collect();
        prof::disable();
        double covered = 0;
        json classes = json::object();
        for (size_t c = 0; c < size_t(prof::OpClass::Count); ++c) {
          classes[prof::op_class_name(prof::OpClass(c))] = {{"ms", s.ms[c]}, {"calls", s.calls[c]}};
          covered += s.ms[c];
        }
        classes["other"] = {{"ms", std::max(0.0, total - covered)},
                            {"note", "elementwise ops, embeddings, patchify/unpatchify, launch gaps: the forward's "
                                     "total minus the classes above"}};
        r.profile = {{"forward_ms", total}, {"classes", classes},
                     {"note", "CUDA events around each layer call of one forward (a profiled forward is slightly "
                              "slower than an unprofiled one: the events)"}};
      }

      if (sampler_steps > 0) {
        // The real rCM loop: host f64 state, fresh noise per step, the forward on the device.
        const sampling::RcmSchedule schedule = sampling::rcm_schedule(sampler_steps);
        const Tensor ctx = in.context;
        auto velocity = [&](const Tensor& x, double timestep) {
          const Tensor t = Tensor::from_f32({1}, {float(timestep)});
          Tensor v = model.forward(x.to(DType::F32), t, ctx);
          return device.is_cuda() ? v.to(Device::cpu()) : v;
        };
        sync(device);
        const auto s0 = Clock::now();
        (void)sampling::rcm_sample(in.latent_shape, o.seed, schedule, velocity);
        sync(device);
        r.sampler_s = std::chrono::duration<double>(Clock::now() - s0).count();
        r.sampler_steps = sampler_steps;
      }
      if (device.is_cuda()) r.peak_bytes = cuda::peak_allocated_bytes(device.index);
      r.ran = true;
      r.attention_ran = kind_name;
      return r;
    } catch (const Error& e) {
      // Unsupported: this attention path cannot run here; try the next (sagesla -> sla).
      // Anything else ends this stage with the error in the JSON; the other stages still run.
      r.attempts.push_back({{"attention", kind_name}, {"error", e.what()}, {"kind", error_kind_name(e.kind())}});
      log_warn("bench e2e: --attention ", kind_name, ": ", e.what());
      if (e.kind() != ErrorKind::Unsupported) break;
    } catch (const std::exception& e) {
      r.attempts.push_back({{"attention", kind_name}, {"error", e.what()}});
      log_warn("bench e2e: --attention ", kind_name, ": ", e.what());
      break;
    }
  }
  if (device.is_cuda()) {
    try {
      sync(device);
    } catch (const Error&) {
    }
  }
  return r;
}

// Random-weight Wan2.1 VAE decode of the latent (the CUDA channels-last path on a GPU).
json measure_vae(const models::wan::WanConfig& cfg, const Inputs& in, Device device, bool tiny, uint64_t seed,
                 int reps) {
  namespace vae = models::wan_vae;
  try {
    vae::WanVaeCheckpoint ck;
    if (tiny) ck.config.base_dim = 8;
    ck.config.z_dim = cfg.out_dim;
    ck.config.source = tiny ? "bench e2e tiny VAE" : "Wan2.1 VAE sizes";
    ck.path = "random weights";
    ck.layout = "original";
    uint64_t stream = 1u << 24;
    for (const auto& s : vae::wan_vae_tensor_specs(ck.config)) {
      Tensor t = Tensor::empty(s.shape, DType::F32);
      int64_t fan_in = 1;
      for (size_t d = 1; d < s.shape.size(); ++d) fan_in *= s.shape[d];
      const bool gamma = s.original.find("gamma") != std::string::npos;
      const float b = s.shape.size() >= 2 ? float(1.0 / std::sqrt(double(fan_in))) : 0.02f;
      ops::random_fill_(t, seed, stream++, gamma ? 0.9f : -b, gamma ? 1.1f : b);
      ck.tensors[s.original] = std::move(t);
    }
    const vae::WanVae model(std::move(ck));
    vae::WanVaeRunOptions ro;
    ro.device = device;
    // the DiT's output is f32 on the device; the VAE takes it as it is
    std::vector<double> s;
    for (int i = 0; i < reps + 1; ++i) {  // the first decode converts the weights for the device: not timed
      sync(device);
      const auto t0 = Clock::now();
      (void)model.decode(in.latent, ro);
      sync(device);
      if (i > 0 || reps == 0) s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return {{"available", true},
            {"decode_s", median_of(s)},
            {"runs", s.size()},
            {"device", device.str()},
            {"note", "random-weight Wan2.1 VAE, latent as the DiT's, video returned to the host (included); "
                     "median after one untimed decode"}};
  } catch (const std::exception& e) {
    return {{"available", false}, {"error", e.what()}};
  }
}

// Random-weight umT5 encoder (XXL at real size) on the prompt length Wan uses.
json measure_text_encoder(Device device, DType dtype, bool tiny, int text_len, uint64_t seed, int reps) {
  namespace t5 = models::umt5;
  try {
    t5::UMT5Weights w;
    w.config = t5::umt5_xxl_config();
    if (tiny) {
      w.config.d_model = 64, w.config.d_kv = 16, w.config.num_heads = 4, w.config.d_ff = 128, w.config.num_layers = 2;
      w.config.source = "bench e2e tiny umT5";
    }
    // The token table stays on the host (only the prompt's rows are gathered):
    // a 4096-row slice stands in for the 256384 rows, which changes nothing timed.
    w.config.vocab = 4096;
    w.config.source += " (random weights, token table cut to 4096 rows)";
    w.layout = t5::UMT5Layout::Wan;
    w.path = "random weights";
    w.dtype = dtype;
    w.device = device;
    const auto& c = w.config;
    uint64_t stream = 1u << 26;
    auto fill = [&](const Shape& shape, DType dt, Device dev, float lo, float hi) {
      Tensor t = Tensor::empty(shape, dt, dev);
      ops::random_fill_(t, seed, stream++, lo, hi);
      return t;
    };
    const float bd = float(1.0 / std::sqrt(double(c.d_model))), bi = float(1.0 / std::sqrt(double(c.inner_dim()))),
                bf = float(1.0 / std::sqrt(double(c.d_ff)));
    w.token_embedding = fill({c.vocab, c.d_model}, DType::F32, Device::cpu(), -1.f, 1.f);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      t5::UMT5Layer l;
      l.norm1 = fill({c.d_model}, DType::F32, device, 0.9f, 1.1f);
      l.q = fill({c.inner_dim(), c.d_model}, dtype, device, -bd, bd);
      l.k = fill({c.inner_dim(), c.d_model}, dtype, device, -bd, bd);
      l.v = fill({c.inner_dim(), c.d_model}, dtype, device, -bd, bd);
      l.o = fill({c.d_model, c.inner_dim()}, dtype, device, -bi, bi);
      l.norm2 = fill({c.d_model}, DType::F32, device, 0.9f, 1.1f);
      l.gate = fill({c.d_ff, c.d_model}, dtype, device, -bd, bd);
      l.fc1 = fill({c.d_ff, c.d_model}, dtype, device, -bd, bd);
      l.fc2 = fill({c.d_model, c.d_ff}, dtype, device, -bf, bf);
      l.relative_bias = fill({c.num_buckets, c.num_heads}, DType::F32, device, -1.f, 1.f);
      w.layers.push_back(std::move(l));
    }
    w.final_norm = fill({c.d_model}, DType::F32, device, 0.9f, 1.1f);
    const t5::UMT5Encoder enc(std::move(w));
    Tensor ids = Tensor::empty({1, text_len}, DType::I64);
    Tensor mask = Tensor::empty({1, text_len}, DType::I64);
    for (int i = 0; i < text_len; ++i) {
      ids.data<int64_t>()[i] = 2 + (int64_t(i) * 7919) % (c.vocab - 2);
      mask.data<int64_t>()[i] = 1;
    }
    std::vector<double> s;
    for (int i = 0; i < reps + 1; ++i) {
      sync(device);
      const auto t0 = Clock::now();
      (void)enc.forward(ids, mask);
      sync(device);
      if (i > 0 || reps == 0) s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return {{"available", true},     {"encode_s", median_of(s)}, {"runs", s.size()},
            {"tokens", text_len},    {"model", c.describe()},    {"device", device.str()},
            {"note", "umT5 encoder with random weights, one prompt of text_len tokens, median after one untimed run"}};
  } catch (const std::exception& e) {
    return {{"available", false}, {"error", e.what()}};
  }
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", s);
  return b;
}

int run_bench_e2e(const BenchE2eOptions& o) {
  const models::wan::WanConfig cfg = bench_config(o);
  const bool tiny = cfg.variant == "tiny";
  const bool gpu = cuda::device_count() > 0;
  const std::string device_name = o.device == "auto" ? (gpu ? "cuda" : "cpu") : o.device;
  if (device_name == "cuda" && !gpu)
    fail(ErrorKind::Unsupported, "--device cuda: no usable CUDA GPU (", cuda::unavailable_reason(), ")");
  const Device device = device_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const DType dtype = device.is_cuda() ? DType::BF16 : DType::F32;
  const auto variant = o.int8_variant.empty() ? std::optional(nn::kDefaultInt8LinearVariant)
                                              : nn::parse_int8_linear_variant(o.int8_variant);
  if (!variant) fail(ErrorKind::Usage, "--int8-variant ", o.int8_variant, ": expected token128, block128 or post-scale");

  // Resolution: the model's own unless given.
  int height = o.height, width = o.width;
  if (height == 0 || width == 0) {
    const bool big = cfg.dim >= 5120;
    height = height ? height : (tiny ? 64 : big ? 720 : 480);
    width = width ? width : (tiny ? 64 : big ? 1280 : 832);
  }
  const int frames = o.frames > 0 ? o.frames : (tiny ? 5 : 81);
  TD_CHECK(frames >= 1 && (frames - 1) % 4 == 0, Usage, "--frames ", frames, ": must be 4k + 1 (Wan's VAE)");
  TD_CHECK(height % 16 == 0 && width % 16 == 0 && height > 0 && width > 0, Usage, "--height ", height, " --width ",
           width, ": must be positive multiples of 16");
  const Shape latent_shape = {1, cfg.in_dim, (frames - 1) / 4 + 1, height / 8, width / 8};
  const int64_t tokens = latent_shape[2] * (latent_shape[3] / cfg.patch_h) * (latent_shape[4] / cfg.patch_w);

  std::vector<StageDef> stages;
  if (o.switches) {
    // Issue 7's switch matrix: one forward of every combination, no fallback.
    for (const bool quant : {false, true})
      for (const bool default_norm : {true, false})
        for (const char* attn : {"original", "sla", "sagesla"}) {
          StageDef s;
          s.id = cat(quant ? "w8a8" : "float", "-", default_norm ? "default" : "fused", "-", attn);
          s.label = cat(quant ? cat("W8A8 ", nn::int8_linear_variant_name(*variant)) : std::string(dtype_name(dtype)),
                        ", ", default_norm ? "default norms" : "FastNorm", ", ", attn,
                        std::string(attn) == "original" ? std::string() : cat(" topk ", o.sla_topk));
          s.quant = quant;
          s.default_norm = default_norm;
          s.attention = attn;
          s.steps = 1;
          stages.push_back(s);
        }
  } else {
    std::stringstream ss(o.stages);
    std::string id;
    const auto defs = all_stages(o, dtype);
    while (std::getline(ss, id, ',')) {
      auto it = std::find_if(defs.begin(), defs.end(), [&](const StageDef& s) { return s.id == id; });
      TD_CHECK(it != defs.end(), Usage, "--stages ", o.stages, ": unknown stage '", id, "' (a, b, c, d)");
      stages.push_back(*it);
    }
    TD_CHECK(!stages.empty(), Usage, "--stages: give at least one of a, b, c, d");
  }

  json out;
  out["command"] = "bench e2e";
  out["mode"] = o.switches ? "switches" : "stages";
  out["model"] = cfg.describe();
  out["model_name"] = cfg.variant;
  out["frames"] = frames;
  out["height"] = height;
  out["width"] = width;
  out["latent"] = latent_shape;
  out["tokens"] = tokens;
  out["text_len"] = o.text_len;
  out["device"] = device.str();
  out["dtype"] = dtype_name(dtype);
  out["int8_variant"] = nn::int8_linear_variant_name(*variant);
  out["proj_l"] = !o.no_proj_l ? "random, in every block (a TurboDiffusion SLA checkpoint's layout: stage d runs the "
                                 "linear branch)"
                               : "none (--no-proj-l: sla/sagesla run proj_l = 0, which skips the linear branch)";
  out["forwards_timed"] = o.forwards;
  out["warmup"] = o.warmup;
  if (device.is_cuda()) {
    const auto info = cuda::device_info(device.index);
    out["gpu"] = {{"name", info.name},
                  {"cc", cat(info.cc_major, ".", info.cc_minor)},
                  {"sms", info.sm_count},
                  {"memory_bytes", info.total_memory},
                  {"driver", cuda::driver_version()},
                  {"runtime", cuda::runtime_version()}};
  }

  const Inputs in = make_inputs(cfg, latent_shape, o.text_len, device, dtype, o.seed);

  // One measurement per distinct forward (stage c reuses b's forward), in stage order.
  std::map<ForwardKey, ForwardResult> results;
  json vae, text;  // null until measured

  // The JSON of what has been measured so far: written to --json after every
  // measurement, so a run cut short (a time limit) still leaves its numbers.
  const auto assemble = [&]() {
    out["vae"] = vae.is_null() ? json{{"available", false}, {"error", "not measured yet"}} : vae;
    out["text_encoder"] = text.is_null() ? json{{"available", false}, {"error", "not measured yet"}} : text;
    out.erase("profile");
    json js = json::array();
    for (const StageDef& s : stages) {
      const ForwardKey key{s.quant, s.default_norm, s.attention, s.fallback};
      json j;
      j["stage"] = s.id;
      j["label"] = s.label;
      j["steps"] = s.steps;
      j["forwards_per_step"] = s.forwards_per_step;
      j["forwards"] = s.steps * s.forwards_per_step;
      j["linears"] = s.quant ? cat("W8A8 ", nn::int8_linear_variant_name(*variant)) : std::string(dtype_name(dtype));
      j["norms"] = s.default_norm ? "default (unfused)" : "fused (FastNorm)";
      j["attention_requested"] = s.attention == "sagesla" ? cat("sagesla topk ", o.sla_topk) : s.attention;
      const auto it = results.find(key);
      if (it == results.end()) {
        j["ran"] = false;
        j["pending"] = true;
        js.push_back(j);
        continue;
      }
      const ForwardResult& r = it->second;
      j["ran"] = r.ran;
      if (!r.attempts.empty()) j["attention_refused"] = r.attempts;
      if (r.ran) {
        j["attention"] = r.attention_ran == "original" ? r.attention_ran : cat(r.attention_ran, " topk ", o.sla_topk);
        if (s.attention == "sagesla" && r.attention_ran != "sagesla")
          j["attention_note"] = cat("sagesla could not run here; ", r.attention_ran, " ran instead");
        j["forward_ms"] = r.median_ms;
        j["forward_ms_min"] = r.min_ms;
        j["forward_ms_max"] = r.max_ms;
        j["forward_ms_all"] = r.ms;
        const double diffusion = double(s.steps * s.forwards_per_step) * r.median_ms / 1000.0;
        j["diffusion_s"] = diffusion;
        j["diffusion_from"] = cat(s.steps * s.forwards_per_step,
                                  " forwards x the median forward (sampler overhead not included)");
        if (s.rcm && r.sampler_s) {
          j["sampler_s"] = *r.sampler_s;
          j["sampler_note"] = cat("the real ", r.sampler_steps,
                                  "-step rCM loop (host f64 state, fresh noise per step, latent to and velocity from "
                                  "the device each step), wall clock");
        }
        j["peak_gpu_bytes"] = device.is_cuda() ? json(r.peak_bytes) : json(nullptr);
        j["dit_weight_bytes"] = r.weight_bytes;
        j["build_s"] = r.build_s;
        double total = diffusion;
        bool complete = true;
        const json& v = out["vae"];
        const json& t = out["text_encoder"];
        if (v.value("available", false)) total += v["decode_s"].get<double>();
        else complete = false;
        if (t.value("available", false)) total += t["encode_s"].get<double>();
        else complete = false;
        j["total_s"] = total;
        j["total_note"] = complete ? "text encoder + diffusion + VAE decode (MP4 encoding not included)"
                                   : "diffusion plus the parts that ran (see vae / text_encoder)";
        if (!r.profile.is_null()) {
          json p = r.profile;
          p["stage"] = s.id;
          p["label"] = s.label;
          p["attention"] = j["attention"];
          out["profile"] = p;
        }
      }
      js.push_back(j);
    }
    out["stages"] = js;
  };
  const auto write_json = [&]() {
    if (o.json_path.empty()) return;
    const std::string tmp = o.json_path + ".partial";
    {
      std::ofstream f(tmp);
      TD_CHECK(bool(f), Io, "--json ", o.json_path, ": cannot write ", tmp);
      f << out.dump(1) << "\n";
      TD_CHECK(bool(f), Io, "--json ", o.json_path, ": write failed");
    }
    TD_CHECK(std::rename(tmp.c_str(), o.json_path.c_str()) == 0, Io, "--json ", o.json_path, ": cannot rename ", tmp);
  };

  const StageDef* profiled = nullptr;
  for (const StageDef& s : stages) profiled = &s;  // the last (most accelerated) stage asked for
  for (const StageDef& s : stages) {
    const ForwardKey key{s.quant, s.default_norm, s.attention, s.fallback};
    int sampler = (s.rcm && !o.no_sampler) ? s.steps : 0;
    auto it = results.find(key);
    if (it != results.end() && (sampler == 0 || it->second.sampler_s || !it->second.ran)) continue;
    std::fprintf(stderr, "bench e2e: stage %s (%s): building %s and timing %d forwards...\n", s.id.c_str(),
                 s.label.c_str(), cfg.variant.c_str(), o.forwards);
    ForwardResult r = measure_forward(o, cfg, key, in, device, dtype, *variant, sampler,
                                      o.profile && &s == profiled);
    results[key] = std::move(r);
    assemble();
    write_json();
  }

  vae = o.no_vae ? json{{"available", false}, {"error", "skipped (--no-vae)"}}
                 : measure_vae(cfg, in, device, tiny, o.seed, o.vae_runs > 0 ? o.vae_runs : tiny ? 1 : 2);
  assemble();
  write_json();
  text = o.no_text_encoder ? json{{"available", false}, {"error", "skipped (--no-text-encoder)"}}
                           : measure_text_encoder(device, dtype, tiny, o.text_len, o.seed, tiny ? 1 : 3);
  assemble();
  const json& js = out["stages"];

  // A short table on stderr, the JSON on stdout or in --json.
  int idw = 6;
  for (const auto& j : js) idw = std::max(idw, int(j["stage"].get<std::string>().size()));
  std::fprintf(stderr, "\n%-*s %-48s %-22s %12s %12s %10s\n", idw, "stage", "", "attention", "forward ms",
               "diffusion s", "peak GiB");
  for (const auto& j : js) {
    if (!j["ran"].get<bool>()) {
      std::fprintf(stderr, "%-*s %-48s not run: %s\n", idw, j["stage"].get<std::string>().c_str(),
                   j["label"].get<std::string>().c_str(), j.contains("attention_refused") ? "attention refused" : "?");
      continue;
    }
    std::fprintf(stderr, "%-*s %-48s %-22s %12.2f %12s %10.2f\n", idw, j["stage"].get<std::string>().c_str(),
                 j["label"].get<std::string>().c_str(), j["attention"].get<std::string>().c_str(),
                 j["forward_ms"].get<double>(), fmt_s(j["diffusion_s"].get<double>()).c_str(),
                 j["peak_gpu_bytes"].is_null() ? 0.0 : double(j["peak_gpu_bytes"].get<size_t>()) / double(1ull << 30));
  }
  std::fprintf(stderr, "VAE decode: %s   text encoder: %s\n",
               vae.value("available", false) ? (fmt_s(vae["decode_s"].get<double>()) + " s").c_str() : "not available",
               text.value("available", false) ? (fmt_s(text["encode_s"].get<double>()) + " s").c_str()
                                              : "not available");
  if (o.json_path.empty()) {
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    write_json();
    std::fprintf(stderr, "JSON written to %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace

void register_bench(CLI::App& app, Commands& cmds) {
  auto* bench = app.add_subcommand("bench", "Benchmarks of whole models (random weights at real size)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchE2eOptions>();
  auto* e2e = bench->add_subcommand(
      "e2e", "Wan DiT end to end in TurboDiffusion's cumulative stages (a: BF16 dense 50-step teacher with CFG, b: + "
             "W8A8 + FastNorm, c: + 4-step rCM, d: + SageSLA), random weights built on the device; JSON out");
  e2e->add_option("--model", o->model, "Wan2.1-1.3B (480p), Wan2.1-14B (720p) or tiny (CI)");
  e2e->add_option("--config", o->config, "a diffusers config.json instead of --model");
  e2e->add_option("--frames", o->frames, "video frames (4k + 1; default 81, tiny 5)")->check(CLI::Range(0, 1025));
  e2e->add_option("--height", o->height, "pixels (default: 480 for 1.3B, 720 for 14B)")->check(CLI::Range(0, 4096));
  e2e->add_option("--width", o->width, "pixels (default: 832 for 1.3B, 1280 for 14B)")->check(CLI::Range(0, 4096));
  e2e->add_option("--stages", o->stages, "comma-separated subset of a,b,c,d (default all)");
  e2e->add_option("--forwards", o->forwards, "timed forwards per distinct configuration (median reported)")
      ->check(CLI::Range(1, 1000));
  e2e->add_option("--warmup", o->warmup, "untimed forwards first")->check(CLI::Range(0, 100));
  e2e->add_option("--teacher-steps", o->teacher_steps, "steps of the teacher stages a, b (default 50)")
      ->check(CLI::Range(1, 1000));
  e2e->add_option("--rcm-steps", o->rcm_steps, "steps of the rCM stages c, d (default 4)")->check(CLI::Range(1, 4));
  e2e->add_option("--sla-topk", o->sla_topk, "stage d: fraction of key blocks kept (default 0.1)")
      ->check(CLI::Range(1e-6, 1.0));
  e2e->add_option("--int8-variant", o->int8_variant, "W8A8 variant of stages b-d: token128 (default), block128, post-scale")
      ->check(CLI::IsMember({"token128", "block128", "post-scale"}));
  e2e->add_option("--device", o->device, "cuda or cpu (default: cuda when a GPU is usable)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  e2e->add_option("--json", o->json_path, "write the JSON here instead of stdout");
  e2e->add_flag("--profile", o->profile,
                "time per op class (GEMM, attention, norm, other) of one forward of the last stage asked for");
  e2e->add_flag("--no-proj-l", o->no_proj_l,
                "no SLA proj_l in the blocks (by default every block has a random one, as TurboDiffusion's SLA "
                "checkpoints, so stage d runs SLA's linear branch too)");
  e2e->add_flag("--switches", o->switches,
                "instead of the stages: one forward (timed as the stages are) of every switch combination: float / "
                "W8A8 x default norms / FastNorm x original / sla / sagesla (no fallback: what cannot run says why)");
  e2e->add_flag("--no-sampler", o->no_sampler, "skip the real rCM sampler loop of stages c, d");
  e2e->add_flag("--no-vae", o->no_vae, "skip the VAE decode");
  e2e->add_flag("--no-text-encoder", o->no_text_encoder, "skip the umT5 encoder");
  e2e->add_option("--seed", o->seed, "Philox seed of the random weights and inputs");
  e2e->add_option("--vae-runs", o->vae_runs, "timed VAE decodes after an untimed one (default 2, tiny 1)")
      ->check(CLI::Range(0, 100));
  e2e->add_option("--text-len", o->text_len, "context tokens (default 512, as Wan)")->check(CLI::Range(1, 4096));
  cmds.emplace_back(e2e, [o] { return run_bench_e2e(*o); });
}

}  // namespace td::app
