#include "models/wan_vae/wan_vae.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/log.h"
#include "io/checkpoint.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/elementwise.h"

namespace td::models::wan_vae {
namespace {

// ---------------------------------------------------------------- loading

WanVaeConfig detect_config(const std::map<std::string, Tensor>& by_name, const std::string& what) {
  WanVaeConfig c;
  const auto shape_of = [&](std::initializer_list<const char*> names) -> const Shape* {
    for (const char* n : names)
      if (auto it = by_name.find(n); it != by_name.end()) return &it->second.shape();
    return nullptr;
  };
  const Shape* stem = shape_of({"encoder.conv1.weight", "encoder.conv_in.weight"});
  const Shape* head = shape_of({"decoder.head.2.weight", "decoder.conv_out.weight"});
  const Shape* post = shape_of({"conv2.weight", "post_quant_conv.weight"});
  if ((!stem && !head) || !post)
    fail(ErrorKind::Format, what, ": not a Wan2.1 VAE checkpoint (none of encoder.conv1 / encoder.conv_in / "
                                  "decoder.head.2 / decoder.conv_out, or no conv2 / post_quant_conv weight)");
  c.base_dim = stem ? (*stem)[0] : (*head)[1] / c.dim_mult.front();
  c.z_dim = (*post)[0];
  c.source = cat(what, " (base_dim and z_dim detected from tensor shapes; other sizes Wan2.1's)");
  if (c.z_dim != int64_t(c.latents_mean.size()))
    fail(ErrorKind::Format, what, ": z_dim ", c.z_dim,
         " detected, but only Wan2.1's 16-channel latent mean/std are known: put the model's diffusers config.json "
         "(with latents_mean and latents_std) beside the weights or pass --config FILE");
  c.validate();
  return c;
}

// ---------------------------------------------------------------- tensors along time

// Concatenates [B, C, t_i, H, W] contiguous f32 tensors along time.
Tensor cat_time(const std::vector<Tensor>& parts) {
  const Tensor& f = parts.front();
  int64_t t = 0;
  for (const Tensor& p : parts) t += p.size(2);
  Tensor out = Tensor::empty({f.size(0), f.size(1), t, f.size(3), f.size(4)}, DType::F32);
  const int64_t hw = f.size(3) * f.size(4), planes = f.size(0) * f.size(1);
  float* o = out.data<float>();
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dst = o + pl * t * hw;
    for (const Tensor& p : parts) {
      const int64_t n = p.size(2) * hw;
      std::memcpy(dst, p.data<float>() + pl * n, size_t(n) * sizeof(float));
      dst += n;
    }
  }
  return out;
}

// A copy-free-when-possible slice with canonical strides: contiguous() keeps
// the odd stride of a size-1 dim, which the row-wise elementwise ops reject.
Tensor dense(const Tensor& x) {
  const Tensor c = x.contiguous();
  return c.view(c.shape());
}
Tensor frames(const Tensor& x, int64_t begin, int64_t end) { return dense(x.slice(2, begin, end)); }
Tensor last_frames(const Tensor& x, int64_t n) { return frames(x, std::max<int64_t>(0, x.size(2) - n), x.size(2)); }
Tensor zero_frames(const Tensor& like, int64_t n) {
  return Tensor::zeros({like.size(0), like.size(1), n, like.size(3), like.size(4)}, DType::F32);
}

// ---------------------------------------------------------------- the network

// Per-convolution history across chunks. `rep` marks a temporal upsample whose
// time_conv was skipped on the first chunk (diffusers' "Rep").
struct CacheEntry {
  Tensor frames;
  bool rep = false;
};
using Cache = std::map<std::string, CacheEntry>;

constexpr int64_t kCacheFrames = 2;

class Net {
 public:
  explicit Net(const std::map<std::string, Tensor>& w) : w_(w) {}

  const Tensor& w(const std::string& name) const {
    auto it = w_.find(name);
    if (it == w_.end()) fail(ErrorKind::Internal, "Wan VAE: tensor ", name, " missing after the load check");
    return it->second;
  }
  bool has(const std::string& name) const { return w_.count(name) != 0; }

