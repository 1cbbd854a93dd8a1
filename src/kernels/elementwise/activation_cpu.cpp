// fp32 CPU reference of the activations (see activation.h): the textbook
// formulas, element by element, rows split across the thread pool. Each
// element is read before it is written, so y == x is safe.
#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/elementwise/activation.h"
#include "kernels/norm/norm_host.h"

namespace td::kernels {

Status activation_check(Activation act, const void* x, ElemType x_type, int64_t x_stride,
                        const void* y, ElemType y_type, int64_t y_stride, int64_t rows, int64_t dim) {
  if (act != Activation::GeluTanh && act != Activation::Silu) return Status::InvalidArgument;
  if (!valid_shape(rows, dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(x, x_type, x_stride, rows, dim)) return Status::InvalidArgument;
  if (!valid_rows_operand(y, y_type, y_stride, rows, dim)) return Status::InvalidArgument;
  if (!alias_ok(x, x_type, x_stride, y, y_type, y_stride)) return Status::InvalidArgument;
  return Status::Ok;
}

Status activation_cpu(Activation act, const void* x, ElemType x_type, int64_t x_stride,
                      void* y, ElemType y_type, int64_t y_stride, int64_t rows, int64_t dim) {
  if (Status s = activation_check(act, x, x_type, x_stride, y, y_type, y_stride, rows, dim); s != Status::Ok)
    return s;
  parallel_for(rows, std::max<int64_t>(1, 65536 / dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < dim; ++i) {
        const float v = load_act(x, x_type, r * x_stride + i);
        float out;
        if (act == Activation::GeluTanh) {
          const float sqrt_2_over_pi = 0.7978845608028654f;
          out = 0.5f * v * (1.f + std::tanh(sqrt_2_over_pi * (v + 0.044715f * v * v * v)));
        } else {
          out = v / (1.f + std::exp(-v));
        }
        store_act(y, y_type, r * y_stride + i, out);
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
