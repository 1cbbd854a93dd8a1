// CPU reference of the Philox random fills (contract in philox_fill.h).
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/norm/norm_host.h"
#include "kernels/random/philox_fill.h"

namespace td::kernels {

Status random_fill_cpu(const RandomFill& f) {
  if (f.n < 0 || (f.n > 0 && !f.out)) return Status::InvalidArgument;
  if (f.out_type != ElemType::I8 && !is_activation_type(f.out_type)) return Status::InvalidArgument;
  const float span = f.hi - f.lo;
  td::parallel_for((f.n + 3) / 4, 1024, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const Philox4 c = philox4x32_10_hd(uint64_t(b), f.stream, f.seed);
      for (int j = 0; j < 4; ++j) {
        const int64_t i = b * 4 + j;
        if (i >= f.n) break;
        if (f.out_type == ElemType::I8)
          static_cast<int8_t*>(f.out)[i] = int8_t(int(c.v[j] % 255u) - 127);
        else
          store_act(f.out, f.out_type, i, std::fma(span, philox_unit24(c.v[j]), f.lo));
      }
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
