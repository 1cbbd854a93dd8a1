// Deterministic random fills (kernels/random/philox_fill.h) of a tensor on its
// own device: the random-weight models of `turbodiff bench e2e` are built with
// them on the GPU at real size. Same (seed, stream) -> same values on the CPU
// and on CUDA.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace td::ops {

// t: contiguous F32 / F16 / BF16: uniform in [lo, hi); I8: codes uniform on [-127, 127].
void random_fill_(Tensor& t, uint64_t seed, uint64_t stream, float lo = -1.f, float hi = 1.f);

}  // namespace td::ops
