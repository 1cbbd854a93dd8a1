// The TAEHV decoder (see taehv.h for the network and its conventions).
#include "models/taehv/taehv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "ops/conv.h"
#include "ops/taehv.h"

namespace td::models::taehv {
namespace {

std::string key(int64_t i, const std::string& rest) { return cat("decoder.", i, ".", rest); }

// Index of the first MemBlock of stage s, and of its TGrow and conv.
int64_t stage_base(int s) { return 3 + 6 * s; }
int64_t tgrow_index(int s) { return stage_base(s) + 4; }
int64_t stage_conv_index(int s) { return stage_base(s) + 5; }
constexpr int64_t kFinalConv = 22;

struct Expected {
  std::string name;
  Shape shape;
  bool tgrow = false;  // rows may exceed shape[0] (a stride-2-trained TGrow used with stride 1)
};

std::vector<Expected> expected_tensors(const TaehvConfig& c) {
  const int64_t lc = c.latent_channels;
  std::vector<Expected> e;
  e.push_back({key(1, "weight"), {c.n_f[0], lc, 3, 3}});
  e.push_back({key(1, "bias"), {c.n_f[0]}});
  for (int s = 0; s < 3; ++s) {
    const int64_t n = c.n_f[s];
    for (int k = 0; k < 3; ++k) {
      const int64_t i = stage_base(s) + k;
      e.push_back({key(i, "conv.0.weight"), {n, 2 * n, 3, 3}});
      e.push_back({key(i, "conv.0.bias"), {n}});
      e.push_back({key(i, "conv.2.weight"), {n, n, 3, 3}});
      e.push_back({key(i, "conv.2.bias"), {n}});
      e.push_back({key(i, "conv.4.weight"), {n, n, 3, 3}});
      e.push_back({key(i, "conv.4.bias"), {n}});
    }
    e.push_back({key(tgrow_index(s), "conv.weight"), {n * c.time_stride[s], n, 1, 1}, true});
    e.push_back({key(stage_conv_index(s), "weight"), {c.n_f[s + 1], n, 3, 3}});
  }
  e.push_back({key(kFinalConv, "weight"), {3, c.n_f[3], 3, 3}});
  e.push_back({key(kFinalConv, "bias"), {3}});
  return e;
}

std::string list(const std::vector<std::string>& v) {
  std::string s;
  const size_t show = std::min<size_t>(v.size(), 20);
  for (size_t i = 0; i < show; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > show) s += cat(", ... (", v.size() - show, " more)");
  return s;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

std::string TaehvConfig::describe() const {
  return cat("TAEHV decoder (", latent_channels, " latent channels, widths ", n_f[0], "/", n_f[1], "/", n_f[2], "/",
             n_f[3], ", time strides ", time_stride[0], "/", time_stride[1], "/", time_stride[2], ")");
}

bool looks_like_taehv(const std::vector<std::string>& names) {
  bool dec = false, dec_mem = false, enc_mem = false, enc = false;
  for (const auto& n : names) {
    if (n == "decoder.1.weight") dec = true;
    if (n == "decoder.3.conv.0.weight") dec_mem = true;
    if (n == "encoder.0.weight") enc = true;
    if (n == "encoder.4.conv.0.weight") enc_mem = true;
  }
  return (dec && dec_mem) || (enc && enc_mem);
}

TaehvCheckpoint match_taehv_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::string& what) {
  std::map<std::string, Tensor> by_name;
  TaehvCheckpoint ck;
  ck.path = what;
  for (const auto& [n, t] : tensors) {
    by_name[n] = t;
    if (starts_with(n, "encoder.")) ck.has_encoder = true;
  }
  std::vector<std::string> names;
  for (const auto& [n, t] : by_name) names.push_back(n);
  TD_CHECK(looks_like_taehv(names), Format, what,
           ": not a TAEHV checkpoint (expected madebyollin/taehv's 'decoder.1.weight', 'decoder.3.conv.0.weight', "
           "... names, as in taew2_1.pth)");
  TD_CHECK(by_name.count("decoder.1.weight"), Unsupported, what,
           ": a TAEHV checkpoint without its decoder (no 'decoder.1.weight'); only the decoder is implemented");
  TD_CHECK(!by_name.count("decoder.0.weight"), Unsupported, what,
           ": a TAEHV 'super' decoder (1x1 conv at decoder.0, ConvNeXt-style MemBlocks) is not supported; use "
           "taew2_1.pth");
  const Tensor& first = by_name["decoder.1.weight"];
  TD_CHECK(first.dim() == 4, Format, what, ": decoder.1.weight must be [256, 16, 3, 3], got ", first.desc());
  TaehvConfig& c = ck.config;
  c.latent_channels = first.size(1);
  c.n_f[0] = first.size(0);
  for (int s = 0; s < 3; ++s) {
    const auto it = by_name.find(key(stage_conv_index(s), "weight"));
    if (it != by_name.end() && it->second.dim() == 4) c.n_f[s + 1] = it->second.size(0);
  }
  if (const auto it = by_name.find(key(kFinalConv, "weight")); it != by_name.end() && it->second.dim() == 4)
    TD_CHECK(it->second.size(0) == 3, Unsupported, what, ": decoder.22.weight has ", it->second.size(0),
             " output channels (", it->second.size(0) / 3,
             "x pixel shuffle: taew2_2 / taehv1_5 style); only the patch-size-1 decoder of taew2_1 (3 output "
             "channels) is supported");
  TD_CHECK(c.latent_channels == 16, Unsupported, what, ": a TAEHV decoder for ", c.latent_channels,
           "-channel latents; only Wan2.1's 16-channel latents (taew2_1) are supported");

  std::vector<std::string> missing, shapes, unexpected;
  std::map<std::string, bool> used;
  for (const Expected& e : expected_tensors(c)) {
    const auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      missing.push_back(e.name);
      continue;
    }
    used[e.name] = true;
    const Tensor& t = it->second;
    bool ok = t.shape() == e.shape;
    if (!ok && e.tgrow && t.dim() == 4 && t.size(1) == e.shape[1] && t.size(2) == 1 && t.size(3) == 1 &&
        t.size(0) > e.shape[0] && t.size(0) % e.shape[1] == 0)
      ok = true;
    if (!ok || !dtype_is_floating(t.dtype())) {
      shapes.push_back(cat(e.name, " ", t.desc(), " (expected ", shape_str(e.shape), " float)"));
      continue;
    }
    Tensor f = t.dtype() == DType::F32 ? t : t.to(DType::F32);
    if (t.size(0) > e.shape[0]) f = f.slice(0, t.size(0) - e.shape[0], t.size(0));  // the last rows
    ck.tensors[e.name] = f.contiguous().clone();
  }
  for (const auto& n : names)
    if (!used.count(n) && !starts_with(n, "encoder.")) unexpected.push_back(n);
  if (!missing.empty() || !shapes.empty() || !unexpected.empty()) {
    std::string msg = cat(what, ": does not match the ", c.describe(), " in taew2_1.pth's layout:");
    if (!missing.empty()) msg += cat(" ", missing.size(), " missing tensor(s): ", list(missing), ";");
    if (!shapes.empty()) msg += cat(" ", shapes.size(), " mis-shaped: ", list(shapes), ";");
    if (!unexpected.empty()) msg += cat(" ", unexpected.size(), " unexpected: ", list(unexpected), ";");
    fail(ErrorKind::Format, msg);
  }
  return ck;
}

TaehvCheckpoint load_taehv(const std::string& path) {
  const io::TensorFile file = io::read_tensor_file(path);
  TaehvCheckpoint ck = match_taehv_tensors(file.tensors, path);
  ck.path = path;
  log_info("loaded ", ck.config.describe(), " from ", path, " (", ck.tensors.size(), " decoder tensors",
           ck.has_encoder ? "; encoder tensors ignored" : "", ")");
  return ck;
}

TaehvCheckpoint random_taehv_checkpoint(const TaehvConfig& c, uint32_t seed) {
  TaehvCheckpoint ck;
  ck.config = c;
  ck.path = "random";
  std::mt19937 rng(seed);
  for (const Expected& e : expected_tensors(c)) {
    Tensor t = Tensor::empty(e.shape, DType::F32);
    const bool bias = e.shape.size() == 1;
    const double fan_in = bias ? 1.0 : double(t.numel() / e.shape[0]);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const float a = bias ? 0.05f : float(std::sqrt(3.0 / fan_in));
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = a * u(rng);
    ck.tensors[e.name] = t;
  }
  return ck;
}

int64_t default_taehv_chunk() {
  static const int64_t v = [] {
    const char* e = std::getenv("TURBODIFF_TAEHV_CHUNK");
    if (!e || !*e) return int64_t(4);
    char* end = nullptr;
    const long long n = std::strtoll(e, &end, 10);
    TD_CHECK(end && *end == 0 && n >= 0, Usage, "TURBODIFF_TAEHV_CHUNK='", e,
             "': expected a number of latent frames >= 0 (0 = all)");
    return int64_t(n);
  }();
  return v;
}

// ---------------------------------------------------------------- decoder

struct TaehvDecoder::Weights {
  std::map<std::string, Tensor> w;  // conv weights [Co, 1, kh, kw, Ci] in the run dtype; biases f32 [Co]
  Tensor out_scale, out_shift;      // f32 [3]: [0, 1] -> [-1, 1]
};

struct TaehvDecoder::Cache {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Weights>> by_key;
};

TaehvDecoder::TaehvDecoder(TaehvCheckpoint checkpoint)
    : ck_(std::move(checkpoint)), cache_(std::make_unique<Cache>()) {}
TaehvDecoder::~TaehvDecoder() = default;

void TaehvDecoder::release_device_weights() const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  cache_->by_key.clear();
}