  // Causal conv (3x3x3, padding 1): [cached frames | zero frames] in front, so
  // the input always sees kt-1 frames of history; then the cache keeps the
  // last two frames of this call's input (one old frame + one new when the
  // call brings a single frame).
  Tensor causal_conv(Cache& cache, const std::string& name, const Tensor& x) const {
    const Tensor& weight = w(name + ".weight");
    const int64_t history = weight.size(2) - 1, pad = (weight.size(3) - 1) / 2;
    auto it = cache.find(name);
    const Tensor prev = it != cache.end() ? it->second.frames : Tensor();
    Tensor keep = last_frames(x, kCacheFrames);
    if (keep.size(2) < kCacheFrames && prev.defined()) keep = cat_time({last_frames(prev, 1), keep});
    std::vector<Tensor> parts;
    const int64_t have = prev.defined() ? prev.size(2) : 0;
    if (history > have) parts.push_back(zero_frames(x, history - have));
    if (prev.defined()) parts.push_back(prev);
    parts.push_back(x);
    const Tensor y = ops::conv3d(parts.size() == 1 ? x : cat_time(parts), weight, w(name + ".bias"),
                                 ops::ConvOptions::same_pad(pad));
    cache[name] = {keep, false};
    return y;
  }

  Tensor conv1x1(const std::string& name, const Tensor& x) const {
    return ops::conv3d(x, w(name + ".weight"), w(name + ".bias"));
  }

  // A per-frame Conv2d on [B, C, T, H, W]: a conv3d with kt = 1.
  Tensor frame_conv(const std::string& name, const Tensor& x, const ops::ConvOptions& o) const {
    const Tensor& k = w(name + ".weight");
    return ops::conv3d(x, k.view({k.size(0), k.size(1), 1, k.size(2), k.size(3)}), w(name + ".bias"), o);
  }

  Tensor residual(Cache& cache, const std::string& p, const Tensor& x) const {
    const Tensor shortcut = has(p + "shortcut.weight") ? conv1x1(p + "shortcut", x) : x;
    Tensor y = ops::silu(ops::channel_rms_norm(x, w(p + "residual.0.gamma")));
    y = causal_conv(cache, p + "residual.2", y);
    y = ops::silu(ops::channel_rms_norm(y, w(p + "residual.3.gamma")));
    y = causal_conv(cache, p + "residual.6", y);
    ops::add_(y, shortcut);
    return y;
  }

  // Single-head attention over the H*W positions of each frame, scale 1/sqrt(C).
  Tensor attention(const std::string& p, const Tensor& x) const {
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), wd = x.size(4), n = b * t, l = h * wd;
    const Tensor xf = x.permute({0, 2, 1, 3, 4}).contiguous().view({n, c, 1, h, wd});
    const Tensor normed = ops::channel_rms_norm(xf, w(p + "norm.gamma"));
    const Tensor qkv = frame_conv(p + "to_qkv", normed, {}).view({n, 3 * c, l}).permute({0, 2, 1}).contiguous();
    const auto part = [&](int64_t i) { return qkv.slice(2, i * c, (i + 1) * c).contiguous().view({n, l, 1, c}); };
    const Tensor o = ops::attention(part(0), part(1), part(2));  // [n, l, 1, c]
    const Tensor of = o.view({n, l, c}).permute({0, 2, 1}).contiguous().view({n, c, 1, h, wd});
    Tensor y = dense(frame_conv(p + "proj", of, {}).view({b, t, c, h, wd}).permute({0, 2, 1, 3, 4}));
    ops::add_(y, x);
    return y;
  }

  Tensor middle(Cache& cache, const std::string& p, Tensor x) const {
    x = residual(cache, p + "middle.0.", x);
    x = attention(p + "middle.1.", x);
    return residual(cache, p + "middle.2.", x);
  }

  Tensor head(Cache& cache, const std::string& p, const Tensor& x) const {
    return causal_conv(cache, p + "head.2", ops::silu(ops::channel_rms_norm(x, w(p + "head.0.gamma"))));
  }

