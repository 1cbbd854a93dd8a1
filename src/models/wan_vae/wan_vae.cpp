#include "models/wan_vae/wan_vae.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <mutex>
#include <set>

#include "core/log.h"
#include "io/checkpoint.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

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

// The decoder's and encoder's block order, shared by the channel-first
// reference network (Net) and the channels-last one (ClNet): each supplies
// causal_conv, middle, residual, upsample / downsample and head.
template <typename Network>
Tensor decoder_graph(const Network& n, Cache& cache, const WanVaeConfig& c, Tensor x) {
  x = n.causal_conv(cache, "decoder.conv1", x);
  x = n.middle(cache, "decoder.", x);
  const size_t stages = c.dim_mult.size();
  int idx = 0;
  for (size_t i = 0; i < stages; ++i) {
    for (int64_t r = 0; r <= c.num_res_blocks; ++r, ++idx) x = n.residual(cache, cat("decoder.upsamples.", idx, "."), x);
    if (i + 1 != stages)
      x = n.upsample(cache, cat("decoder.upsamples.", idx++, "."), x, c.temporal_downsample[stages - 2 - i]);
  }
  return n.head(cache, "decoder.", x);
}

template <typename Network>
Tensor encoder_graph(const Network& n, Cache& cache, const WanVaeConfig& c, Tensor x) {
  x = n.causal_conv(cache, "encoder.conv1", x);
  const size_t stages = c.dim_mult.size();
  int idx = 0;
  for (size_t i = 0; i < stages; ++i) {
    for (int64_t r = 0; r < c.num_res_blocks; ++r, ++idx)
      x = n.residual(cache, cat("encoder.downsamples.", idx, "."), x);
    if (i + 1 != stages) x = n.downsample(cache, cat("encoder.downsamples.", idx++, "."), x, c.temporal_downsample[i]);
  }
  x = n.middle(cache, "encoder.", x);
  return n.head(cache, "encoder.", x);
}

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

  Tensor decoder(Cache& cache, const WanVaeConfig& c, Tensor x) const { return decoder_graph(*this, cache, c, x); }
  Tensor encoder(Cache& cache, const WanVaeConfig& c, Tensor x) const { return encoder_graph(*this, cache, c, x); }

 private:
  const std::map<std::string, Tensor>& w_;
};

// ---------------------------------------------------------------- the channels-last network

// The same network over [1, T, H, W, C] activations and the *_cl ops: the
// CUDA path (BF16) and, on the host, its fp32 twin. Weights: conv kernels
// [Co, kt, kh, kw, Ci] in the run dtype, the attention's to_qkv / proj as
// [Co, Ci] matrices in the run dtype, biases and gammas f32 [C]; all on the
// run device.
Tensor cl_frames(const Tensor& x, int64_t begin, int64_t end) { return x.slice(1, begin, end); }
Tensor cl_last_frames(const Tensor& x, int64_t n) { return cl_frames(x, std::max<int64_t>(0, x.size(1) - n), x.size(1)); }
Tensor cl_zero_frames(const Tensor& like, int64_t n) {
  return Tensor::zeros({like.size(0), n, like.size(2), like.size(3), like.size(4)}, like.dtype(), like.device());
}

class ClNet {
 public:
  explicit ClNet(const std::map<std::string, Tensor>& w) : w_(w) {}

  const Tensor& w(const std::string& name) const {
    auto it = w_.find(name);
    if (it == w_.end()) fail(ErrorKind::Internal, "Wan VAE: tensor ", name, " missing from the device weights");
    return it->second;
  }
  bool has(const std::string& name) const { return w_.count(name) != 0; }

