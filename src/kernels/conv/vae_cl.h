// The channels-last kernels of the CUDA Wan VAE (beside the cuDNN convolution
// in conv.h). Activations are [n, t, h, w, c] with the channel dim
// contiguous, the layout cuDNN's BF16 convolutions are fastest with; the VAE
// converts at its entry and exit (to_channels_last / to_channels_first).
// Each kernel has its fp32 CPU reference (`*_cpu`, F32 only) and a CUDA
// version taking F32 or BF16 (`type`), fp32 math inside; framework-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/status.h"

namespace td::kernels {

// Wan's RMS_norm over the channels of each of `rows` positions:
// y[r, :] = x[r, :] / max(||x[r, :]||_2, 1e-12) * sqrt(c) * gamma, then
// SiLU (y / (1 + exp(-y))) when `silu` (the VAE's norm -> SiLU pairs).
// gamma: c fp32 values. y may equal x.
Status channel_rms_norm_cl_cpu(const float* x, int64_t rows, int64_t c, const float* gamma, bool silu, float* y);

// Nearest 2x upsampling of [planes, h, w, c] -> [planes, 2h, 2w, c].
Status upsample_nearest2x_cl_cpu(const float* x, int64_t planes, int64_t h, int64_t w, int64_t c, float* y);

// Row softmax of scores: p[r, j] = exp(scale s[r, j] - m) / sum_j exp(scale s[r, j] - m)
// over `cols` columns (m the row max), s fp32 [rows, cols], p [rows, cols].
Status softmax_rows_cpu(const float* s, int64_t rows, int64_t cols, float scale, float* p);

// Layout conversion at the VAE's entry: x [n, c, t_total, hw] fp32 (channel
// first), frames [t0, t0 + t) -> y [n, t, hw, c], y = x * scale[c] + shift[c]
// (scale / shift: c fp32 values or null = 1 / 0).
struct ToChannelsLast {
  int64_t n = 1, c = 0, t_total = 0, t0 = 0, t = 0, hw = 0;
  const float* scale = nullptr;
  const float* shift = nullptr;
};
Status to_channels_last_cpu(const ToChannelsLast& p, const float* x, float* y);

// At the exit: x [n, t, hw, c_x] (channels last), channels [0, c) ->
// y [n, c, t_total, hw] fp32 at frames [t0, t0 + t): y = x * scale[c] + shift[c],
// clamped to [-1, 1] when `clamp`.
struct ToChannelsFirst {
  int64_t n = 1, c_x = 0, c = 0, t_total = 0, t0 = 0, t = 0, hw = 0;
  const float* scale = nullptr;
  const float* shift = nullptr;
  bool clamp = false;
};
Status to_channels_first_cpu(const ToChannelsFirst& p, const float* x, float* y);

// A strided 2-D byte copy: `rows` rows of `row_bytes` from src (row pitch
// src_pitch) to dst (dst_pitch). The VAE's frame concatenation and the
// temporal upsample's channel-halves-to-frames interleave are this copy.
Status copy2d_cpu(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows);

#if TURBODIFF_HAVE_CUDA
Status channel_rms_norm_cl_cuda(const void* x, ElemType type, int64_t rows, int64_t c, const float* gamma, bool silu,
                                void* y, void* stream);
Status upsample_nearest2x_cl_cuda(const void* x, ElemType type, int64_t planes, int64_t h, int64_t w, int64_t c,
                                  void* y, void* stream);
// p in p_type (F32 or BF16).
Status softmax_rows_cuda(const float* s, int64_t rows, int64_t cols, float scale, void* p, ElemType p_type,
                         void* stream);
// y in `type` (F32 or BF16); x fp32.
Status to_channels_last_cuda(const ToChannelsLast& p, const float* x, void* y, ElemType type, void* stream);
// x in `type` (F32 or BF16); y fp32.
Status to_channels_first_cuda(const ToChannelsFirst& p, const void* x, ElemType type, float* y, void* stream);
// Device to device, stream-ordered (cudaMemcpy2DAsync).
Status copy2d_cuda(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                   void* stream);
#endif

}  // namespace td::kernels