  // Decoder upsample: for upsample3d first the time_conv doubling the frames
  // (skipped on the first chunk, then zero history instead of that chunk's
  // frame), then per frame nearest 2x and a 3x3 conv halving the channels.
  Tensor upsample(Cache& cache, const std::string& p, Tensor x, bool temporal) const {
    if (temporal) {
      const std::string name = p + "time_conv";
      auto it = cache.find(name);
      if (it == cache.end()) {
        cache[name] = {Tensor(), true};
      } else {
        const CacheEntry prev = it->second;
        Tensor keep = last_frames(x, kCacheFrames);
        if (keep.size(2) < kCacheFrames)
          keep = cat_time({prev.rep ? zero_frames(x, 1) : last_frames(prev.frames, 1), keep});
        std::vector<Tensor> parts;
        const int64_t have = prev.rep ? 0 : prev.frames.size(2);
        if (have < 2) parts.push_back(zero_frames(x, 2 - have));
        if (!prev.rep) parts.push_back(prev.frames);
        parts.push_back(x);
        const Tensor y = ops::conv3d(cat_time(parts), w(name + ".weight"), w(name + ".bias"));  // [B, 2C, t, H, W]
        cache[name] = {keep, false};
        // Channel halves k = 0, 1 become frames 2s + k.
        const int64_t b = x.size(0), c = x.size(1), t = x.size(2), hw = x.size(3) * x.size(4);
        Tensor out = Tensor::empty({b, c, 2 * t, x.size(3), x.size(4)}, DType::F32);
        for (int64_t bi = 0; bi < b; ++bi)
          for (int64_t k = 0; k < 2; ++k)
            for (int64_t ci = 0; ci < c; ++ci)
              for (int64_t s = 0; s < t; ++s)
                std::memcpy(out.data<float>() + ((bi * c + ci) * 2 * t + 2 * s + k) * hw,
                            y.data<float>() + ((bi * 2 * c + k * c + ci) * t + s) * hw, size_t(hw) * sizeof(float));
        x = out;
      }
    }
    return frame_conv(p + "resample.1", ops::upsample_nearest2x(x), ops::ConvOptions::same_pad(1));
  }

  // Encoder downsample: per frame a 3x3 stride-2 conv after a right/bottom zero
  // pad; for downsample3d then a stride-2 (3,1,1) time_conv over [the previous
  // chunk's last frame | this chunk] (the first chunk passes through).
  Tensor downsample(Cache& cache, const std::string& p, Tensor x, bool temporal) const {
    ops::ConvOptions o;
    o.stride_h = o.stride_w = 2;
    o.pad_bottom = o.pad_right = 1;
    x = frame_conv(p + "resample.1", x, o);
    if (!temporal) return x;
    const std::string name = p + "time_conv";
    auto it = cache.find(name);
    if (it == cache.end()) {
      cache[name] = {x, false};
      return x;
    }
    const Tensor keep = last_frames(x, 1);
    ops::ConvOptions ot;
    ot.stride_t = 2;
    const Tensor y = ops::conv3d(cat_time({last_frames(it->second.frames, 1), x}), w(name + ".weight"),
                                 w(name + ".bias"), ot);
    cache[name] = {keep, false};
    return y;
  }

  Tensor decoder(Cache& cache, const WanVaeConfig& c, Tensor x) const {
    x = causal_conv(cache, "decoder.conv1", x);
    x = middle(cache, "decoder.", x);
    const size_t stages = c.dim_mult.size();
    int idx = 0;
    for (size_t i = 0; i < stages; ++i) {
      for (int64_t r = 0; r <= c.num_res_blocks; ++r, ++idx) x = residual(cache, cat("decoder.upsamples.", idx, "."), x);
      if (i + 1 != stages)
        x = upsample(cache, cat("decoder.upsamples.", idx++, "."), x, c.temporal_downsample[stages - 2 - i]);
    }
    return head(cache, "decoder.", x);
  }

