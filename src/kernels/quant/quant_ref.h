// Host-only building blocks of the CPU references in this folder: element
// loaders per input type, argument checks, and the serial per-row / per-block
// quantization loops. The public *_cpu functions run these under
// td::parallel_for; the fused references call them directly from inside their
// own parallel_for (the thread pool does not nest).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/quant/quant_common.h"
#include "kernels/status.h"

namespace td::kernels::ref {

struct LoadF32 {
  float operator()(const void* p, int64_t i) const { return static_cast<const float*>(p)[i]; }
};
struct LoadF16 {
  float operator()(const void* p, int64_t i) const { return td::f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
};
struct LoadBF16 {
  float operator()(const void* p, int64_t i) const { return td::bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
};

// Calls f(loader) for an activation type; InvalidArgument for any other type.
template <typename F>
Status with_loader(ElemType t, F&& f) {
  switch (t) {
    case ElemType::F32: return f(LoadF32{});
    case ElemType::F16: return f(LoadF16{});
    case ElemType::BF16: return f(LoadBF16{});
    default: return Status::InvalidArgument;
  }
}

// The common shape checks of a [rows, cols] input -> int8 output pair.
inline bool matrix_args_ok(const void* x, int64_t rows, int64_t cols, int64_t ld_x, const void* q, int64_t ld_q,
                           const void* scales) {
  if (rows < 0 || cols < 0) return false;
  if (rows == 0 || cols == 0) return true;
  return x && q && scales && ld_x >= cols && ld_q >= cols;
}

// Quantizes rows [r0, r0 + nr) (nr <= 128) of x, one 128-row block, with
// TurboDiffusion's formula; writes that block row's ceil(cols/128) scales to
// block_scales.
template <typename Load>
void quantize_block128_rows(Load load, const void* x, int64_t r0, int64_t nr, int64_t cols, int64_t ld_x, int8_t* q,
                            int64_t ld_q, float* block_scales) {
  for (int64_t c0 = 0; c0 < cols; c0 += kQuantGroup) {
    const int64_t nc = std::min<int64_t>(kQuantGroup, cols - c0);
    float amax = 0.f;
    for (int64_t r = r0; r < r0 + nr; ++r)
      for (int64_t c = c0; c < c0 + nc; ++c) amax = std::max(amax, std::fabs(load(x, r * ld_x + c)));
    const QuantParams p = block128_params(amax);
    for (int64_t r = r0; r < r0 + nr; ++r)
      for (int64_t c = c0; c < c0 + nc; ++c) q[r * ld_q + c] = quantize_rn_sat(load(x, r * ld_x + c) * p.inv);
    block_scales[c0 / kQuantGroup] = p.scale;
  }
}

// Quantizes row `row_x` of x (a row of cols elements at x + row_x * ld_x) in
// 1x128 groups into q_row; the scale of group g goes to scale_col[g * ld_scales].
template <typename Load>
void quantize_token128_row(Load load, const void* x, int64_t row_x, int64_t cols, int64_t ld_x, int8_t* q_row,
                           float* scale_col, int64_t ld_scales) {
  const int64_t base = row_x * ld_x;
  for (int64_t c0 = 0; c0 < cols; c0 += kQuantGroup) {
    const int64_t nc = std::min<int64_t>(kQuantGroup, cols - c0);
    float amax = 0.f;
    for (int64_t c = c0; c < c0 + nc; ++c) amax = std::max(amax, std::fabs(load(x, base + c)));
    const QuantParams p = symmetric_params(amax);
    for (int64_t c = c0; c < c0 + nc; ++c) q_row[c] = quantize_rn_sat(load(x, base + c) * p.inv);
    scale_col[(c0 / kQuantGroup) * ld_scales] = p.scale;
  }
}

// One scale over the whole row.
template <typename Load>
void quantize_per_row_row(Load load, const void* x, int64_t row_x, int64_t cols, int64_t ld_x, int8_t* q_row,
                          float* scale) {
  const int64_t base = row_x * ld_x;
  float amax = 0.f;
  for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(load(x, base + c)));
  const QuantParams p = symmetric_params(amax);
  for (int64_t c = 0; c < cols; ++c) q_row[c] = quantize_rn_sat(load(x, base + c) * p.inv);
  *scale = p.scale;
}

}  // namespace td::kernels::ref
