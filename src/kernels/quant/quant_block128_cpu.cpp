// fp32 CPU reference of the 128x128 block quantizer (TurboDiffusion's format).
#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/quant/quant_block128.h"
#include "kernels/quant/quant_ref.h"

namespace td::kernels {

Status quantize_block128_cpu(ElemType x_type, const void* x, int64_t rows, int64_t cols, int64_t ld_x, int8_t* q,
                             int64_t ld_q, float* scales) {
  if (!ref::matrix_args_ok(x, rows, cols, ld_x, q, ld_q, scales)) return Status::InvalidArgument;
  if (rows == 0 || cols == 0) return Status::Ok;
  return ref::with_loader(x_type, [&](auto load) {
    const int64_t row_blocks = quant_groups(rows), col_blocks = quant_groups(cols);
    td::parallel_for(row_blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t rb = b0; rb < b1; ++rb) {
        const int64_t r0 = rb * kQuantGroup;
        ref::quantize_block128_rows(load, x, r0, std::min<int64_t>(kQuantGroup, rows - r0), cols, ld_x, q, ld_q,
                                    scales + rb * col_blocks);
      }
    });
    return Status::Ok;
  });
}

Status dequantize_block128_cpu(const int8_t* q, int64_t rows, int64_t cols, int64_t ld_q, const float* scales,
                               float* out, int64_t ld_out) {
  if (!ref::matrix_args_ok(q, rows, cols, ld_q, out, ld_out, scales)) return Status::InvalidArgument;
  const int64_t col_blocks = quant_groups(cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * ld_out + c] = float(q[r * ld_q + c]) * scales[(r / kQuantGroup) * col_blocks + c / kQuantGroup];
  return Status::Ok;
}

}  // namespace td::kernels