  // As Net::causal_conv.
  Tensor causal_conv(Cache& cache, const std::string& name, const Tensor& x) const {
    const Tensor& weight = w(name + ".weight");
    const int64_t history = weight.size(1) - 1, pad = (weight.size(2) - 1) / 2;
    auto it = cache.find(name);
    const Tensor prev = it != cache.end() ? it->second.frames : Tensor();
    Tensor keep = cl_last_frames(x, kCacheFrames);
    if (keep.size(1) < kCacheFrames && prev.defined()) keep = ops::cat_frames_cl({cl_last_frames(prev, 1), keep});
    std::vector<Tensor> parts;
    const int64_t have = prev.defined() ? prev.size(1) : 0;
    if (history > have) parts.push_back(cl_zero_frames(x, history - have));
    if (prev.defined()) parts.push_back(prev);
    parts.push_back(x);
    const Tensor y = ops::conv3d_cl(parts.size() == 1 ? x : ops::cat_frames_cl(parts), weight, w(name + ".bias"),
                                    ops::ConvOptions::same_pad(pad));
    cache[name] = {keep, false};
    return y;
  }

  Tensor conv(const std::string& name, const Tensor& x, const ops::ConvOptions& o = {}) const {
    return ops::conv3d_cl(x, w(name + ".weight"), w(name + ".bias"), o);
  }

  Tensor residual(Cache& cache, const std::string& p, const Tensor& x) const {
    const Tensor shortcut = has(p + "shortcut.weight") ? conv(p + "shortcut", x) : x;
    Tensor y = ops::channel_rms_norm_cl(x, w(p + "residual.0.gamma"), true);
    y = causal_conv(cache, p + "residual.2", y);
    y = ops::channel_rms_norm_cl(y, w(p + "residual.3.gamma"), true);
    y = causal_conv(cache, p + "residual.6", y);
    ops::add_(y, shortcut);
    return y;
  }

  // Single-head attention over each frame's H*W positions, scale 1/sqrt(C),
  // as GEMMs: the head dim (C = 384 in Wan2.1's middle blocks) is beyond the
  // fused attention kernels (cuDNN SDPA, flash: up to 128 / 256). Scores are
  // f32, probabilities in the run dtype; V's bias is added after P.V (rows of
  // P sum to 1), so V is computed transposed straight from the GEMM.
  Tensor attention(const std::string& p, const Tensor& x) const {
    const int64_t t = x.size(1), h = x.size(2), wd = x.size(3), c = x.size(4), l = h * wd;
    const Tensor normed = ops::channel_rms_norm_cl(x, w(p + "norm.gamma"), false).view({t * l, c});
    const Tensor& wqkv = w(p + "to_qkv.weight");  // [3C, C]
    const Tensor& bqkv = w(p + "to_qkv.bias");    // [3C] f32
    const auto rows = [](const Tensor& m, int64_t i, int64_t c) { return m.slice(0, i * c, (i + 1) * c); };
    const float scale = float(1.0 / std::sqrt(double(c)));
    // Query rows per score block: the f32 scores stay near 256 MB.
    const int64_t block = std::max<int64_t>(1, (int64_t(64) << 20) / l);
    std::vector<Tensor> out_frames;
    for (int64_t f = 0; f < t; ++f) {
      const Tensor xf = normed.slice(0, f * l, (f + 1) * l);
      const Tensor q = ops::linear(xf, rows(wqkv, 0, c), rows(bqkv, 0, c));
      const Tensor k = ops::linear(xf, rows(wqkv, 1, c), rows(bqkv, 1, c));
      const Tensor vt = ops::linear(rows(wqkv, 2, c), xf, Tensor());  // [C, l]
      std::vector<Tensor> parts;
      for (int64_t q0 = 0; q0 < l; q0 += block) {
        const int64_t q1 = std::min(l, q0 + block);
        const Tensor s = ops::linear(q.slice(0, q0, q1), k, Tensor(), DType::F32);  // [lq, l]
        const Tensor prob = ops::softmax_rows(s, scale, x.dtype());
        parts.push_back(ops::linear(prob, vt, rows(bqkv, 2, c)).view({1, q1 - q0, 1, 1, c}));
      }
      const Tensor o = (parts.size() == 1 ? parts.front() : ops::cat_frames_cl(parts)).view({l, c});
      out_frames.push_back(ops::linear(o, w(p + "proj.weight"), w(p + "proj.bias")).view({1, 1, h, wd, c}));
    }
    Tensor y = out_frames.size() == 1 ? out_frames.front() : ops::cat_frames_cl(out_frames);
    ops::add_(y, x);
    return y;
  }