const TaehvDecoder::Weights& TaehvDecoder::weights(Device device, DType dtype) const {
  std::lock_guard<std::mutex> lock(cache_->mu);
  const std::string k = cat(device.str(), "/", dtype_name(dtype));
  if (auto it = cache_->by_key.find(k); it != cache_->by_key.end()) return *it->second;
  auto w = std::make_unique<Weights>();
  const auto put = [&](const Tensor& host) { return device.is_cpu() ? host : host.to(device); };
  for (const auto& [name, t] : ck_.tensors) {
    if (t.dim() == 4)
      w->w[name] = ops::conv_weight_to_cl(t.view({t.size(0), t.size(1), 1, t.size(2), t.size(3)}), dtype, device);
    else
      w->w[name] = put(t);
  }
  w->out_scale = put(Tensor::from_f32({3}, {2.f, 2.f, 2.f}));
  w->out_shift = put(Tensor::from_f32({3}, {-1.f, -1.f, -1.f}));
  if (device.is_cuda()) log_info("TAEHV: weights converted to ", dtype_name(dtype), " channels-last on ", device.str());
  return *(cache_->by_key[k] = std::move(w));
}

void TaehvDecoder::check_latent(const Tensor& latent) const {
  TD_CHECK(latent.dim() == 5 && latent.size(1) == ck_.config.latent_channels && latent.numel() > 0, Shape,
           "TAEHV: latent must be [B, ", ck_.config.latent_channels, ", T, H, W] with no empty dim, got ",
           latent.desc());
  TD_CHECK(dtype_is_floating(latent.dtype()), DType, "TAEHV: latent must be a floating-point tensor, got ",
           latent.desc());
}

