// fp32 CPU reference of the per-token 1x128 group quantizer.
#include "core/thread_pool.h"
#include "kernels/quant/quant_ref.h"
#include "kernels/quant/quant_token128.h"

namespace td::kernels {

Status quantize_token128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales, int64_t ld_scales) {
  if (!ref::matrix_args_ok(x, rows, cols, ld_x, q, ld_q, scales) || ld_scales < rows) return Status::InvalidArgument;
  if (rows == 0 || cols == 0) return Status::Ok;
  return ref::with_loader(x_type, [&](auto load) {
    td::parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) ref::quantize_token128_row(load, x, r, cols, ld_x, q + r * ld_q, scales + r, ld_scales);
    });
    return Status::Ok;
  });
}

Status dequantize_token128_cpu(const int8_t* q, int64_t rows, int64_t cols, int64_t ld_q, const float* scales,
                               int64_t ld_scales, float* out, int64_t ld_out) {
  if (!ref::matrix_args_ok(q, rows, cols, ld_q, out, ld_out, scales) || ld_scales < rows) return Status::InvalidArgument;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * ld_out + c] = float(q[r * ld_q + c]) * scales[(c / kQuantGroup) * ld_scales + r];
  return Status::Ok;
}

}  // namespace td::kernels
