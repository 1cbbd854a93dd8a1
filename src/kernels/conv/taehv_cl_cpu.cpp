// fp32 CPU references of the TAEHV channels-last kernels (contract in taehv_cl.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/conv/taehv_cl.h"

namespace td::kernels {

Status taehv_pointwise_cpu(TaehvPointwise op, const float* x, const float* r, int64_t n, float* y) {
  if (n < 0 || !x || !y || (op == TaehvPointwise::AddRelu && !r)) return Status::InvalidArgument;
  if (op != TaehvPointwise::Relu && op != TaehvPointwise::TanhClamp3 && op != TaehvPointwise::AddRelu)
    return Status::InvalidArgument;
  parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float v = x[i];
      float out;
      if (op == TaehvPointwise::Relu) out = v > 0.f ? v : 0.f;
      else if (op == TaehvPointwise::TanhClamp3) out = 3.f * std::tanh(v / 3.f);
      else out = std::max(v + r[i], 0.f);
      y[i] = out;
    }
  });
  return Status::Ok;
}

Status taehv_memblock_input_cpu(const float* x, const float* prev, int64_t t, int64_t hw, int64_t c, float* y) {
  if (t < 0 || hw < 0 || c <= 0 || !x || !y) return Status::InvalidArgument;
  const size_t row = size_t(c) * sizeof(float);
  parallel_for(t * hw, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {  // r = frame * hw + position
      float* dst = y + r * 2 * c;
      std::memcpy(dst, x + r * c, row);
      if (r >= hw) std::memcpy(dst + c, x + (r - hw) * c, row);
      else if (prev) std::memcpy(dst + c, prev + r * c, row);
      else std::memset(dst + c, 0, row);
    }
  });
  return Status::Ok;
}

}  // namespace td::kernels