  Tensor encoder(Cache& cache, const WanVaeConfig& c, Tensor x) const {
    x = causal_conv(cache, "encoder.conv1", x);
    const size_t stages = c.dim_mult.size();
    int idx = 0;
    for (size_t i = 0; i < stages; ++i) {
      for (int64_t r = 0; r < c.num_res_blocks; ++r, ++idx)
        x = residual(cache, cat("encoder.downsamples.", idx, "."), x);
      if (i + 1 != stages) x = downsample(cache, cat("encoder.downsamples.", idx++, "."), x, c.temporal_downsample[i]);
    }
    x = middle(cache, "encoder.", x);
    return head(cache, "encoder.", x);
  }

 private:
  const std::map<std::string, Tensor>& w_;
};

}  // namespace

std::map<std::string, Tensor> match_wan_vae_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                    const WanVaeConfig& config, const std::string& what,
                                                    std::string* layout) {
  const std::vector<WanVaeTensorSpec> specs = wan_vae_tensor_specs(config);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : tensors) by_name[n] = &t;
  size_t n_orig = 0, n_diff = 0;
  for (const auto& s : specs) {
    n_orig += by_name.count(s.original);
    n_diff += by_name.count(s.diffusers);
  }
  const bool diffusers = n_diff > n_orig;
  if (layout) *layout = diffusers ? "diffusers" : "original";
  std::vector<std::string> missing, shapes;
  std::set<std::string> used;
  std::map<std::string, Tensor> out;
  for (const auto& s : specs) {
    const std::string& src = diffusers ? s.diffusers : s.original;
    auto it = by_name.find(src);
    if (it == by_name.end()) {
      missing.push_back(src);
      continue;
    }
    used.insert(src);
    if (it->second->shape() != s.shape) {
      shapes.push_back(cat(src, " is ", shape_str(it->second->shape()), ", expected ", shape_str(s.shape)));
      continue;
    }
    out[s.original] = *it->second;
  }
  std::vector<std::string> unexpected;
  for (const auto& [n, t] : tensors)
    if (!used.count(n)) unexpected.push_back(n);
  if (missing.empty() && shapes.empty() && unexpected.empty()) return out;
  const auto list = [](const std::vector<std::string>& v) {
    std::string s;
    const size_t show = std::min<size_t>(v.size(), 20);
    for (size_t i = 0; i < show; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > show) s += cat(", ... (", v.size() - show, " more)");
    return s;
  };
  std::string msg = cat(what, ": does not match ", config.describe(), " in the ",
                        diffusers ? "diffusers AutoencoderKLWan" : "original Wan2.1_VAE.pth", " layout:");
  if (!missing.empty()) msg += cat(" ", missing.size(), " missing tensor(s): ", list(missing), ";");
  if (!shapes.empty()) msg += cat(" ", shapes.size(), " mis-shaped: ", list(shapes), ";");
  if (!unexpected.empty()) msg += cat(" ", unexpected.size(), " unexpected: ", list(unexpected), ";");
  fail(ErrorKind::Format, msg);
}

WanVaeCheckpoint load_wan_vae(const std::string& path, const WanVaeLoadOptions& options) {
  const io::TensorFile file = io::read_tensor_file(path);
  WanVaeCheckpoint ck;
  ck.path = path;
  std::string cfg = options.config_path.empty() ? find_wan_vae_config_json(path) : options.config_path;
  if (!cfg.empty()) {
    ck.config = wan_vae_config_from_json(cfg);
  } else {
    std::map<std::string, Tensor> by_name(file.tensors.begin(), file.tensors.end());
    ck.config = detect_config(by_name, path);
  }
  const std::map<std::string, Tensor> src = match_wan_vae_tensors(file.tensors, ck.config, path, &ck.layout);
  for (const auto& [name, t] : src) {
    Tensor f = t.dtype() == DType::F32 ? t : t.to(DType::F32);
    ck.tensors[name] = f.is_contiguous() ? f : f.contiguous();
  }
  log_info("loaded ", ck.config.describe(), " from ", path, " (", ck.layout, " names, ", ck.tensors.size(),
           " tensors)");
  return ck;
}

WanVae::WanVae(WanVaeCheckpoint checkpoint) : ck_(std::move(checkpoint)) {}

