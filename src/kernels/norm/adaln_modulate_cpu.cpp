// fp32 CPU reference of adaln_modulate (see adaln_modulate.h): a LayerNorm
// without affine parameters (two-pass statistics) followed by the per-sample
// modulation ln * (1 + scale[b]) + shift[b], b = row / rows_per_batch.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/norm/adaln_modulate.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {

Status adaln_modulate_check(const void* x, ElemType x_type, int64_t x_stride,
                            const void* y, ElemType y_type, int64_t y_stride,
                            int64_t mod_stride, int64_t rows_per_batch, int64_t rows, int64_t dim, float eps) {
  if (!valid_shape(rows, dim) || !(eps >= 0.f) || !std::isfinite(eps)) return Status::InvalidArgument;
  if (!valid_rows_operand(x, x_type, x_stride, rows, dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(y, y_type, y_stride, rows, dim)) return Status::InvalidArgument;
  if (!alias_ok(x, x_type, x_stride, y, y_type, y_stride)) return Status::InvalidArgument;
  if (!valid_per_sample_rows(mod_stride, rows_per_batch, dim)) return Status::InvalidArgument;
  return Status::Ok;
}

Status adaln_modulate_cpu(const void* x, ElemType x_type, int64_t x_stride,
                          void* y, ElemType y_type, int64_t y_stride,
                          const float* scale, const float* shift, int64_t mod_stride, int64_t rows_per_batch,
                          int64_t rows, int64_t dim, float eps) {
  if (Status s = adaln_modulate_check(x, x_type, x_stride, y, y_type, y_stride, mod_stride, rows_per_batch,
                                      rows, dim, eps);
      s != Status::Ok)
    return s;
  parallel_for(rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t r = r0; r < r1; ++r) {
      double sum = 0;
      for (int64_t i = 0; i < dim; ++i) {
        row[size_t(i)] = load_act(x, x_type, r * x_stride + i);
        sum += row[size_t(i)];
      }
      const RowStats st = layer_norm_row_stats(row.data(), dim, sum, eps);
      const float mean_f = st.mean, rstd = st.rstd;
      const int64_t mod_row = (r / rows_per_batch) * mod_stride;
      for (int64_t i = 0; i < dim; ++i) {
        float v = (row[size_t(i)] - mean_f) * rstd;
        if (scale) v *= 1.f + scale[mod_row + i];
        if (shift) v += shift[mod_row + i];
        store_act(y, y_type, r * y_stride + i, v);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