  Tensor middle(Cache& cache, const std::string& p, Tensor x) const {
    x = residual(cache, p + "middle.0.", x);
    x = attention(p + "middle.1.", x);
    return residual(cache, p + "middle.2.", x);
  }

  Tensor head(Cache& cache, const std::string& p, const Tensor& x) const {
    return causal_conv(cache, p + "head.2", ops::channel_rms_norm_cl(x, w(p + "head.0.gamma"), true));
  }

  // As Net::upsample.
  Tensor upsample(Cache& cache, const std::string& p, Tensor x, bool temporal) const {
    if (temporal) {
      const std::string name = p + "time_conv";
      auto it = cache.find(name);
      if (it == cache.end()) {
        cache[name] = {Tensor(), true};
      } else {
        const CacheEntry prev = it->second;
        Tensor keep = cl_last_frames(x, kCacheFrames);
        if (keep.size(1) < kCacheFrames)
          keep = ops::cat_frames_cl({prev.rep ? cl_zero_frames(x, 1) : cl_last_frames(prev.frames, 1), keep});
        std::vector<Tensor> parts;
        const int64_t have = prev.rep ? 0 : prev.frames.size(1);
        if (have < 2) parts.push_back(cl_zero_frames(x, 2 - have));
        if (!prev.rep) parts.push_back(prev.frames);
        parts.push_back(x);
        const Tensor y = conv(name, ops::cat_frames_cl(parts));  // [1, t, H, W, 2C]
        cache[name] = {keep, false};
        x = ops::channel_halves_to_frames_cl(y);
      }
    }
    return conv(p + "resample.1", ops::upsample_nearest2x_cl(x), ops::ConvOptions::same_pad(1));
  }

  // As Net::downsample.
  Tensor downsample(Cache& cache, const std::string& p, Tensor x, bool temporal) const {
    ops::ConvOptions o;
    o.stride_h = o.stride_w = 2;
    o.pad_bottom = o.pad_right = 1;
    x = conv(p + "resample.1", x, o);
    if (!temporal) return x;
    const std::string name = p + "time_conv";
    auto it = cache.find(name);
    if (it == cache.end()) {
      cache[name] = {x, false};
      return x;
    }
    const Tensor keep = cl_last_frames(x, 1);
    ops::ConvOptions ot;
    ot.stride_t = 2;
    const Tensor y = conv(name, ops::cat_frames_cl({cl_last_frames(it->second.frames, 1), x}), ot);
    cache[name] = {keep, false};
    return y;
  }

  Tensor decoder(Cache& cache, const WanVaeConfig& c, Tensor x) const { return decoder_graph(*this, cache, c, x); }
  Tensor encoder(Cache& cache, const WanVaeConfig& c, Tensor x) const { return encoder_graph(*this, cache, c, x); }

 private:
  const std::map<std::string, Tensor>& w_;
};

// ---------------------------------------------------------------- tiling

// diffusers' blend_v / blend_h on host f32 [B, C, T, H, W] tiles, in place on b:
// the first `extent` rows (columns) of b become a linear mix from a's last
// rows (columns) to b's own.
void blend_v(const Tensor& a, Tensor& b, int64_t extent) {
  const int64_t ah = a.size(3), bh = b.size(3), w = b.size(4);
  extent = std::min({ah, bh, extent});
  const int64_t planes = b.size(0) * b.size(1) * b.size(2);
  const float* ap = a.data<float>();
  float* bp = b.data<float>();
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t y = 0; y < extent; ++y) {
      const float wa = float(1.0 - double(y) / double(extent)), wb = float(double(y) / double(extent));
      const float* ar = ap + (pl * ah + ah - extent + y) * a.size(4);
      float* br = bp + (pl * bh + y) * w;
      for (int64_t x = 0; x < w; ++x) br[x] = ar[x] * wa + br[x] * wb;
    }
}