void WanVae::check_latent(const Tensor& latent) const {
  TD_CHECK(latent.dim() == 5 && latent.size(1) == ck_.config.z_dim && latent.numel() > 0, Shape,
           "latent must be [B, ", ck_.config.z_dim, ", T, H, W] with no empty dim, got ", latent.desc());
  TD_CHECK(dtype_is_floating(latent.dtype()), DType, "latent must be a floating-point tensor, got ", latent.desc());
}

void WanVae::check_video(const Tensor& video) const {
  TD_CHECK(video.dim() == 5 && video.size(1) == 3 && video.numel() > 0, Shape,
           "video must be [B, 3, F, H, W] with no empty dim, got ", video.desc());
  TD_CHECK(dtype_is_floating(video.dtype()), DType, "video must be a floating-point tensor, got ", video.desc());
  const int64_t tf = ck_.config.temporal_factor(), sf = ck_.config.spatial_factor();
  TD_CHECK((video.size(2) - 1) % tf == 0, Shape, "video has ", video.size(2), " frames; the VAE encodes ", tf,
           "k+1 frames (e.g. ", (video.size(2) - 1) / tf * tf + 1, " or ", ((video.size(2) - 1) / tf + 1) * tf + 1,
           ")");
  TD_CHECK(video.size(3) % sf == 0 && video.size(4) % sf == 0, Shape, "video is ", video.size(3), "x",
           video.size(4), "; height and width must be multiples of ", sf);
}

Tensor WanVae::decode(const Tensor& latent_in) const {
  check_latent(latent_in);
  if (latent_in.device().is_cuda())
    fail(ErrorKind::Unsupported, "VAE on CUDA not implemented yet (decode on the CPU: --device cpu)");
  const WanVaeConfig& c = ck_.config;
  Tensor z = (latent_in.dtype() == DType::F32 ? latent_in : latent_in.to(DType::F32)).clone();
  const int64_t b = z.size(0), ch = z.size(1), t = z.size(2), hw = z.size(3) * z.size(4);
  float* zp = z.data<float>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ci = 0; ci < ch; ++ci) {
      float* p = zp + (bi * ch + ci) * t * hw;
      for (int64_t i = 0; i < t * hw; ++i) p[i] = p[i] * c.latents_std[ci] + c.latents_mean[ci];
    }
  const Net net(ck_.tensors);
  const Tensor x = net.conv1x1("conv2", z);
  Cache cache;
  std::vector<Tensor> out;
  for (int64_t i = 0; i < t; ++i) out.push_back(net.decoder(cache, c, frames(x, i, i + 1)));
  Tensor video = out.size() == 1 ? out.front() : cat_time(out);
  float* v = video.data<float>();
  for (int64_t i = 0; i < video.numel(); ++i) v[i] = std::clamp(v[i], -1.0f, 1.0f);
  return video;
}

Tensor WanVae::encode(const Tensor& video_in) const {
  check_video(video_in);
  if (video_in.device().is_cuda())
    fail(ErrorKind::Unsupported, "VAE on CUDA not implemented yet (encode on the CPU: --device cpu)");
  const WanVaeConfig& c = ck_.config;
  const Tensor video = (video_in.dtype() == DType::F32 ? video_in : video_in.to(DType::F32)).contiguous();
  const int64_t tf = c.temporal_factor(), f = video.size(2);
  const Net net(ck_.tensors);
  Cache cache;
  std::vector<Tensor> out;
  out.push_back(net.encoder(cache, c, frames(video, 0, 1)));
  for (int64_t s = 1; s < f; s += tf) out.push_back(net.encoder(cache, c, frames(video, s, s + tf)));
  const Tensor h = net.conv1x1("conv1", out.size() == 1 ? out.front() : cat_time(out));  // [B, 2z, T, h, w]
  Tensor mu = h.slice(1, 0, c.z_dim).contiguous();
  const int64_t b = mu.size(0), t = mu.size(2), hw = mu.size(3) * mu.size(4);
  float* p = mu.data<float>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ci = 0; ci < c.z_dim; ++ci) {
      float* q = p + (bi * c.z_dim + ci) * t * hw;
      for (int64_t i = 0; i < t * hw; ++i) q[i] = (q[i] - c.latents_mean[ci]) / c.latents_std[ci];
    }
  return mu;
}

}  // namespace td::models::wan_vae