namespace {

// A per-frame convolution (kt = 1) of x [1, T, H, W, Ci]; on CUDA, split
// along T so no single cuDNN call sees a tensor of 2^31 elements or more
// (all 84 frames of a 480p video at once would), exact since frames are
// independent.
Tensor conv_frames(const Tensor& x, const Tensor& w, const Tensor& b, const ops::ConvOptions& o) {
  const int64_t t = x.size(1), co = w.size(0);
  const int64_t per_frame = std::max(x.numel() / std::max<int64_t>(t, 1), x.size(2) * x.size(3) * co);
  const int64_t limit = int64_t(1) << 30;
  if (x.device().is_cpu() || per_frame * t < limit || t <= 1) return ops::conv3d_cl(x, w, b, o);
  const int64_t step = std::max<int64_t>(1, limit / per_frame);
  std::vector<Tensor> parts;
  for (int64_t f = 0; f < t; f += step) parts.push_back(ops::conv3d_cl(x.slice(1, f, std::min(t, f + step)), w, b, o));
  return ops::cat_frames_cl(parts);
}

struct Net {
  const std::map<std::string, Tensor>& w;
  const Tensor& get(const std::string& n) const {
    const auto it = w.find(n);
    TD_CHECK(it != w.end(), Internal, "TAEHV: weight ", n, " not loaded");
    return it->second;
  }
  Tensor conv3(const Tensor& x, int64_t i, const std::string& sub, bool bias) const {
    const std::string p = sub.empty() ? cat("decoder.", i, ".") : cat("decoder.", i, ".", sub, ".");
    return conv_frames(x, get(p + "weight"), bias ? get(p + "bias") : Tensor(), ops::ConvOptions::same_pad(1));
  }
  // MemBlock i: x [1, T, H, W, C]; mem: its input's last frame from the previous chunk (updated).
  Tensor memblock(const Tensor& x, int64_t i, Tensor& mem) const {
    Tensor h = conv3(ops::memblock_input_cl(x, mem), i, "conv.0", true);
    ops::relu_(h);
    h = conv3(h, i, "conv.2", true);
    ops::relu_(h);
    h = conv3(h, i, "conv.4", true);
    ops::add_relu_(h, x);
    mem = x.slice(1, x.size(1) - 1, x.size(1)).clone();
    return h;
  }
};

Tensor host_f32(const Tensor& x) {
  Tensor h = x.device().is_cpu() ? x : x.to(Device::cpu());
  if (h.dtype() != DType::F32) h = h.to(DType::F32);
  return h.is_contiguous() ? h : h.contiguous();
}

}  // namespace