void blend_h(const Tensor& a, Tensor& b, int64_t extent) {
  const int64_t aw = a.size(4), bw = b.size(4), h = b.size(3);
  extent = std::min({aw, bw, extent});
  const int64_t planes = b.size(0) * b.size(1) * b.size(2);
  const float* ap = a.data<float>();
  float* bp = b.data<float>();
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t y = 0; y < h; ++y) {
      const float* ar = ap + (pl * a.size(3) + y) * aw;
      float* br = bp + (pl * h + y) * bw;
      for (int64_t x = 0; x < extent; ++x) {
        const float wa = float(1.0 - double(x) / double(extent)), wb = float(double(x) / double(extent));
        br[x] = ar[aw - extent + x] * wa + br[x] * wb;
      }
    }
}

// Runs `one` on overlapping spatial tiles of x [B, C, T, H, W] (host f32) and
// blends the results as diffusers' tiled_decode / tiled_encode do. Sizes in
// x's units (in) and the result's (out = in * out_per_in_num / out_per_in_den).
Tensor tiled(const Tensor& x, int64_t tile_h, int64_t tile_w, int64_t stride_h, int64_t stride_w, int64_t out_h,
             int64_t out_w, int64_t out_stride_h, int64_t out_stride_w, int64_t blend_h_extent,
             int64_t blend_w_extent, const std::function<Tensor(const Tensor&)>& one) {
  const int64_t h = x.size(3), w = x.size(4);
  std::vector<std::vector<Tensor>> rows;
  for (int64_t i = 0; i < h; i += stride_h) {
    std::vector<Tensor> row;
    for (int64_t j = 0; j < w; j += stride_w)
      row.push_back(one(x.slice(3, i, std::min(h, i + tile_h)).slice(4, j, std::min(w, j + tile_w)).contiguous()));
    rows.push_back(std::move(row));
  }
  const Tensor& f = rows.front().front();
  Tensor out = Tensor::empty({f.size(0), f.size(1), f.size(2), out_h, out_w}, DType::F32);
  const int64_t planes = f.size(0) * f.size(1) * f.size(2);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j) {
      Tensor& tile = rows[i][j];
      if (i > 0) blend_v(rows[i - 1][j], tile, blend_h_extent);
      if (j > 0) blend_h(rows[i][j - 1], tile, blend_w_extent);
      const int64_t y0 = int64_t(i) * out_stride_h, x0 = int64_t(j) * out_stride_w;
      const int64_t ch = std::min({tile.size(3), out_stride_h, out_h - y0});
      const int64_t cw = std::min({tile.size(4), out_stride_w, out_w - x0});
      for (int64_t pl = 0; pl < planes; ++pl)
        for (int64_t y = 0; y < ch; ++y)
          std::memcpy(out.data<float>() + (pl * out_h + y0 + y) * out_w + x0,
                      tile.data<float>() + (pl * tile.size(3) + y) * tile.size(4), size_t(cw) * sizeof(float));
    }
  return out;
}

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

// ---------------------------------------------------------------- WanVae

void WanVaeTiling::validate(int64_t sf) const {
  if (!enabled) return;
  for (const auto& [v, name] : {std::pair{tile_height, "tile height"}, std::pair{tile_width, "tile width"},
                                std::pair{stride_height, "tile stride height"},
                                std::pair{stride_width, "tile stride width"}})
    TD_CHECK(v > 0 && v % sf == 0, Usage, "VAE tiling: ", name, " ", v, " must be a positive multiple of ", sf,
             " pixels");
  TD_CHECK(stride_height <= tile_height && stride_width <= tile_width, Usage, "VAE tiling: the stride ",
           stride_height, "x", stride_width, " must not exceed the tile ", tile_height, "x", tile_width,
           " (tiles overlap by tile - stride)");
}

