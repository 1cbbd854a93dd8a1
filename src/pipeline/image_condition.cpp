#include "pipeline/image_condition.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/wan_vae/wan_vae.h"

namespace td::pipeline {
namespace {

// One axis of PIL's resampling (ImagingResample's precompute_coeffs with the
// bilinear filter, support 1): for output i, the first input index and the
// normalised weights of the inputs it covers.
struct AxisTaps {
  std::vector<int64_t> first;
  std::vector<std::vector<double>> weights;
};

AxisTaps bilinear_taps(int64_t in, int64_t out) {
  const double scale = double(in) / double(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;
  const double inv = 1.0 / filter_scale;
  AxisTaps taps;
  taps.first.resize(size_t(out));
  taps.weights.resize(size_t(out));
  for (int64_t i = 0; i < out; ++i) {
    const double center = (double(i) + 0.5) * scale;
    // C casts truncate toward zero, as PIL's (int) does.
    int64_t lo = int64_t(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = int64_t(center + support + 0.5);
    if (hi > in) hi = in;
    std::vector<double> w;
    double total = 0;
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((double(x) - center + 0.5) * inv);
      const double k = d < 1.0 ? 1.0 - d : 0.0;
      w.push_back(k);
      total += k;
    }
    if (total != 0)
      for (double& k : w) k /= total;
    taps.first[size_t(i)] = lo;
    taps.weights[size_t(i)] = std::move(w);
  }
  return taps;
}

uint8_t round_u8(double v) { return uint8_t(std::clamp(std::floor(v + 0.5), 0.0, 255.0)); }

}  // namespace

std::pair<int64_t, int64_t> adaptive_resolution(int64_t image_width, int64_t image_height, int64_t target_width,
                                                int64_t target_height, int64_t stride) {
  TD_CHECK(image_width > 0 && image_height > 0 && target_width > 0 && target_height > 0 && stride > 0, Internal,
           "adaptive_resolution: sizes must be positive");
  const double area = double(target_width) * double(target_height);
  const double ratio = double(image_height) / double(image_width);
  // std::nearbyint rounds half to even under the default rounding mode, as Python's round().
  const int64_t w = int64_t(std::nearbyint(std::sqrt(area / ratio) / double(stride))) * stride;
  const int64_t h = int64_t(std::nearbyint(std::sqrt(area * ratio) / double(stride))) * stride;
  TD_CHECK(w >= stride && h >= stride, Usage, "--adaptive-resolution: the image is ", image_width, "x", image_height,
           "; at the area of ", target_width, "x", target_height, " its aspect ratio gives ", w, "x", h,
           " pixels (a side below ", stride, "): crop the image or use a fixed size");
  return {w, h};
}

io::RgbImage resize_bilinear_antialias(const io::RgbImage& image, int64_t width, int64_t height) {
  TD_CHECK(image.width > 0 && image.height > 0 && int64_t(image.rgb.size()) == image.width * image.height * 3,
           Internal, "resize: malformed image ", image.width, "x", image.height);
  TD_CHECK(width > 0 && height > 0, Internal, "resize: target ", width, "x", height);
  // Horizontal pass (skipped when the width does not change, as PIL does), rounded to 8 bits.
  io::RgbImage mid;
  if (width == image.width) {
    mid = image;
  } else {
    const AxisTaps tx = bilinear_taps(image.width, width);
    mid.width = width;
    mid.height = image.height;
    mid.rgb.resize(size_t(width * image.height * 3));
    for (int64_t y = 0; y < image.height; ++y)
      for (int64_t x = 0; x < width; ++x)
        for (int c = 0; c < 3; ++c) {
          double s = 0;
          const auto& w = tx.weights[size_t(x)];
          for (size_t k = 0; k < w.size(); ++k) s += w[k] * image.at(y, tx.first[size_t(x)] + int64_t(k), c);
          mid.rgb[size_t((y * width + x) * 3 + c)] = round_u8(s);
        }
  }
  if (height == mid.height) return mid;
  const AxisTaps ty = bilinear_taps(mid.height, height);
  io::RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.resize(size_t(width * height * 3));
  for (int64_t y = 0; y < height; ++y) {
    const auto& w = ty.weights[size_t(y)];
    for (int64_t x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (size_t k = 0; k < w.size(); ++k) s += w[k] * mid.at(ty.first[size_t(y)] + int64_t(k), x, c);
        out.rgb[size_t((y * width + x) * 3 + c)] = round_u8(s);
      }
  }
  return out;
}

Tensor image_to_tensor(const io::RgbImage& image) {
  Tensor t = Tensor::empty({1, 3, image.height, image.width}, DType::F32);
  float* p = t.data<float>();
  const int64_t plane = image.height * image.width;
  for (int64_t i = 0; i < plane; ++i)
    for (int c = 0; c < 3; ++c) {
      // (v / 255 - 0.5) / 0.5, in float32 as torchvision computes it.
      const float v = float(image.rgb[size_t(i * 3 + c)]) / 255.0f;
      p[c * plane + i] = (v - 0.5f) / 0.5f;
    }
  return t;
}

Tensor i2v_latent_mask(int64_t num_frames, int64_t temporal_factor, int64_t latent_height, int64_t latent_width) {
  TD_CHECK(num_frames >= 1 && temporal_factor >= 1 && (num_frames - 1) % temporal_factor == 0, Internal,
           "i2v mask: ", num_frames, " frames with temporal factor ", temporal_factor);
  const int64_t lat_t = (num_frames - 1) / temporal_factor + 1;
  // Pixel-frame mask with frame 0 repeated temporal_factor times: F - 1 + tf
  // entries = tf * T; entry tf * t + c is channel c of latent frame t.
  std::vector<float> frames(size_t(lat_t * temporal_factor), 0.f);
  for (int64_t c = 0; c < temporal_factor; ++c) frames[size_t(c)] = 1.f;
  Tensor m = Tensor::empty({1, temporal_factor, lat_t, latent_height, latent_width}, DType::F32);
  float* p = m.data<float>();
  const int64_t plane = latent_height * latent_width;
  for (int64_t c = 0; c < temporal_factor; ++c)
    for (int64_t t = 0; t < lat_t; ++t)
      std::fill_n(p + (c * lat_t + t) * plane, plane, frames[size_t(temporal_factor * t + c)]);
  return m;
}

Tensor concat_channels(const Tensor& x, const Tensor& y) {
  TD_CHECK(x.dim() == 5 && y.dim() == 5 && (y.shape()[0] == 1 || y.shape()[0] == x.shape()[0]) &&
               x.shape()[2] == y.shape()[2] && x.shape()[3] == y.shape()[3] && x.shape()[4] == y.shape()[4],
           Shape, "I2V input: latent ", shape_str(x.shape()), " and condition ", shape_str(y.shape()),
           " must be [B, C, T, h, w] with the same T, h, w (and batch 1 or B for the condition)");
  const Tensor xf = (x.device().is_cpu() ? x : x.to(Device::cpu())).contiguous().to(DType::F32);
  const Tensor yf = (y.device().is_cpu() ? y : y.to(Device::cpu())).contiguous().to(DType::F32);
  const int64_t b = x.shape()[0], cx = x.shape()[1], cy = y.shape()[1];
  const int64_t per_channel = x.shape()[2] * x.shape()[3] * x.shape()[4];
  Tensor out = Tensor::empty({b, cx + cy, x.shape()[2], x.shape()[3], x.shape()[4]}, DType::F32);
  for (int64_t k = 0; k < b; ++k) {
    float* o = out.data<float>() + k * (cx + cy) * per_channel;
    std::copy_n(xf.data<float>() + k * cx * per_channel, cx * per_channel, o);
    std::copy_n(yf.data<float>() + (yf.shape()[0] == 1 ? 0 : k) * cy * per_channel, cy * per_channel,
                o + cx * per_channel);
  }
  return out;
}

Tensor i2v_condition(const models::wan_vae::WanVae& vae, const Tensor& image, int64_t num_frames,
                     const models::wan_vae::WanVaeRunOptions& run) {
  TD_CHECK(image.dim() == 4 && image.shape()[0] == 1 && image.shape()[1] == 3 && image.dtype() == DType::F32 &&
               image.device().is_cpu(),
           Shape, "I2V image tensor ", shape_str(image.shape()), ": expected f32 [1, 3, H, W] on the host");
  const int64_t h = image.shape()[2], w = image.shape()[3];
  const int64_t tf = vae.config().temporal_factor(), sf = vae.config().spatial_factor();
  Tensor video = Tensor::zeros({1, 3, num_frames, h, w}, DType::F32);
  const Tensor img = image.contiguous();
  for (int64_t c = 0; c < 3; ++c)
    std::copy_n(img.data<float>() + c * h * w, h * w, video.data<float>() + c * num_frames * h * w);
  const Tensor latent = vae.encode(video, run);
  const Tensor mask = i2v_latent_mask(num_frames, tf, h / sf, w / sf);
  TD_CHECK(latent.shape()[2] == mask.shape()[2] && latent.shape()[3] == mask.shape()[3] &&
               latent.shape()[4] == mask.shape()[4],
           Internal, "I2V: VAE latent ", shape_str(latent.shape()), " vs mask ", shape_str(mask.shape()));
  return concat_channels(mask, latent);
}

}  // namespace td::pipeline
