// fp32 CPU reference of rms_norm (see rms_norm.h). Rows are independent and
// are split across the thread pool; each row is read into an fp32 buffer
// first, which makes the in-place case (y == x) safe.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/norm/norm_host.h"
#include "kernels/norm/rms_norm.h"

namespace td::kernels {

Status rms_norm_check(const void* x, ElemType x_type, int64_t x_stride,
                      const void* y, ElemType y_type, int64_t y_stride,
                      int64_t rows, int64_t dim, float eps) {
  if (!valid_shape(rows, dim) || !(eps >= 0.f) || !std::isfinite(eps)) return Status::InvalidArgument;
  if (!valid_rows_operand(x, x_type, x_stride, rows, dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(y, y_type, y_stride, rows, dim)) return Status::InvalidArgument;
  if (!alias_ok(x, x_type, x_stride, y, y_type, y_stride)) return Status::InvalidArgument;
  return Status::Ok;
}

Status rms_norm_cpu(const void* x, ElemType x_type, int64_t x_stride,
                    void* y, ElemType y_type, int64_t y_stride,
                    const float* weight, int64_t rows, int64_t dim, float eps) {
  if (Status s = rms_norm_check(x, x_type, x_stride, y, y_type, y_stride, rows, dim, eps); s != Status::Ok)
    return s;
  parallel_for(rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(dim));
    for (int64_t r = r0; r < r1; ++r) {
      double sum_sq = 0;  // the reference accumulates in double: its error is the rounding of y alone
      for (int64_t i = 0; i < dim; ++i) {
        row[size_t(i)] = load_act(x, x_type, r * x_stride + i);
        sum_sq += double(row[size_t(i)]) * row[size_t(i)];
      }
      const float rstd = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
      for (int64_t i = 0; i < dim; ++i) {
        float v = row[size_t(i)] * rstd;
        if (weight) v *= weight[i];
        store_act(y, y_type, r * y_stride + i, v);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