Tensor TaehvDecoder::decode(const Tensor& latent_in, const TaehvRunOptions& o) const {
  check_latent(latent_in);
  const TaehvConfig& c = ck_.config;
  const Device device = o.device.value_or(latent_in.device());
  DType dt = DType::F32;
  if (device.is_cpu()) {
    TD_CHECK(!o.dtype || *o.dtype == DType::F32, Unsupported, "TAEHV: on the CPU the decoder runs in f32, not ",
             dtype_name(*o.dtype));
  } else {
    dt = o.dtype.value_or(DType::BF16);
    TD_CHECK(dt == DType::BF16 || dt == DType::F32, Unsupported, "TAEHV: on CUDA the decoder runs in bf16 or f32, not ",
             dtype_name(dt));
  }
  TD_CHECK(o.latent_frames_per_chunk >= 0, Usage, "TAEHV: latent frames per chunk must be >= 0 (0 = all), got ",
           o.latent_frames_per_chunk);
  const Tensor latent = host_f32(latent_in);
  const Weights& W = weights(device, dt);
  const Net net{W.w};
  const int64_t b = latent.size(0), t = latent.size(2), sf = c.spatial_factor();
  const int64_t hh = latent.size(3) * sf, ww = latent.size(4) * sf, tu = c.t_upscale(), trim = c.frames_to_trim();
  const int64_t frames_out = c.frames_out(t);
  const int64_t chunk = o.latent_frames_per_chunk == 0 ? t : std::min(o.latent_frames_per_chunk, t);
  Tensor video = Tensor::empty({b, 3, frames_out, hh, ww}, DType::F32);
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor zb = latent.slice(0, bi, bi + 1);
    if (device.is_cuda()) zb = zb.to(device);
    std::vector<Tensor> mem(kFinalConv);
    int64_t written = 0;
    for (int64_t c0 = 0; c0 < t; c0 += chunk) {
      const int64_t n = std::min(chunk, t - c0);
      Tensor x = ops::to_channels_last(zb, c0, n, dt);  // [1, n, h, w, 16]
      ops::tanh_clamp3_(x);
      x = net.conv3(x, 1, "", true);
      ops::relu_(x);
      for (int s = 0; s < 3; ++s) {
        for (int k = 0; k < 3; ++k) {
          const int64_t i = stage_base(s) + k;
          x = net.memblock(x, i, mem[size_t(i)]);
        }
        x = ops::upsample_nearest2x_cl(x);
        x = conv_frames(x, net.get(key(tgrow_index(s), "conv.weight")), Tensor(), {});
        if (c.time_stride[s] == 2) x = ops::channel_halves_to_frames_cl(x);
        x = net.conv3(x, stage_conv_index(s), "", false);
      }
      ops::relu_(x);
      x = net.conv3(x, kFinalConv, "", true);  // [1, tu n, H, W, 3]
      const int64_t g0 = c0 * tu, skip = std::max<int64_t>(0, trim - g0), nf = x.size(1) - skip;
      if (nf <= 0) continue;
      const Tensor y = x.slice(1, skip, x.size(1));
      const int64_t f0 = g0 + skip - trim;
      Tensor vb = video.slice(0, bi, bi + 1);
      if (device.is_cpu()) {
        ops::to_channels_first(y, vb, f0, W.out_scale, W.out_shift, true);
      } else {
        Tensor dev_chunk = Tensor::empty({1, 3, nf, hh, ww}, DType::F32, device);
        ops::to_channels_first(y, dev_chunk, 0, W.out_scale, W.out_shift, true);
        vb.slice(2, f0, f0 + nf).copy_(dev_chunk.to(Device::cpu()));
      }
      written += nf;
    }
    TD_CHECK(written == frames_out, Internal, "TAEHV: decoded ", written, " frames, expected ", frames_out);
  }
  return video;
}

}  // namespace td::models::taehv