std::string WanVaeTiling::describe() const {
  if (!enabled) return "off";
  return cat(tile_height, "x", tile_width, " every ", stride_height, "x", stride_width);
}

struct WanVae::DeviceWeights {
  std::map<std::string, Tensor> w;
  Tensor mean, std, inv_std, neg_mean_over_std;  // f32 [z_dim] on the device
};

struct WanVae::DeviceCache {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<DeviceWeights>> by_key;  // "device/dtype"
};

WanVae::WanVae(WanVaeCheckpoint checkpoint) : ck_(std::move(checkpoint)), dev_(std::make_unique<DeviceCache>()) {}
WanVae::~WanVae() = default;

void WanVae::release_device_weights() const {
  std::lock_guard<std::mutex> lock(dev_->mu);
  dev_->by_key.clear();
}

const WanVae::DeviceWeights& WanVae::device_weights(Device device, DType dtype) const {
  std::lock_guard<std::mutex> lock(dev_->mu);
  const std::string key = cat(device.str(), "/", dtype_name(dtype));
  auto it = dev_->by_key.find(key);
  if (it != dev_->by_key.end()) return *it->second;
  auto dw = std::make_unique<DeviceWeights>();
  const auto put_f32 = [&](const Tensor& host) {
    const Tensor flat = host.view({host.numel()});
    return device.is_cpu() ? flat : flat.to(device);
  };
  for (const auto& [name, t] : ck_.tensors) {
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const bool attn = name.find("to_qkv.weight") != std::string::npos || name.find("proj.weight") != std::string::npos;
    if (weight && attn) {  // [Co, Ci, 1, 1] -> a [Co, Ci] matrix
      Tensor m = t.view({t.size(0), t.size(1)});
      if (dtype != DType::F32) m = m.to(dtype);
      dw->w[name] = device.is_cpu() ? m : m.to(device);
    } else if (weight && (t.dim() == 5 || t.dim() == 4)) {
      const Tensor k5 = t.dim() == 5 ? t : t.view({t.size(0), t.size(1), 1, t.size(2), t.size(3)});
      dw->w[name] = ops::conv_weight_to_cl(k5, dtype, device);
    } else {
      dw->w[name] = put_f32(t);
    }
  }
  const WanVaeConfig& c = ck_.config;
  std::vector<float> inv(c.latents_std.size()), nm(c.latents_std.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    inv[i] = 1.0f / c.latents_std[i];
    nm[i] = -c.latents_mean[i] / c.latents_std[i];
  }
  const int64_t z = c.z_dim;
  dw->mean = put_f32(Tensor::from_f32({z}, c.latents_mean));
  dw->std = put_f32(Tensor::from_f32({z}, c.latents_std));
  dw->inv_std = put_f32(Tensor::from_f32({z}, inv));
  dw->neg_mean_over_std = put_f32(Tensor::from_f32({z}, nm));
  if (device.is_cuda())
    log_info("Wan VAE: weights converted to ", dtype_name(dtype), " channels-last on ", device.str());
  return *(dev_->by_key[key] = std::move(dw));
}

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

