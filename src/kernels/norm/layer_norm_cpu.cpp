// fp32 CPU reference of layer_norm (see layer_norm.h): two-pass statistics
// per row (mean, then the mean squared deviation), rows split across the
// thread pool, each row buffered in fp32 so y == x is safe.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/norm/layer_norm.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {

Status layer_norm_check(const void* x, ElemType x_type, int64_t x_stride,
                        const void* y, ElemType y_type, int64_t y_stride,
                        int64_t rows, int64_t dim, float eps) {
  if (!valid_shape(rows, dim) || !(eps >= 0.f) || !std::isfinite(eps)) return Status::InvalidArgument;
  if (!valid_rows_operand(x, x_type, x_stride, rows, dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(y, y_type, y_stride, rows, dim)) return Status::InvalidArgument;
  if (!alias_ok(x, x_type, x_stride, y, y_type, y_stride)) return Status::InvalidArgument;
  return Status::Ok;
}

Status layer_norm_cpu(const void* x, ElemType x_type, int64_t x_stride,
                      void* y, ElemType y_type, int64_t y_stride,
                      const float* weight, const float* bias, int64_t rows, int64_t dim, float eps) {
  if (Status s = layer_norm_check(x, x_type, x_stride, y, y_type, y_stride, rows, dim, eps); s != Status::Ok)
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
      for (int64_t i = 0; i < dim; ++i) {
        float v = (row[size_t(i)] - mean_f) * rstd;
        if (weight) v *= weight[i];
        if (bias) v += bias[i];
        store_act(y, y_type, r * y_stride + i, v);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
