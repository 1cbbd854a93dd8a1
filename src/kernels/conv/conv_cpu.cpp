#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/conv/conv.h"
#include "kernels/gemm_f32/gemm_f32.h"

namespace td::kernels {

Status conv3d_check(const Conv3dParams& p) {
  if (p.cin <= 0 || p.t <= 0 || p.h <= 0 || p.w <= 0 || p.cout <= 0 || p.kt <= 0 || p.kh <= 0 || p.kw <= 0)
    return Status::InvalidArgument;
  if (p.stride_t <= 0 || p.stride_h <= 0 || p.stride_w <= 0) return Status::InvalidArgument;
  if (p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0) return Status::InvalidArgument;
  if (!p.x || !p.weight || !p.y) return Status::InvalidArgument;
  if (conv_out_size(p.t, p.kt, p.stride_t, 0, 0) == 0 ||
      conv_out_size(p.h, p.kh, p.stride_h, p.pad_top, p.pad_bottom) == 0 ||
      conv_out_size(p.w, p.kw, p.stride_w, p.pad_left, p.pad_right) == 0)
    return Status::InvalidArgument;
  return Status::Ok;
}

Status conv3d_f32_cpu(const Conv3dParams& p) {
  if (const Status s = conv3d_check(p); s != Status::Ok) return s;
  const int64_t ot = conv_out_size(p.t, p.kt, p.stride_t, 0, 0);
  const int64_t oh = conv_out_size(p.h, p.kh, p.stride_h, p.pad_top, p.pad_bottom);
  const int64_t ow = conv_out_size(p.w, p.kw, p.stride_w, p.pad_left, p.pad_right);
  const int64_t positions = ot * oh * ow;
  const int64_t k = p.cin * p.kt * p.kh * p.kw;
  const int64_t hw = p.h * p.w, thw = p.t * hw;
  // Positions per block: the im2col scratch stays near 32 MB whatever the layer.
  const int64_t block = std::clamp<int64_t>((int64_t(8) << 20) / k, 64, positions);
  std::vector<float> col(size_t(block * k));

  for (int64_t p0 = 0; p0 < positions; p0 += block) {
    const int64_t n = std::min(block, positions - p0);
    // col[j, (ci, dt, dh, dw)] = padded input under output position p0 + j: the
    // K order of the weight's [cout, cin, kt, kh, kw] rows.
    parallel_for(n, 16, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t pos = p0 + j;
        const int64_t xo = pos % ow, yo = (pos / ow) % oh, to = pos / (ow * oh);
        float* dst = col.data() + j * k;
        const int64_t x0 = xo * p.stride_w - p.pad_left;
        const bool cols_in = x0 >= 0 && x0 + p.kw <= p.w;  // the common interior case: no per-tap checks
        for (int64_t ci = 0; ci < p.cin; ++ci)
          for (int64_t dt = 0; dt < p.kt; ++dt) {
            const float* plane = p.x + ci * thw + (to * p.stride_t + dt) * hw;
            for (int64_t dh = 0; dh < p.kh; ++dh, dst += p.kw) {
              const int64_t yi = yo * p.stride_h - p.pad_top + dh;
              if (yi < 0 || yi >= p.h) {
                std::fill(dst, dst + p.kw, 0.0f);
              } else if (cols_in) {
                const float* src = plane + yi * p.w + x0;
                for (int64_t dw = 0; dw < p.kw; ++dw) dst[dw] = src[dw];
              } else {
                for (int64_t dw = 0; dw < p.kw; ++dw) {
                  const int64_t xi = x0 + dw;
                  dst[dw] = (xi >= 0 && xi < p.w) ? plane[yi * p.w + xi] : 0.0f;
                }
              }
            }
          }
      }
    });
    // y[co, p0 + j] = sum_k weight[co, k] * col[j, k]
    GemmF32Params g;
    g.m = p.cout;
    g.n = n;
    g.k = k;
    g.a = p.weight;
    g.lda = k;
    g.w = col.data();
    g.ldw = k;
    g.c = p.y + p0;
    g.ldc = positions;
    if (const Status s = gemm_f32_cpu(g); s != Status::Ok) return s;
  }
  if (p.bias)
    parallel_for(p.cout, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t co = c0; co < c1; ++co) {
        float* row = p.y + co * positions;
        const float b = p.bias[co];
        for (int64_t i = 0; i < positions; ++i) row[i] += b;
      }
    });
  return Status::Ok;
}

Status upsample_nearest2x_f32_cpu(const float* x, int64_t planes, int64_t h, int64_t w, float* y) {
  if (planes <= 0 || h <= 0 || w <= 0 || !x || !y) return Status::InvalidArgument;
  parallel_for(planes * h, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t plane = r / h, i = r % h;
      const float* src = x + r * w;
      float* d0 = y + plane * 4 * h * w + (2 * i) * (2 * w);
      float* d1 = d0 + 2 * w;
      for (int64_t j = 0; j < w; ++j) d0[2 * j] = d0[2 * j + 1] = d1[2 * j] = d1[2 * j + 1] = src[j];
    }
  });
  return Status::Ok;
}

Status channel_rms_norm_f32_cpu(const float* x, int64_t c, int64_t positions, const float* gamma,
                                const float* bias, float* y) {
  if (c <= 0 || positions <= 0 || !x || !gamma || !y) return Status::InvalidArgument;
  const float scale = std::sqrt(float(c));
  // Positions in runs of 256, so the channel-strided reads touch whole cache lines.
  constexpr int64_t kRun = 256;
  parallel_for((positions + kRun - 1) / kRun, 1, [&](int64_t b0, int64_t b1) {
    float ss[kRun];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t q0 = b * kRun, n = std::min(kRun, positions - q0);
      std::fill(ss, ss + n, 0.0f);
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* xr = x + ch * positions + q0;
        for (int64_t i = 0; i < n; ++i) ss[i] += xr[i] * xr[i];
      }
      for (int64_t i = 0; i < n; ++i) ss[i] = scale / std::max(std::sqrt(ss[i]), 1e-12f);
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* xr = x + ch * positions + q0;
        float* yr = y + ch * positions + q0;
        const float g = gamma[ch], bb = bias ? bias[ch] : 0.0f;
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * ss[i] * g + bb;
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