namespace {

Tensor host_f32(const Tensor& x) {
  Tensor h = x.device().is_cpu() ? x : x.to(Device::cpu());
  if (h.dtype() != DType::F32) h = h.to(DType::F32);
  return dense(h);
}

// The channels-last path's dtype on `device`.
DType cl_dtype(Device device, const WanVaeRunOptions& o) {
  if (device.is_cpu()) {
    TD_CHECK(!o.dtype || *o.dtype == DType::F32, Unsupported, "Wan VAE: on the CPU the VAE runs in f32, not ",
             dtype_name(*o.dtype));
    return DType::F32;
  }
  const DType d = o.dtype.value_or(DType::BF16);
  TD_CHECK(d == DType::BF16 || d == DType::F32, Unsupported, "Wan VAE: on CUDA the VAE runs in bf16 (or f32), not ",
           dtype_name(d));
  return d;
}

void clamp_(Tensor& t) {
  float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = std::clamp(v[i], -1.0f, 1.0f);
}

// Copies a device f32 [1, C, f, H, W] chunk into frames [t0, t0 + f) of sample b of host out [B, C, T, H, W].
void put_chunk(Tensor& out, int64_t b, int64_t t0, const Tensor& chunk) {
  const Tensor host = chunk.device().is_cpu() ? chunk : chunk.to(Device::cpu());
  const int64_t c = out.size(1), t = out.size(2), hw = out.size(3) * out.size(4), f = chunk.size(2);
  for (int64_t ci = 0; ci < c; ++ci)
    std::memcpy(out.data<float>() + ((b * c + ci) * t + t0) * hw, host.data<float>() + ci * f * hw,
                size_t(f * hw) * sizeof(float));
}

}  // namespace

Tensor WanVae::decode(const Tensor& latent_in, const WanVaeRunOptions& options) const {
  check_latent(latent_in);
  const WanVaeConfig& c = ck_.config;
  const int64_t sf = c.spatial_factor();
  options.tiling.validate(sf);
  WanVaeRunOptions o = options;
  o.device = options.device.value_or(latent_in.device());
  const Tensor latent = host_f32(latent_in);  // small; each sample / tile goes to the device on its own
  const WanVaeTiling& tl = o.tiling;
  const int64_t h = latent.size(3), w = latent.size(4);
  if (tl.enabled && (w > tl.tile_width / sf || h > tl.tile_height / sf)) {
    Tensor out = tiled(latent, tl.tile_height / sf, tl.tile_width / sf, tl.stride_height / sf, tl.stride_width / sf,
                       h * sf, w * sf, tl.stride_height, tl.stride_width, tl.tile_height - tl.stride_height,
                       tl.tile_width - tl.stride_width,
                       [&](const Tensor& tile) { return decode_untiled(tile, o, false); });
    clamp_(out);
    return out;
  }
  return decode_untiled(latent, o, true);
}

Tensor WanVae::decode_untiled(const Tensor& latent, const WanVaeRunOptions& o, bool clamp) const {
  const WanVaeConfig& c = ck_.config;
  const Device device = *o.device;
  const int64_t b = latent.size(0), t = latent.size(2);
  if (device.is_cpu() && !o.channels_last) {
    Tensor z = latent.clone();
    const int64_t ch = z.size(1), hw = z.size(3) * z.size(4);
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
    if (clamp) clamp_(video);
    return video;
  }
  const DType dt = cl_dtype(device, o);
  const DeviceWeights& dw = device_weights(device, dt);
  const ClNet net(dw.w);
  const int64_t sf = c.spatial_factor(), tf = c.temporal_factor();
  const int64_t frames_out = tf * (t - 1) + 1, hh = latent.size(3) * sf, ww = latent.size(4) * sf;
  Tensor video = Tensor::empty({b, 3, frames_out, hh, ww}, DType::F32);
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor zb = dense(latent.slice(0, bi, bi + 1));
    if (device.is_cuda()) zb = zb.to(device);
    const Tensor x = net.conv("conv2", ops::to_channels_last(zb, 0, t, dt, dw.std, dw.mean));
    Cache cache;
    int64_t f0 = 0;
    for (int64_t i = 0; i < t; ++i) {
      const Tensor y = net.decoder(cache, c, cl_frames(x, i, i + 1));  // [1, f, H, W, 3]
      if (device.is_cpu()) {
        Tensor vb = video.slice(0, bi, bi + 1);
        ops::to_channels_first(y, vb, f0, {}, {}, clamp);
      } else {
        Tensor chunk = Tensor::empty({1, 3, y.size(1), hh, ww}, DType::F32, device);
        ops::to_channels_first(y, chunk, 0, {}, {}, clamp);
        put_chunk(video, bi, f0, chunk);
      }
      f0 += y.size(1);
    }
    TD_CHECK(f0 == frames_out, Internal, "Wan VAE: decoded ", f0, " frames, expected ", frames_out);
  }
  return video;
}

