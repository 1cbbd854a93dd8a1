// fp32 CPU references of the channels-last VAE kernels (contract in vae_cl.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/conv/vae_cl.h"

namespace td::kernels {

Status channel_rms_norm_cl_cpu(const float* x, int64_t rows, int64_t c, const float* gamma, bool silu, float* y) {
  if (rows < 0 || c <= 0 || !x || !gamma || !y) return Status::InvalidArgument;
  const float root_c = std::sqrt(float(c));
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      double ss = 0;
      for (int64_t i = 0; i < c; ++i) ss += double(xr[i]) * xr[i];
      const float inv = root_c / std::max(float(std::sqrt(ss)), 1e-12f);
      for (int64_t i = 0; i < c; ++i) {
        const float v = xr[i] * inv * gamma[i];
        yr[i] = silu ? v / (1.0f + std::exp(-v)) : v;
      }
    }
  });
  return Status::Ok;
}

Status upsample_nearest2x_cl_cpu(const float* x, int64_t planes, int64_t h, int64_t w, int64_t c, float* y) {
  if (planes < 0 || h <= 0 || w <= 0 || c <= 0 || !x || !y) return Status::InvalidArgument;
  parallel_for(planes * 2 * h, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {  // i = plane * 2h + output row
      const int64_t pl = i / (2 * h), oy = i % (2 * h);
      const float* src = x + (pl * h + oy / 2) * w * c;
      float* dst = y + i * 2 * w * c;
      for (int64_t ox = 0; ox < 2 * w; ++ox) std::memcpy(dst + ox * c, src + (ox / 2) * c, size_t(c) * sizeof(float));
    }
  });
  return Status::Ok;
}

Status softmax_rows_cpu(const float* s, int64_t rows, int64_t cols, float scale, float* p) {
  if (rows < 0 || cols <= 0 || !s || !p || !(scale > 0) || !std::isfinite(scale)) return Status::InvalidArgument;
  parallel_for(rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* sr = s + r * cols;
      float* pr = p + r * cols;
      float m = -INFINITY;
      for (int64_t j = 0; j < cols; ++j) m = std::max(m, scale * sr[j]);
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        pr[j] = std::exp(scale * sr[j] - m);
        sum += pr[j];
      }
      const float inv = float(1.0 / sum);
      for (int64_t j = 0; j < cols; ++j) pr[j] *= inv;
    }
  });
  return Status::Ok;
}

Status to_channels_last_cpu(const ToChannelsLast& p, const float* x, float* y) {
  if (p.n <= 0 || p.c <= 0 || p.t <= 0 || p.hw <= 0 || p.t0 < 0 || p.t0 + p.t > p.t_total || !x || !y)
    return Status::InvalidArgument;
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t f = 0; f < p.t; ++f)
      for (int64_t ci = 0; ci < p.c; ++ci) {
        const float sc = p.scale ? p.scale[ci] : 1.0f, sh = p.shift ? p.shift[ci] : 0.0f;
        const float* src = x + ((b * p.c + ci) * p.t_total + p.t0 + f) * p.hw;
        float* dst = y + (b * p.t + f) * p.hw * p.c + ci;
        for (int64_t i = 0; i < p.hw; ++i) dst[i * p.c] = src[i] * sc + sh;
      }
  return Status::Ok;
}

Status to_channels_first_cpu(const ToChannelsFirst& p, const float* x, float* y) {
  if (p.n <= 0 || p.c <= 0 || p.c > p.c_x || p.t <= 0 || p.hw <= 0 || p.t0 < 0 || p.t0 + p.t > p.t_total || !x || !y)
    return Status::InvalidArgument;
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t f = 0; f < p.t; ++f)
      for (int64_t ci = 0; ci < p.c; ++ci) {
        const float sc = p.scale ? p.scale[ci] : 1.0f, sh = p.shift ? p.shift[ci] : 0.0f;
        const float* src = x + (b * p.t + f) * p.hw * p.c_x + ci;
        float* dst = y + ((b * p.c + ci) * p.t_total + p.t0 + f) * p.hw;
        for (int64_t i = 0; i < p.hw; ++i) {
          const float v = src[i * p.c_x] * sc + sh;
          dst[i] = p.clamp ? std::clamp(v, -1.0f, 1.0f) : v;
        }
      }
  return Status::Ok;
}

Status copy2d_cpu(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows) {
  if ((rows && row_bytes && (!dst || !src)) || (rows > 1 && (row_bytes > dst_pitch || row_bytes > src_pitch)))
    return Status::InvalidArgument;
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
  return Status::Ok;
}

}  // namespace td::kernels
