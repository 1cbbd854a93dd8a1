// fp32 CPU references of the fused LayerNorm + AdaLN modulation + INT8
// quantization: the plain LN-modulate loop below composed with the reference
// quantizers of quant_ref.h applied to its fp32 output.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/quant/layernorm_modulate_quant.h"
#include "kernels/quant/quant_ref.h"

namespace td::kernels {
namespace {

bool ln_args_ok(const void* x, int64_t rows, int64_t dim, int64_t ld_x, const float* mod_shift,
                const float* mod_scale, int64_t ld_mod, int64_t rows_per_batch, float eps) {
  if (rows < 0 || dim < 0 || rows_per_batch < 1 || !(eps >= 0.f)) return false;
  if (rows == 0 || dim == 0) return true;
  return x && mod_shift && mod_scale && ld_x >= dim && ld_mod >= dim;
}

// y_row = LN(x row r) * (1 + scale[b]) + shift[b]; mean and variance (biased)
// accumulated in fp64 and rounded to fp32, the rest in fp32.
template <typename Load>
void layernorm_modulate_row(Load load, const void* x, int64_t r, int64_t dim, int64_t ld_x, const float* mod_shift,
                            const float* mod_scale, int64_t ld_mod, int64_t rows_per_batch, float eps, float* y_row) {
  const int64_t base = r * ld_x;
  double sum = 0;
  for (int64_t c = 0; c < dim; ++c) sum += double(load(x, base + c));
  const double mean = sum / double(dim);
  double sq = 0;
  for (int64_t c = 0; c < dim; ++c) {
    const double d = double(load(x, base + c)) - mean;
    sq += d * d;
  }
  const float mean_f = float(mean);
  const float rstd = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
  const int64_t b = r / rows_per_batch;
  const float* shift = mod_shift + b * ld_mod;
  const float* scale = mod_scale + b * ld_mod;
  for (int64_t c = 0; c < dim; ++c) y_row[c] = (load(x, base + c) - mean_f) * rstd * (1.f + scale[c]) + shift[c];
}

}  // namespace

Status layernorm_modulate_f32_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                  const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                  int64_t rows_per_batch, float eps, float* y, int64_t ld_y) {
  if (!ln_args_ok(x, rows, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps)) return Status::InvalidArgument;
  if (rows == 0 || dim == 0) return Status::Ok;
  if (!y || ld_y < dim) return Status::InvalidArgument;
  return ref::with_loader(x_type, [&](auto load) {
    td::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        layernorm_modulate_row(load, x, r, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps, y + r * ld_y);
    });
    return Status::Ok;
  });
}

Status layernorm_modulate_quant_token128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                             const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                             int64_t rows_per_batch, float eps, int8_t* q, int64_t ld_q,
                                             float* scales, int64_t ld_scales) {
  if (!ln_args_ok(x, rows, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps)) return Status::InvalidArgument;
  if (rows == 0 || dim == 0) return Status::Ok;
  if (!q || !scales || ld_q < dim || ld_scales < rows) return Status::InvalidArgument;
  return ref::with_loader(x_type, [&](auto load) {
    td::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      std::vector<float> y(static_cast<size_t>(dim));
      for (int64_t r = r0; r < r1; ++r) {
        layernorm_modulate_row(load, x, r, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps, y.data());
        ref::quantize_token128_row(ref::LoadF32{}, y.data(), 0, dim, dim, q + r * ld_q, scales + r, ld_scales);
      }
    });
    return Status::Ok;
  });
}

Status layernorm_modulate_quant_block128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t dim, int64_t ld_x,
                                             const float* mod_shift, const float* mod_scale, int64_t ld_mod,
                                             int64_t rows_per_batch, float eps, int8_t* q, int64_t ld_q,
                                             float* scales) {
  if (!ln_args_ok(x, rows, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps)) return Status::InvalidArgument;
  if (rows == 0 || dim == 0) return Status::Ok;
  if (!q || !scales || ld_q < dim) return Status::InvalidArgument;
  return ref::with_loader(x_type, [&](auto load) {
    const int64_t row_blocks = quant_groups(rows), col_blocks = quant_groups(dim);
    td::parallel_for(row_blocks, 1, [&](int64_t b0, int64_t b1) {
      // y of one 128-row block, then the block quantizer on it.
      std::vector<float> y(static_cast<size_t>(kQuantGroup) * static_cast<size_t>(dim));
      for (int64_t rb = b0; rb < b1; ++rb) {
        const int64_t r0 = rb * kQuantGroup, nr = std::min<int64_t>(kQuantGroup, rows - r0);
        for (int64_t i = 0; i < nr; ++i)
          layernorm_modulate_row(load, x, r0 + i, dim, ld_x, mod_shift, mod_scale, ld_mod, rows_per_batch, eps,
                                 y.data() + i * dim);
        ref::quantize_block128_rows(ref::LoadF32{}, y.data(), 0, nr, dim, dim, q + r0 * ld_q, ld_q,
                                    scales + rb * col_blocks);
      }
    });
    return Status::Ok;
  });
}

}  // namespace td::kernels