Tensor WanVae::encode(const Tensor& video_in, const WanVaeRunOptions& options) const {
  check_video(video_in);
  const WanVaeConfig& c = ck_.config;
  const int64_t sf = c.spatial_factor();
  options.tiling.validate(sf);
  WanVaeRunOptions o = options;
  o.device = options.device.value_or(video_in.device());
  const Tensor video = host_f32(video_in);
  const WanVaeTiling& tl = o.tiling;
  const int64_t h = video.size(3), w = video.size(4);
  if (tl.enabled && (w > tl.tile_width || h > tl.tile_height))
    return tiled(video, tl.tile_height, tl.tile_width, tl.stride_height, tl.stride_width, h / sf, w / sf,
                 tl.stride_height / sf, tl.stride_width / sf, (tl.tile_height - tl.stride_height) / sf,
                 (tl.tile_width - tl.stride_width) / sf, [&](const Tensor& tile) { return encode_untiled(tile, o); });
  return encode_untiled(video, o);
}

Tensor WanVae::encode_untiled(const Tensor& video, const WanVaeRunOptions& o) const {
  const WanVaeConfig& c = ck_.config;
  const Device device = *o.device;
  const int64_t tf = c.temporal_factor(), f = video.size(2), b = video.size(0);
  if (device.is_cpu() && !o.channels_last) {
    const Net net(ck_.tensors);
    Cache cache;
    std::vector<Tensor> out;
    out.push_back(net.encoder(cache, c, frames(video, 0, 1)));
    for (int64_t s = 1; s < f; s += tf) out.push_back(net.encoder(cache, c, frames(video, s, s + tf)));
    const Tensor h = net.conv1x1("conv1", out.size() == 1 ? out.front() : cat_time(out));  // [B, 2z, T, h, w]
    Tensor mu = h.slice(1, 0, c.z_dim).contiguous();
    const int64_t t = mu.size(2), hw = mu.size(3) * mu.size(4);
    float* p = mu.data<float>();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t ci = 0; ci < c.z_dim; ++ci) {
        float* q = p + (bi * c.z_dim + ci) * t * hw;
        for (int64_t i = 0; i < t * hw; ++i) q[i] = (q[i] - c.latents_mean[ci]) / c.latents_std[ci];
      }
    return mu;
  }
  const DType dt = cl_dtype(device, o);
  const DeviceWeights& dw = device_weights(device, dt);
  const ClNet net(dw.w);
  const int64_t sf = c.spatial_factor(), t = (f - 1) / tf + 1;
  Tensor mu = Tensor::empty({b, c.z_dim, t, video.size(3) / sf, video.size(4) / sf}, DType::F32);
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor vb = dense(video.slice(0, bi, bi + 1));
    if (device.is_cuda()) vb = vb.to(device);
    Cache cache;
    std::vector<Tensor> out;
    out.push_back(net.encoder(cache, c, ops::to_channels_last(vb, 0, 1, dt)));
    for (int64_t s = 1; s < f; s += tf) out.push_back(net.encoder(cache, c, ops::to_channels_last(vb, s, tf, dt)));
    const Tensor h = net.conv("conv1", out.size() == 1 ? out.front() : ops::cat_frames_cl(out));  // [1, T, h, w, 2z]
    if (device.is_cpu()) {
      Tensor mb = mu.slice(0, bi, bi + 1);
      ops::to_channels_first(h, mb, 0, dw.inv_std, dw.neg_mean_over_std);
    } else {
      Tensor chunk = Tensor::empty({1, c.z_dim, t, mu.size(3), mu.size(4)}, DType::F32, device);
      ops::to_channels_first(h, chunk, 0, dw.inv_std, dw.neg_mean_over_std);
      put_chunk(mu, bi, 0, chunk);
    }
  }
  return mu;
}

}  // namespace td::models::wan_vae
